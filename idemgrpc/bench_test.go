package idemgrpc_test

import (
	"context"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemgrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/internal/ordertest"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// BenchmarkUnary: one unary call at a time over a real server on loopback,
// bare (no interceptors) against the Guard's: a new key per call (claim,
// handler, complete) and one key for every call (a replay), on memstore
// and Redis. The difference to bare is what the interceptors add to a
// call, in latency and allocations (client and server share the process).
func BenchmarkUnary(b *testing.B) {
	in := ordertest.Order("o-1", 25)
	run := func(b *testing.B, e *env, key func(i int) string) {
		b.ReportAllocs()
		ctx := context.Background()
		b.ResetTimer()
		for i := range b.N {
			c := ctx
			if key != nil {
				c = idemgrpc.WithKey(ctx, key(i))
			}
			if _, err := ordertest.Call(c, e.cc, ordertest.Create, in); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("bare", func(b *testing.B) {
		e := newEnv(b, memstore.New(&memstore.Config{SweepInterval: -1}), options{noClient: true, bare: true})
		run(b, e, nil)
	})
	for _, be := range ordertest.Backends(redisAddr) {
		b.Run(be.Name+"/new", func(b *testing.B) {
			e := newEnv(b, be.Store(b), options{noClient: true})
			run(b, e, strconv.Itoa)
		})
		b.Run(be.Name+"/replay", func(b *testing.B) {
			e := newEnv(b, be.Store(b), options{noClient: true})
			run(b, e, func(int) string { return "same" })
		})
	}
}

// BenchmarkInterceptor: the server interceptor alone, called as gRPC calls
// it, around a handler that answers at once, against calling the handler
// directly: the interceptor's own cost, without the network (memstore).
func BenchmarkInterceptor(b *testing.B) {
	in := ordertest.Order("o-1", 25)
	out := ordertest.Order("o-1", 25)
	handler := func(context.Context, any) (any, error) { return out, nil }
	info := &grpc.UnaryServerInfo{FullMethod: ordertest.Create}
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		ctx := context.Background()
		for range b.N {
			if _, err := handler(ctx, in); err != nil {
				b.Fatal(err)
			}
		}
	})
	newGuard := func(b *testing.B) grpc.UnaryServerInterceptor {
		st := memstore.New(&memstore.Config{SweepInterval: -1})
		b.Cleanup(func() { st.Close() })
		eng, err := idem.New(st, nil)
		if err != nil {
			b.Fatal(err)
		}
		g, err := idemrpc.New(eng, &idemrpc.Config{Files: ordertest.Files, Methods: map[string]idemrpc.Method{ordertest.Create: {}}})
		if err != nil {
			b.Fatal(err)
		}
		return idemgrpc.UnaryServerInterceptor(g)
	}
	call := func(b *testing.B, icpt grpc.UnaryServerInterceptor, key func(i int) string) {
		b.ReportAllocs()
		// The server's stream, as gRPC puts it in the context: a replay
		// sets its header there.
		base := grpc.NewContextWithServerTransportStream(context.Background(), benchStream{})
		for i := range b.N {
			ctx := metadata.NewIncomingContext(base, metadata.Pairs(idemrpc.DefaultKeyMetadata, key(i)))
			res, err := icpt(ctx, in, info, handler)
			if err != nil || res.(*structpb.Struct) == nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("new", func(b *testing.B) { call(b, newGuard(b), strconv.Itoa) })
	b.Run("replay", func(b *testing.B) { call(b, newGuard(b), func(int) string { return "same" }) })
}

// benchStream is the server transport stream of BenchmarkInterceptor's
// calls: it takes headers and trailers and sends nothing.
type benchStream struct{}

func (benchStream) Method() string               { return ordertest.Create }
func (benchStream) SetHeader(metadata.MD) error  { return nil }
func (benchStream) SendHeader(metadata.MD) error { return nil }
func (benchStream) SetTrailer(metadata.MD) error { return nil }
