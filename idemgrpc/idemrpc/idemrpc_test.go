package idemrpc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// Every error the Guard or the engine can answer a call with, and its
// status: the table of the package documentation.
func TestStatusFor(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	stored, _ := proto.Marshal(&spb.Status{Code: int32(code.Code_PERMISSION_DENIED), Message: "not yours"})
	for _, c := range []struct {
		name  string
		err   error
		code  code.Code
		delay time.Duration // of a RetryInfo detail, 0 for none
	}{
		{"missing key", idemrpc.ErrMissingKey, code.Code_INVALID_ARGUMENT, 0},
		{"invalid key", &idem.KeyError{Field: idemrpc.KeyField, Value: "", Reason: "empty"}, code.Code_INVALID_ARGUMENT, 0},
		{"principal", &idemrpc.PrincipalError{Err: errors.New("no token")}, code.Code_UNAUTHENTICATED, 0},
		{"in progress", &idem.InProgressError{LeaseUntil: now.Add(2500 * time.Millisecond)}, code.Code_ABORTED, 2500 * time.Millisecond},
		{"mismatch", &idem.MismatchError{}, code.Code_FAILED_PRECONDITION, 0},
		{"held for an operator", &idem.HeldError{Key: "k", LeaseUntil: now.Add(-time.Second)}, code.Code_FAILED_PRECONDITION, 0},
		{"stored status", &idem.TerminalError{Code: "grpc.PERMISSION_DENIED", Body: stored, Replayed: true}, code.Code_PERMISSION_DENIED, 0},
		{"stored, no status", &idem.TerminalError{Code: "x", Message: "m", Replayed: true}, code.Code_UNKNOWN, 0},
		{"result too large", &idem.TerminalError{Code: idem.CodeResultTooLarge, Replayed: true}, code.Code_DATA_LOSS, 0},
		{"corrupt record", &store.CorruptError{Key: "k"}, code.Code_DATA_LOSS, 0},
		{"stored response unreadable", &idemrpc.ResponseError{Key: "k", Err: errors.New("x")}, code.Code_DATA_LOSS, 0},
		{"store", &idem.StoreError{Err: store.ErrUnavailable}, code.Code_UNAVAILABLE, 7 * time.Second},
		{"streaming", &idemrpc.StreamingMethodError{Method: "/a.B/C"}, code.Code_UNIMPLEMENTED, 0},
		{"request not proto", &idemrpc.MessageError{Method: "/a.B/C", Type: "string"}, code.Code_INTERNAL, 0},
		{"cancelled", fmt.Errorf("x: %w", context.Canceled), code.Code_CANCELLED, 0},
		{"deadline", context.DeadlineExceeded, code.Code_DEADLINE_EXCEEDED, 0},
		{"other", errors.New("boom"), code.Code_INTERNAL, 0},
	} {
		st := idemrpc.StatusFor(c.err, now, 7*time.Second)
		if code.Code(st.GetCode()) != c.code {
			t.Errorf("%s: %v, want %v", c.name, code.Code(st.GetCode()), c.code)
		}
		var delay time.Duration
		for _, d := range st.GetDetails() {
			var ri errdetails.RetryInfo
			if d.MessageIs(&ri) && d.UnmarshalTo(&ri) == nil {
				delay = ri.GetRetryDelay().AsDuration()
			}
		}
		if delay != c.delay {
			t.Errorf("%s: retry delay %v, want %v", c.name, delay, c.delay)
		}
		if st.GetMessage() == "" && c.name != "stored, no status" {
			t.Errorf("%s: no message", c.name)
		}
	}
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	if k, err := idemrpc.ParseKey([]string{"8c1e-4a"}); k != "8c1e-4a" || err != nil {
		t.Errorf("valid key: %q, %v", k, err)
	}
	if _, err := idemrpc.ParseKey(nil); !errors.Is(err, idemrpc.ErrMissingKey) {
		t.Errorf("no key: %v", err)
	}
	for _, v := range [][]string{{""}, {"a", "b"}, {strings.Repeat("k", idemrpc.MaxKeyLen+1)}, {"a\x00b"}, {"clé"}, {" a"}, {"a "}} {
		var ke *idem.KeyError
		if _, err := idemrpc.ParseKey(v); !errors.As(err, &ke) || !errors.Is(err, idem.ErrInvalidKey) || ke.Field != idemrpc.KeyField || ke.Reason == "" {
			t.Errorf("%q: %v, want an *idem.KeyError", v, err)
		}
	}
	if k := idemrpc.NewKey(); len(k) != 32 || k == idemrpc.NewKey() {
		t.Errorf("NewKey %q", k)
	}
}

