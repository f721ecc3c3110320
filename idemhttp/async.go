package idemhttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/seed-a1b882c0/idem"
)

// DefaultExpectedCompletion is Config.ExpectedCompletion's default.
const DefaultExpectedCompletion = 10 * time.Minute

// CodeProblem is the code of the terminal error that [Middleware.Fail]
// stores: its Body is the problem, as JSON, replayed with its status.
const CodeProblem = "idemhttp.problem"

// Errors of asynchronous mode.
var (
	// ErrNotCovered: [Accept] was called for a request the middleware does
	// not cover (its method is not covered, it carries no Idempotency-Key
	// and none is required, or it never went through a middleware).
	// Nothing was handed off; the handler answers as it would without
	// asynchronous mode. Set Config.Required on endpoints that accept work.
	ErrNotCovered = errors.New("idemhttp: Accept outside a request covered by the middleware")
	// ErrNotAsync: [Accept] was called under a middleware whose
	// Config.StatusPath is empty. Nothing was handed off.
	ErrNotAsync = errors.New("idemhttp: Accept needs asynchronous mode (Config.StatusPath)")
	// ErrInvalidOutcome: [Middleware.Complete] or [Middleware.Fail] was
	// given a response or problem that cannot be stored; nothing was
	// written. The error is an [*OutcomeError]. Answered 400 (problem
	// "invalid-outcome") where it reaches a client.
	ErrInvalidOutcome = errors.New("idemhttp: invalid outcome")
	// ErrUnknownStatus: a status resource's id is malformed, or names no
	// live record of the caller. Answered 404 (problem "status-not-found").
	ErrUnknownStatus = errors.New("idemhttp: no such status resource")
	// ErrStatusMethod: a status resource was asked for with a method other
	// than GET or HEAD. Answered 405 (problem "method-not-allowed").
	ErrStatusMethod = errors.New("idemhttp: status resources answer GET and HEAD only")
)

// OutcomeError says why a worker's outcome was refused before any write.
type OutcomeError struct{ Reason string }

func (e *OutcomeError) Error() string { return "idemhttp: invalid outcome: " + e.Reason }

// Is makes errors.Is(err, ErrInvalidOutcome) true.
func (e *OutcomeError) Is(target error) bool { return target == ErrInvalidOutcome }

// validateAsync checks the asynchronous fields, filling in the default
// expected completion; expiry is the engine's.
func (c *Config) validateAsync(expiry time.Duration) error {
	if c.StatusPath == "" {
		return nil
	}
	if !strings.HasPrefix(c.StatusPath, "/") || !strings.HasSuffix(c.StatusPath, "/") || strings.ContainsAny(c.StatusPath, "?#") {
		return fmt.Errorf("%w: idemhttp: StatusPath %q must be a path that starts and ends with \"/\", such as \"/idempotency/status/\"", idem.ErrInvalidConfig, c.StatusPath)
	}
	if c.ExpectedCompletion == 0 {
		c.ExpectedCompletion = min(DefaultExpectedCompletion, expiry)
	}
	if c.ExpectedCompletion < 0 || c.ExpectedCompletion > expiry {
		return fmt.Errorf("%w: idemhttp: ExpectedCompletion %v must be positive and at most the engine's Expiry (%v)", idem.ErrInvalidConfig, c.ExpectedCompletion, expiry)
	}
	return nil
}

// Accepted is what [AcceptContext] hands back: the claim's token and the
// status resource the client is sent to.
type Accepted struct {
	// Token names the claim. Hand Token.String() to the worker, which
	// settles the key with [Middleware.Complete] or [Middleware.Fail].
	Token idem.Token
	// Location is the status resource: Config.StatusPath and the status
	// id. Send it as the 202's Location header.
	Location string
	// RetryAfter is the time until the expected completion, at least a
	// second: send it as the 202's Retry-After header, in seconds.
	RetryAfter time.Duration
}

// Accept hands the claim of the request r to work that outlives it: the
// handler calls it, then answers 202 Accepted and gives the token's string
// form to its worker (a queue, a workflow, another process). It sets the
// Location header on w to the request's status resource, and Retry-After
// to the expected completion; the handler writes the status and any body
// itself. See [AcceptContext].
func Accept(w http.ResponseWriter, r *http.Request) (idem.Token, error) {
	a, err := AcceptContext(r.Context())
	if err != nil {
		return idem.Token{}, err
	}
	h := w.Header()
	h.Set("Location", a.Location)
	h.Set("Retry-After", RetryAfter(a.RetryAfter))
	return a.Token, nil
}

