// Package console is idem's operator console: web pages over any store
// that show every key's state and settle stuck work by hand. idemctl serve
// serves it for a store URL; idem-gateway -console serves it on the
// gateway's admin listener for the gateway's own store (the bolt file is
// single-process, so the gateway's console is the only way to look into
// it while the gateway runs).
//
// # Pages
//
//   - Overview: IN_PROGRESS, stuck (past expected completion) and FAILED
//     counts and the oldest IN_PROGRESS age, in total and by operation,
//     from the last sweep of a [monitor.Monitor]: the numbers the
//     Prometheus gauges show, with the sweep's time; a sweep that stopped
//     at its record limit shows each count as "≥ N", a lower bound.
//   - Records: filtered by status, stuck, operation/tenant and age, paged
//     with the store's cursor ([store.Lister]) by idemctl's listing rule
//     ([ops.List]): never more than one page (and a bounded scan for the
//     filters the store does not apply) is read per request.
//   - Record: every field, the result or terminal error (JSON indented,
//     text as is, binary as hex, large bodies cut with their size; a
//     response idemhttp or the gateway stored as its status line, header
//     and body, the body shown the same way, not as base64), the
//     fingerprint and the execution reference, linked to the AWS console
//     for a Step Functions execution ARN or through Config.RefLink; an
//     IN_PROGRESS record's finished steps (idem.Step) as a table: each
//     one's name, when it was recorded, and its result's size or its
//     terminal error.
//   - Actions: release, delete, resolve as COMPLETED with a result, or as
//     FAILED with a code and message, through package ops (idemctl's code
//     path), each behind a confirmation page that says what will change.
//     A write is refused (409) when the record changed in any field since
//     the page was read ([ops.Guard]): two operators settling one record
//     get one write and one refusal. A fresh IN_PROGRESS record needs an
//     explicit force.
//
// # Safety
//
// The console is read-only unless Config.Write is set, and writes need
// Config.Credentials: with credentials, every page needs a sign-in (a
// token, or a user and password) whose session cookie is HttpOnly,
// SameSite=Strict, and Secure behind TLS (Config.SecureCookies, or a
// trusted proxy's X-Forwarded-Proto). Failed sign-ins close sign-in to
// the client that made them, for all users and for the user it named,
// with growing delays (429 with Retry-After); a user's failures from all
// clients together only hold that user's sign-ins a while
// (Config.SignInUserDelay) and never refuse them, so a guesser cannot
// lock an operator out. Failures are logged as a few summary lines per burst, and never log what was typed: a user
// name that is no credential's is logged as "(unknown)". Cross-origin
// POSTs are refused by http.CrossOriginProtection (Sec-Fetch-Site, or
// Origin against Host), the sign-in form's included; every POST of a
// signed-in page also carries the session's CSRF token, for a browser
// that sends neither header. Responses
// set a Content-Security-Policy that allows no script at all and styles
// from the console itself only. Keys, results and errors are untrusted:
// html/template escapes all of them. Every action is logged (who, what,
// when, before and after) and passed to Config.OnAction for a metric.
//
// Pages are server-rendered html/template with embedded assets: no
// JavaScript, no build step.
package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/monitor"
	"github.com/seed-a1b882c0/idem/ops"
	"github.com/seed-a1b882c0/idem/store"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config configures a [Console]. A nil *Config means all defaults:
