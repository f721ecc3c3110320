package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/seed-a1b882c0/idem/console"
	"github.com/seed-a1b882c0/idem/monitor"
)

// EnvConsoleAuth is the environment variable serve reads credentials
// from when -auth-file is not given: USER:PASSWORD or a token, one a line.
const EnvConsoleAuth = "IDEM_CONSOLE_AUTH"

var serveCommand = command{
	name: "serve", args: "",
	summary: "Serve the operator console in the browser (overview, records, record, and with -write the actions), with Prometheus metrics at /metrics. Read-only unless -write; runs until interrupted.",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		addr := fs.String("listen", "127.0.0.1:8089", "serve the console at http://`ADDR`/ (loopback by default)")
		write := fs.Bool("write", false, "enable release, delete and resolve; needs credentials from -auth-file or $"+EnvConsoleAuth)
		authFile := fs.String("auth-file", "", "read sign-in credentials from `FILE`: USER:PASSWORD or a token, one a line (default $"+EnvConsoleAuth+")")
		interval := fs.Duration("interval", time.Minute, "time between the monitor's sweeps (the overview's numbers)")
		maxRecords := fs.Int("max-records", 10_000, "most records of each status (IN_PROGRESS, FAILED) one sweep reads")
		storeWait := fs.Duration("store-wait", time.Minute, "keep trying to open the store this long before giving up (0: once)")
		refLink := fs.String("ref-link", "", "link execution references that are not Step Functions ARNs through `URL`, where {ref} stands for the reference")
		var cfg console.Config
		applySignIn := cfg.DefineSignInFlags(fs, "")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("serve takes no arguments")
			}
			if *interval <= 0 || *maxRecords <= 0 || *storeWait < 0 {
				return usagef("-interval and -max-records must be positive, -store-wait not negative")
			}
			creds, err := c.consoleCredentials(*authFile)
			if err != nil {
				return err
			}
			if *write && len(creds) == 0 {
				return usagef("-write needs credentials: -auth-file FILE or $%s (USER:PASSWORD or a token)", EnvConsoleAuth)
			}
			cfg.Write, cfg.Credentials, cfg.RefLink = *write, creds, *refLink
			if err := applySignIn(); err != nil {
				return usagef("%v", err)
			}
			return c.serve(ctx, *addr, *storeWait, &cfg,
				&monitor.Config{Interval: *interval, MaxRecords: *maxRecords})
		}
	},
}

// consoleCredentials reads -auth-file, or else $IDEM_CONSOLE_AUTH; none
// when neither is set.
func (c *ctl) consoleCredentials(file string) ([]console.Credential, error) {
	var src string
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("-auth-file: %w", err)
		}
		src = string(b)
	case c.env.Getenv(EnvConsoleAuth) != "":
		src = c.env.Getenv(EnvConsoleAuth)
		file = "$" + EnvConsoleAuth
	default:
		return nil, nil
	}
	creds, err := console.ParseCredentials(strings.NewReader(src))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return creds, nil
}

// consoleActions counts the console's actions for Prometheus.
func consoleActions(reg prometheus.Registerer) func(console.ActionEvent) {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_console_actions_total",
		Help: "Actions taken through the operator console, by action and outcome (done, refused, error)."}, []string{"action", "outcome"})
	reg.MustRegister(v)
	return func(ev console.ActionEvent) { v.WithLabelValues(string(ev.Action), ev.Outcome).Inc() }
}

func (c *ctl) serve(ctx context.Context, addr string, storeWait time.Duration, cfg *console.Config, mcfg *monitor.Config) error {
	s, closeStore, err := c.openWaiting(ctx, storeWait)
	if err != nil {
		return err
	}
	defer closeStore()
	log := c.logger()
	g := newGauges()
	var m *monitor.Monitor
	if l, err := lister(s); err == nil {
		mcfg.Clock, mcfg.Logger, mcfg.OnSweep = c.env.Clock, log, g.sweep
		mcfg.OnEvent = func(ev monitor.Event) { g.events.WithLabelValues(ev.Kind.String()).Inc() }
		if m, err = monitor.Start(l, mcfg); err != nil {
			return err
		}
		defer m.Close()
	}
	cfg.Name, cfg.Monitor, cfg.Clock, cfg.Logger, cfg.Owner = redactURL(c.storeURL()), m, c.env.Clock, log, "idemctl-console"
	cfg.OnAction = consoleActions(g.reg)
	con, err := console.New(s, cfg)
	if err != nil {
		return err
	}
	defer con.Close()
	ln, err := c.listen(addr)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.reg, promhttp.HandlerOpts{}))
	mux.Handle("/", con)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	mode := "read-only"
	if cfg.Write {
		mode = "writes enabled"
	}
	fmt.Fprintf(c.env.Stderr, "idemctl serve: console on http://%s/ (%s), metrics on http://%s/metrics\n", ln.Addr(), mode, ln.Addr())
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		fmt.Fprintf(c.env.Stderr, "idemctl serve: warning: %s is not a loopback address; the console speaks plain HTTP, so put TLS in front of it\n", ln.Addr())
	}
	return serveUntilDone(ctx, srv, errc, c.env.Stderr, shutdownGrace)
}

// serveUntilDone waits until ctx is done or srv failed (errc), then shuts
// srv down (nil: none), giving requests in flight grace; what is
// still in flight then (a page waiting on a slow store, a browser's
// request) is cut, and the command has stopped as asked: that is no
// failure, and warn says how many were cut.
func serveUntilDone(ctx context.Context, srv *http.Server, errc <-chan error, warn io.Writer, grace time.Duration) error {
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
		defer cancel()
		if serr := srv.Shutdown(sctx); errors.Is(serr, context.DeadlineExceeded) {
			_ = srv.Close()
			fmt.Fprintf(warn, "idemctl: requests still in flight %v after the stop were cut\n", grace)
		} else if serr != nil && err == nil {
			err = serr
		}
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// shutdownGrace is how long a stopping server lets requests in flight end.
const shutdownGrace = 5 * time.Second

// redactURL hides a password in a store URL.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}
