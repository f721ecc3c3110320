package idemhttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// Problem is an RFC 9457 problem details object, the body of every error
// response the middleware writes (Content-Type application/problem+json).
type Problem struct {
	// Type is a URI naming the kind of problem: ProblemTypeBase followed by
	// a short name such as "in-progress".
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance is the request path.
	Instance string `json:"instance,omitempty"`
	// RetryAfter, when positive, is sent as a Retry-After header (whole
	// seconds, rounded up).
	RetryAfter time.Duration `json:"-"`
}

// ProblemTypeBase prefixes the Type of every problem the middleware writes.
const ProblemTypeBase = "urn:idem:problem:"

// The problem type names: ProblemTypeBase + name. The README's HTTP section
// lists them with their statuses.
const (
	ProblemMissingKey       = "missing-key"        // 400
	ProblemInvalidKey       = "invalid-key"        // 400
	ProblemUnauthenticated  = "unauthenticated"    // 401
	ProblemBodyUnreadable   = "body-unreadable"    // 400
	ProblemBodyTooLarge     = "body-too-large"     // 413
	ProblemBodyTimeout      = "body-timeout"       // 408
	ProblemInProgress       = "in-progress"        // 409
	ProblemHeld             = "held"               // 409
	ProblemKeyReused        = "key-reused"         // 422
	ProblemResponseNotSaved = "response-not-saved" // 410
	ProblemStoreUnavailable = "store-unavailable"  // 503
	ProblemRecordUnreadable = "record-unreadable"  // 500
	ProblemCancelled        = "cancelled"          // 503
	ProblemInternal         = "internal"           // 500
	ProblemStatusNotFound   = "status-not-found"   // 404
	ProblemMethodNotAllowed = "method-not-allowed" // 405
	ProblemInvalidToken     = "invalid-token"      // 400
	ProblemStaleToken       = "stale-token"        // 409
	ProblemInvalidOutcome   = "invalid-outcome"    // 400
)

// BodyTooLargeError is returned when a request body is over the limit; the
// request is answered 413 before any claim.
type BodyTooLargeError struct {
	// Limit is the limit in bytes; Size the declared Content-Length, or -1
	// when the body was cut off while reading.
	Limit, Size int64
}

func (e *BodyTooLargeError) Error() string {
	if e.Size >= 0 {
		return fmt.Sprintf("idemhttp: request body of %d bytes is over the limit of %d", e.Size, e.Limit)
	}
	return fmt.Sprintf("idemhttp: request body is over the limit of %d bytes", e.Limit)
}

// BodyError is returned when the request body could not be read.
type BodyError struct{ Err error }

func (e *BodyError) Error() string { return "idemhttp: reading the request body: " + e.Err.Error() }

// Unwrap returns the read error.
func (e *BodyError) Unwrap() error { return e.Err }

// BodyTimeoutError is returned when the request body did not arrive in
// time: Config.BodyTimeout passed, or the server's read deadline, while it
// stalled or trickled in. The request is answered 408 before any claim.
type BodyTimeoutError struct {
	// Timeout is Config.BodyTimeout; 0 when the deadline was the server's.
	Timeout time.Duration
	// Err is the read error.
	Err error
}

func (e *BodyTimeoutError) Error() string {
	if e.Timeout > 0 {
		return fmt.Sprintf("idemhttp: request body not received within %v: %v", e.Timeout, e.Err)
	}
	return "idemhttp: request body not received in time: " + e.Err.Error()
}

// Unwrap returns the read error.
func (e *BodyTimeoutError) Unwrap() error { return e.Err }

// PrincipalError is returned when Config.Principal refused the request.
type PrincipalError struct{ Err error }

func (e *PrincipalError) Error() string { return "idemhttp: no principal: " + e.Err.Error() }

// Unwrap returns the Principal func's error.
func (e *PrincipalError) Unwrap() error { return e.Err }

