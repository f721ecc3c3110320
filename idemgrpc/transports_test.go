package idemgrpc_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/seed-a1b882c0/idem/idemgrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemconnect"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/internal/ordertest"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// One Guard behind a gRPC server and a Connect handler: every situation
// gets the same code over both (one mapping), and a key used over one
// transport is the same key over the other.
func TestTransportsAgree(t *testing.T) {
	t.Parallel()
	e := newEnv(t, memstore.New(&memstore.Config{SweepInterval: -1}), options{noClient: true, guard: &idemrpc.Config{
		Methods: map[string]idemrpc.Method{ordertest.Create: {}, ordertest.Get: {Required: true}},
	}})
	e.orders.CreateFunc = func(_ context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		if in.Fields["order"].GetStringValue() == "declined" {
			return nil, status.Error(codes.PermissionDenied, "card declined")
		}
		return structpb.NewStruct(map[string]any{"receipt": float64(e.orders.Creates.Load())})
	}
	srv := httptest.NewServer(ordertest.ConnectHandler(e.orders, connect.WithInterceptors(idemconnect.NewInterceptor(e.guard))))
	t.Cleanup(srv.Close)
	t.Cleanup(srv.Client().CloseIdleConnections)

	type answer struct {
		code     codes.Code
		msg      *structpb.Struct
		replayed bool
	}
	viaGRPC := func(method, key string, in *structpb.Struct) answer {
		ctx := context.Background()
		if key != "" {
			ctx = idemgrpc.WithKey(ctx, key)
		}
		var h metadata.MD
		out, err := ordertest.Call(ctx, e.cc, method, in, grpc.Header(&h))
		return answer{status.Code(err), out, idemgrpc.Replayed(h)}
	}
	viaConnect := func(method, key string, in *structpb.Struct) answer {
		c := connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+method)
		req := connect.NewRequest(in)
		if key != "" {
			req.Header().Set("Idempotency-Key", key)
		}
		res, err := c.CallUnary(context.Background(), req)
		if err != nil {
			var ce *connect.Error
			errors.As(err, &ce)
			return answer{codes.Code(connect.CodeOf(err)), nil, ce != nil && ce.Meta().Get(idemconnect.ReplayedHeader) == "true"}
		}
		return answer{codes.OK, res.Msg, res.Header().Get(idemconnect.ReplayedHeader) == "true"}
	}
	type via func(method, key string, in *structpb.Struct) answer
	for _, c := range []struct {
		name     string
		first    via // sets the scene, when not nil
		method   string
		key      string
		in       *structpb.Struct
		code     codes.Code
		replayed bool
	}{
		{"replay of the other transport's call", viaGRPC, ordertest.Create, "k-1", ordertest.Order("o", 1), codes.OK, true},
		{"reused key", viaGRPC, ordertest.Create, "k-2", ordertest.Order("o", 2), codes.FailedPrecondition, false},
		{"terminal error replayed", viaGRPC, ordertest.Create, "k-3", ordertest.Order("declined", 1), codes.PermissionDenied, true},
		{"key required", nil, ordertest.Get, "", ordertest.Order("o", 1), codes.InvalidArgument, false},
		{"key too long", nil, ordertest.Create, strings.Repeat("k", 256), ordertest.Order("o", 1), codes.InvalidArgument, false},
	} {
		in := c.in
		if c.name == "reused key" {
			in = ordertest.Order("o", 1)
		}
		if c.first != nil {
			c.first(c.method, c.key, in)
		}
		g, k := viaGRPC(c.method, c.key, c.in), viaConnect(c.method, c.key, c.in)
		if g.code != c.code || k.code != c.code {
			t.Errorf("%s: gRPC %v, Connect %v; want %v over both", c.name, g.code, k.code, c.code)
		}
		if g.replayed != c.replayed || k.replayed != c.replayed {
			t.Errorf("%s: replayed gRPC %v, Connect %v; want %v", c.name, g.replayed, k.replayed, c.replayed)
		}
		if c.code == codes.OK && !proto.Equal(g.msg, k.msg) {
			t.Errorf("%s: gRPC %v, Connect %v; want one stored response", c.name, g.msg, k.msg)
		}
	}
	if n := e.orders.Creates.Load(); n != 3 {
		t.Errorf("handler ran %d times, want 3 (one per key)", n)
	}
}
