package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/seed-a1b882c0/idem/monitor"
	"github.com/seed-a1b882c0/idem/store"
)

var watchCommand = command{
	name: "watch", args: "",
	summary: "Sweep the store on an interval, log each newly stuck or failed record once and a store setting that turns wrong (Redis eviction), and serve Prometheus gauges with -metrics. Read-only; runs until interrupted.",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		addr := fs.String("metrics", "", "serve Prometheus metrics at http://`ADDR`/metrics (such as :9464)")
		interval := fs.Duration("interval", time.Minute, "time between sweeps")
		maxRecords := fs.Int("max-records", 10_000, "most records of each status (IN_PROGRESS, FAILED) one sweep reads")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("watch takes no arguments")
			}
			if *interval <= 0 || *maxRecords <= 0 {
				return usagef("-interval and -max-records must be positive")
			}
			return c.watch(ctx, *addr, &monitor.Config{Interval: *interval, MaxRecords: *maxRecords})
		}
	},
}

// gauges are watch's metrics.
type gauges struct {
	reg                                           *prometheus.Registry
	stuck, held, inProgress, failed, oldest, last prometheus.Gauge
	truncated                                     prometheus.Gauge
	sweepErrors, events                           *prometheus.CounterVec
	misconfigured                                 *prometheus.GaugeVec
}

func newGauges() *gauges {
	g := &gauges{reg: prometheus.NewRegistry()}
	gauge := func(name, help string) prometheus.Gauge {
		m := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		g.reg.MustRegister(m)
		return m
	}
	g.stuck = gauge("idem_stuck", "IN_PROGRESS records past their expected completion, at the last sweep.")
	g.held = gauge("idem_stuck_held", "Of idem_stuck, the records held for an operator (takeover policy Hold: no retry takes them over; resolve or release them), at the last sweep.")
	g.inProgress = gauge("idem_in_progress", "IN_PROGRESS records, at the last sweep.")
	g.failed = gauge("idem_failed", "FAILED records, at the last sweep.")
	g.oldest = gauge("idem_oldest_in_progress_age_seconds", "Age of the oldest IN_PROGRESS record since its claim, at the last sweep (0: none).")
	g.last = gauge("idem_monitor_last_sweep_timestamp_seconds", "When the last successful sweep started (Unix seconds).")
	g.truncated = gauge("idem_monitor_sweep_truncated", "1 when the last sweep stopped at -max-records (the counts are lower bounds).")
	g.sweepErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_monitor_sweep_errors_total", Help: "Sweeps that failed to list the store."}, nil)
	g.events = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_monitor_events_total", Help: "Records that newly became stuck or failed, by kind."}, []string{"kind"})
	g.misconfigured = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_store_misconfigured",
		Help: "1 when the store's check of a backend setting found it wrong at the last sweep that could read it (check=\"eviction\": Redis may evict records, so operations may run again), else 0."}, []string{"check"})
	g.reg.MustRegister(g.sweepErrors, g.events, g.misconfigured)
	return g
}

func (g *gauges) sweep(s monitor.Snapshot) {
	for _, c := range s.Settings() {
		switch {
		case c.Err == nil:
			g.misconfigured.WithLabelValues(c.Name).Set(0)
		case errors.Is(c.Err, store.ErrMisconfigured):
			g.misconfigured.WithLabelValues(c.Name).Set(1)
		} // unreadable (unavailable): as it was
	}
	if s.Err != nil {
		g.sweepErrors.WithLabelValues().Inc()
		return
	}
	g.stuck.Set(float64(s.Stuck))
	g.held.Set(float64(s.Held))
	g.inProgress.Set(float64(s.InProgress))
	g.failed.Set(float64(s.Failed))
	g.oldest.Set(s.OldestInProgress.Seconds())
	g.last.Set(float64(s.At.UnixNano()) / 1e9)
	t := 0.0
	if s.Truncated {
		t = 1
	}
	g.truncated.Set(t)
}

func (c *ctl) watch(ctx context.Context, addr string, cfg *monitor.Config) error {
	s, closeStore, err := c.openReadOnly(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	l, err := lister(s)
	if err != nil {
		return err
	}
	g := newGauges()
	cfg.Clock, cfg.Logger = c.env.Clock, c.logger()
	cfg.OnSweep = g.sweep
	cfg.OnEvent = func(ev monitor.Event) { g.events.WithLabelValues(ev.Kind.String()).Inc() }
	var srv *http.Server
	errc := make(chan error, 1)
	if addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("-metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(g.reg, promhttp.HandlerOpts{}))
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- srv.Serve(ln) }()
		fmt.Fprintf(c.env.Stderr, "idemctl watch: serving metrics on http://%s/metrics\n", ln.Addr())
	}
	m, err := monitor.Start(l, cfg)
	if err != nil {
		return err
	}
	defer m.Close()
	return serveUntilDone(ctx, srv, errc, c.env.Stderr, shutdownGrace)
}