// ProblemFor maps an error of the middleware or the engine to its answer.
// It is the one place where errors become statuses; Config.ErrorHandler
// gets its result and may change it. now is used for Retry-After.
//
// A stored failure of handed-off work ([Middleware.Fail]: an
// [idem.TerminalError] with code [CodeProblem]) is answered with the
// problem that was stored, and its status.
func ProblemFor(err error, now time.Time, storeRetryAfter time.Duration) Problem {
	var (
		te  *idem.TerminalError
		ke  *idem.KeyError
		tle *BodyTooLargeError
		bte *BodyTimeoutError
		be  *BodyError
		pe  *PrincipalError
		ipe *idem.InProgressError
		he  *idem.HeldError
		me  *idem.MismatchError
		ce  *store.CorruptError
	)
	p := func(status int, name, title, detail string) Problem {
		return Problem{Type: ProblemTypeBase + name, Title: title, Status: status, Detail: detail}
	}
	switch {
	case errors.As(err, &te) && te.Code == CodeProblem:
		var stored Problem
		if json.Unmarshal(te.Body, &stored) == nil && stored.Status >= 400 && stored.Status <= 599 {
			return stored
		}
		return p(http.StatusInternalServerError, ProblemRecordUnreadable, "Stored response unreadable",
			"the saved outcome of this Idempotency-Key cannot be read; the request is not processed again")
	case errors.Is(err, ErrUnknownStatus):
		return p(http.StatusNotFound, ProblemStatusNotFound, "Status not found",
			"no request with this status resource is known to the caller, or its record expired")
	case errors.Is(err, ErrStatusMethod):
		return p(http.StatusMethodNotAllowed, ProblemMethodNotAllowed, "Method not allowed",
			"a status resource answers GET and HEAD only")
	case errors.Is(err, idem.ErrInvalidToken):
		return p(http.StatusBadRequest, ProblemInvalidToken, "Invalid token", err.Error())
	case errors.Is(err, idem.ErrStaleToken):
		return p(http.StatusConflict, ProblemStaleToken, "Stale token",
			"the token's claim is no longer the key's (its expected completion passed and a retry took the key over, or the key was settled or released); nothing was written")
	case errors.Is(err, ErrInvalidOutcome):
		return p(http.StatusBadRequest, ProblemInvalidOutcome, "Invalid outcome", err.Error())
	case errors.Is(err, ErrMissingKey):
		return p(http.StatusBadRequest, ProblemMissingKey, "Idempotency-Key header missing",
			"this endpoint requires an Idempotency-Key header")
	case errors.As(err, &ke):
		return p(http.StatusBadRequest, ProblemInvalidKey, "Invalid Idempotency-Key header", ke.Reason)
	case errors.As(err, &pe):
		return p(http.StatusUnauthorized, ProblemUnauthenticated, "Caller not identified", pe.Err.Error())
	case errors.As(err, &tle):
		return p(http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large",
			fmt.Sprintf("the body may be at most %d bytes", tle.Limit))
	case errors.As(err, &bte):
		detail := "the request body was not received in time"
		if bte.Timeout > 0 {
			detail = fmt.Sprintf("the request body was not received within %v", bte.Timeout)
		}
		return p(http.StatusRequestTimeout, ProblemBodyTimeout, "Request body too slow",
			detail+"; the request was not processed, send it again with the same Idempotency-Key")
	case errors.As(err, &be):
		return p(http.StatusBadRequest, ProblemBodyUnreadable, "Request body unreadable", be.Err.Error())
	case errors.As(err, &ipe):
		pr := p(http.StatusConflict, ProblemInProgress, "Request in progress",
			"a request with this Idempotency-Key is still being processed; retry after the Retry-After delay")
		pr.RetryAfter = ipe.RetryAfter(now)
		return pr
	case errors.As(err, &he):
		return p(http.StatusConflict, ProblemHeld, "Request held for an operator",
			"a request with this Idempotency-Key was interrupted and is held for a person to settle; it is not processed again, and a retry gets this answer until it is settled")
	case errors.As(err, &me):
		return p(http.StatusUnprocessableEntity, ProblemKeyReused, "Idempotency-Key reused",
			"this Idempotency-Key was used with a different request; use a new key for a new request")
	case errors.Is(err, idem.ErrResultTooLarge):
		return p(http.StatusGone, ProblemResponseNotSaved, "Response not saved",
			"the request with this Idempotency-Key was processed, but its response was too large to be saved; it is not processed again")
	case errors.As(err, &ce):
		return p(http.StatusInternalServerError, ProblemRecordUnreadable, "Stored response unreadable",
			"the saved outcome of this Idempotency-Key cannot be read; the request is not processed again")
	case errors.Is(err, idem.ErrStore), errors.Is(err, store.ErrUnavailable):
		pr := p(http.StatusServiceUnavailable, ProblemStoreUnavailable, "Idempotency store unavailable",
			"the request was not processed; retry later with the same Idempotency-Key")
		pr.RetryAfter = storeRetryAfter
		return pr
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return p(http.StatusServiceUnavailable, ProblemCancelled, "Request cancelled",
			"the request was cancelled before it was processed")
	}
	return p(http.StatusInternalServerError, ProblemInternal, "Internal error", "")
}

// WriteProblem writes p as an application/problem+json body, with
// Cache-Control: no-store and, when p.RetryAfter is positive, Retry-After in
// whole seconds, rounded up. Instance defaults to the request path.
func WriteProblem(w http.ResponseWriter, r *http.Request, p Problem) {
	if p.Instance == "" && r != nil {
		p.Instance = r.URL.Path
	}
	b, err := json.Marshal(p)
	if err != nil { // cannot happen: only strings and an int
		b = []byte(`{"type":"about:blank","status":500}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", RetryAfter(p.RetryAfter))
	}
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(p.Status)
	_, _ = w.Write(b)
}
