// Command idem-gateway is a reverse proxy that puts Idempotency-Key semantics
// in front of any HTTP service: a covered request with an Idempotency-Key is
// passed upstream once, its response stored and replayed to retries, and
// concurrent duplicates, reused keys and malformed keys are answered by the
// gateway (409, 422, 400) without reaching the upstream.
//
//	idem-gateway -listen 127.0.0.1:8080 -upstream http://127.0.0.1:9000 \
//	  [-store bolt:///path/idem.db | memory: | redis://… | postgres://… | dynamodb://TABLE?endpoint=…&region=…] \
//	  [-store-wait 60s] [-admin 127.0.0.1:9090] [-require-key] [-principal-header Authorization] \
//	  [-expiry 24h] [-lease 30s] [-max-body 1MiB] [-methods POST,PATCH] \
//	  [-read-header-timeout 10s] [-body-timeout 30s] [-read-timeout 1m] [-idle-timeout 2m] \
//	  [-status-path /idempotency/status/ -expected-completion 10m] \
//	  [-console [-console-write -console-auth-file FILE] [-console-secure-cookies] \
//	    [-console-trusted-proxies ADDRS] [-console-sign-in-failures 5 -console-sign-in-window 1m]]
//
// # Operator console
//
// With -console, the admin listener also serves the operator console
// (package console) at /console/, over the gateway's own store: the only
// way to look into the bolt file while the gateway holds it. It is
// read-only unless -console-write, which needs sign-in credentials from
// -console-auth-file or $IDEM_CONSOLE_AUTH (USER:PASSWORD or a token, one
// a line). Behind a TLS-terminating proxy, set -console-secure-cookies (or
// name the proxy in -console-trusted-proxies, whose X-Forwarded-Proto and
// X-Forwarded-For are then believed); failed sign-ins close sign-in to
// the client that made them, and only slow the user's sign-ins from other
// clients (-console-sign-in-failures, -console-sign-in-window,
// -console-sign-in-max-delay, -console-sign-in-user-delay). See
// docs/operations.md.
//
// Run idem-gateway -h for every flag.
//
// # Tracing
//
// Off unless OTEL_TRACES_EXPORTER is otlp (OTLP over HTTP/protobuf to
// OTEL_EXPORTER_OTLP_ENDPOINT) or console (JSON on standard output); the
// rest is the OpenTelemetry SDK's standard environment (OTEL_SERVICE_NAME,
// default idem-gateway; OTEL_TRACES_SAMPLER; OTEL_EXPORTER_OTLP_HEADERS …).
// Each request is a server span continuing the client's trace, with the
// idem attributes (idem.operation, idem.key.hash, idem.outcome,
// idem.replayed, idem.fence); the engine's spans are its children, and the
// upstream gets the trace in traceparent. See docs/tracing.md.
//
// # Starting before the store
//
// The gateway listens at once and opens its store in the background,
// retrying for -store-wait while the store is down or starting
// (storeurl.StartOpen). Until it is open, covered requests get 503 with
// Retry-After and never reach the upstream unprotected; the admin
// listener's /healthz answers 200 (liveness) and /readyz 503 (readiness,
// 200 once the store is open and answers). When the wait is over the
// gateway exits, saying so; a configuration fault (a role without rights,
// a table of another shape…) ends it at once.
//
// # Asynchronous work
//
// With -status-path (which needs -admin), the upstream may answer a covered
// request 202 Accepted and finish the work later.
//
// Every covered request reaches the upstream with an Idem-Token header:
// the token of the request's claim, an opaque, URL-safe string (the
// gateway removes any Idem-Token a client sent). An upstream that accepts
// the work answers 202 and hands the token to its worker. The gateway then
// hands the claim off — its expected completion becomes now +
// -expected-completion — and answers the client 202 with the upstream's
// body, Retry-After, and as Location its own status resource: -status-path
// followed by an id, which the gateway serves (GET it for the status as
// JSON). A retry with the key gets 202 and the status while the work runs,
// and the final answer after it. Any other upstream answer is stored and
// replayed as always, and its token is spent.
//
// The worker settles the key through the ADMIN listener, never the public
// one, with one POST:
//
//	POST /idem/v1/tokens/{token}/complete?status=201  the request's Content-Type and body become
//	                                                  the stored response (status default 200)
//	POST /idem/v1/tokens/{token}/fail                 a problem+json body; its "status" member
//	                                                  (400-599) is the status retries get
//	POST /idem/v1/tokens/{token}/release              frees the key: a retry goes upstream again
//	POST /idem/v1/tokens/{token}/extend?for=10m       moves the expected completion (a heartbeat)
//	POST /idem/v1/tokens/{token}/attach?ref=…         the execution reference, shown as
//	                                                  "execution" in the status
//
// It answers 204 when done, and problem+json otherwise: 400 for a malformed
// token, one of another operation or a bad parameter; 409 for a
// stale token — the expected completion passed and a retry took the key
// over, or the key was settled or released — and then nothing was written.
// For example, a worker in a shell:
//
//	curl -X POST "http://127.0.0.1:9090/idem/v1/tokens/$TOKEN/complete?status=201" \
//	  -H 'Content-Type: application/json' -d '{"transfer":"tr_1"}'
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/console"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// scope is the operation name under which the gateway stores its keys:
// idemhttp's store key under it is clientkey.HTTP's, which idemctl find
// and the console derive from what a client sent.
const scope = clientkey.GatewayOperation

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "idem-gateway:", err)
		os.Exit(2)
	}
}

