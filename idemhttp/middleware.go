package idemhttp

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
)

// Config configures a [Middleware]. A nil *Config means all defaults; every
// field documents its default.
type Config struct {
	// Operation is the operation name under which keys are stored. Default
	// "http".
	Operation string

	// HoldCrashed sets the operation's takeover policy to Hold
	// (idem.Config.HoldCrashed): a key whose holder died is not run again
	// but held for a person; its duplicates are answered 409 with the problem type
	// "held". Default false: the engine's policy.
	HoldCrashed bool

	// Methods are the request methods the middleware covers; others pass
	// through untouched. Default POST and PATCH.
	Methods []string

	// Required answers 400 to a covered request without an
	// Idempotency-Key. By default such a request runs unprotected.
	Required bool

	// Principal returns who is calling (a user, an API key's account).
	// It is part of the key's scope, so two callers sending the same key
	// never share a record or see each other's responses. An error
	// refuses the request with 401. Nil means every caller shares one key
	// space: a client that guesses or sees another's key gets that
	// client's stored response. Set it in any multi-tenant service.
	Principal func(*http.Request) (string, error)

	// Route names the endpoint, part of the key's scope. Default: the
	// request's URL path.
	Route func(*http.Request) string

	// FingerprintHeaders are request headers whose values are part of the
	// payload fingerprint, besides the method, path, query and body. A
	// retry with the same key and another fingerprint is answered 422.
	FingerprintHeaders []string

	// MaxBodyBytes caps the request body; a larger one is answered 413
	// before any claim. Default 1 MiB.
	MaxBodyBytes int64

	// MemoryBodyBytes is how much of a request body is kept in memory
	// while it is fingerprinted; the rest is spooled to a temporary file
	// in TempDir (default os.TempDir). Default 64 KiB.
	MemoryBodyBytes int64
	TempDir         string

	// BodyTimeout bounds the time to read a covered request's body, from
	// when the middleware starts reading it to its end: a body that stalls
	// or trickles in too slowly is answered 408 (problem "body-timeout")
	// before any claim, and the connection is closed. The deadline is the
	// connection's read deadline, set through [http.ResponseController]
	// (it replaces http.Server.ReadTimeout's while the body is read) and
	// lifted once the whole body is in, so the handler's own time is not
	// bounded by it. Where the ResponseWriter cannot set a read deadline,
	// the time is checked after every read instead: that cuts off a
	// trickle, but not a body that stops altogether. Default 0: no limit of
	// the middleware's own; a read that times out under the server's
	// ReadTimeout is answered 408 all the same.
	BodyTimeout time.Duration

	// MaxResponseBytes caps the stored response body. A larger response
	// still reaches its client, but is not stored: retries with the key
	// are answered 410 (problem "response-not-saved") and the handler does
	// not run again. Default 1 MiB; the store's own limit may be lower.
	MaxResponseBytes int

	// ReplayHeaders, when not empty, is a strict allowlist: only these
	// response headers are stored and replayed. By default every header
	// is, custom ones (X-Charge-Id) included, but those in
	// [NeverReplayed], which cannot be listed. Replaying them is safe
	// because a replay reaches only a caller who sent the same key under
	// the same principal (see Principal): the caller of the first request,
	// where Principal is set.
	ReplayHeaders []string

	// Release decides, from the handler's status, that the response is
	// not final: the key is released and a retry runs the handler again.
	// Default: [DefaultRelease] (5xx, and 408, 425 and 429, which say the
	// request was not run). Every other response is stored and replayed.
	Release func(status int) bool

	// StoreRetryAfter is the Retry-After sent with 503 when the store
	// cannot be reached. Default 1s.
	StoreRetryAfter time.Duration

	// ErrorHandler writes the answer to a request the middleware refuses;
	// p is what [ProblemFor] made of err. Default: [WriteProblem].
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error, p Problem)

	// Logger receives store failures and refusals worth a look. Default
	// slog.Default().
	Logger *slog.Logger

	// StatusPath, when not empty, turns on asynchronous mode (see
	// [Accept]): a handler may answer 202 Accepted and hand its claim to a
	// worker, and the middleware itself serves the status resources,
	// GET and HEAD of StatusPath followed by a status id; any other
	// method there gets 405. It is a path as the middleware sees it
	// (r.URL.Path), starting and ending with "/", such as
	// "/idempotency/status/", and it is the Location of every 202. Default
	// "": no asynchronous mode.
	StatusPath string

	// ExpectedCompletion is how long handed-off work should take: the
	// claim's lease from [Accept] on, after which the record counts as
	// stuck and a retry may take the key over (unless the worker extends
	// it). At most the engine's Expiry. Used only with StatusPath.
	// Default 10 minutes, or the engine's Expiry when that is shorter.
	ExpectedCompletion time.Duration
}

