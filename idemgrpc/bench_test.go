package idemgrpc_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemgrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/internal/ordertest"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// The benchmarks send two kinds of message:
//
//   - struct: ordertest's google.protobuf.Struct, a map, whose
//     deterministic encoding sorts its keys (allocations of its own on
//     every encoding);
//   - simple: grpc.testing.SimpleRequest and SimpleResponse, the messages
//     of gRPC's own benchmarks (generated code in the grpc module):
//     scalars, strings and bytes, no map, as most services' messages.

// simpleMethod is the method the simple messages are sent to.
const simpleMethod = testgrpc.BenchmarkService_UnaryCall_FullMethodName

// simpleRequest and simpleResponse are a typical request and response:
// a few scalars and strings and a 64-byte payload.
func simpleRequest() *testgrpc.SimpleRequest {
	return &testgrpc.SimpleRequest{
		ResponseType: testgrpc.PayloadType_COMPRESSABLE,
		ResponseSize: 64,
		Payload:      &testgrpc.Payload{Body: make([]byte, 64)},
		FillUsername: true,
	}
}

func simpleResponse() *testgrpc.SimpleResponse {
	return &testgrpc.SimpleResponse{
		Payload:    &testgrpc.Payload{Body: make([]byte, 64)},
		Username:   "alice",
		OauthScope: "orders.write",
		ServerId:   "server-1",
		Hostname:   "host-1",
	}
}

// simpleServer answers UnaryCall with simpleResponse.
type simpleServer struct {
	testgrpc.UnimplementedBenchmarkServiceServer
	resp *testgrpc.SimpleResponse
}

func (s *simpleServer) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return s.resp, nil
}

