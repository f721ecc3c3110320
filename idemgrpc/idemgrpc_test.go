package idemgrpc_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemgrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/internal/ordertest"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// call makes a Create call and returns its response, error and header.
func call(t testing.TB, e *env, ctx context.Context, in *structpb.Struct) (*structpb.Struct, metadata.MD, error) {
	t.Helper()
	var header metadata.MD
	out, err := ordertest.Call(ctx, e.cc, ordertest.Create, in, grpc.Header(&header))
	return out, header, err
}

// receipt makes the handler answer a receipt numbered by execution.
func receipt(e *env) {
	e.orders.CreateFunc = func(_ context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		return structpb.NewStruct(map[string]any{"order": in.Fields["order"].GetStringValue(), "receipt": float64(e.orders.Creates.Load())})
	}
}

// First call: the handler runs and its response is not marked replayed;
// the same key again: the stored response, marked replayed, the handler
// not run again.
func TestNewAndReplay(t *testing.T) {
	t.Parallel()
	for _, b := range ordertest.Backends(redisAddr) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b.Store(t), options{noClient: true})
			receipt(e)
			out, h, err := call(t, e, keyed("k-1"), ordertest.Order("o-1", 10))
			if err != nil {
				t.Fatal(err)
			}
			if idemgrpc.Replayed(h) {
				t.Error("first call marked replayed")
			}
			if got := out.Fields["receipt"].GetNumberValue(); got != 1 {
				t.Errorf("receipt %v, want 1", got)
			}
			for range 3 {
				again, h, err := call(t, e, keyed("k-1"), ordertest.Order("o-1", 10))
				if err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(again, out) {
					t.Errorf("replay %v, want %v", again, out)
				}
				if !idemgrpc.Replayed(h) {
					t.Errorf("replay header %v lacks %s: true", h, idemrpc.ReplayedMetadata)
				}
			}
			if n := e.orders.Creates.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
			// Another key is another call.
			if out, _, err := call(t, e, keyed("k-2"), ordertest.Order("o-1", 10)); err != nil || out.Fields["receipt"].GetNumberValue() != 2 {
				t.Errorf("another key: %v, %v; want receipt 2", out, err)
			}
		})
	}
}

// Many concurrent calls with one key: the handler runs once; while it
// runs, every duplicate gets ABORTED with a RetryInfo delay (and gRPC's
// retry pushback); afterwards, the stored response.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	for _, b := range ordertest.Backends(redisAddr) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b.Store(t), options{noClient: true})
			entered, release := make(chan struct{}), make(chan struct{})
			e.orders.CreateFunc = func(_ context.Context, in *structpb.Struct) (*structpb.Struct, error) {
				close(entered)
				<-release
				return in, nil
			}
			first := make(chan error, 1)
			go func() {
				_, _, err := call(t, e, keyed("dup"), ordertest.Order("o-1", 5))
				first <- err
			}()
			<-entered
			const dups = 16
			var wg sync.WaitGroup
			for range dups {
				wg.Go(func() {
					var trailer metadata.MD
					_, err := ordertest.Call(keyed("dup"), e.cc, ordertest.Create, ordertest.Order("o-1", 5), grpc.Trailer(&trailer))
					st := status.Convert(err)
					if st.Code() != codes.Aborted {
						t.Errorf("duplicate in progress: %v, want ABORTED", err)
						return
					}
					if d := retryDelay(st); d <= 0 {
						t.Errorf("duplicate in progress: no RetryInfo delay in %v", st.Details())
					}
					if v := trailer.Get(idemgrpc.PushbackMetadata); len(v) != 1 {
						t.Errorf("no %s trailer: %v", idemgrpc.PushbackMetadata, trailer)
					} else if ms, err := strconv.Atoi(v[0]); err != nil || ms <= 0 {
						t.Errorf("%s %q", idemgrpc.PushbackMetadata, v[0])
					}
				})
			}
			wg.Wait()
			close(release)
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			if _, h, err := call(t, e, keyed("dup"), ordertest.Order("o-1", 5)); err != nil || !idemgrpc.Replayed(h) {
				t.Errorf("after the first finished: %v, replayed %v; want the stored response", err, idemgrpc.Replayed(h))
			}
			if n := e.orders.Creates.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}

