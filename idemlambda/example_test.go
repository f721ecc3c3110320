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

// A Kinesis handler runs the records of a shard in order, each at most
// once. The first record that fails is the batch's one batch item failure,
// so Lambda resumes the shard at it and the records after it wait; a
// redelivered batch skips the records already done, with their stored
// outcome.
func ExampleKinesis() {
	store := memstore.New(nil)
	defer store.Close()
	eng, err := idem.New(store, &idem.Config{Expiry: 48 * time.Hour}) // beyond the stream's retention
	if err != nil {
		fmt.Println(err)
		return
	}

	attempts := map[string]int{}
	ship := func(ctx context.Context, r events.KinesisEventRecord) error {
		var o struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal(r.Kinesis.Data, &o); err != nil {
			return idem.Terminal(err, "unreadable")
		}
		attempts[o.OrderID]++
		if o.OrderID == "o-2" && attempts[o.OrderID] == 1 {
			return errors.New("carrier unavailable")
		}
		fmt.Println("shipped", o.OrderID)
		return nil
	}
	// The default key is the record's eventID (with the stream's ARN).
	h, err := idemlambda.Kinesis(eng, "ship", ship, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	var batch events.KinesisEvent
	for i, order := range []string{"o-1", "o-2", "o-3"} {
		seq := fmt.Sprintf("4959033827149025660855969253836157109592157598913658889%d", i)
		batch.Records = append(batch.Records, events.KinesisEventRecord{
			EventID:        "shardId-000000000000:" + seq,
			EventSourceArn: "arn:aws:kinesis:eu-west-1:123456789012:stream/orders",
			Kinesis:        events.KinesisRecord{SequenceNumber: seq, PartitionKey: order, Data: []byte(`{"order_id":"` + order + `"}`)},
		})
	}
	for range 2 { // the second time, as Lambda redelivers the batch
		resp, err := h(context.Background(), batch)
		fmt.Printf("batch item failures: %v %v\n", resp.BatchItemFailures, err)
	}
	// Output:
	// shipped o-1
	// batch item failures: [{49590338271490256608559692538361571095921575989136588891}] <nil>
	// shipped o-2
	// shipped o-3
	// batch item failures: [] <nil>
}

// A DynamoDB Streams handler keyed on the item and its version runs once
// per version of an item, however often the stream delivers it. A record
// that fails with a terminal error is stored as failed and the shard
// moves past it (StopOnDeadLetter would stop the shard there instead).
func ExampleDynamoDBStream() {
	store := memstore.New(nil)
	defer store.Close()
	eng, err := idem.New(store, &idem.Config{Expiry: 48 * time.Hour}) // beyond the stream's retention
	if err != nil {
		fmt.Println(err)
		return
	}

	runs := 0
	project := func(ctx context.Context, r events.DynamoDBEventRecord) error {
		runs++
		img := r.Change.NewImage
		if img["amount"].IsNull() || img["amount"].DataType() != events.DataTypeNumber {
			return idem.Terminal(errors.New("no amount"), "invalid_order")
		}
		fmt.Println(img["pk"].String(), "version", img["version"].Number(), img["status"].String())
		return nil
	}
	h, err := idemlambda.DynamoDBStream(eng, "project", project, &idemlambda.DynamoDBStreamConfig{
		Config: idemlambda.Config{KeyJMESPath: "[dynamodb.Keys.pk.S, dynamodb.NewImage.version.N]"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	item := func(eventID, seq, pk, version, status string, amount *string) events.DynamoDBEventRecord {
		img := map[string]events.DynamoDBAttributeValue{
			"pk": events.NewStringAttribute(pk), "version": events.NewNumberAttribute(version), "status": events.NewStringAttribute(status),
		}
		if amount != nil {
			img["amount"] = events.NewNumberAttribute(*amount)
		}
		return events.DynamoDBEventRecord{EventID: eventID, EventName: "MODIFY", Change: events.DynamoDBStreamRecord{
			SequenceNumber: seq, Keys: map[string]events.DynamoDBAttributeValue{"pk": events.NewStringAttribute(pk)}, NewImage: img,
		}}
	}
	amount := "1999"
	batch := events.DynamoDBEvent{Records: []events.DynamoDBEventRecord{
		item("c4ca4238", "4421584500000000017450439091", "o-1", "1", "PLACED", &amount),
		item("c81e728d", "4421584500000000017450439092", "o-2", "1", "PLACED", nil),
		item("eccbc87e", "4421584500000000017450439093", "o-1", "2", "PAID", &amount),
	}}
	for range 2 {
		resp, err := h(context.Background(), batch)
		fmt.Printf("batch item failures: %v %v\n", resp.BatchItemFailures, err)
	}
	fmt.Println("runs:", runs)
	// Output:
	// o-1 version 1 PLACED
	// o-1 version 2 PAID
	// batch item failures: [] <nil>
	// batch item failures: [] <nil>
	// runs: 3
}
