package idemgrpc_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemgrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/internal/ordertest"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// A payment method served over gRPC on loopback: the client sends the
// same call twice with one key (as after a lost response); the charge is
// made once and the second answer is the stored one, marked replayed.
// The service is idem.test.v1.Orders (its Create method); in an
// application it is the generated code's RegisterOrdersServer.
func Example() {
	st := memstore.New(nil)
	defer st.Close()
	eng, err := idem.New(st, nil)
	if err != nil {
		panic(err)
	}
	g, err := idemrpc.New(eng, &idemrpc.Config{
		Methods: map[string]idemrpc.Method{ordertest.Create: {Required: true}},
	})
	if err != nil {
		panic(err)
	}

	charges := 0
	orders := &ordertest.Server{CreateFunc: func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		charges++ // the effect that must happen once
		return structpb.NewStruct(map[string]any{"order": in.Fields["order"].GetStringValue(), "status": "charged"})
	}}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(idemgrpc.UnaryServerInterceptor(g)),
		grpc.ChainStreamInterceptor(idemgrpc.StreamServerInterceptor(g)),
	)
	srv.RegisterService(&ordertest.ServiceDesc, orders)
	if err := idemgrpc.Check(g, srv); err != nil {
		panic(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	c, err := idemrpc.NewClient(nil)
	if err != nil {
		panic(err)
	}
	cc, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(c)))
	if err != nil {
		panic(err)
	}
	defer cc.Close()

	// The application's own key for this order, kept for its retries.
	ctx := idemgrpc.WithKey(context.Background(), "order-1001")
	for range 2 {
		var header metadata.MD
		out, err := ordertest.Call(ctx, cc, ordertest.Create, ordertest.Order("1001", 25), grpc.Header(&header))
		if err != nil {
			panic(err)
		}
		fmt.Println(out.Fields["order"].GetStringValue(), out.Fields["status"].GetStringValue(), "replayed:", idemgrpc.Replayed(header))
	}
	fmt.Println("charges:", charges)
	// Output:
	// 1001 charged replayed: false
	// 1001 charged replayed: true
	// charges: 1
}