// read-only, no sign-in, served at "/".
type Config struct {
	// Name names the store in the page header (a redacted URL, say).
	Name string
	// Write enables the actions (release, delete, resolve). It needs
	// Credentials.
	Write bool
	// Credentials, when set, are the only way in: every page needs a
	// sign-in. See [ParseCredentials].
	Credentials []Credential
	// Monitor, when set, is the monitor whose last sweep the overview
	// shows (the one whose snapshots feed the process's gauges). Default:
	// the console starts its own, sweeping every MonitorInterval, and
	// stops it on Close.
	Monitor *monitor.Monitor
	// MonitorInterval is the own monitor's interval. Default 1m.
	MonitorInterval time.Duration
	// BasePath is the path the console is served under, with a trailing
	// slash ("/console/"). Default "/".
	BasePath string
	// RefLink, when set, links execution references that are not Step
	// Functions execution ARNs: "{ref}" in it is replaced by the
	// query-escaped reference, e.g. "https://ci.example.com/runs/{ref}".
	// Only http and https links are made.
	RefLink string
	// PageSize is the records listed per page. Default 50, at most 500.
	PageSize int
	// MaxScan bounds the records one listing request reads to fill a page
	// when filtering by operation or age (filters the store does not
	// apply); the page then ends early with a link to continue. Default
	// 5,000.
	MaxScan int
	// MaxBody is the most bytes of a result or error body shown. Default
	// 64 KiB.
	MaxBody int
	// SessionTTL is how long a sign-in lasts. Default 12h.
	SessionTTL time.Duration
	// SignInFailures is how many failed sign-ins a client may make
	// within SignInWindow, whatever users it names, and how many it may
	// make as one user, before sign-in is closed to that client (for all
	// users, or for that user); each further failure closes it for twice
	// as long as the last, starting at SignInWindow / SignInFailures, at
	// most SignInMaxDelay. While closed, the client's sign-in is answered
	// 429 with Retry-After, credentials unchecked. Other clients are not
	// refused: a user's failures from all clients together only slow
	// that user's sign-ins down (SignInUserDelay), so a guesser cannot
	// lock an operator out. Defaults 5, 1m and 15m.
	SignInFailures int
	SignInWindow   time.Duration
	SignInMaxDelay time.Duration
	// SignInUserDelay is how long every sign-in as a user is held before
	// its credentials are checked, from any client, the right password
	// included, once that user's failures from all clients together
	// passed SignInFailures within SignInWindow (and until a window passes
	// without one). It slows a guesser spread over many clients and never
	// refuses anyone. Default 1s.
	SignInUserDelay time.Duration
	// SecureCookies marks the session cookie Secure whatever the request:
	// set it when a TLS-terminating proxy serves the console (the console
	// itself speaks plain HTTP then). Without it the cookie is Secure when
	// the console serves TLS itself, or when a trusted proxy says
	// X-Forwarded-Proto: https.
	SecureCookies bool
	// TrustedProxies are the addresses of the proxies in front of the
	// console: from them alone X-Forwarded-Proto is believed (Secure
	// cookies) and X-Forwarded-For names the client (sign-in throttling).
	// Default none: the peer is the client.
	TrustedProxies []netip.Prefix
	// TrustedOrigins are origins ("https://ops.example.com") whose POSTs
	// are accepted although their host is not the request's Host (a
	// proxy that rewrites Host). Every other cross-origin POST is refused
	// by http.CrossOriginProtection.
	TrustedOrigins []string
	// Owner is the owner written on records resolved by hand. Default
	// "idem-console".
	Owner string
	// Clock times sessions and sign-in throttling. Records (stuck or
	// within their expected completion, ages, expiry) are judged on it
	// corrected to the store's clock ([store.ServerClock]) when the store
	// tells its time and Clock is real time, as the engine decides
	// leases: a console whose host's clock runs ahead neither lists live
	// work as stuck nor offers to settle it without force. Default
	// store.SystemClock.
	Clock store.Clock
	// Logger receives one line per action and per refused sign-in.
	// Default slog.Default().
	Logger *slog.Logger
	// OnAction, when set, is called after every action, done or refused.
	OnAction func(ActionEvent)
}

