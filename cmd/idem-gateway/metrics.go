package main

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/seed-a1b882c0/idem"
)

// metrics are the gateway's Prometheus metrics, in a registry of its own.
// They also serve as the engine's idem.Observer.
type metrics struct {
	reg       *prometheus.Registry
	outcomes  *prometheus.CounterVec
	storeCall *prometheus.HistogramVec
	inFlight  prometheus.Gauge
	responses *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_outcomes_total",
			Help: "Outcomes of idempotent calls (acquired, replayed, in_progress, mismatch, released, uncertain, ...).",
		}, []string{"op", "outcome"}),
		storeCall: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_store_call_duration_seconds",
			Help:    "Latency of idempotency store calls by method and result.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"method", "result"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idem_gateway_in_flight_requests",
			Help: "Requests the gateway is serving now.",
		}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_gateway_responses_total",
			Help: "Responses by status code and whether they were replayed.",
		}, []string{"code", "replayed"}),
	}
	m.reg.MustRegister(m.outcomes, m.storeCall, m.inFlight, m.responses,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every outcome is exported from the start, at zero.
	for _, o := range idem.Outcomes() {
		m.outcomes.WithLabelValues(scope, o.String())
	}
	return m
}

// Observe implements idem.Observer.
func (m *metrics) Observe(op string, o idem.Outcome) {
	m.outcomes.WithLabelValues(op, o.String()).Inc()
}

// StoreCall implements idem.Observer.
func (m *metrics) StoreCall(op idem.StoreOp, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.storeCall.WithLabelValues(string(op), result).Observe(d.Seconds())
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// instrument counts in-flight requests and responses around h.
func (m *metrics) instrument(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.inFlight.Inc()
		defer m.inFlight.Dec()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		replayed := "false"
		if w.Header().Get("Idempotent-Replayed") == "true" {
			replayed = "true"
		}
		m.responses.WithLabelValues(strconv.Itoa(sw.status), replayed).Inc()
	})
}

// statusWriter remembers the status; Unwrap keeps Flush and Hijack working.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
