// Tokens: a claim as a string any process can hold, signed when
// Config.TokenKey is set.

package idem

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// Token names one claim of one key: the store key, and the claim's fence
// and owner, which never repeat together (see docs/state-machine.md). It is
// what [Engine.Begin] hands to the work that finishes elsewhere: any
// process with the token and an engine on the same store can complete,
// fail, release, extend or attach the claim, and every such write is
// refused once the claim is no longer the record's.
//
// Its string form ([Token.String]) is opaque and URL-safe; read it back
// with [ParseToken].
//
// # A token is a capability
//
// Whoever holds a token can settle its claim. A token is not authenticated
// unless the engine signs it: its fence and owner are not secret (an
// owner is host/pid/engine/sequence), so a token can be made up or
// altered by anyone who knows a key, and a write through a token whose
// claim is not the record's is refused only by the store's fence check —
// and idemsfn settles a key whose token is stale through the record's
// current claim. Where tokens cross a trust boundary (the gateway's
// Idem-Token header, a Step Functions execution's input, an admin
// endpoint), set [Config.TokenKey]: every token the engine hands out then
// carries an HMAC-SHA256 of its contents, and every write through a token
// checks it before any store call, refusing a forged, altered or unsigned
// token with [ErrInvalidToken].
//
// # Trace context
//
// A token handed out by a traced call (Config.Observer is an
// [observe.Tracer], such as idemotel's) carries the W3C trace context of
// that call's span ([Token.TraceParent]), and the span of every write
// through it is linked to that span: the trace of the request that began
// the work leads to the worker that finished it. The trace context names
// a trace, not a claim: it is not part of what a signature covers (like a
// traceparent header, it is a hint for telemetry, and [Token.WithTraceOf]
// moves it to another token without the key). Tokens without one, such
// as those made before tokens carried it, parse and work as before.
type Token struct {
	// Key is the claimed key.
	Key StoreKey
	// Fence and Owner name the claim.
	Fence uint64
	Owner string
	// Status is the status the token's holder saw the record in, which
	// every write through the token requires it to still have:
	// [StatusInProgress] for a claim from Begin. A token read from a
	// settled record ([State.Token]) lets its holder correct that record
	// (a workflow redriven to success, an operator resolving a key by
	// hand) and is refused if anything changed in between.
	Status Status

	// mac is the HMAC-SHA256 of the token's unsigned form under the
	// engine's Config.TokenKey, when signed is set.
	mac    [sha256.Size]byte
	signed bool
	// trace is the trace context of the call that handed the token out;
	// zero when it was not traced.
	trace observe.TraceContext
}

// The first byte of every encoded token: its version. After the key, a
// token with a trace context has it (25 bytes: trace id, span id, flags),
// then a signed token has its MAC, then comes the owner.
const (
	tokenVersion             = 1
	signedTokenVersion       = 2
	tracedTokenVersion       = 3
	signedTracedTokenVersion = 4
	traceContextLen          = 16 + 8 + 1
)

// String returns the token's opaque, URL-safe form (base64url, no padding).
func (t Token) String() string {
	return base64.RawURLEncoding.EncodeToString(t.encode(t.signed, t.trace.IsValid()))
}

// encode returns the token's bytes, with its MAC when signed and its
// trace context when traced.
func (t Token) encode(signed, traced bool) []byte {
	key := t.Key.String()
	b := make([]byte, 0, 2+2*binary.MaxVarintLen64+len(key)+traceContextLen+sha256.Size+len(t.Owner))
	var v byte
	switch {
	case signed && traced:
		v = signedTracedTokenVersion
	case traced:
		v = tracedTokenVersion
	case signed:
		v = signedTokenVersion
	default:
		v = tokenVersion
	}
	b = append(b, v, byte(t.Status))
	b = binary.AppendUvarint(b, t.Fence)
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	if traced {
		b = append(b, t.trace.TraceID[:]...)
		b = append(b, t.trace.SpanID[:]...)
		b = append(b, t.trace.Flags)
	}
	if signed {
		b = append(b, t.mac[:]...)
	}
	return append(b, t.Owner...)
}

// TraceParent returns the W3C traceparent of the span of the call that
// handed the token out ("00-<trace id>-<span id>-<flags>"), or "" when the
// token carries none (see [Token]).
func (t Token) TraceParent() string { return t.trace.String() }

// WithTraceOf returns t carrying the trace context of from (none, when
// from carries none). A signature stays valid: it does not cover the
// trace context. idemsfn uses it to settle a key through the record's
// current claim while linking the write to the call that began the work.
func (t Token) WithTraceOf(from Token) Token {
	t.trace = from.trace
	return t
}

// tokenMAC is the MAC of t's unsigned form, without its trace context,
// under key.
func tokenMAC(key []byte, t Token) [sha256.Size]byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("idem-token\x00"))
	m.Write(t.encode(false, false))
	var out [sha256.Size]byte
	m.Sum(out[:0])
	return out
}

// sign returns t signed with the engine's Config.TokenKey, or t as it is
// without one.
func (e *Engine) sign(t Token) Token {
	if len(e.cfg.TokenKey) == 0 {
		return t
	}
	t.mac, t.signed = tokenMAC(e.cfg.TokenKey, t), true
	return t
}

// verify checks t's signature against the engine's Config.TokenKey (any
// token passes without one), before any store call.
func (e *Engine) verify(t Token) error {
	if len(e.cfg.TokenKey) == 0 {
		return nil
	}
	if !t.signed {
		return &tokenError{Token: t.String(), Reason: "not signed, and this engine takes only tokens signed with its TokenKey"}
	}
	if want := tokenMAC(e.cfg.TokenKey, t); !hmac.Equal(want[:], t.mac[:]) {
		return &tokenError{Token: t.String(), Reason: "its signature does not match its contents under this engine's TokenKey: forged or altered"}
	}
	return nil
}