// ActionEvent is one action taken (or refused) through the console.
type ActionEvent struct {
	At time.Time
	// Who is the signed-in user.
	Who string
	// Action is the write asked for.
	Action ops.Action
	Key    string
	// Before is the record's status when it was read (zero when absent),
	// After its status after the write (zero when deleted, or when the
	// write was refused: then unchanged).
	Before, After idem.Status
	Fence         uint64
	// Outcome is "done", "refused" (the rules or the record's changes
	// refused it) or "error" (the store failed).
	Outcome string
	Err     error
}

// WithDefaults returns a copy of c with every zero field set to its
// default. A nil c gives all defaults.
func (c *Config) WithDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.MonitorInterval == 0 {
		out.MonitorInterval = time.Minute
	}
	if out.BasePath == "" {
		out.BasePath = "/"
	}
	if out.PageSize == 0 {
		out.PageSize = 50
	}
	if out.MaxScan == 0 {
		out.MaxScan = 5000
	}
	if out.MaxBody == 0 {
		out.MaxBody = 64 << 10
	}
	if out.SessionTTL == 0 {
		out.SessionTTL = 12 * time.Hour
	}
	if out.SignInFailures == 0 {
		out.SignInFailures = 5
	}
	if out.SignInWindow == 0 {
		out.SignInWindow = time.Minute
	}
	if out.SignInMaxDelay == 0 {
		out.SignInMaxDelay = 15 * time.Minute
	}
	if out.SignInUserDelay == 0 {
		out.SignInUserDelay = time.Second
	}
	if out.Owner == "" {
		out.Owner = "idem-console"
	}
	if out.Clock == nil {
		out.Clock = store.SystemClock{}
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *Config) validate() error {
	switch {
	case c.Write && len(c.Credentials) == 0:
		return fmt.Errorf("%w: console writes need credentials (a token, or a user and password); none were given", idem.ErrInvalidConfig)
	case !strings.HasPrefix(c.BasePath, "/") || !strings.HasSuffix(c.BasePath, "/"):
		return fmt.Errorf("%w: console BasePath %q must begin and end with /", idem.ErrInvalidConfig, c.BasePath)
	case c.PageSize < 0 || c.PageSize > 500:
		return fmt.Errorf("%w: console PageSize %d: want 1 to 500", idem.ErrInvalidConfig, c.PageSize)
	case c.MaxScan < 0 || c.MaxBody < 0 || c.MonitorInterval < 0:
		return fmt.Errorf("%w: console MaxScan, MaxBody and MonitorInterval must be positive", idem.ErrInvalidConfig)
	case c.SessionTTL < 0:
		return fmt.Errorf("%w: console SessionTTL %v must be positive", idem.ErrInvalidConfig, c.SessionTTL)
	case c.SignInFailures < 0 || c.SignInWindow < 0 || c.SignInMaxDelay < 0 || c.SignInUserDelay < 0:
		return fmt.Errorf("%w: console SignInFailures, SignInWindow, SignInMaxDelay and SignInUserDelay must be positive", idem.ErrInvalidConfig)
	}
	for _, p := range c.TrustedProxies {
		if !p.IsValid() {
			return fmt.Errorf("%w: console TrustedProxies holds an invalid prefix %v", idem.ErrInvalidConfig, p)
		}
	}
	for _, cr := range c.Credentials {
		if cr.Secret == "" {
			return fmt.Errorf("%w: console credential for %q has an empty secret", idem.ErrInvalidConfig, cr.User)
		}
	}
	return nil
}

// Console serves the operator console. Close stops its monitor.
type Console struct {
	cfg      Config
	store    store.Store
	lister   store.Lister
	op       *ops.Operator
	mon      *monitor.Monitor
	ownMon   bool
	pages    map[string]*template.Template
	mux      *http.ServeMux
	sess     sessions
	throttle *throttle
	held     atomic.Int64 // sign-ins held now (SignInUserDelay)
	cop      *http.CrossOriginProtection
	once     sync.Once
}

