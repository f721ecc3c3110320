package idemlambda_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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

// A handler that hands its work off — here to a queue; in practice a Step
// Functions execution, an SQS message — holds its claim past its own
// invocation: idem.Detach makes the claim's lease the work's expected
// completion instead of the invocation's deadline, and the engine records
// nothing when the handler returns. A duplicate invocation meanwhile fails
// with an *idem.InProgressError naming the execution; once the worker
// completed the key through the token, duplicates get the worker's result.
func ExampleWrap_handOff() {
	store := memstore.New(nil)
	defer store.Close()
	eng, err := idem.New(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	queue := make(chan string, 1)
	charge := func(ctx context.Context, e chargeEvent) (chargeReceipt, error) {
		tok, err := idem.Detach(ctx, 15*time.Minute, "queue://charges/"+e.OrderID)
		if err != nil {
			return chargeReceipt{}, err
		}
		queue <- tok.String() // the worker gets the token with the job
		return chargeReceipt{Charge: "pending"}, nil
	}
	h, err := idemlambda.Wrap(eng, "charge", charge, &idemlambda.FuncConfig[chargeEvent, chargeReceipt]{
		Config: idemlambda.Config{Operation: "charges"},
		Key:    func(ctx context.Context, e chargeEvent) (string, error) { return e.OrderID, nil },
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	event := json.RawMessage(`{"order_id":"o-42","amount":1200}`)
	r, err := h(context.Background(), event)
	fmt.Println(r.Charge, err)

	var busy *idem.InProgressError
	if _, err := h(context.Background(), event); errors.As(err, &busy) {
		fmt.Println("duplicate during the work:", busy.Ref)
	}

	// The worker, in any process with an engine on the store.
	tok, err := idem.ParseToken(<-queue, "charges")
	if err == nil {
		err = eng.Complete(context.Background(), tok, chargeReceipt{Charge: "ch_1"})
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	r, err = h(context.Background(), event)
	fmt.Println(r.Charge, err)
	// Output:
	// pending <nil>
	// duplicate during the work: queue://charges/o-42
	// ch_1 <nil>
}
