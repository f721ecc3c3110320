package idemgrpc_test

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemgrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/internal/ordertest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// redisAddr is the Redis the tests run on: skipped outside CI when none
// answers, failing in CI.
func redisAddr(t testing.TB) string {
	return testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
}

// env is a gRPC server serving ordertest's service behind a Guard, on
// loopback, and a client connection to it.
type env struct {
	orders *ordertest.Server
	eng    *idem.Engine
	guard  *idemrpc.Guard
	srv    *grpc.Server
	cc     *grpc.ClientConn
}

type options struct {
	engine idem.Config
	guard  *idemrpc.Config
	// outer interceptors run before the Guard's.
	outer []grpc.UnaryServerInterceptor
	// client, when set, configures the client interceptor; noClient
	// leaves it off (the test sets keys itself).
	client      *idemrpc.ClientConfig
	noClient    bool
	dialOptions []grpc.DialOption
	// bare serves without any interceptor (benchmarks' baseline).
	bare bool
	// register registers more services on the server.
	register func(*grpc.Server)
}

func newEnv(t testing.TB, st store.Store, o options) *env {
	t.Helper()
	if o.engine.Logger == nil {
		o.engine.Logger = slog.New(slog.DiscardHandler)
	}
	eng, err := idem.New(st, &o.engine)
	if err != nil {
		t.Fatal(err)
	}
	gc := o.guard
	if gc == nil {
		gc = &idemrpc.Config{Methods: map[string]idemrpc.Method{ordertest.Create: {}}}
	}
	if gc.Files == nil {
		gc.Files = ordertest.Files
	}
	if gc.Logger == nil {
		gc.Logger = slog.New(slog.DiscardHandler)
	}
	g, err := idemrpc.New(eng, gc)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{orders: &ordertest.Server{}, eng: eng, guard: g}
	chain := append(append([]grpc.UnaryServerInterceptor(nil), o.outer...), idemgrpc.UnaryServerInterceptor(g))
	if o.bare {
		e.srv = grpc.NewServer()
	} else {
		e.srv = grpc.NewServer(grpc.ChainUnaryInterceptor(chain...), grpc.ChainStreamInterceptor(idemgrpc.StreamServerInterceptor(g)))
	}
	e.srv.RegisterService(&ordertest.ServiceDesc, e.orders)
	if o.register != nil {
		o.register(e.srv)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = e.srv.Serve(lis)
	}()
	t.Cleanup(func() {
		e.srv.Stop()
		<-served
	})
	dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if !o.noClient {
		c, err := idemrpc.NewClient(o.client)
		if err != nil {
			t.Fatal(err)
		}
		dial = append(dial, grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(c)))
	}
	e.cc, err = grpc.NewClient(lis.Addr().String(), append(dial, o.dialOptions...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.cc.Close() })
	return e
}

// keyed returns ctx carrying key in its outgoing metadata.
func keyed(key string) context.Context {
	return idemgrpc.WithKey(context.Background(), key)
}
