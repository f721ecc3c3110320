package idemconnect_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemconnect"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/internal/ordertest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// redisAddr is the Redis the tests run on: skipped outside CI when none
// answers, failing in CI.
func redisAddr(t testing.TB) string {
	return testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
}

// env is ordertest's service over Connect behind a Guard, on a real HTTP
// server on loopback, and clients of it.
type env struct {
	orders *ordertest.Server
	eng    *idem.Engine
	url    string
	http   *http.Client
	create *connect.Client[structpb.Struct, structpb.Struct]
}

func newEnv(t testing.TB, st store.Store, cfg *idemrpc.Config) *env {
	t.Helper()
	eng, err := idem.New(st, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = &idemrpc.Config{Methods: map[string]idemrpc.Method{ordertest.Create: {}}}
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	g, err := idemrpc.New(eng, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{orders: &ordertest.Server{}, eng: eng}
	srv := httptest.NewServer(ordertest.ConnectHandler(e.orders, connect.WithInterceptors(idemconnect.NewInterceptor(g))))
	t.Cleanup(srv.Close)
	e.url, e.http = srv.URL, srv.Client()
	t.Cleanup(e.http.CloseIdleConnections)
	e.create = connect.NewClient[structpb.Struct, structpb.Struct](e.http, e.url+ordertest.Create)
	return e
}

func (e *env) call(key string, in *structpb.Struct) (*connect.Response[structpb.Struct], error) {
	req := connect.NewRequest(in)
	if key != "" {
		req.Header().Set("Idempotency-Key", key)
	}
	return e.create.CallUnary(context.Background(), req)
}

func replayed(h http.Header) bool { return h.Get(idemconnect.ReplayedHeader) == "true" }

func TestNewAndReplay(t *testing.T) {
	t.Parallel()
	for _, b := range ordertest.Backends(redisAddr) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b.Store(t), nil)
			e.orders.CreateFunc = func(_ context.Context, in *structpb.Struct) (*structpb.Struct, error) {
				return structpb.NewStruct(map[string]any{"receipt": float64(e.orders.Creates.Load())})
			}
			first, err := e.call("k-1", ordertest.Order("o-1", 10))
			if err != nil {
				t.Fatal(err)
			}
			if replayed(first.Header()) {
				t.Error("first call marked replayed")
			}
			for range 2 {
				again, err := e.call("k-1", ordertest.Order("o-1", 10))
				if err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(again.Msg, first.Msg) || !replayed(again.Header()) {
					t.Errorf("replay %v (header %v), want %v marked replayed", again.Msg, again.Header(), first.Msg)
				}
			}
			if n := e.orders.Creates.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}

// The Connect protocol's JSON codec replays the stored response too.
func TestReplayJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t, memstore.New(&memstore.Config{SweepInterval: -1}), nil)
	c := connect.NewClient[structpb.Struct, structpb.Struct](e.http, e.url+ordertest.Create, connect.WithProtoJSON())
	var got []*structpb.Struct
	for range 2 {
		req := connect.NewRequest(ordertest.Order("o-1", 10))
		req.Header().Set("Idempotency-Key", "json")
		res, err := c.CallUnary(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, res.Msg)
	}
	if !proto.Equal(got[0], got[1]) || e.orders.Creates.Load() != 1 {
		t.Errorf("JSON replay %v, want %v, one execution (ran %d)", got[1], got[0], e.orders.Creates.Load())
	}
}

func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	for _, b := range ordertest.Backends(redisAddr) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b.Store(t), nil)
			entered, release := make(chan struct{}), make(chan struct{})
			e.orders.CreateFunc = func(_ context.Context, in *structpb.Struct) (*structpb.Struct, error) {
				close(entered)
				<-release
				return in, nil
			}
			first := make(chan error, 1)
			go func() {
				_, err := e.call("dup", ordertest.Order("o-1", 5))
				first <- err
			}()
			<-entered
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					_, err := e.call("dup", ordertest.Order("o-1", 5))
					var ce *connect.Error
					if !errors.As(err, &ce) || ce.Code() != connect.CodeAborted {
						t.Errorf("duplicate in progress: %v, want aborted", err)
						return
					}
					var ri *errdetails.RetryInfo
					for _, d := range ce.Details() {
						if v, err := d.Value(); err == nil {
							ri, _ = v.(*errdetails.RetryInfo)
						}
					}
					if ri.GetRetryDelay().AsDuration() <= 0 {
						t.Errorf("duplicate in progress: no RetryInfo delay in %v", ce.Details())
					}
				})
			}
			wg.Wait()
			close(release)
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			if n := e.orders.Creates.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}