// options are the command line.
type options struct {
	tokenKey                       []byte // -token-key-file, or $IDEM_TOKEN_KEY
	listen, upstream, store, admin string
	requireKey, holdCrashed        bool
	principalHeader                string
	expiry, lease, wait            time.Duration
	storeWait                      time.Duration
	upstreamTimeout, grace         time.Duration
	readHeaderTimeout, bodyTimeout time.Duration
	readTimeout, idleTimeout       time.Duration
	maxBody, maxResponse           int64
	cacheEntries                   int
	cacheBytes                     int64
	methods                        []string
	replayHeaders, fpHeaders       []string
	logLevel                       slog.Level
	statusPath                     string
	expectedCompletion             time.Duration
	console                        consoleOptions
	tracing                        *tracing // from the OTEL_* environment (tracing.go); nil: off
}

func parseFlags(args []string, out io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("idem-gateway", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve on")
	fs.StringVar(&o.upstream, "upstream", "", "the service behind the gateway, http://host:port (required)")
	fs.StringVar(&o.store, "store", "", "where records live: bolt:///path.db, memory:, redis://…, postgres://…, dynamodb://TABLE?region=…&endpoint=… (default: bolt file "+defaultStorePath()+")")
	fs.DurationVar(&o.storeWait, "store-wait", time.Minute, "how long to keep trying to open the store (connect, migrate, check) at start, with backoff; meanwhile the gateway serves, covered requests get 503 and /readyz 503; then it exits (0: one attempt)")
	fs.StringVar(&o.admin, "admin", "", "address of the admin listener (/metrics, /healthz, /readyz); empty: none")
	fs.BoolVar(&o.requireKey, "require-key", false, "answer 400 to a covered request without Idempotency-Key (default: pass it through unprotected)")
	fs.StringVar(&o.principalHeader, "principal-header", "", "request header naming the caller (e.g. Authorization); its hash scopes the keys, and requests without it get 401")
	fs.DurationVar(&o.expiry, "expiry", 24*time.Hour, "how long a stored response is replayed")
	fs.DurationVar(&o.lease, "lease", 30*time.Second, "how long an in-flight request holds its key before a retry may take it over (renewed while the upstream works)")
	fs.BoolVar(&o.holdCrashed, "hold-crashed", false, "takeover policy Hold: a request whose gateway died while it was in flight (its lease passed) is not sent upstream again; its key is held (409, problem type held) until an operator resolves or releases it (idemctl, the console) or it expires (default: a retry after the lease sends it again)")
	fs.DurationVar(&o.wait, "wait", 0, "how long a duplicate waits for the first request to finish before 409 (0: answer 409 at once)")
	fs.DurationVar(&o.upstreamTimeout, "upstream-timeout", 25*time.Second, "how long to wait for the upstream's response headers; then 504, and the key stays held until its lease ends")
	fs.DurationVar(&o.readHeaderTimeout, "read-header-timeout", 10*time.Second, "how long a client may take to send a request's headers; then the connection is closed (0: no limit)")
	fs.DurationVar(&o.bodyTimeout, "body-timeout", 30*time.Second, "how long a covered request's body may take to arrive, stalled or trickling; then 408, nothing is stored and the connection is closed (0: only -read-timeout)")
	fs.DurationVar(&o.readTimeout, "read-timeout", time.Minute, "how long a whole request, headers and body, may take to arrive; bounds requests passed through unprotected (a covered request's body has -body-timeout instead) (0: no limit)")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", 2*time.Minute, "how long a kept-alive connection may wait idle for its next request (0: no limit)")
	fs.DurationVar(&o.grace, "grace", 30*time.Second, "on SIGTERM or SIGINT, how long in-flight requests may take to finish")
	maxBody := fs.String("max-body", "1MiB", "largest request body (413 above it)")
	maxResponse := fs.String("max-response", "1MiB", "largest response body stored for replay (retries of a larger one get 410)")
	fs.IntVar(&o.cacheEntries, "cache-entries", 10000, "completed responses kept in memory for replay without a store call (0: no cache)")
	cacheBytes := fs.String("cache-bytes", "64MiB", "memory the replay cache may use")
	methods := fs.String("methods", "POST,PATCH", "methods covered, comma separated")
	replay := fs.String("replay-headers", "", "replay only these response headers, comma separated (default: every header but cookies, credentials, authentication challenges, hop-by-hop headers, Date and Content-Length); with -principal-header, keys are scoped by caller, so a replay only reaches the caller that sent the first request")
	fp := fs.String("fingerprint-headers", "", "request headers that are part of the payload fingerprint, comma separated")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.statusPath, "status-path", "", "turns on asynchronous mode: covered requests reach the upstream with an "+tokenHeader+" header, an upstream 202 hands the key off and is answered 202 with the Location of a status resource under this path (e.g. /idempotency/status/), and workers settle keys through -admin (required); empty: off")
	fs.DurationVar(&o.expectedCompletion, "expected-completion", idemhttp.DefaultExpectedCompletion, "with -status-path: how long handed-off work may take before a retry may take its key over (at most -expiry; a worker extends it through -admin)")
	tokenKeyFile := fs.String("token-key-file", "", "with -status-path: sign the "+tokenHeader+" tokens handed to the upstream and workers with the secret in `FILE` (at least 16 bytes; default $"+envTokenKey+"), so that a forged or altered token is refused before any store call; every gateway of a fleet needs the same key")
	o.console.define(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := o.readTokenKey(*tokenKeyFile, os.Getenv); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if o.maxBody, err = parseSize(*maxBody); err != nil {
		return nil, fmt.Errorf("-max-body: %w", err)
	}
	if o.maxResponse, err = parseSize(*maxResponse); err != nil {
		return nil, fmt.Errorf("-max-response: %w", err)
	}
	if o.cacheBytes, err = parseSize(*cacheBytes); err != nil {
		return nil, fmt.Errorf("-cache-bytes: %w", err)
	}
	if o.cacheEntries < 0 {
		return nil, fmt.Errorf("-cache-entries %d is negative", o.cacheEntries)
	}
	for name, d := range map[string]time.Duration{
		"-read-header-timeout": o.readHeaderTimeout, "-body-timeout": o.bodyTimeout,
		"-read-timeout": o.readTimeout, "-idle-timeout": o.idleTimeout, "-store-wait": o.storeWait,
	} {
		if d < 0 {
			return nil, fmt.Errorf("%s %v is negative; use 0 for no limit", name, d)
		}
	}
	o.methods = list(strings.ToUpper(*methods))
	o.replayHeaders, o.fpHeaders = list(*replay), list(*fp)
	if err := o.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return nil, fmt.Errorf("-log-level: %w", err)
	}
	if o.upstream == "" {
		return nil, errors.New("-upstream is required, e.g. -upstream http://127.0.0.1:9000")
	}
	if o.store == "" {
		o.store = "bolt://" + defaultStorePath()
	}
	if o.statusPath != "" && o.admin == "" {
		return nil, errors.New("-status-path needs -admin: workers settle handed-off work through the admin listener")
	}
	if err := o.console.check(o.admin, os.Getenv); err != nil {
		return nil, err
	}
	return o, nil
}

