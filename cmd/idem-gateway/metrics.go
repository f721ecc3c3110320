package main

import (
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemprom"
)

// metrics are the gateway's Prometheus metrics, in a registry of its own:
// the engine's outcomes and store latencies from idemprom (idem_outcomes_total,
// idem_store_call_duration_seconds, the metrics a user of the library gets),
// and the gateway's own.
type metrics struct {
	reg       *prometheus.Registry
	observer  *idemprom.Observer // the engine's observe.Observer
	inFlight  prometheus.Gauge
	responses *prometheus.CounterVec
	// byStatus caches the children of responses: [status-100] not
	// replayed, [900+status-100] replayed.
	byStatus [2 * 900]atomic.Pointer[prometheus.Counter]
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idem_gateway_in_flight_requests",
			Help: "Requests the gateway is serving now.",
		}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_gateway_responses_total",
			Help: "Responses by status code and whether they were replayed.",
		}, []string{"code", "replayed"}),
	}
	// Every outcome of the gateway's operation is exported from the start, at zero.
	m.observer = idemprom.MustNew(m.reg, &idemprom.Config{Operations: []string{scope}})
	m.reg.MustRegister(m.inFlight, m.responses,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
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
		replayed := w.Header().Get(idemhttp.ReplayedHeader) == "true"
		m.response(sw.status, replayed).Inc()
	})
}

// response returns the counter of responses with status, replayed or not.
// The counters of the statuses a server sends (100-999) are kept once
// made, so that counting a response does not hash its labels.
func (m *metrics) response(status int, replayed bool) prometheus.Counter {
	label := strconv.FormatBool(replayed)
	if status < 100 || status > 999 {
		return m.responses.WithLabelValues(strconv.Itoa(status), label)
	}
	i := status - 100
	if replayed {
		i += 900
	}
	cell := &m.byStatus[i]
	if c := cell.Load(); c != nil {
		return *c
	}
	c := m.responses.WithLabelValues(strconv.Itoa(status), label)
	cell.Store(&c) // a racing first response stores the same child
	return c
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