// Many calls with one key released at once, the handler not held: one
// execution; every other answer is the same response replayed, or ABORTED.
func TestConcurrentDuplicatesRace(t *testing.T) {
	t.Parallel()
	for _, b := range ordertest.Backends(redisAddr) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b.Store(t), options{noClient: true})
			receipt(e)
			const calls = 32
			start := make(chan struct{})
			var wg sync.WaitGroup
			var ok, aborted atomic.Int64
			for range calls {
				wg.Go(func() {
					<-start
					out, _, err := call(t, e, keyed("race"), ordertest.Order("o-1", 5))
					switch {
					case err == nil && out.Fields["receipt"].GetNumberValue() == 1:
						ok.Add(1)
					case status.Code(err) == codes.Aborted:
						aborted.Add(1)
					default:
						t.Errorf("call: %v, %v", out, err)
					}
				})
			}
			close(start)
			wg.Wait()
			if n := e.orders.Creates.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
			if ok.Load() < 1 || ok.Load()+aborted.Load() != calls {
				t.Errorf("%d responses and %d ABORTED of %d calls", ok.Load(), aborted.Load(), calls)
			}
		})
	}
}

func retryDelay(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// The same key with another request (message, or fingerprinted metadata)
// is FAILED_PRECONDITION with a PreconditionFailure; the handler does not
// run.
func TestMismatch(t *testing.T) {
	t.Parallel()
	for _, b := range ordertest.Backends(redisAddr) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b.Store(t), options{noClient: true, guard: &idemrpc.Config{Methods: map[string]idemrpc.Method{
				ordertest.Create: {FingerprintMetadata: []string{"x-tenant-region"}},
			}}})
			ctx := metadata.AppendToOutgoingContext(keyed("m-1"), "x-tenant-region", "eu")
			if _, _, err := call(t, e, ctx, ordertest.Order("o-1", 10)); err != nil {
				t.Fatal(err)
			}
			for name, ctx := range map[string]context.Context{
				"message":  ctx,
				"metadata": metadata.AppendToOutgoingContext(keyed("m-1"), "x-tenant-region", "us"),
			} {
				in := ordertest.Order("o-1", 10)
				if name == "message" {
					in = ordertest.Order("o-1", 11)
				}
				_, _, err := call(t, e, ctx, in)
				st := status.Convert(err)
				if st.Code() != codes.FailedPrecondition {
					t.Errorf("%s differs: %v, want FAILED_PRECONDITION", name, err)
					continue
				}
				var pf *errdetails.PreconditionFailure
				for _, d := range st.Details() {
					pf, _ = d.(*errdetails.PreconditionFailure)
				}
				if pf == nil || pf.GetViolations()[0].GetType() != "IDEMPOTENCY_KEY_REUSED" {
					t.Errorf("%s differs: details %v, want a PreconditionFailure IDEMPOTENCY_KEY_REUSED", name, st.Details())
				}
			}
			// Struct fields are a map: their order on the wire does not
			// matter (deterministic encoding sorts them).
			in := &structpb.Struct{Fields: map[string]*structpb.Value{"amount": structpb.NewNumberValue(10), "order": structpb.NewStringValue("o-1")}}
			if _, h, err := call(t, e, ctx, in); err != nil || !idemgrpc.Replayed(h) {
				t.Errorf("same request rebuilt: %v, replayed %v", err, idemgrpc.Replayed(h))
			}
			if n := e.orders.Creates.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}

// A store that cannot be reached: UNAVAILABLE with a RetryInfo delay, and
// the handler does not run.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	for name, st := range map[string]func(t testing.TB) store.Store{
		"memstore": func(t testing.TB) store.Store {
			fs := faultstore.New(memstore.New(&memstore.Config{SweepInterval: -1}))
			fs.FailAlways("claim", store.ErrUnavailable)
			t.Cleanup(func() { fs.Inner.(*memstore.Store).Close() })
			return fs
		},
		"redis": func(t testing.TB) store.Store {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := lis.Addr().String()
			lis.Close() // nothing listens there any more
			return ordertest.RedisStore(t, addr)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, st(t), options{noClient: true, guard: &idemrpc.Config{
				Methods:         map[string]idemrpc.Method{ordertest.Create: {}},
				StoreRetryAfter: 2 * time.Second,
			}})
			_, _, err := call(t, e, keyed("down"), ordertest.Order("o-1", 10))
			s := status.Convert(err)
			if s.Code() != codes.Unavailable {
				t.Fatalf("store down: %v, want UNAVAILABLE", err)
			}
			if d := retryDelay(s); d != 2*time.Second {
				t.Errorf("retry delay %v, want StoreRetryAfter 2s", d)
			}
			if n := e.orders.Creates.Load(); n != 0 {
				t.Errorf("handler ran %d times with the store down, want 0", n)
			}
		})
	}
}