// New returns a console over s. A store that cannot list records
// ([store.Lister]) has no overview or listing; its records are still
// shown and settled by key.
func New(s store.Store, cfg *Config) (*Console, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: console needs a store", idem.ErrInvalidConfig)
	}
	c := &Console{cfg: cfg.WithDefaults(), store: s}
	if err := c.cfg.validate(); err != nil {
		return nil, err
	}
	c.lister, _ = s.(store.Lister)
	c.op = &ops.Operator{Store: s, Clock: c.cfg.Clock, Owner: c.cfg.Owner, Logger: c.cfg.Logger}
	c.sess = sessions{m: make(map[string]*session)}
	c.throttle = newThrottle(&c.cfg)
	c.cop = http.NewCrossOriginProtection()
	for _, o := range c.cfg.TrustedOrigins {
		if err := c.cop.AddTrustedOrigin(o); err != nil {
			return nil, fmt.Errorf("%w: console TrustedOrigins: %v", idem.ErrInvalidConfig, err)
		}
	}
	var err error
	if c.pages, err = parsePages(); err != nil {
		return nil, err
	}
	c.mon = c.cfg.Monitor
	if c.mon == nil && c.lister != nil {
		if c.mon, err = monitor.Start(c.lister, &monitor.Config{Interval: c.cfg.MonitorInterval, Clock: c.cfg.Clock, Logger: c.cfg.Logger}); err != nil {
			return nil, err
		}
		c.ownMon = true
	}
	c.routes()
	return c, nil
}

// Close stops the console's own monitor, if it started one.
func (c *Console) Close() error {
	c.once.Do(func() {
		if c.ownMon {
			c.mon.Close()
		}
	})
	return nil
}

// ServeHTTP serves the console's pages under Config.BasePath.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if err := c.cop.Check(r); err != nil {
		c.fail(w, r, nil, http.StatusForbidden, "Cross-origin request refused: a form of another site cannot post to this console.")
		return
	}
	c.mux.ServeHTTP(w, r)
}

// contentSecurityPolicy allows the console's own styles and images and
// nothing else: no script at all, no framing, forms only to itself.
const contentSecurityPolicy = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func (c *Console) routes() {
	b := c.cfg.BasePath
	m := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	m.Handle("GET "+b+"static/", http.StripPrefix(b+"static/", http.FileServerFS(static)))
	m.HandleFunc("GET "+b+"login", c.loginPage)
	m.HandleFunc("POST "+b+"login", c.login)
	m.HandleFunc("POST "+b+"logout", c.signedIn(c.logout))
	m.HandleFunc("GET "+b+"{$}", c.signedIn(c.overview))
	m.HandleFunc("GET "+b+"records", c.signedIn(c.records))
	m.HandleFunc("GET "+b+"record", c.signedIn(c.record))
	m.HandleFunc("GET "+b+"find", c.signedIn(c.find))
	m.HandleFunc("POST "+b+"confirm", c.signedIn(c.writer(c.confirm)))
	m.HandleFunc("POST "+b+"act", c.signedIn(c.writer(c.act)))
	m.HandleFunc(b, func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, nil, http.StatusNotFound, "No such page: "+r.URL.Path)
	})
	c.mux = m
}

// fail renders the error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, code int, msg string) {
	c.render(w, r, s, code, "error", "Error", map[string]any{"Status": code, "StatusText": http.StatusText(code), "Message": msg})
}

// storeFailure renders a store error: not found is 404, the rest 503.
func (c *Console) storeFailure(w http.ResponseWriter, r *http.Request, s *session, err error) {
	if errors.Is(err, store.ErrNotFound) {
		c.fail(w, r, s, http.StatusNotFound, err.Error())
		return
	}
	c.fail(w, r, s, http.StatusServiceUnavailable, "The store failed: "+err.Error())
}

// now is the console's own time, for sessions; records are judged at
// c.op.Now(), the store's.
func (c *Console) now() time.Time { return c.cfg.Clock.Now() }

// ctx bounds one request's store calls.
func storeCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 30*time.Second)
}