// IsZero reports whether t is the zero Token (no claim).
func (t Token) IsZero() bool { return t.Fence == 0 && t.Owner == "" }

// ParseToken reads a token made by [Token.String]. When operation is not
// empty, the token must name a key of that operation: a worker that
// finishes one kind of work refuses a token of another before any store
// write. A signed token's signature is checked where it is used, by an
// engine with the TokenKey (see [Token]). A token is a capability: whoever holds it may settle its claim,
// whatever tenant the key names, so hand it only to the work it is for;
// a caller that knows the tenant may compare Key.Tenant itself. Errors
// match [ErrInvalidToken].
func ParseToken(s, operation string) (Token, error) {
	bad := func(reason string) (Token, error) { return Token{}, &tokenError{Token: s, Reason: reason} }
	if s == "" {
		return bad("empty")
	}
	if len(s) > MaxTokenLen {
		return bad(fmt.Sprintf("%d characters, over the limit of %d", len(s), MaxTokenLen))
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return bad("not base64url: " + err.Error())
	}
	if len(b) < 2 || b[0] < tokenVersion || b[0] > signedTracedTokenVersion {
		return bad("unknown token version")
	}
	t := Token{Status: Status(b[1]), signed: b[0] == signedTokenVersion || b[0] == signedTracedTokenVersion}
	traced := b[0] >= tracedTokenVersion
	if t.Status == 0 || !t.Status.Valid() {
		return bad(fmt.Sprintf("unknown status %d", b[1]))
	}
	b = b[2:]
	var n int
	if t.Fence, n = binary.Uvarint(b); n <= 0 || t.Fence == 0 {
		return bad("no fence")
	}
	b = b[n:]
	klen, n := binary.Uvarint(b)
	if n <= 0 || klen > uint64(len(b)-n) {
		return bad("truncated key")
	}
	b = b[n:]
	if t.Key, err = ParseStoreKey(string(b[:klen])); err != nil {
		return bad("its key is invalid: " + err.Error())
	}
	b = b[klen:]
	if traced {
		if len(b) < traceContextLen {
			return bad("truncated trace context")
		}
		copy(t.trace.TraceID[:], b)
		copy(t.trace.SpanID[:], b[16:])
		t.trace.Flags = b[24]
		if !t.trace.IsValid() {
			return bad("its trace context has an all-zero id")
		}
		b = b[traceContextLen:]
	}
	if t.signed {
		if len(b) < sha256.Size {
			return bad("truncated signature")
		}
		copy(t.mac[:], b)
		b = b[sha256.Size:]
	}
	t.Owner = string(b)
	if t.Owner == "" || !utf8.ValidString(t.Owner) {
		return bad("no valid owner")
	}
	if operation != "" && t.Key.Operation != operation {
		return bad(fmt.Sprintf("it names operation %q, not %q", t.Key.Operation, operation))
	}
	return t, nil
}

// Errors of work handed elsewhere ([Engine.Begin] and its tokens).
var (
	// ErrInvalidToken: a token is malformed, names another operation, or
	// (with Config.TokenKey) is not signed by the key. The error is a
	// an error matching [ErrInvalidToken]; nothing was written.
	ErrInvalidToken = errors.New("idem: invalid token")
	// ErrStaleToken: a write through a token was refused because the
	// token's claim is no longer the record's (the key was taken over,
	// settled, released or expired). The error is a [*StaleTokenError].
	ErrStaleToken = errors.New("idem: stale token")
	// ErrNotFound: no live record for the key ([Engine.Status]). It is
	// store.ErrNotFound, the same error value.
	ErrNotFound = store.ErrNotFound
)

// tokenError describes a token that cannot be used; it matches
// [ErrInvalidToken].
type tokenError struct {
	Token  string
	Reason string
}

func (e *tokenError) Error() string {
	t := e.Token
	if len(t) > 24 {
		t = t[:24] + "..."
	}
	return fmt.Sprintf("idem: invalid token %q: %s", t, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidToken) true.
func (e *tokenError) Is(target error) bool { return target == ErrInvalidToken }

// StaleTokenError is a write through a token that the store refused: the
// record is absent or expired (Status zero), or holds another claim, or is
// no longer in the status the token names.
type StaleTokenError struct {
	// Op is the refused write.
	Op observe.StoreOp
	// Token is the token used.
	Token Token
	// Status, Fence and Owner describe the record as the store saw it;
	// Status is zero when it was absent or expired.
	Status Status
	Fence  uint64
	Owner  string
	// Err is the store's answer: [store.ErrNotFound] or a
	// [*store.FencedError].
	Err error
}

func staleToken(op observe.StoreOp, t Token, err error) error {
	e := &StaleTokenError{Op: op, Token: t, Err: err}
	var fe *store.FencedError
	switch {
	case errors.As(err, &fe):
		e.Status, e.Fence, e.Owner = fe.Status, fe.Current, fe.CurrentOwner
	case errors.Is(err, store.ErrNotFound):
	default:
		return err
	}
	return e
}

func (e *StaleTokenError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("idem: %s through a stale token refused: %s is absent or expired", e.Op, e.Token.Key)
	}
	return fmt.Sprintf("idem: %s through a stale token refused: %s is %s under claim %d (%s), the token names %s under claim %d (%s)",
		e.Op, e.Token.Key, e.Status, e.Fence, e.Owner, e.Token.Status, e.Token.Fence, e.Token.Owner)
}

// Is makes errors.Is(err, ErrStaleToken) true.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// Unwrap returns the store's answer.
func (e *StaleTokenError) Unwrap() error { return e.Err }
