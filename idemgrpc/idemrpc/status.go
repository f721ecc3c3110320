package idemrpc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// KeyField is the [idem.KeyError] Field of a malformed or repeated key.
const KeyField = "idempotency key"

// ErrMissingKey: the method requires a key (Method.Required) and the call
// has none. Answered INVALID_ARGUMENT.
var ErrMissingKey = errors.New("idemrpc: idempotency key required")

// PrincipalError is returned when Config.Principal refused the call.
// Answered UNAUTHENTICATED.
type PrincipalError struct{ Err error }

func (e *PrincipalError) Error() string { return "idemrpc: no principal: " + e.Err.Error() }

// Unwrap returns the Principal func's error.
func (e *PrincipalError) Unwrap() error { return e.Err }

// MessageError is returned when a covered call's request is not a
// protocol buffers message (a server with another codec), or cannot be
// encoded to be fingerprinted. Answered INTERNAL.
type MessageError struct {
	Method, Type string
	Err          error
}

func (e *MessageError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("idemrpc: %s: request %s cannot be encoded: %v", e.Method, e.Type, e.Err)
	}
	return fmt.Sprintf("idemrpc: %s: request of type %s is not a protocol buffers message", e.Method, e.Type)
}

// Unwrap returns the encoding error, if any.
func (e *MessageError) Unwrap() error { return e.Err }

// ResponseError is returned when a stored response cannot be decoded: its
// bytes are damaged, or its message type is not in Config.Types. Answered
// DATA_LOSS; the handler does not run again.
type ResponseError struct {
	Key string
	// Type is the stored response's type URL, when it was read.
	Type string
	Err  error
}

func (e *ResponseError) Error() string {
	if e.Type != "" {
		return fmt.Sprintf("idemrpc: stored response of %s (%s) cannot be decoded: %v", e.Key, e.Type, e.Err)
	}
	return fmt.Sprintf("idemrpc: stored response of %s cannot be decoded: %v", e.Key, e.Err)
}

// Unwrap returns the decoding error.
func (e *ResponseError) Unwrap() error { return e.Err }

// ParseKey parses the values of the key metadata entry of one call. The
// key is 1 to [MaxKeyLen] bytes of printable ASCII, without leading or
// trailing spaces, sent once. It returns [ErrMissingKey] when there is no
// value, else an [*idem.KeyError] naming the problem (Field [KeyField]).
func ParseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrMissingKey
	case 1:
	default:
		return "", &idem.KeyError{Field: KeyField, Value: strings.Join(values, ", "), Reason: fmt.Sprintf("sent %d times; send exactly one", len(values))}
	}
	k := values[0]
	switch {
	case k == "":
		return "", &idem.KeyError{Field: KeyField, Value: k, Reason: "empty"}
	case len(k) > MaxKeyLen:
		return "", &idem.KeyError{Field: KeyField, Value: k, Reason: fmt.Sprintf("%d bytes, over the limit of %d", len(k), MaxKeyLen)}
	case k[0] == ' ' || k[len(k)-1] == ' ':
		return "", &idem.KeyError{Field: KeyField, Value: k, Reason: "leading or trailing space"}
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return "", &idem.KeyError{Field: KeyField, Value: k, Reason: fmt.Sprintf("byte 0x%02x at offset %d is not printable ASCII", k[i], i)}
		}
	}
	return k, nil
}