func list(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parseSize reads a byte size: 1048576, 512KiB, 1MiB, 10MB, 1GiB.
func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1000}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a positive size such as 1048576, 512KiB or 1MiB", s)
	}
	return n * mult, nil
}

// gateway is one configured gateway: the proxy behind the middleware.
// It serves before its store is open (see waiting), and attach puts the
// middleware in front of the proxy once it is.
type gateway struct {
	opts    *options
	log     *slog.Logger
	metrics *metrics
	up      *url.URL
	pass    http.Handler // the proxy, without the middleware
	handler http.Handler // what the public listener serves
	// ready is set once the store is open.
	ready atomic.Pointer[ready]
	// opening reports the store's opening while ready is nil; nil when
	// the gateway was made with its store.
	opening *storeurl.Opening
}

// ready is the gateway's state once its store is open.
type ready struct {
	store   store.Store
	mw      *idemhttp.Middleware
	handler http.Handler     // the middleware in front of the proxy
	console *console.Console // -console
}

// newGateway returns a gateway on store, ready.
func newGateway(o *options, store store.Store, log *slog.Logger) (*gateway, error) {
	g, err := newPending(o, log)
	if err != nil {
		return nil, err
	}
	if err := g.attach(store); err != nil {
		return nil, err
	}
	return g, nil
}

