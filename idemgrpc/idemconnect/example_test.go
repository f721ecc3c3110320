package idemconnect_test

import (
	"context"
	"fmt"
	"net/http/httptest"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemconnect"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/internal/ordertest"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// A Connect handler behind the interceptor, on loopback: the same request
// sent twice with one Idempotency-Key runs once; the second answer is the
// stored response, marked Idempotent-Replayed. In an application the
// handler comes from the generated NewOrdersHandler, with
// connect.WithInterceptors.
func ExampleNewInterceptor() {
	st := memstore.New(nil)
	defer st.Close()
	eng, err := idem.New(st, nil)
	if err != nil {
		panic(err)
	}
	g, err := idemrpc.New(eng, &idemrpc.Config{Methods: map[string]idemrpc.Method{ordertest.Create: {}}})
	if err != nil {
		panic(err)
	}
	orders := &ordertest.Server{CreateFunc: func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		return structpb.NewStruct(map[string]any{"status": "charged"})
	}}
	srv := httptest.NewServer(ordertest.ConnectHandler(orders, connect.WithInterceptors(idemconnect.NewInterceptor(g))))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()

	client := connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+ordertest.Create)
	for range 2 {
		req := connect.NewRequest(ordertest.Order("1001", 25))
		req.Header().Set("Idempotency-Key", "order-1001")
		res, err := client.CallUnary(context.Background(), req)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Msg.Fields["status"].GetStringValue(), "replayed:", res.Header().Get(idemconnect.ReplayedHeader) == "true")
	}
	fmt.Println("executions:", orders.Creates.Load())
	// Output:
	// charged replayed: false
	// charged replayed: true
	// executions: 1
}