// NewKey returns a new random idempotency key: 32 lower-case hex digits
// (128 bits), what the client interceptors attach to a call without one.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// StatusFor maps an error of the Guard or the engine, from a call whose
// handler did not run ([Outcome].Ran false), to the status the caller
// gets. It is the one place where those errors become status codes, for
// gRPC and Connect alike; the package documentation gives each mapping
// and its reason. now is used for the retry delay of a duplicate in
// progress, storeRetryAfter is the one of a store outage.
func StatusFor(err error, now time.Time, storeRetryAfter time.Duration) *spb.Status {
	var (
		te  *idem.TerminalError
		ke  *idem.KeyError
		pe  *PrincipalError
		me  *MessageError
		re  *ResponseError
		se  *StreamingMethodError
		ipe *idem.InProgressError
		he  *idem.HeldError
		mme *idem.MismatchError
		ce  *store.CorruptError
	)
	s := func(c code.Code, msg string, details ...proto.Message) *spb.Status {
		st := &spb.Status{Code: int32(c), Message: msg}
		for _, d := range details {
			if a, err := anypb.New(d); err == nil {
				st.Details = append(st.Details, a)
			}
		}
		return st
	}
	switch {
	case errors.Is(err, idem.ErrResultTooLarge):
		return s(code.Code_DATA_LOSS, "the call with this idempotency key was processed, but its response was too large to be saved; it is not processed again")
	case errors.As(err, &te):
		if st := storedStatus(te); st != nil {
			return st
		}
		return s(code.Code_UNKNOWN, te.Message)
	case errors.As(err, &se):
		return s(code.Code_UNIMPLEMENTED, "idempotency keys are not supported on streaming method "+se.Method)
	case errors.Is(err, ErrMissingKey):
		return s(code.Code_INVALID_ARGUMENT, "this method requires an idempotency key",
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "idempotency-key", Description: "missing"}}})
	case errors.As(err, &ke):
		// The message as this package has always sent it.
		return s(code.Code_INVALID_ARGUMENT, "idemrpc: "+strings.TrimPrefix(ke.Error(), "idem: "),
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "idempotency-key", Description: ke.Reason}}})
	case errors.As(err, &pe):
		return s(code.Code_UNAUTHENTICATED, "caller not identified: "+pe.Err.Error())
	case errors.As(err, &ipe):
		return s(code.Code_ABORTED, "a call with this idempotency key is still in progress; retry after the retry delay",
			&errdetails.RetryInfo{RetryDelay: durationpb.New(ipe.RetryAfter(now))})
	case errors.As(err, &he):
		return s(code.Code_FAILED_PRECONDITION, "a call with this idempotency key was interrupted and is held for a person to settle; it is not processed again, and a retry gets this answer until it is settled",
			&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: "IDEMPOTENCY_KEY_HELD", Subject: "idempotency-key",
				Description: "the key's takeover policy is Hold and its holder was lost; an operator resolves or releases it"}}})
	case errors.As(err, &mme):
		return s(code.Code_FAILED_PRECONDITION, "this idempotency key was used with a different request; use a new key for a new request",
			&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: "IDEMPOTENCY_KEY_REUSED", Subject: "idempotency-key",
				Description: "the key was first used with another request (message, metadata or method)"}}})
	case errors.As(err, &re), errors.As(err, &ce):
		return s(code.Code_DATA_LOSS, "the saved outcome of this idempotency key cannot be read; the call is not processed again")
	case errors.As(err, &me):
		return s(code.Code_INTERNAL, "internal error")
	case errors.Is(err, idem.ErrStore), errors.Is(err, store.ErrUnavailable):
		return s(code.Code_UNAVAILABLE, "idempotency store unavailable; the call was not processed, retry later with the same idempotency key",
			&errdetails.RetryInfo{RetryDelay: durationpb.New(storeRetryAfter)})
	case errors.Is(err, context.Canceled):
		return s(code.Code_CANCELLED, "the call was cancelled before it was processed")
	case errors.Is(err, context.DeadlineExceeded):
		return s(code.Code_DEADLINE_EXCEEDED, "the call's deadline passed before it was processed")
	}
	return s(code.Code_INTERNAL, "internal error")
}

// storedStatus returns the google.rpc.Status a terminal error carries in
// its Body, or nil when it carries none.
func storedStatus(te *idem.TerminalError) *spb.Status {
	if len(te.Body) == 0 {
		return nil
	}
	var st spb.Status
	if proto.Unmarshal(te.Body, &st) != nil || st.GetCode() <= int32(code.Code_OK) || st.GetCode() > int32(code.Code_UNAUTHENTICATED) {
		return nil
	}
	return &st
}

// Status is [StatusFor] with the Guard's configuration and clock; it logs
// the refusals an operator should see (a store outage, an unreadable
// record, a misconfiguration).
func (g *Guard) Status(ctx context.Context, method string, err error) *spb.Status {
	st := StatusFor(err, g.eng.Now(), g.cfg.StoreRetryAfter)
	switch code.Code(st.GetCode()) {
	case code.Code_UNAVAILABLE, code.Code_INTERNAL, code.Code_UNIMPLEMENTED:
		g.cfg.Logger.WarnContext(ctx, "idemrpc: call refused", "method", method, "code", code.Code(st.GetCode()).String(), "err", err)
	case code.Code_DATA_LOSS:
		var te *idem.TerminalError
		if !errors.As(err, &te) || !te.Replayed || errors.Is(err, idem.ErrResultTooLarge) {
			g.cfg.Logger.ErrorContext(ctx, "idemrpc: call refused", "method", method, "code", "DATA_LOSS", "err", err)
		}
	}
	return st
}