// DefaultRelease is the default Config.Release: the answers that do not
// keep a key, so that a retry with it runs the handler again. They are
// every 5xx (the server failed), and the three statuses by which a server
// says it did not run the request and the client may send it again: 408
// Request Timeout, 425 Too Early and 429 Too Many Requests. Storing
// those would replay "try later" for the whole expiry, and the client
// could never get through with its key. A policy that adds to this calls
// it: func(s int) bool { return idemhttp.DefaultRelease(s) || s == 409 }.
func DefaultRelease(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return status >= 500
}

// Middleware applies Idempotency-Key semantics to the requests it covers.
type Middleware struct {
	eng           *idem.Engine
	cfg           Config
	methods       map[string]bool
	replayHeaders *replayPolicy
	fpHeaders     []string
}

// New returns a middleware over eng. It fails with [idem.ErrInvalidConfig]
// naming a bad field.
func New(eng *idem.Engine, cfg *Config) (*Middleware, error) {
	if eng == nil {
		return nil, fmt.Errorf("%w: idemhttp: engine is nil", idem.ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Operation == "" {
		c.Operation = clientkey.DefaultHTTPOperation
	}
	if _, err := idem.NewStoreKey(c.Operation, "", nil); err != nil {
		return nil, fmt.Errorf("%w: idemhttp: Operation: %v", idem.ErrInvalidConfig, err)
	}
	if c.Methods == nil {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.MemoryBodyBytes == 0 {
		c.MemoryBodyBytes = 64 << 10
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = 1 << 20
	}
	if c.Release == nil {
		c.Release = DefaultRelease
	}
	if c.StoreRetryAfter == 0 {
		c.StoreRetryAfter = time.Second
	}
	if c.ErrorHandler == nil {
		c.ErrorHandler = func(w http.ResponseWriter, r *http.Request, _ error, p Problem) { WriteProblem(w, r, p) }
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.MaxBodyBytes < 0:
		return nil, fmt.Errorf("%w: idemhttp: MaxBodyBytes %d is negative", idem.ErrInvalidConfig, c.MaxBodyBytes)
	case c.MemoryBodyBytes < 0:
		return nil, fmt.Errorf("%w: idemhttp: MemoryBodyBytes %d is negative", idem.ErrInvalidConfig, c.MemoryBodyBytes)
	case c.MaxResponseBytes < 0:
		return nil, fmt.Errorf("%w: idemhttp: MaxResponseBytes %d is negative", idem.ErrInvalidConfig, c.MaxResponseBytes)
	case c.StoreRetryAfter < 0:
		return nil, fmt.Errorf("%w: idemhttp: StoreRetryAfter %v is negative", idem.ErrInvalidConfig, c.StoreRetryAfter)
	case c.BodyTimeout < 0:
		return nil, fmt.Errorf("%w: idemhttp: BodyTimeout %v is negative; use 0 for no limit", idem.ErrInvalidConfig, c.BodyTimeout)
	}
	if err := c.validateAsync(eng.Config().Expiry); err != nil {
		return nil, err
	}
	m := &Middleware{eng: eng, cfg: c, methods: map[string]bool{}}
	for _, meth := range c.Methods {
		if meth == "" || strings.ToUpper(meth) != meth {
			return nil, fmt.Errorf("%w: idemhttp: method %q must be upper case", idem.ErrInvalidConfig, meth)
		}
		m.methods[meth] = true
	}
	var never string
	if m.replayHeaders, never = newReplayPolicy(c.ReplayHeaders); never != "" {
		return nil, fmt.Errorf("%w: idemhttp: ReplayHeaders: %s is never replayed", idem.ErrInvalidConfig, never)
	}
	for _, h := range c.FingerprintHeaders {
		m.fpHeaders = append(m.fpHeaders, http.CanonicalHeaderKey(h))
	}
	slices.Sort(m.fpHeaders)
	m.fpHeaders = slices.Compact(m.fpHeaders)
	return m, nil
}

// Response is a stored response: what a retry with the same key gets.
type Response struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
}

// call is the state of one covered request, in its context.
type call struct {
	m         *Middleware
	key       idem.StoreKey
	uncertain bool
	// accepted is the token the handler handed off with Accept, if any.
	accepted *idem.Token
}

type callKey struct{}

// MarkUncertain tells the middleware that the request's effect is unknown
// (it was passed on and no answer came back): instead of storing the
// response or releasing the key, the claim is kept until its lease ends, so
// that no retry runs the handler again before then (see [idem.Uncertain]).
// It reports false when ctx is not a request covered by the middleware.
func MarkUncertain(ctx context.Context) bool {
	c, ok := ctx.Value(callKey{}).(*call)
	if ok {
		c.uncertain = true
	}
	return ok
}

// errReleased is the operation error that releases the key after a
// response the Release policy does not keep, or a hijacked connection.
type errReleased struct{ status int }

func (e *errReleased) Error() string {
	if e.status == 0 {
		return "idemhttp: connection hijacked; response not stored"
	}
	return "idemhttp: status " + strconv.Itoa(e.status) + " is not final; key released"
}

var errUncertain = errors.New("idemhttp: handler marked the outcome uncertain")

// Handler wraps next.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if id, ok := m.statusID(r); ok {
		m.serveStatus(w, r, id)
		return
	}
	if !m.methods[r.Method] {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(HeaderName)
	if len(values) == 0 && !m.cfg.Required {
		next.ServeHTTP(w, r)
		return
	}
	key, err := ParseHeader(values)
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	id, body, err := m.identify(w, r, key)
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	defer body.close()

	ran := false
	res, err := idem.DoIdentity(r.Context(), m.eng, id, func(ctx context.Context) (Response, error) {
		ran = true
		st := &call{m: m, key: id.StoreKey}
		r2 := r.WithContext(context.WithValue(ctx, callKey{}, st))
		r2.Body, r2.ContentLength = body.reader(), body.size
		if body.size == 0 {
			r2.Body = http.NoBody
		}
		cw := &capture{w: w, replay: m.replayHeaders, limit: m.cfg.MaxResponseBytes}
		next.ServeHTTP(cw, r2)
		cw.finish()
		if st.accepted != nil && (cw.hijacked || m.cfg.Release(cw.status)) {
			// Accepted, then answered with an error (the work could not
			// be queued): nothing will settle the handed-off claim, so
			// give it up now rather than at its expected completion.
			if err := m.eng.Release(context.WithoutCancel(ctx), *st.accepted); err != nil {
				m.cfg.Logger.Error("idemhttp: releasing a handed-off claim after an error answer", "status", cw.status, "err", err)
			}
		}
		switch {
		case st.uncertain:
			return Response{}, idem.Uncertain(errUncertain)
		case cw.hijacked:
			return Response{}, &errReleased{}
		case m.cfg.Release(cw.status):
			return Response{}, &errReleased{status: cw.status}
		case cw.over:
			return Response{}, &idem.TerminalError{Code: idem.CodeResultTooLarge,
				Message: fmt.Sprintf("response body of %d bytes is over the limit of %d", cw.size, m.cfg.MaxResponseBytes)}
		}
		return Response{Status: cw.status, Header: cw.header, Body: cw.body}, nil
	})
	if ran {
		// The handler answered the client itself; what the engine made
		// of it (stored, released, kept) is logged by the engine.
		return
	}
	var ipe *idem.InProgressError
	if m.cfg.StatusPath != "" && errors.As(err, &ipe) && ipe.Ref != "" {
		// The work was handed off (Accept): the duplicate is accepted too.
		m.duplicateAccepted(w, r, id.StoreKey, ipe)
		return
	}
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	m.replay(w, res.Value)
}

// identify reads the body and derives the store key and fingerprint.
func (m *Middleware) identify(w http.ResponseWriter, r *http.Request, key string) (idem.Identity, *spool, error) {
	if r.ContentLength > m.cfg.MaxBodyBytes {
		return idem.Identity{}, nil, &BodyTooLargeError{Limit: m.cfg.MaxBodyBytes, Size: r.ContentLength}
	}
	tenant, err := m.tenant(r)
	if err != nil {
		return idem.Identity{}, nil, err
	}
	route := r.URL.Path
	if m.cfg.Route != nil {
		route = m.cfg.Route(r)
	}
	h := m.fingerprint(r)
	body := &spool{}
	if r.Body != nil && r.Body != http.NoBody {
		if body, err = m.spoolBody(w, r, h); err != nil {
			return idem.Identity{}, nil, err
		}
	}
	var fp [sha256.Size]byte
	id, err := clientkey.HTTPIdentity(m.cfg.Operation, tenant, r.Method, route, key, [sha256.Size]byte(h.Sum(fp[:0])))
	id.HoldCrashed = m.cfg.HoldCrashed
	return id, body, err
}

// spoolBody reads r's body into h and a spool within Config.BodyTimeout.
// A read that times out, under that deadline or the server's, fails with a
// *BodyTimeoutError.
func (m *Middleware) spoolBody(w http.ResponseWriter, r *http.Request, h hash.Hash) (*spool, error) {
	var src io.Reader = r.Body
	var rc *http.ResponseController
	if d := m.cfg.BodyTimeout; d > 0 {
		// The connection's deadline is wall-clock time; the check after
		// every read follows the engine's clock, like all other time here.
		rc = http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(d)) != nil {
			rc = nil // not supported: only the check after every read is left
		}
		src = &deadlineReader{r: r.Body, now: m.eng.Now, deadline: m.eng.Now().Add(d)}
	}
	body, err := readBody(src, h, r.ContentLength, m.cfg.MaxBodyBytes, m.cfg.MemoryBodyBytes, m.cfg.TempDir)
	var be *BodyError
	if errors.As(err, &be) && isTimeout(be.Err) {
		return nil, &BodyTimeoutError{Timeout: m.cfg.BodyTimeout, Err: be.Err}
	}
	if err == nil && rc != nil {
		// The body is in: the deadline must not bound the handler. After
		// a refusal it stays, and bounds net/http's draining of the rest.
		_ = rc.SetReadDeadline(time.Time{})
	}
	return body, err
}