// Bad configuration is refused, naming the field.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	eng, err := idem.New(memstore.New(&memstore.Config{SweepInterval: -1}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idemrpc.New(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil engine: %v", err)
	}
	for name, cfg := range map[string]idemrpc.Config{
		"KeyMetadata":         {KeyMetadata: "Idempotency-Key"},
		"binary KeyMetadata":  {KeyMetadata: "key-bin"},
		"StoreRetryAfter":     {StoreRetryAfter: -time.Second},
		"Default.Operation":   {Default: idemrpc.Method{Operation: "x"}},
		"method name":         {Methods: map[string]idemrpc.Method{"Orders.Create": {}}},
		"operation":           {Methods: map[string]idemrpc.Method{"/a.B/C": {Operation: "has space"}}},
		"FingerprintMetadata": {Methods: map[string]idemrpc.Method{"/a.B/C": {FingerprintMetadata: []string{"X-Region"}}}},
	} {
		if _, err := idemrpc.New(eng, &cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := idemrpc.NewClient(&idemrpc.ClientConfig{Methods: []string{"nope"}}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("client method name: %v", err)
	}
	if _, err := idemrpc.NewClient(&idemrpc.ClientConfig{KeyMetadata: "grpc-key"}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("client KeyMetadata: %v", err)
	}
}

func TestDefaultTerminal(t *testing.T) {
	t.Parallel()
	var final []string
	for c := code.Code_OK; c <= code.Code_UNAUTHENTICATED; c++ {
		if idemrpc.DefaultTerminal(c) {
			final = append(final, c.String())
		}
	}
	want := "INVALID_ARGUMENT NOT_FOUND ALREADY_EXISTS PERMISSION_DENIED FAILED_PRECONDITION OUT_OF_RANGE"
	if got := strings.Join(final, " "); got != want {
		t.Errorf("terminal codes %s, want %s", got, want)
	}
}

// A malformed or repeated key fails the Guard with an *idem.KeyError, the
// one error of key validation, matching idem.ErrInvalidKey, before the
// handler runs; StatusFor answers it INVALID_ARGUMENT with the message and
// BadRequest detail it has always had.
func TestInvalidKeyIsTheEngineKeyError(t *testing.T) {
	t.Parallel()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	eng, err := idem.New(mem, nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := idemrpc.New(eng, &idemrpc.Config{Methods: map[string]idemrpc.Method{"/shop.v1.Orders/Create": {}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		keys    []string
		message string
	}{
		{[]string{" k"}, `idemrpc: invalid idempotency key " k": leading or trailing space`},
		{[]string{"a", "b"}, `idemrpc: invalid idempotency key "a, b": sent 2 times; send exactly one`},
	} {
		out, err := g.Do(context.Background(), idemrpc.Call{
			Method:   "/shop.v1.Orders/Create",
			Metadata: func(string) []string { return c.keys },
			Request:  &spb.Status{},
		}, func(context.Context) (proto.Message, error) {
			t.Errorf("%q: the handler ran", c.keys)
			return &spb.Status{}, nil
		})
		var ke *idem.KeyError
		if out.Ran || !errors.As(err, &ke) || ke.Field != idemrpc.KeyField || !errors.Is(err, idem.ErrInvalidKey) {
			t.Fatalf("%q: ran %v, %v (%T); want an *idem.KeyError matching idem.ErrInvalidKey", c.keys, out.Ran, err, err)
		}
		st := idemrpc.StatusFor(err, time.Now(), time.Second)
		var br errdetails.BadRequest
		if code.Code(st.GetCode()) != code.Code_INVALID_ARGUMENT || st.GetMessage() != c.message ||
			len(st.GetDetails()) != 1 || st.GetDetails()[0].UnmarshalTo(&br) != nil ||
			br.GetFieldViolations()[0].GetDescription() != ke.Reason {
			t.Errorf("%q: status %v, want INVALID_ARGUMENT %q with a BadRequest saying %q", c.keys, st, c.message, ke.Reason)
		}
	}
}
