package idemlambda_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

type chargeEvent struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
}

type chargeReceipt struct {
	Charge   string `json:"charge"`
	Replayed bool   `json:"replayed"`
}

// A typed handler keyed on the order id: the event delivered twice charges
// once, and the second invocation gets the first one's receipt. In a
// function, pass h to lambda.StartHandlerFunc; here it is called directly.
func ExampleWrap() {
	store := memstore.New(nil) // in Lambda: a shared store, such as dynamostore
	defer store.Close()
	eng, err := idem.New(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	charges := 0
	charge := func(ctx context.Context, e chargeEvent) (chargeReceipt, error) {
		charges++
		return chargeReceipt{Charge: fmt.Sprintf("ch_%d", charges)}, nil
	}
	h, err := idemlambda.Wrap(eng, "charge", charge, &idemlambda.FuncConfig[chargeEvent, chargeReceipt]{
		Key: func(ctx context.Context, e chargeEvent) (string, error) { return e.OrderID, nil },
		OnReplay: func(ctx context.Context, r chargeReceipt) chargeReceipt {
			r.Replayed = true
			return r
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	event := json.RawMessage(`{"order_id":"o-42","amount":1200}`)
	for range 2 {
		r, err := h(context.Background(), event)
		fmt.Printf("%s replayed=%t %v\n", r.Charge, r.Replayed, err)
	}
	fmt.Println("charges:", charges)
	// Output:
	// ch_1 replayed=false <nil>
	// ch_1 replayed=true <nil>
	// charges: 1
}

// An API Gateway HTTP API handler answers a retried request, by its
// Idempotency-Key header, with the first response, marked as a replay.
func ExampleAPIGatewayV2() {
	store := memstore.New(nil)
	defer store.Close()
	eng, err := idem.New(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	orders := 0
	create := func(ctx context.Context, e events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		orders++
		return events.APIGatewayV2HTTPResponse{
			StatusCode: 201,
			Headers:    map[string]string{"Content-Type": "application/json"},
			Body:       fmt.Sprintf(`{"order":"ord_%d"}`, orders),
		}, nil
	}
	h, err := idemlambda.APIGatewayV2(eng, "create-order", create, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	var req events.APIGatewayV2HTTPRequest
	req.RouteKey = "POST /orders"
	req.RawPath = "/orders"
	req.RequestContext.HTTP.Method = "POST"
	req.Headers = map[string]string{"idempotency-key": "9b1d", "content-type": "application/json"}
	req.Body = `{"sku":"book","qty":1}`
	for range 2 {
		resp, err := h(context.Background(), req)
		fmt.Printf("%d replayed=%q %s %v\n", resp.StatusCode, resp.Headers["Idempotent-Replayed"], resp.Body, err)
	}
	fmt.Println("orders:", orders)
	// Output:
	// 201 replayed="" {"order":"ord_1"} <nil>
	// 201 replayed="true" {"order":"ord_1"} <nil>
	// orders: 1
}
