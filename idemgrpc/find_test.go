package idemgrpc_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemconnect"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/internal/ordertest"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
)

// An operator who has a call's method, caller and key finds its record in
// the console from those alone (clientkey.RPC, which the Guard keys its
// records with and idemctl find -grpc uses too), for a gRPC and for a
// Connect call, on every backend.
func TestRecordIsFoundFromWhatTheCallerSent(t *testing.T) {
	t.Parallel()
	for _, b := range ordertest.Backends(redisAddr) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			st := b.Store(t)
			who := func(ctx context.Context) (string, error) {
				if v := metadata.ValueFromIncomingContext(ctx, "x-user"); len(v) == 1 { // gRPC
					return v[0], nil
				}
				if ci, ok := connect.CallInfoForHandlerContext(ctx); ok && ci.RequestHeader().Get("X-User") != "" { // Connect
					return ci.RequestHeader().Get("X-User"), nil
				}
				return "", errors.New("no x-user")
			}
			e := newEnv(t, st, options{noClient: true, guard: &idemrpc.Config{Methods: map[string]idemrpc.Method{ordertest.Create: {}}, Principal: who}})
			receipt(e)
			ctx := metadata.AppendToOutgoingContext(keyed("order-42"), "x-user", "alice")
			if _, _, err := call(t, e, ctx, ordertest.Order("o", 1)); err != nil {
				t.Fatal(err)
			}
			consoletest.FindIn(t, st, clientkey.Material{Kind: clientkey.KindRPC, Method: ordertest.Create, Principal: "alice", Key: "order-42"})

			srv := httptest.NewServer(ordertest.ConnectHandler(e.orders, connect.WithInterceptors(idemconnect.NewInterceptor(e.guard))))
			defer srv.Close()
			defer srv.Client().CloseIdleConnections()
			req := connect.NewRequest(ordertest.Order("o", 2))
			req.Header().Set("Idempotency-Key", "order-43")
			req.Header().Set("X-User", "bob")
			if _, err := connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+ordertest.Create).CallUnary(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			consoletest.FindIn(t, st, clientkey.Material{Kind: clientkey.KindRPC, Method: ordertest.Create, Principal: "bob", Key: "order-43"})
		})
	}
}