// A terminal error (a code Config.Terminal keeps, or one marked with
// idem.Terminal) is stored and replayed with its code, message and
// details; an ordinary error releases the key, and a retry runs the
// handler again.
func TestTerminalErrorReplayed(t *testing.T) {
	t.Parallel()
	for _, b := range ordertest.Backends(redisAddr) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b.Store(t), options{noClient: true})
			declined := func() error {
				st, err := status.New(codes.FailedPrecondition, "card declined").WithDetails(
					&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example", Metadata: map[string]string{"card": "4242"}})
				if err != nil {
					t.Fatal(err)
				}
				return st.Err()
			}
			e.orders.CreateFunc = func(_ context.Context, in *structpb.Struct) (*structpb.Struct, error) {
				switch in.Fields["order"].GetStringValue() {
				case "declined":
					return nil, declined()
				case "marked":
					return nil, idem.Terminal(status.Error(codes.Internal, "ledger refused the entry"), "ledger_refused")
				case "flaky":
					return nil, status.Error(codes.Unavailable, "bank timed out")
				}
				return in, nil
			}
			check := func(t *testing.T, err error, h metadata.MD, code codes.Code, msg string, replayed bool) *status.Status {
				t.Helper()
				st := status.Convert(err)
				if st.Code() != code || st.Message() != msg {
					t.Errorf("got %v, want %v %q", err, code, msg)
				}
				if idemgrpc.Replayed(h) != replayed {
					t.Errorf("replayed %v, want %v (header %v)", idemgrpc.Replayed(h), replayed, h)
				}
				return st
			}
			_, h, err := call(t, e, keyed("t-1"), ordertest.Order("declined", 1))
			first := check(t, err, h, codes.FailedPrecondition, "card declined", false)
			_, h, err = call(t, e, keyed("t-1"), ordertest.Order("declined", 1))
			again := check(t, err, h, codes.FailedPrecondition, "card declined", true)
			if !proto.Equal(first.Proto(), again.Proto()) {
				t.Errorf("replayed status %v, want %v", again.Proto(), first.Proto())
			}
			if len(again.Details()) != 1 || again.Details()[0].(*errdetails.ErrorInfo).GetReason() != "CARD_DECLINED" {
				t.Errorf("replayed details %v, want the ErrorInfo", again.Details())
			}

			_, h, err = call(t, e, keyed("t-2"), ordertest.Order("marked", 1))
			check(t, err, h, codes.Internal, "ledger refused the entry", false)
			_, h, err = call(t, e, keyed("t-2"), ordertest.Order("marked", 1))
			check(t, err, h, codes.Internal, "ledger refused the entry", true)

			_, h, err = call(t, e, keyed("t-3"), ordertest.Order("flaky", 1))
			check(t, err, h, codes.Unavailable, "bank timed out", false)
			_, h, err = call(t, e, keyed("t-3"), ordertest.Order("flaky", 1))
			check(t, err, h, codes.Unavailable, "bank timed out", false)

			if n := e.orders.Creates.Load(); n != 4 {
				t.Errorf("handler ran %d times, want 4: once per terminal key, twice for the released one", n)
			}
			// The stored record names the status code for operators.
			k, _ := idem.NewStoreKey("idem.test.v1.Orders.Create", "", []byte("t-1"))
			rec, err := e.eng.Status(context.Background(), k)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Status != idem.StatusFailed || rec.Err.Code != "grpc.FAILED_PRECONDITION" {
				t.Errorf("record %v %+v, want FAILED with code grpc.FAILED_PRECONDITION", rec.Status, rec.Err)
			}
		})
	}
}