// newPending returns a gateway without a store: until attach, covered
// requests get 503 (see waiting).
func newPending(o *options, log *slog.Logger) (*gateway, error) {
	up, err := url.Parse(o.upstream)
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return nil, fmt.Errorf("-upstream %q: want http://host:port or https://host:port", o.upstream)
	}
	g := &gateway{opts: o, log: log, up: up, metrics: newMetrics()}
	g.pass = g.proxy(up)
	g.handler = o.tracing.server(g.metrics.instrument(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rd := g.ready.Load(); rd != nil {
			rd.handler.ServeHTTP(w, r)
			return
		}
		g.waiting(w, r)
	})))
	return g, nil
}

// attach builds the engine and the middleware on store: from now on the
// gateway serves covered requests.
func (g *gateway) attach(store store.Store) error {
	o, log := g.opts, g.log
	eng, err := idem.New(store, engineConfig(o, log, o.tracing.observer(g.metrics.observer)))
	if err != nil {
		return err
	}
	mcfg := &idemhttp.Config{
		Operation:          scope,
		Methods:            o.methods,
		Required:           o.requireKey,
		HoldCrashed:        o.holdCrashed,
		FingerprintHeaders: o.fpHeaders,
		ReplayHeaders:      o.replayHeaders,
		MaxBodyBytes:       o.maxBody,
		MaxResponseBytes:   int(o.maxResponse),
		BodyTimeout:        o.bodyTimeout,
		StatusPath:         o.statusPath,
		ExpectedCompletion: o.expectedCompletion,
		Logger:             log,
	}
	if h := o.principalHeader; h != "" {
		mcfg.Principal = func(r *http.Request) (string, error) {
			v := r.Header.Get(h)
			if v == "" {
				return "", fmt.Errorf("the %s header is required", h)
			}
			return v, nil // idemhttp keeps only its hash
		}
	}
	mw, err := idemhttp.New(eng, mcfg)
	if err != nil {
		return err
	}
	rd := &ready{store: store, mw: mw, handler: mw.Handler(g.pass)}
	if rd.console, err = g.openConsole(store); err != nil {
		return err
	}
	g.ready.Store(rd)
	return nil
}

