package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
)

// tokenHeader carries the claim's token to the upstream in asynchronous
// mode (-status-path).
const tokenHeader = "Idem-Token"

// maxProblemBytes caps the problem a worker stores with fail.
const maxProblemBytes = 64 << 10

// claimToken returns the token of the claim a covered request runs under,
// as the upstream's worker needs it (signed with -token-key-file): the
// token [idem.Detach] returns once the 202 hands the claim off.
func claimToken(ctx context.Context) (idem.Token, bool) {
	c, ok := idem.FromContext(ctx)
	if !ok {
		return idem.Token{}, false
	}
	t := c.Token()
	return t, !t.IsZero()
}

// acceptError is an upstream 202 whose claim could not be handed off.
type acceptError struct{ err error }

func (e *acceptError) Error() string { return "handing off accepted work: " + e.err.Error() }
func (e *acceptError) Unwrap() error { return e.err }

// accepted hands the claim of a covered request off when the upstream
// answers 202 in asynchronous mode, and points the client at the gateway's
// status resource (Location, Retry-After); the upstream's body passes
// through. Every other answer is left to the middleware, which stores it.
//
// The upstream's worker holds the token before the 202 reaches the
// gateway, and may have settled the key already: then there is nothing to
// hand off, and the 202 still points at the status resource, which shows
// the outcome; the middleware is told not to store the 202 over it.
func (g *gateway) accepted(resp *http.Response) error {
	ctx := resp.Request.Context()
	if g.opts.statusPath == "" || resp.StatusCode != http.StatusAccepted {
		return nil
	}
	if _, ok := idem.FromContext(ctx); !ok {
		return nil // not covered: passed through as it is
	}
	acc, err := idemhttp.AcceptContext(ctx)
	var stale *idem.StaleTokenError
	switch {
	case err == nil:
	case errors.As(err, &stale) && stale.Fence == stale.Token.Fence && stale.Owner == stale.Token.Owner && stale.Status != idem.StatusInProgress:
		idemhttp.MarkUncertain(ctx)
		acc = idemhttp.Accepted{Location: acc.Location, RetryAfter: time.Second}
	default:
		return &acceptError{err}
	}
	resp.Header.Set("Location", acc.Location)
	resp.Header.Set("Retry-After", idemhttp.RetryAfter(acc.RetryAfter))
	return nil
}

// errBadRequest is a token endpoint's parameter that cannot be used.
var errBadRequest = errors.New("bad request")

// settle serves POST /idem/v1/tokens/{token}/{action} on the admin
// listener: the upstream's worker settles a key it was handed (see the
// package comment for the actions). 204 on success; refusals are
// problem+json: 400 for a bad token or parameter, 409 for a stale token,
// 413 for a body over -max-response, 503 when the store fails or is not
// open yet.
func (g *gateway) settle(w http.ResponseWriter, r *http.Request) {
	tok, q, ctx := r.PathValue("token"), r.URL.Query(), r.Context()
	rd := g.ready.Load()
	if rd == nil {
		idemhttp.WriteProblem(w, r, g.notOpen())
		return
	}
	var err error
	switch r.PathValue("action") {
	case "complete":
		resp := idemhttp.Response{Status: http.StatusOK}
		if s := q.Get("status"); s != "" {
			if resp.Status, err = strconv.Atoi(s); err != nil {
				err = fmt.Errorf("%w: status %q is not a number", errBadRequest, s)
				break
			}
		}
		if resp.Body, err = readAll(w, r, g.opts.maxResponse); err != nil {
			break
		}
		if ct := r.Header.Get("Content-Type"); ct != "" {
			resp.Header = http.Header{"Content-Type": {ct}}
		}
		err = rd.mw.Complete(ctx, tok, resp)
	case "fail":
		var b []byte
		if b, err = readAll(w, r, maxProblemBytes); err != nil {
			break
		}
		var p idemhttp.Problem
		if jerr := json.Unmarshal(b, &p); jerr != nil {
			err = fmt.Errorf("%w: the body is not a problem+json object: %v", errBadRequest, jerr)
			break
		}
		err = rd.mw.Fail(ctx, tok, p)
	case "release":
		err = rd.mw.Release(ctx, tok)
	case "extend":
		d, perr := time.ParseDuration(q.Get("for"))
		if perr != nil || d <= 0 {
			err = fmt.Errorf("%w: for=%q is not a positive duration such as 10m", errBadRequest, q.Get("for"))
			break
		}
		err = rd.mw.Extend(ctx, tok, d)
	case "attach":
		err = rd.mw.Attach(ctx, tok, q.Get("ref"))
	default:
		http.NotFound(w, r)
		return
	}
	if err != nil {
		g.adminProblem(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// readAll reads r's body up to limit bytes; a longer one fails with an
// *idemhttp.BodyTooLargeError.
func readAll(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, &idemhttp.BodyTooLargeError{Limit: limit, Size: -1}
	}
	if err != nil {
		return nil, &idemhttp.BodyError{Err: err}
	}
	return b, nil
}

// adminProblem answers a refused token request: a bad parameter (or an
// execution reference or duration the engine refuses) is 400, anything else
// as idemhttp.ProblemFor maps it.
func (g *gateway) adminProblem(w http.ResponseWriter, r *http.Request, err error) {
	var p idemhttp.Problem
	if errors.Is(err, errBadRequest) || errors.Is(err, idem.ErrInvalidArgument) {
		p = idemhttp.Problem{Type: idemhttp.ProblemTypeBase + "invalid-request", Title: "Invalid request",
			Status: http.StatusBadRequest, Detail: err.Error()}
	} else {
		p = idemhttp.ProblemFor(err, time.Now(), time.Second)
	}
	if p.Status >= 500 {
		g.log.Warn("token request refused", "path", r.URL.Path, "status", p.Status, "err", err)
	}
	idemhttp.WriteProblem(w, r, p)
}
