// The operation's context: its claim (FromContext), and the marks a
// caller sets on it (EndsAtDeadline).

package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// Claim describes the claim under which an operation runs. The engine puts
// it in the operation's context; read it with [FromContext].
type Claim struct {
	// Key is the store key.
	Key string
	// Fence is the claim's fence token. It changes on a takeover.
	Fence uint64
	// Owner is the claim's owner string.
	Owner string

	e     *Engine              // the engine running the operation, which signs Token
	trace observe.TraceContext // the call's span, which Token carries
}

// ref names the claim, IN_PROGRESS, in a fenced write at now (ms).
func (c Claim) ref(now int64) store.ClaimRef {
	return store.ClaimRef{Key: c.Key, Fence: c.Fence, Owner: c.Owner, Now: now}
}

// Token returns the token of the claim, IN_PROGRESS, as work the claim is
// handed to needs it (signed with the engine's Config.TokenKey when it has
// one): the token [Detach] returns. When the engine traces, the token
// carries the trace context of the call's span ([Token.TraceParent]). The
// zero Token for a claim whose key does not parse.
func (c Claim) Token() Token {
	return tokenOf(c.e, c.Key, c.Fence, c.Owner, StatusInProgress, c.trace)
}

// tokenOf is the token of the claim (key, fence, owner) of a record in
// status st, signed by e when it has a TokenKey, carrying trace (when
// valid): the one place a token is made from a claim. The zero Token when
// key does not parse.
func tokenOf(e *Engine, key string, fence uint64, owner string, st Status, trace observe.TraceContext) Token {
	k, err := ParseStoreKey(key)
	if err != nil {
		return Token{}
	}
	t := Token{Key: k, Fence: fence, Owner: owner, Status: st, trace: trace}
	if e != nil {
		t = e.sign(t)
	}
	return t
}

// DownstreamKey returns an idempotency key to pass to a downstream service
// (a payment API, another idem service) for the call named label. It depends
// only on the store key and label, so it stays the same across retries and
// takeovers: a re-run after a crash presents the same key downstream, which
// is what makes the overall effect exactly once when the downstream honours
// idempotency keys too.
func (c Claim) DownstreamKey(label string) string {
	h := sha256.New()
	h.Write([]byte("idem-downstream\x00"))
	h.Write([]byte(c.Key))
	h.Write([]byte{0})
	h.Write([]byte(label))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

type claimCtxKey struct{}

// FromContext returns the claim carried by ctx, if any.
func FromContext(ctx context.Context) (Claim, bool) {
	c, ok := ctx.Value(claimCtxKey{}).(Claim)
	return c, ok
}

type endsAtDeadlineKey struct{}

// EndsAtDeadline returns a copy of ctx saying that whatever runs an
// operation in it is ended at ctx's deadline, as AWS Lambda ends an
// invocation that timed out (idemlambda marks every invocation so). The
// claim of an operation run in such a context holds until the deadline and
// is not renewed: its holder is gone there, so a retry takes the key over
// once the deadline has passed (on the store's clock: within the error
// bound of the engines' readings of it, about a second on DynamoDB; see
// Config.ClockSync). Without the mark a deadline only sets
// the first lease, which the engine renews while the operation runs.
//
// Never mark the context of a caller who merely stops waiting at its
// deadline (a gRPC, Connect or HTTP client's): the handler may run on
// after it, and a retry at another server would then run the operation
// again. A context without a deadline is renewed as usual.
func EndsAtDeadline(ctx context.Context) context.Context {
	return context.WithValue(ctx, endsAtDeadlineKey{}, true)
}

// endsAtDeadline reports whether ctx has a deadline marked by
// [EndsAtDeadline].
func endsAtDeadline(ctx context.Context) bool {
	if _, ok := ctx.Deadline(); !ok {
		return false
	}
	_, ok := ctx.Value(endsAtDeadlineKey{}).(bool)
	return ok
}