func TestConcurrentDuplicatesRace(t *testing.T) {
	t.Parallel()
	for _, b := range ordertest.Backends(redisAddr) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b.Store(t), nil)
			const calls = 16
			start := make(chan struct{})
			var wg sync.WaitGroup
			var ok atomic.Int64
			for range calls {
				wg.Go(func() {
					<-start
					_, err := e.call("race", ordertest.Order("o-1", 5))
					switch {
					case err == nil:
						ok.Add(1)
					case connect.CodeOf(err) != connect.CodeAborted:
						t.Errorf("call: %v", err)
					}
				})
			}
			close(start)
			wg.Wait()
			if n := e.orders.Creates.Load(); n != 1 || ok.Load() < 1 {
				t.Errorf("handler ran %d times (want 1), %d calls answered", n, ok.Load())
			}
		})
	}
}

func TestMismatch(t *testing.T) {
	t.Parallel()
	for _, b := range ordertest.Backends(redisAddr) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b.Store(t), nil)
			if _, err := e.call("m", ordertest.Order("o-1", 10)); err != nil {
				t.Fatal(err)
			}
			_, err := e.call("m", ordertest.Order("o-1", 11))
			if connect.CodeOf(err) != connect.CodeFailedPrecondition {
				t.Errorf("another request with the key: %v, want failed_precondition", err)
			}
			if n := e.orders.Creates.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}

func TestStoreDown(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	e := newEnv(t, ordertest.RedisStore(t, addr), nil)
	_, err = e.call("down", ordertest.Order("o-1", 10))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("store down: %v, want unavailable", err)
	}
	if n := e.orders.Creates.Load(); n != 0 {
		t.Errorf("handler ran %d times with the store down, want 0", n)
	}
}

// A terminal error is stored and replayed with its code, message and
// details, marked replayed; an ordinary one releases the key.
func TestTerminalErrorReplayed(t *testing.T) {
	t.Parallel()
	for _, b := range ordertest.Backends(redisAddr) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, b.Store(t), nil)
			e.orders.CreateFunc = func(_ context.Context, in *structpb.Struct) (*structpb.Struct, error) {
				if in.Fields["order"].GetStringValue() == "flaky" {
					return nil, connect.NewError(connect.CodeUnavailable, errors.New("bank timed out"))
				}
				ce := connect.NewError(connect.CodeInvalidArgument, errors.New("amount over the limit"))
				d, err := connect.NewErrorDetail(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount", Description: "over 100"}}})
				if err != nil {
					return nil, err
				}
				ce.AddDetail(d)
				return nil, ce
			}
			var errs []*connect.Error
			for range 2 {
				_, err := e.call("t", ordertest.Order("big", 1000))
				var ce *connect.Error
				if !errors.As(err, &ce) {
					t.Fatalf("got %v, want a *connect.Error", err)
				}
				errs = append(errs, ce)
			}
			for i, ce := range errs {
				if ce.Code() != connect.CodeInvalidArgument || ce.Message() != "amount over the limit" || len(ce.Details()) != 1 {
					t.Errorf("call %d: %v %v, want invalid_argument with its BadRequest", i, ce, ce.Details())
					continue
				}
				v, err := ce.Details()[0].Value()
				if br, ok := v.(*errdetails.BadRequest); err != nil || !ok || br.GetFieldViolations()[0].GetField() != "amount" {
					t.Errorf("call %d: detail %v, %v", i, v, err)
				}
				if got := ce.Meta().Get(idemconnect.ReplayedHeader) == "true"; got != (i == 1) {
					t.Errorf("call %d: replayed %v", i, got)
				}
			}
			for range 2 {
				if _, err := e.call("f", ordertest.Order("flaky", 1)); connect.CodeOf(err) != connect.CodeUnavailable {
					t.Errorf("ordinary error: %v", err)
				}
			}
			if n := e.orders.Creates.Load(); n != 3 {
				t.Errorf("handler ran %d times, want 3: once for the terminal key, twice for the released one", n)
			}
		})
	}
}