// A client with gRPC's retry policy on, and a server that fails the first
// attempt after running it (the response is lost on the way back): the
// client interceptor's key is the same on every attempt, so the retry
// gets the stored response and the operation runs once. Without the
// Guard, the same client runs it twice.
func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	const serviceConfig = `{"methodConfig": [{
		"name": [{"service": "idem.test.v1.Orders"}],
		"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
			"backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`
	// loseFirst runs the call and, on the first attempt, answers
	// UNAVAILABLE in place of its response.
	loseFirst := func(attempts *atomic.Int64) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			resp, err := handler(ctx, req)
			if attempts.Add(1) == 1 {
				return nil, status.Error(codes.Unavailable, "connection reset after the work was done")
			}
			return resp, err
		}
	}
	for _, b := range ordertest.Backends(redisAddr) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			var attempts atomic.Int64
			e := newEnv(t, b.Store(t), options{
				outer:       []grpc.UnaryServerInterceptor{loseFirst(&attempts)},
				dialOptions: []grpc.DialOption{grpc.WithDefaultServiceConfig(serviceConfig)},
			})
			receipt(e)
			out, h, err := call(t, e, context.Background(), ordertest.Order("o-1", 10))
			if err != nil {
				t.Fatal(err)
			}
			if attempts.Load() != 2 {
				t.Errorf("%d attempts, want 2: the retry policy did not retry", attempts.Load())
			}
			if n := e.orders.Creates.Load(); n != 1 {
				t.Errorf("handler ran %d times across the client's retries, want 1", n)
			}
			if !idemgrpc.Replayed(h) || out.Fields["receipt"].GetNumberValue() != 1 {
				t.Errorf("answer %v, replayed %v; want the first execution's response, replayed", out, idemgrpc.Replayed(h))
			}
		})
	}
	t.Run("without the guard", func(t *testing.T) {
		t.Parallel()
		var attempts atomic.Int64
		e := newEnv(t, memstore.New(&memstore.Config{SweepInterval: -1}), options{
			guard:       &idemrpc.Config{}, // covers nothing
			outer:       []grpc.UnaryServerInterceptor{loseFirst(&attempts)},
			dialOptions: []grpc.DialOption{grpc.WithDefaultServiceConfig(serviceConfig)},
		})
		if _, _, err := call(t, e, context.Background(), ordertest.Order("o-1", 10)); err != nil {
			t.Fatal(err)
		}
		if n := e.orders.Creates.Load(); n != 2 {
			t.Errorf("handler ran %d times, want 2: the test would not tell the Guard's effect", n)
		}
	})
}

// Keys: a missing key runs the call unprotected unless the method requires
// one (INVALID_ARGUMENT); a malformed or repeated key is INVALID_ARGUMENT
// with a BadRequest detail.
func TestKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, memstore.New(&memstore.Config{SweepInterval: -1}), options{noClient: true, guard: &idemrpc.Config{
		Methods: map[string]idemrpc.Method{ordertest.Create: {}, ordertest.Get: {Required: true}},
	}})
	for range 2 {
		if _, h, err := call(t, e, context.Background(), ordertest.Order("o", 1)); err != nil || idemgrpc.Replayed(h) {
			t.Errorf("no key: %v, replayed %v", err, idemgrpc.Replayed(h))
		}
	}
	if n := e.orders.Creates.Load(); n != 2 {
		t.Errorf("unkeyed calls ran %d times, want 2", n)
	}
	if _, err := ordertest.Call(context.Background(), e.cc, ordertest.Get, ordertest.Order("o", 1)); status.Code(err) != codes.InvalidArgument {
		t.Errorf("required key missing: %v, want INVALID_ARGUMENT", err)
	}
	for name, ctx := range map[string]context.Context{
		"too long":      keyed(strings.Repeat("k", 256)),
		"twice":         metadata.AppendToOutgoingContext(keyed("a"), idemrpc.DefaultKeyMetadata, "b"),
		"leading space": keyed(" k"),
	} {
		_, _, err := call(t, e, ctx, ordertest.Order("o", 1))
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || len(st.Details()) != 1 {
			t.Errorf("%s: %v %v, want INVALID_ARGUMENT with a BadRequest", name, err, st.Details())
		}
	}
	if n := e.orders.Creates.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2", n)
	}
}