// BenchmarkUnary: one unary call at a time over a real server on loopback,
// bare (no interceptors) against the Guard's: a new key per call (claim,
// handler, complete) and one key for every call (a replay), on memstore
// and Redis, with each kind of message. The difference to bare is what
// the interceptors add to a call, in latency and allocations (client and
// server share the process).
func BenchmarkUnary(b *testing.B) {
	in := ordertest.Order("o-1", 25)
	sin := simpleRequest()
	guard := &idemrpc.Config{Methods: map[string]idemrpc.Method{ordertest.Create: {}, simpleMethod: {}}}
	register := func(s *grpc.Server) {
		testgrpc.RegisterBenchmarkServiceServer(s, &simpleServer{resp: simpleResponse()})
	}
	calls := []struct {
		name string
		call func(ctx context.Context, e *env) error
	}{
		{"struct", func(ctx context.Context, e *env) error {
			_, err := ordertest.Call(ctx, e.cc, ordertest.Create, in)
			return err
		}},
		{"simple", func(ctx context.Context, e *env) error {
			_, err := testgrpc.NewBenchmarkServiceClient(e.cc).UnaryCall(ctx, sin)
			return err
		}},
	}
	run := func(b *testing.B, e *env, call func(context.Context, *env) error, key func(i int) string) {
		b.ReportAllocs()
		ctx := context.Background()
		i := 0
		for b.Loop() {
			c := ctx
			if key != nil {
				c = idemgrpc.WithKey(ctx, key(i))
			}
			i++
			if err := call(c, e); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, c := range calls {
		b.Run(c.name+"/bare", func(b *testing.B) {
			e := newEnv(b, memstore.New(&memstore.Config{SweepInterval: -1}), options{noClient: true, bare: true, register: register})
			run(b, e, c.call, nil)
		})
		for _, be := range ordertest.Backends(redisAddr) {
			b.Run(c.name+"/"+be.Name+"/new", func(b *testing.B) {
				e := newEnv(b, be.Store(b), options{noClient: true, guard: guard, register: register})
				run(b, e, c.call, strconv.Itoa)
			})
			b.Run(c.name+"/"+be.Name+"/replay", func(b *testing.B) {
				e := newEnv(b, be.Store(b), options{noClient: true, guard: guard, register: register})
				run(b, e, c.call, func(int) string { return "same" })
			})
		}
	}
}

// BenchmarkInterceptor: the server interceptor alone, called as gRPC calls
// it, around a handler that answers at once, against calling the handler
// directly: the interceptor's own cost, without the network (memstore).
// Besides the time per call, each reports cpu-ns/op: the CPU time the
// process used per call (the garbage collector's included), which a
// machine shared with other work inflates far less than the time.
// The call's context is made before the loop, as gRPC makes it before
// any interceptor runs: a new call's key is set in place, from keys made
// beforehand (a new batch of them, untimed, every 65,536 calls).
func BenchmarkInterceptor(b *testing.B) {
	for _, c := range []struct {
		name, method string
		in, out      proto.Message
	}{
		{"struct", ordertest.Create, ordertest.Order("o-1", 25), ordertest.Order("o-1", 25)},
		{"simple", simpleMethod, simpleRequest(), simpleResponse()},
	} {
		handler := func(context.Context, any) (any, error) { return c.out, nil }
		info := &grpc.UnaryServerInfo{FullMethod: c.method}
		b.Run(c.name+"/bare", func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			cpu := startCPU()
			for b.Loop() {
				if _, err := handler(ctx, c.in); err != nil {
					b.Fatal(err)
				}
			}
			cpu.report(b)
		})
		call := func(b *testing.B, fresh bool) {
			st := memstore.New(&memstore.Config{SweepInterval: -1, MaxRecords: 1 << 30})
			b.Cleanup(func() { st.Close() })
			eng, err := idem.New(st, nil)
			if err != nil {
				b.Fatal(err)
			}
			g, err := idemrpc.New(eng, &idemrpc.Config{Files: ordertest.Files, Methods: map[string]idemrpc.Method{c.method: {}}})
			if err != nil {
				b.Fatal(err)
			}
			icpt := idemgrpc.UnaryServerInterceptor(g)
			// The server's stream, as gRPC puts it in the context: a
			// replay sets its header there.
			md := metadata.Pairs(idemrpc.DefaultKeyMetadata, "same")
			ctx := metadata.NewIncomingContext(grpc.NewContextWithServerTransportStream(context.Background(), benchStream{}), md)
			keys := make([]string, 1<<16)
			round := 0
			newKeys := func() {
				for i := range keys {
					keys[i] = "k" + strconv.Itoa(round) + "-" + strconv.Itoa(i)
				}
				round++
			}
			i := len(keys)
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				if fresh {
					if i == len(keys) {
						b.StopTimer()
						cpu.pause()
						newKeys()
						i = 0
						cpu.resume()
						b.StartTimer()
					}
					md[idemrpc.DefaultKeyMetadata][0] = keys[i]
					i++
				}
				res, err := icpt(ctx, c.in, info, handler)
				if err != nil || res == nil {
					b.Fatal(res, err)
				}
			}
			cpu.report(b)
			res, err := icpt(ctx, c.in, info, handler)
			if err != nil || !proto.Equal(res.(proto.Message), c.out) {
				b.Fatalf("answer %v, %v; want %v", res, err, c.out)
			}
		}
		b.Run(c.name+"/new", func(b *testing.B) { call(b, true) })
		b.Run(c.name+"/replay", func(b *testing.B) { call(b, false) })
	}
}

// cpuMeter counts the CPU time this process uses in a benchmark's loop,
// untimed parts left out.
type cpuMeter struct {
	start, paused time.Duration
	left          time.Duration // CPU time of the untimed parts
}

func startCPU() *cpuMeter { return &cpuMeter{start: selfCPU()} }

func (m *cpuMeter) pause()  { m.paused = selfCPU() }
func (m *cpuMeter) resume() { m.left += selfCPU() - m.paused }

// report reports the CPU time per call as cpu-ns/op.
func (m *cpuMeter) report(b *testing.B) {
	b.ReportMetric(float64(selfCPU()-m.start-m.left)/float64(b.N), "cpu-ns/op")
}

func selfCPU() time.Duration {
	d, _ := benchkit.SelfCPU()
	return d
}

// benchStream is the server transport stream of BenchmarkInterceptor's
// calls: it takes headers and trailers and sends nothing.
type benchStream struct{}

func (benchStream) Method() string               { return ordertest.Create }
func (benchStream) SetHeader(metadata.MD) error  { return nil }
func (benchStream) SetTrailer(metadata.MD) error { return nil }
func (benchStream) SendHeader(metadata.MD) error { return nil }