// ByIdempotencyLevel reads the descriptor Connect passes (Spec.Schema):
// Create is covered, Get (NO_SIDE_EFFECTS) is not. The client interceptor
// attaches a key; a request that has one keeps it.
func TestByIdempotencyLevelAndClientKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, memstore.New(&memstore.Config{SweepInterval: -1}), &idemrpc.Config{ByIdempotencyLevel: true})
	cl, err := idemrpc.NewClient(nil)
	if err != nil {
		t.Fatal(err)
	}
	icpt := connect.WithInterceptors(idemconnect.NewClientInterceptor(cl))
	create := connect.NewClient[structpb.Struct, structpb.Struct](e.http, e.url+ordertest.Create, icpt)
	get := connect.NewClient[structpb.Struct, structpb.Struct](e.http, e.url+ordertest.Get, icpt)
	for range 2 {
		req := connect.NewRequest(ordertest.Order("o", 1))
		req.Header().Set("Idempotency-Key", "same")
		if _, err := create.CallUnary(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		if _, err := get.CallUnary(context.Background(), connect.NewRequest(ordertest.Order("o", 1))); err != nil {
			t.Fatal(err)
		}
	}
	// No key of its own: the interceptor gives each call a new one.
	res, err := create.CallUnary(context.Background(), connect.NewRequest(ordertest.Order("o", 1)))
	if err != nil || replayed(res.Header()) {
		t.Errorf("a new call: %v, replayed %v", err, err == nil && replayed(res.Header()))
	}
	if c, g := e.orders.Creates.Load(), e.orders.Gets.Load(); c != 2 || g != 2 {
		t.Errorf("Create ran %d times (want 2: one per key), Get %d (want 2)", c, g)
	}
}

// A streaming procedure named for coverage is refused (unimplemented)
// when New could not tell from a descriptor.
func TestStreamingRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, memstore.New(&memstore.Config{SweepInterval: -1}), &idemrpc.Config{
		Files:   ordertest.Files,
		Methods: map[string]idemrpc.Method{ordertest.Create: {}},
	})
	watch := connect.NewClient[structpb.Struct, structpb.Struct](e.http, e.url+ordertest.Watch)
	st, err := watch.CallServerStream(context.Background(), connect.NewRequest(ordertest.Order("o", 1)))
	if err != nil {
		t.Fatal(err)
	}
	for st.Receive() {
	}
	if err := st.Err(); err != nil {
		t.Errorf("uncovered stream: %v", err)
	}
	st.Close()

	eng, err := idem.New(memstore.New(&memstore.Config{SweepInterval: -1}), nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := idemrpc.New(eng, &idemrpc.Config{Files: new(protoregistry.Files), Methods: map[string]idemrpc.Method{ordertest.Watch: {}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	orders := &ordertest.Server{}
	srv := httptest.NewServer(ordertest.ConnectHandler(orders, connect.WithInterceptors(idemconnect.NewInterceptor(g))))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	watch = connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+ordertest.Watch)
	st, err = watch.CallServerStream(context.Background(), connect.NewRequest(ordertest.Order("o", 1)))
	if err == nil {
		for st.Receive() {
		}
		err = st.Err()
		st.Close()
	}
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("covered stream: %v, want unimplemented", err)
	}
}

// Over Connect, Principal reads the caller from the handler context
// (connect.CallInfoForHandlerContext): two callers with one key get their
// own executions.
func TestPrincipal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, memstore.New(&memstore.Config{SweepInterval: -1}), &idemrpc.Config{
		Methods: map[string]idemrpc.Method{ordertest.Create: {}},
		Principal: func(ctx context.Context) (string, error) {
			ci, ok := connect.CallInfoForHandlerContext(ctx)
			if !ok || ci.RequestHeader().Get("X-User") == "" {
				return "", errors.New("no X-User")
			}
			return ci.RequestHeader().Get("X-User"), nil
		},
	})
	as := func(user string) error {
		req := connect.NewRequest(ordertest.Order("o", 1))
		req.Header().Set("Idempotency-Key", "shared")
		if user != "" {
			req.Header().Set("X-User", user)
		}
		_, err := e.create.CallUnary(context.Background(), req)
		return err
	}
	for _, u := range []string{"alice", "bob", "alice"} {
		if err := as(u); err != nil {
			t.Fatalf("%s: %v", u, err)
		}
	}
	if n := e.orders.Creates.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2: once per caller", n)
	}
	if err := as(""); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("no caller: %v, want unauthenticated", err)
	}
}