// The principal scopes the key: two callers with one key get their own
// records; a refused principal is UNAUTHENTICATED.
func TestPrincipal(t *testing.T) {
	t.Parallel()
	who := func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-user"); len(v) == 1 {
			return v[0], nil
		}
		return "", errors.New("no x-user")
	}
	e := newEnv(t, memstore.New(&memstore.Config{SweepInterval: -1}), options{noClient: true, guard: &idemrpc.Config{
		Methods: map[string]idemrpc.Method{ordertest.Create: {}}, Principal: who,
	}})
	receipt(e)
	as := func(user string) context.Context {
		return metadata.AppendToOutgoingContext(keyed("shared"), "x-user", user)
	}
	a, _, err := call(t, e, as("alice"), ordertest.Order("o", 1))
	if err != nil {
		t.Fatal(err)
	}
	b, h, err := call(t, e, as("bob"), ordertest.Order("o", 1))
	if err != nil || idemgrpc.Replayed(h) || proto.Equal(a, b) {
		t.Errorf("bob with alice's key: %v, %v, replayed %v; want his own execution", b, err, idemgrpc.Replayed(h))
	}
	if _, _, err := call(t, e, keyed("shared"), ordertest.Order("o", 1)); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no principal: %v, want UNAUTHENTICATED", err)
	}
}

// ByIdempotencyLevel covers the methods whose descriptor leaves
// idempotency_level unset (Create), not those marked NO_SIDE_EFFECTS (Get).
func TestByIdempotencyLevel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, memstore.New(&memstore.Config{SweepInterval: -1}), options{noClient: true, guard: &idemrpc.Config{
		ByIdempotencyLevel: true, Default: idemrpc.Method{Required: true},
	}})
	for range 2 {
		if _, err := ordertest.Call(keyed("lv"), e.cc, ordertest.Create, ordertest.Order("o", 1)); err != nil {
			t.Fatal(err)
		}
		if _, err := ordertest.Call(keyed("lv"), e.cc, ordertest.Get, ordertest.Order("o", 1)); err != nil {
			t.Fatal(err)
		}
	}
	if c, g := e.orders.Creates.Load(), e.orders.Gets.Load(); c != 1 || g != 2 {
		t.Errorf("Create ran %d times (want 1, covered), Get %d (want 2, NO_SIDE_EFFECTS)", c, g)
	}
	if _, err := ordertest.Call(context.Background(), e.cc, ordertest.Create, ordertest.Order("o", 1)); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Default.Required, no key: %v, want INVALID_ARGUMENT", err)
	}
}

// Streaming methods are refused with a typed configuration error: by New
// when the descriptor says so, by Check against the server, and at call
// time (UNIMPLEMENTED) when neither was asked.
func TestStreamingRefused(t *testing.T) {
	t.Parallel()
	eng, err := idem.New(memstore.New(&memstore.Config{SweepInterval: -1}), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = idemrpc.New(eng, &idemrpc.Config{Files: ordertest.Files, Methods: map[string]idemrpc.Method{ordertest.Watch: {}}})
	var se *idemrpc.StreamingMethodError
	if !errors.As(err, &se) || se.Method != ordertest.Watch || !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("New with a streaming method: %v, want a StreamingMethodError matching ErrInvalidConfig", err)
	}

	// Descriptors not found (an empty registry): New cannot tell.
	e := newEnv(t, memstore.New(&memstore.Config{SweepInterval: -1}), options{noClient: true, guard: &idemrpc.Config{
		Files:   new(protoregistry.Files),
		Methods: map[string]idemrpc.Method{ordertest.Watch: {}, "/idem.test.v1.Orders/Crate": {}},
	}})
	err = idemgrpc.Check(e.guard, e.srv)
	var me *idemgrpc.MethodError
	if !errors.As(err, &se) || !errors.As(err, &me) || me.Method != "/idem.test.v1.Orders/Crate" || !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("Check: %v, want a StreamingMethodError and a MethodError", err)
	}
	st, err := e.cc.NewStream(keyed("s"), &grpc.StreamDesc{ServerStreams: true}, ordertest.Watch)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SendMsg(ordertest.Order("o", 1)); err != nil {
		t.Fatal(err)
	}
	_ = st.CloseSend()
	if err := st.RecvMsg(new(structpb.Struct)); status.Code(err) != codes.Unimplemented {
		t.Errorf("streaming call: %v, want UNIMPLEMENTED", err)
	}
}