// AcceptContext is [Accept] for a handler that has the request's context
// but no ResponseWriter (idemlambda's API Gateway adapters): it sets no
// header, and the handler puts Accepted.Location and RetryAfter on its 202
// itself.
//
// In one fenced store write ([idem.Detach]), the claim's expected
// completion becomes now + Config.ExpectedCompletion and the status
// resource is attached as its execution reference; when the handler
// returns, the middleware stores nothing — not the 202, not an error, and
// a panic does not release the key either. The record stays IN_PROGRESS
// until the worker settles it, and meanwhile a retry with the key gets 202
// with the same Location and the status as its body; once settled, the
// final response (or problem), replayed. A worker that never settles lets
// the expected completion pass, and a retry then takes the key over and
// runs the handler again.
//
// It fails with [ErrNotCovered] outside a covered request, [ErrNotAsync]
// without Config.StatusPath, and with the error of idem.Detach when the
// write is refused (an [*idem.StaleTokenError]: the claim was lost) or
// the store fails; then nothing was handed off (the Accepted holds only
// the Location of the key's status resource), and the handler should
// answer with an error status (a 5xx releases the key). A handler that
// accepted but then answers with a status the Release policy does not keep
// (a 5xx: the work could not be queued) has the handed-off claim released
// at once, so a retry runs the handler again.
func AcceptContext(ctx context.Context) (Accepted, error) {
	c, ok := ctx.Value(callKey{}).(*call)
	if !ok {
		return Accepted{}, ErrNotCovered
	}
	m := c.m
	if m.cfg.StatusPath == "" {
		return Accepted{}, ErrNotAsync
	}
	loc := m.location(c.key)
	t, err := idem.Detach(ctx, m.cfg.ExpectedCompletion, loc)
	if err != nil {
		return Accepted{Location: loc}, err
	}
	c.accepted = &t
	return Accepted{Token: t, Location: loc, RetryAfter: max(m.cfg.ExpectedCompletion, time.Second)}, nil
}

// location is the status resource of key.
func (m *Middleware) location(key idem.StoreKey) string { return m.cfg.StatusPath + key.Digest }

// statusID returns the status id of a request for a status resource, and
// false for any other request.
func (m *Middleware) statusID(r *http.Request) (string, bool) {
	if m.cfg.StatusPath == "" {
		return "", false
	}
	return strings.CutPrefix(r.URL.Path, m.cfg.StatusPath)
}

// validStatusID reports whether id can be a status id: the 64 lowercase
// hex characters of a store key's digest.
func validStatusID(id string) bool {
	if len(id) != 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// serveStatus answers a request for the status resource id. The store key
// is found again from the configured operation, the requesting principal
// and the id, so that a caller only ever reads its own keys: another
// principal's id names no record of the caller, and gets 404.
func (m *Middleware) serveStatus(w http.ResponseWriter, r *http.Request, id string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		m.refuse(w, r, ErrStatusMethod)
		return
	}
	if !validStatusID(id) {
		m.refuse(w, r, fmt.Errorf("%w: %q is not a status id", ErrUnknownStatus, id))
		return
	}
	key, err := m.statusKey(r, id)
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	st, err := m.eng.Status(r.Context(), key)
	if errors.Is(err, idem.ErrNotFound) {
		err = fmt.Errorf("%w: %w", ErrUnknownStatus, err)
	}
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	doc, err := m.statusResource(st)
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	if st.Status == idem.StatusInProgress {
		w.Header().Set("Retry-After", RetryAfter(m.retryAfter(st.LeaseUntil)))
	}
	writeStatus(w, http.StatusOK, doc)
}

// statusKey is the store key of status id for the caller of r.
func (m *Middleware) statusKey(r *http.Request, id string) (idem.StoreKey, error) {
	tenant, err := m.tenant(r)
	if err != nil {
		return idem.StoreKey{}, err
	}
	scope := m.cfg.Operation
	if tenant != "" {
		scope += "/" + tenant
	}
	return idem.ParseStoreKey(scope + "#" + id)
}