// waiting answers a request while the store is not open yet. A request the
// middleware would cover — one with an Idempotency-Key (or any request of
// a covered method with -require-key), or for the status resource — gets
// 503 with Retry-After and never reaches the upstream unprotected; any
// other request is passed through, as it would be once the store is open.
func (g *gateway) waiting(w http.ResponseWriter, r *http.Request) {
	o := g.opts
	covered := o.statusPath != "" && strings.HasPrefix(r.URL.Path, o.statusPath) ||
		slices.Contains(o.methods, r.Method) && (o.requireKey || len(r.Header.Values(idemhttp.HeaderName)) > 0)
	if !covered {
		g.pass.ServeHTTP(w, r)
		return
	}
	idemhttp.WriteProblem(w, r, g.notOpen())
}

// notOpen is the problem answered while the store is not open yet.
func (g *gateway) notOpen() idemhttp.Problem {
	return idemhttp.Problem{Type: idemhttp.ProblemTypeBase + idemhttp.ProblemStoreUnavailable,
		Title: "Store not open yet", Status: http.StatusServiceUnavailable,
		Detail: g.openingState() + "; retry with the same Idempotency-Key", RetryAfter: time.Second}
}

// openingState says where the opening of the store stands.
func (g *gateway) openingState() string {
	if g.opening == nil {
		return "the gateway is starting and its store is not open yet"
	}
	st := g.opening.Status()
	return fmt.Sprintf("the gateway is waiting for its store (%d attempts in %v)", st.Attempts, time.Since(st.Since).Round(time.Millisecond))
}

// engineConfig is the configuration of the gateway's engine.
func engineConfig(o *options, log *slog.Logger, obs observe.Observer) *idem.Config {
	cfg := &idem.Config{
		Expiry: o.expiry, Lease: o.lease, Wait: o.wait,
		Logger: log, Observer: obs,
		// The same JSON as the default codec, without reflection.
		Codec: idemhttp.ResponseCodec{},
	}
	if o.cacheEntries > 0 {
		cfg.CacheEntries, cfg.CacheBytes = o.cacheEntries, int(o.cacheBytes)
	}
	cfg.TokenKey = o.tokenKey
	return cfg
}

// envTokenKey holds the token key when -token-key-file is not given.
const envTokenKey = "IDEM_TOKEN_KEY"

// readTokenKey reads the secret that signs tokens, from file or else the
// environment (never a flag's value, which other users can see in the
// process list). A key too short is refused here, as the engine would.
func (o *options) readTokenKey(file string, getenv func(string) string) error {
	key := []byte(getenv(envTokenKey))
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("-token-key-file: %w", err)
		}
		key = bytes.TrimSpace(b)
	}
	if len(key) > 0 && len(key) < 16 {
		return fmt.Errorf("the token key has %d bytes; use a secret of at least 16 random bytes", len(key))
	}
	o.tokenKey = key
	return nil
}

// proxy passes requests to up. It never retries a request by itself.
func (g *gateway) proxy(up *url.URL) http.Handler {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host
			// net/http's Transport treats a request carrying an
			// Idempotency-Key header (under its canonical map key) as
			// safe to send twice when a kept-alive connection dies
			// under it. The gateway must never send a request twice, so
			// the key goes upstream under a lower-case map key, which
			// the Transport does not look at (header names are case-
			// insensitive on the wire).
			if v, ok := pr.Out.Header[idemhttp.HeaderName]; ok {
				delete(pr.Out.Header, idemhttp.HeaderName)
				pr.Out.Header[strings.ToLower(idemhttp.HeaderName)] = v
			}
			// Only the gateway speaks for a claim.
			pr.Out.Header.Del(tokenHeader)
			if g.opts.statusPath != "" {
				if t, ok := claimToken(pr.In.Context()); ok {
					pr.Out.Header.Set(tokenHeader, t.String())
				}
			}
		},
		ModifyResponse: g.accepted,
		Transport:      g.opts.tracing.transport(upstreamTransport(g.opts)),
		ErrorHandler:   g.upstreamError,
		BufferPool:     bufferPool{},
	}
}

