package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
	"github.com/seed-a1b882c0/idem/idemtest/ctltest"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// An operator who has a call's method, caller and key finds its record
// from those alone, in the console and with `idemctl find -grpc`, through
// clientkey.RPC, which the Guard keys its records with — for a gRPC and
// for a Connect call, on a real Redis that idemctl opens by URL.
func TestRecordIsFoundFromWhatTheCallerSent(t *testing.T) {
	t.Parallel()
	addr := redisAddr(t)
	prefix := fmt.Sprintf("idemgrpc-find-%d:", rand.Uint64())
	st, err := redisstore.Open("redis://"+addr+"/0", &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctl := ctltest.Build(t)
	ctlURL := "redis://" + addr + "/0?prefix=" + prefix
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
	alice := clientkey.Material{Kind: clientkey.KindRPC, Method: ordertest.Create, Principal: "alice", Key: "order-42"}
	ctltest.Find(t, ctl, ctlURL, alice, consoletest.FindIn(t, st, alice))

	srv := httptest.NewServer(ordertest.ConnectHandler(e.orders, connect.WithInterceptors(idemconnect.NewInterceptor(e.guard))))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	req := connect.NewRequest(ordertest.Order("o", 2))
	req.Header().Set("Idempotency-Key", "order-43")
	req.Header().Set("X-User", "bob")
	if _, err := connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+ordertest.Create).CallUnary(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	bob := clientkey.Material{Kind: clientkey.KindRPC, Method: ordertest.Create, Principal: "bob", Key: "order-43"}
	ctltest.Find(t, ctl, ctlURL, bob, consoletest.FindIn(t, st, bob))
}