// tenant returns the tenant of r's store keys: its principal, hashed
// (Config.Principal, clientkey.HTTPTenant), or "" when there is none. The
// store key of an Idempotency-Key is the key scoped by the tenant, the
// method and the route (clientkey.HTTP, which idemctl find and the
// console use too); a status resource's key is the same key, found again
// from its digest and the tenant of the request reading it.
func (m *Middleware) tenant(r *http.Request) (string, error) {
	if m.cfg.Principal == nil {
		return "", nil
	}
	p, err := m.cfg.Principal(r)
	if err != nil {
		return "", &PrincipalError{Err: err}
	}
	if p == "" {
		return "", nil
	}
	return clientkey.HTTPTenant(p), nil
}

// fingerprint starts the fingerprint of r: a SHA-256 over the method,
// escaped path, raw query and Config.FingerprintHeaders, each
// length-prefixed so that no two field lists hash alike. The body is
// written to it as it is read.
func (m *Middleware) fingerprint(r *http.Request) hash.Hash {
	path := r.URL.EscapedPath()
	size := 3*8 + len(r.Method) + len(path) + len(r.URL.RawQuery)
	for _, name := range m.fpHeaders {
		size += 2*8 + len(name)
		for _, v := range r.Header.Values(name) {
			size += len(v) + 1
		}
	}
	b := make([]byte, 0, size) // written to the hash in one piece
	b = field(b, r.Method)
	b = field(b, path)
	b = field(b, r.URL.RawQuery)
	for _, name := range m.fpHeaders {
		b = field(b, name)
		b = field(b, strings.Join(r.Header.Values(name), "\x00"))
	}
	h := sha256.New()
	h.Write(b)
	return h
}