// upstreamTransport is the proxy's transport: net/http's default one
// (proxy from the environment, HTTP/2 where the upstream offers it) with
// -upstream-timeout, and enough idle connections kept for every request
// in flight to reuse one.
func upstreamTransport(o *options) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = o.upstreamTimeout
	tr.MaxIdleConnsPerHost = 256
	return tr
}

// bufferPool lends the proxy its 32 KiB copy buffers instead of allocating
// one per request.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }

// upstreamError answers a request the upstream did not answer (or whose
// 202 could not be handed off, see accepted). A request
// that never reached it (connection refused) gets 502 and its key is
// released. Once the request may have been sent, the upstream may have
// acted: the key stays held until its lease ends (504 on a timeout, else
// 502), so that no retry reaches the upstream before then.
func (g *gateway) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	const kept = "; a retry with the same Idempotency-Key is held off until the key's lease ends"
	p := idemhttp.Problem{Status: http.StatusBadGateway}
	var op *net.OpError
	var ne net.Error
	var ae *acceptError
	switch {
	case errors.As(err, &ae):
		idemhttp.MarkUncertain(r.Context())
		p.Type, p.Title = idemhttp.ProblemTypeBase+"not-handed-off", "Accepted work not handed off"
		p.Detail = "the service accepted the request, but the gateway could not hand its key to the work" + kept
	case errors.As(err, &op) && op.Op == "dial":
		p.Type, p.Title = idemhttp.ProblemTypeBase+"upstream-unreachable", "Upstream unreachable"
		p.Detail = "the request did not reach the service; retry with the same Idempotency-Key"
		p.RetryAfter = time.Second
	case errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded):
		idemhttp.MarkUncertain(r.Context())
		p.Status = http.StatusGatewayTimeout
		p.Type, p.Title = idemhttp.ProblemTypeBase+"upstream-timeout", "Upstream timed out"
		p.Detail = "the service did not answer in time and may have processed the request" + kept
	default:
		idemhttp.MarkUncertain(r.Context())
		p.Type, p.Title = idemhttp.ProblemTypeBase+"upstream-failed", "Upstream failed"
		p.Detail = "the connection to the service failed after the request was sent" + kept
	}
	if !errors.Is(err, context.Canceled) { // a client that went away is not worth a warning
		g.log.Warn("upstream error", "method", r.Method, "path", r.URL.Path, "status", p.Status, "err", err)
	}
	idemhttp.WriteProblem(w, r, p)
}

// adminHandler serves /metrics, /healthz (200 while the process serves,
// the store open or not: liveness) and /readyz (200 once the store is open
// and answers, else 503: readiness), and in asynchronous mode the token
// endpoints (see settle).
func (g *gateway) adminHandler() http.Handler {
	mux := http.NewServeMux()
	if g.opts.statusPath != "" {
		mux.Handle("POST /idem/v1/tokens/{token}/{action}", g.opts.tracing.server(http.HandlerFunc(g.settle)))
	}
	mux.Handle("GET /metrics", g.metrics.handler())
	g.mountConsole(mux)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		// The answer is for a readiness probe and the operator reading
		// it, not for a client holding a key.
		rd := g.ready.Load()
		if rd == nil {
			p := g.notOpen()
			p.Title = "Not ready: store not open yet"
			p.Detail = "not ready: " + g.openingState() + "; covered requests get 503 until it opens"
			idemhttp.WriteProblem(w, r, p)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := checkStore(ctx, rd.store); err != nil {
			idemhttp.WriteProblem(w, r, idemhttp.Problem{Type: idemhttp.ProblemTypeBase + idemhttp.ProblemStoreUnavailable,
				Title: "Not ready: store unreachable", Status: http.StatusServiceUnavailable,
				Detail: "not ready: the store does not answer: " + err.Error(), RetryAfter: time.Second})
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ready\n")
	})
	return mux
}