// duplicateAccepted answers a retry of handed-off work: 202, the status
// resource's Location, and the status as the body. The record is read
// again for the status; if the work was settled in between, the retry gets
// the outcome instead, as it would a moment later.
func (m *Middleware) duplicateAccepted(w http.ResponseWriter, r *http.Request, key idem.StoreKey, ipe *idem.InProgressError) {
	st, err := m.eng.Status(r.Context(), key)
	switch {
	case err != nil:
		// Read failed or the record is gone: what the claim said is all
		// there is.
		m.cfg.Logger.Warn("idemhttp: reading the status of handed-off work", "key", key.String(), "err", err)
		st = &idem.State{Key: key.String(), Status: idem.StatusInProgress, Ref: ipe.Ref, Owner: ipe.Owner, LeaseUntil: ipe.LeaseUntil}
	case st.Status == idem.StatusCompleted:
		var resp Response
		if err := st.Decode(&resp); err != nil {
			m.refuse(w, r, err)
			return
		}
		m.replay(w, resp)
		return
	case st.Status == idem.StatusFailed:
		m.refuse(w, r, st.Err)
		return
	}
	doc, err := m.statusResource(st)
	if err != nil {
		m.refuse(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Location", m.location(key))
	h.Set("Retry-After", RetryAfter(m.retryAfter(st.LeaseUntil)))
	writeStatus(w, http.StatusAccepted, doc)
}

// retryAfter is the time from now to until, at least a second.
func (m *Middleware) retryAfter(until time.Time) time.Duration {
	return max(until.Sub(m.eng.Now()), time.Second)
}

// RetryAfter renders d as a Retry-After header value: whole seconds,
// rounded up, at least 1. Every Retry-After idem sends goes through it.
func RetryAfter(d time.Duration) string {
	return strconv.FormatInt(max(int64((d+time.Second-1)/time.Second), 1), 10)
}

// StatusResource is the body of a status resource, and of a 202 that
// answers a retry of handed-off work (Content-Type application/json).
type StatusResource struct {
	// Status is IN_PROGRESS, COMPLETED or FAILED.
	Status string `json:"status"`
	// Execution is the execution reference attached to the claim: the
	// status resource itself after [Accept], or what the worker attached
	// ([Middleware.Attach]); absent when none was.
	Execution string `json:"execution,omitempty"`
	// Created is when the request claimed the key.
	Created time.Time `json:"created"`
	// ExpectedCompletion is when the work should be done: the claim's
	// lease, after which a retry may take the key over.
	ExpectedCompletion *time.Time `json:"expected_completion,omitempty"`
	// CompletedAt is when the key was settled; absent while IN_PROGRESS.
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	// Result is the stored response of a COMPLETED key.
	Result *StatusResult `json:"result,omitempty"`
	// Problem is the answer a retry of a FAILED key gets.
	Problem *Problem `json:"problem,omitempty"`
}

// StatusResult is a stored response as a status resource shows it.
type StatusResult struct {
	Status  int         `json:"status"`
	Headers http.Header `json:"headers,omitempty"`
	// Body is the body when it is JSON (a JSON Content-Type and a valid
	// document); BodyBase64 is any other body, base64-encoded (standard
	// alphabet, padded).
	Body       json.RawMessage `json:"body,omitempty"`
	BodyBase64 []byte          `json:"body_base64,omitempty"`
}

// statusResource renders st. The result's headers are those a replay
// sends.
func (m *Middleware) statusResource(st *idem.State) (*StatusResource, error) {
	doc := &StatusResource{Status: st.Status.String(), Execution: st.Ref, Created: st.CreatedAt.UTC()}
	if !st.LeaseUntil.IsZero() && st.LeaseUntil.UnixMilli() > 0 {
		t := st.LeaseUntil.UTC()
		doc.ExpectedCompletion = &t
	}
	if !st.CompletedAt.IsZero() {
		t := st.CompletedAt.UTC()
		doc.CompletedAt = &t
	}
	switch st.Status {
	case idem.StatusCompleted:
		var resp Response
		if err := st.Decode(&resp); err != nil {
			return nil, err
		}
		res := &StatusResult{Status: resp.Status, Headers: m.replayHeaders.filter(resp.Header)}
		if isJSON(resp.Header.Get("Content-Type"), resp.Body) {
			res.Body = resp.Body
		} else if len(resp.Body) > 0 {
			res.BodyBase64 = resp.Body
		}
		doc.Result = res
	case idem.StatusFailed:
		p := ProblemFor(st.Err, m.eng.Now(), m.cfg.StoreRetryAfter)
		doc.Problem = &p
	}
	return doc, nil
}

// isJSON reports whether a body of Content-Type ct is a JSON document.
func isJSON(ct string, body []byte) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return false
	}
	return len(body) > 0 && json.Valid(body)
}