// field appends s, after its length.
func field(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, err error) {
	p := ProblemFor(err, m.eng.Now(), m.cfg.StoreRetryAfter)
	var te *idem.TerminalError
	if errors.As(err, &te) && te.Replayed && te.Code == CodeProblem {
		// The stored answer of handed-off work (Fail), replayed.
		w.Header().Set(ReplayedHeader, "true")
	}
	if p.Status >= 500 {
		m.cfg.Logger.Warn("idemhttp: request refused", "method", r.Method, "path", r.URL.Path, "status", p.Status, "err", err)
	}
	m.cfg.ErrorHandler(w, r, err, p)
}

// replayedTrue is the value of ReplayedHeader on a replay, shared by all:
// its capacity is its length, so that an Add to it copies it.
var replayedTrue = []string{"true"}[:1:1]

func (m *Middleware) replay(w http.ResponseWriter, resp Response) {
	h := w.Header()
	// Filtered again on the way out: a header stored under an earlier,
	// wider policy is not replayed once it was taken off.
	for name, vs := range m.replayHeaders.filter(resp.Header) {
		h[name] = vs
	}
	h[ReplayedHeader] = replayedTrue
	status := resp.Status
	if status < 200 || status > 999 {
		status = http.StatusOK
	}
	if status != http.StatusNoContent && status != http.StatusNotModified {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(status)
	_, _ = w.Write(resp.Body)
}