// run is the whole command: it returns when ctx is cancelled (SIGTERM) and
// in-flight requests finished, or on a startup error — the store not open
// within -store-wait among them. It listens at once and opens the store in
// the background (storeurl.StartOpen): until the store is open, covered
// requests get 503 and /readyz 503.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: o.logLevel}))
	tr, stopTracing, err := newTracing(ctx, os.Getenv, os.Stdout)
	if err != nil {
		return err
	}
	if tr != nil {
		o.tracing = tr
		defer func() { // last: after the servers stopped, the spans are flushed
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := stopTracing(sctx); err != nil {
				log.Error("flushing traces", "err", err)
			}
		}()
		log.Info("tracing on", "exporter", os.Getenv(envTracesExporter))
	}
	g, err := newPending(o, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	var aln net.Listener
	if o.admin != "" {
		if aln, err = net.Listen("tcp", o.admin); err != nil {
			ln.Close()
			return err
		}
	}
	g.opening = openStoreWait(ctx, o.store, o.storeWait, log)
	defer func() {
		if err := g.opening.Close(); err != nil {
			log.Error("closing the store", "err", err)
		}
	}()
	defer g.closeConsole() // before the store closes
	srv := o.server(g.handler, log)
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	var admin *http.Server
	adminAddr := ""
	if aln != nil {
		adminAddr = aln.Addr().String()
		admin = o.server(g.adminHandler(), log)
		go func() { errc <- admin.Serve(aln) }()
	}
	log.Info("idem-gateway listening", "addr", ln.Addr().String(), "admin", adminAddr,
		"upstream", o.upstream, "store", storeurl.Redact(o.store), "store_wait", o.storeWait.String())

	opened := g.opening.Done()
	for {
		select {
		case err := <-errc:
			return err
		case <-opened:
			opened = nil
			s, err := g.opening.Result()
			if err == nil {
				err = g.attach(s.Store)
			}
			if err != nil && ctx.Err() != nil {
				break // SIGTERM while waiting: shut down as usual
			}
			if err != nil {
				_ = srv.Close()
				if admin != nil {
					_ = admin.Close()
				}
				return storeFailed(o, err)
			}
			st := g.opening.Status()
			log.Info("store open; serving covered requests", "store", storeurl.Redact(o.store),
				"attempts", st.Attempts, "waited", time.Since(st.Since).Round(time.Millisecond).String())
			continue
		case <-ctx.Done():
		}
		break
	}
	log.Info("shutting down", "grace", o.grace.String())
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.grace)
	defer cancel()
	err = srv.Shutdown(sctx)
	if admin != nil {
		_ = admin.Shutdown(sctx)
	}
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("in-flight requests did not finish within -grace %v: %w", o.grace, err)
	}
	log.Info("stopped")
	return nil
}

// server returns an http.Server for h with the -read-header-timeout,
// -read-timeout and -idle-timeout limits, so that a client that opens
// connections and sends nothing, or sends slowly, cannot hold them.
// (-body-timeout is the middleware's, per request.)
func (o *options) server(h http.Handler, log *slog.Logger) *http.Server {
	// For http.Server a zero ReadHeaderTimeout or IdleTimeout means "as
	// ReadTimeout"; for the flags 0 means no limit, which is negative here.
	noLimit := func(d time.Duration) time.Duration {
		if d == 0 {
			return -1
		}
		return d
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: noLimit(o.readHeaderTimeout),
		ReadTimeout:       o.readTimeout,
		IdleTimeout:       noLimit(o.idleTimeout),
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}