// writeStatus writes doc with status.
func writeStatus(w http.ResponseWriter, status int, doc *StatusResource) {
	b, err := json.Marshal(doc)
	if err != nil { // cannot happen: strings, times, numbers and valid JSON
		b = []byte(`{"status":"` + doc.Status + `"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// token parses a worker's token: it must name a key of the middleware's
// operation. A malformed token, or one of another operation, fails with
// an error matching [idem.ErrInvalidToken] before any write.
func (m *Middleware) token(s string) (idem.Token, error) { return idem.ParseToken(s, m.cfg.Operation) }

// Complete stores resp as the final response of the handed-off request
// that token names ([Accept]): the record becomes COMPLETED, and every
// retry with the key gets resp, marked "Idempotent-Replayed: true". Only
// the headers a replay sends are stored (see Config.ReplayHeaders).
//
// It is for the worker, in any process whose middleware has the same
// Operation and whose engine is on the same store. The token is refused
// with an error matching [idem.ErrInvalidToken] when it is malformed or names another
// operation; a status outside 200-599 or a body over Config.MaxResponseBytes
// with an [*OutcomeError]; in both cases nothing is written. The write is
// fenced: a token whose claim is no longer the record's (the expected
// completion passed and a retry took the key over, or the key was settled
// or released) gets an [*idem.StaleTokenError] and changes nothing.
func (m *Middleware) Complete(ctx context.Context, token string, resp Response) error {
	t, err := m.token(token)
	if err != nil {
		return err
	}
	switch {
	case resp.Status < 200 || resp.Status > 599:
		return &OutcomeError{Reason: fmt.Sprintf("response status %d is not a final status (200-599)", resp.Status)}
	case len(resp.Body) > m.cfg.MaxResponseBytes:
		return &OutcomeError{Reason: fmt.Sprintf("response body of %d bytes is over the limit of %d", len(resp.Body), m.cfg.MaxResponseBytes)}
	}
	resp.Header = m.replayHeaders.filter(resp.Header)
	return m.eng.Complete(ctx, t, resp)
}

// Fail stores p as the final answer of the handed-off request that token
// names: the record becomes FAILED, and every retry with the key gets p
// with its status (an [idem.TerminalError] with code [CodeProblem] whose
// body is p as JSON). p.Status must be 400-599; an empty Type is
// "about:blank" and an empty Title the status's text, as RFC 9457 has it.
// Refused as [Middleware.Complete] is.
func (m *Middleware) Fail(ctx context.Context, token string, p Problem) error {
	t, err := m.token(token)
	if err != nil {
		return err
	}
	if p.Status < 400 || p.Status > 599 {
		return &OutcomeError{Reason: fmt.Sprintf("problem status %d is not an error status (400-599)", p.Status)}
	}
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	body, err := json.Marshal(p)
	if err != nil {
		return &OutcomeError{Reason: err.Error()}
	}
	return m.eng.Fail(ctx, t, &idem.TerminalError{Code: CodeProblem, Message: p.Title, Body: body})
}

// Release deletes the claim token names, so that a retry with the key runs
// the handler again: for work that could not start, or failed in a way
// worth retrying. Refused as [Middleware.Complete] is; a claim that is gone
// already counts as released.
func (m *Middleware) Release(ctx context.Context, token string) error {
	t, err := m.token(token)
	if err != nil {
		return err
	}
	return m.eng.Release(ctx, t)
}

// Extend moves the expected completion of the claim token names to now +
// d: the heartbeat of long work, which keeps a retry from taking the key
// over. Refused as [Middleware.Complete] is.
func (m *Middleware) Extend(ctx context.Context, token string, d time.Duration) error {
	t, err := m.token(token)
	if err != nil {
		return err
	}
	return m.eng.Extend(ctx, t, d)
}

// Attach records ref — the execution the work was handed to: a workflow
// execution's ARN, a job's URL — on the claim token names, in place of the
// status resource that [Accept] attached; the status resource shows it as
// "execution". Refused as [Middleware.Complete] is.
func (m *Middleware) Attach(ctx context.Context, token, ref string) error {
	t, err := m.token(token)
	if err != nil {
		return err
	}
	return m.eng.Attach(ctx, t, ref)
}