// A call made inside an idem operation gets the claim's DownstreamKey, the
// same when the operation runs again; a key already set is kept.
func TestClientKey(t *testing.T) {
	t.Parallel()
	var seen []string
	var mu sync.Mutex
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		seen = append(seen, md.Get(idemrpc.DefaultKeyMetadata)...)
		mu.Unlock()
		return handler(ctx, req)
	}
	e := newEnv(t, memstore.New(&memstore.Config{SweepInterval: -1}), options{outer: []grpc.UnaryServerInterceptor{record}})
	// The operation runs twice: its first run fails (the key is released)
	// and the retry runs it again, under a new claim of the same key.
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	ops, err := idem.New(mem, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ctx context.Context
	for run := range 2 {
		_, err := idem.Do(context.Background(), ops, idem.Request{Operation: "charge", Key: "abc"}, func(opCtx context.Context) (int, error) {
			ctx = opCtx
			if _, _, err := call(t, e, opCtx, ordertest.Order("o", 1)); err != nil {
				t.Fatal(err)
			}
			if run == 0 {
				return 0, errors.New("try again")
			}
			return 1, nil
		})
		if run == 1 && err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := call(t, e, keyed("mine"), ordertest.Order("o", 1)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := call(t, e, context.Background(), ordertest.Order("o", 1)); err != nil {
		t.Fatal(err)
	}
	cl, _ := idem.FromContext(ctx)
	want := cl.DownstreamKey(ordertest.Create)
	if len(seen) != 4 || seen[0] != want || seen[1] != want || seen[2] != "mine" || seen[3] == want || len(seen[3]) != 32 {
		t.Errorf("keys sent %q, want the downstream key %q twice, then mine, then a new one", seen, want)
	}
	if n := e.orders.Creates.Load(); n != 3 {
		t.Errorf("handler ran %d times, want 3", n)
	}
}

// A call of another codec than protobuf's (its request and response no
// proto.Message) runs through the Guard where it does not cover the call
// (another method, or no key where none is required), and the handler's
// answer goes back as it is; a covered call with a key is refused with
// INTERNAL, the handler not run. A protobuf call's response goes back as
// the very message the handler returned.
func TestOtherCodec(t *testing.T) {
	t.Parallel()
	st := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	eng, err := idem.New(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := idemrpc.New(eng, &idemrpc.Config{Files: ordertest.Files, Methods: map[string]idemrpc.Method{ordertest.Create: {}},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	icpt := idemgrpc.UnaryServerInterceptor(g)
	var runs int
	handler := func(_ context.Context, req any) (any, error) {
		runs++
		if m, ok := req.(*structpb.Struct); ok {
			return m, nil
		}
		return "answer to " + req.(string), nil
	}
	keyed := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemrpc.DefaultKeyMetadata, "k"))
	for name, c := range map[string]struct {
		ctx    context.Context
		method string
	}{
		"method not covered": {keyed, ordertest.Get},
		"no key":             {context.Background(), ordertest.Create},
	} {
		res, err := icpt(c.ctx, "req", &grpc.UnaryServerInfo{FullMethod: c.method}, handler)
		if err != nil || res != "answer to req" {
			t.Errorf("%s: %v, %v; want the handler's answer", name, res, err)
		}
		in := ordertest.Order("o-1", 1)
		if res, err := icpt(c.ctx, in, &grpc.UnaryServerInfo{FullMethod: c.method}, handler); err != nil || res != any(in) {
			t.Errorf("%s, protobuf: %v, %v; want the handler's own message", name, res, err)
		}
	}
	before := runs
	res, err := icpt(keyed, "req", &grpc.UnaryServerInfo{FullMethod: ordertest.Create}, handler)
	if status.Code(err) != codes.Internal || res != nil || runs != before {
		t.Errorf("covered call with a key: %v, %v, %d runs; want INTERNAL and no run", res, err, runs-before)
	}
}
