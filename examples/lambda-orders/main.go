// Command lambda-orders is an example AWS Lambda function made idempotent
// with idemlambda, over DynamoDB. It creates an order per order_id: a
// retried or duplicated invocation gets the first one's result, and an
// invocation that timed out is taken over by a retry once its deadline (the
// claim's lease) has passed. template.yaml deploys it with SAM.
//
// Event: {"order_id":"o-42","item":"book","qty":1,"work_ms":0}. work_ms is
// simulated slow work on the first attempt only (claim fence 1), to see a
// timeout and its takeover.
//
// Environment: IDEM_TABLE (required), IDEM_DYNAMODB_ENDPOINT (for DynamoDB
// Local), ORDERS_LOG (optional: a file that gets one line per execution, for
// the end-to-end test).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

type orderEvent struct {
	OrderID string `json:"order_id"`
	Item    string `json:"item"`
	Qty     int    `json:"qty"`
	WorkMS  int    `json:"work_ms"`
}

type orderResult struct {
	OrderID   string `json:"order_id"`
	Execution string `json:"execution"` // random per execution: equal on a replay
	Fence     uint64 `json:"fence"`     // the claim it ran under: 2 after a takeover
}

func createOrder(ctx context.Context, ev orderEvent) (orderResult, error) {
	if ev.Item == "" || ev.Qty <= 0 {
		// Final: stored and replayed, never run again for this order_id.
		return orderResult{}, idem.Terminal(errors.New("item and a positive qty are required"), "invalid_order")
	}
	claim, _ := idem.FromContext(ctx)
	record("start", ev.OrderID, claim.Fence)
	if claim.Fence == 1 && ev.WorkMS > 0 {
		time.Sleep(time.Duration(ev.WorkMS) * time.Millisecond) // stands for a stuck downstream call
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	res := orderResult{OrderID: ev.OrderID, Execution: hex.EncodeToString(b[:]), Fence: claim.Fence}
	record("done", ev.OrderID, claim.Fence)
	return res, nil
}

// record appends a line to ORDERS_LOG, when set.
func record(what, order string, fence uint64) {
	path := os.Getenv("ORDERS_LOG")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s %s %d\n", what, order, fence)
}

func main() {
	ctx := context.Background()
	table := os.Getenv("IDEM_TABLE")
	if table == "" {
		fmt.Fprintln(os.Stderr, "lambda-orders: IDEM_TABLE is not set")
		os.Exit(1)
	}
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lambda-orders:", err)
		os.Exit(1)
	}
	client := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
		if ep := os.Getenv("IDEM_DYNAMODB_ENDPOINT"); ep != "" {
			o.BaseEndpoint = aws.String(ep)
		}
	})
	store, err := dynamostore.New(client, dynamostore.Config{Table: table})
	if err != nil {
		fmt.Fprintln(os.Stderr, "lambda-orders:", err)
		os.Exit(1)
	}
	eng, err := idem.New(store, &idem.Config{Expiry: 24 * time.Hour, Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))})
	if err != nil {
		fmt.Fprintln(os.Stderr, "lambda-orders:", err)
		os.Exit(1)
	}
	handler, err := idemlambda.Wrap(eng, "create", createOrder, &idemlambda.FuncConfig[orderEvent, orderResult]{
		Config: idemlambda.Config{KeyJMESPath: "order_id", ValidationJMESPath: "[item, qty]", RaiseOnMissingKey: true},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "lambda-orders:", err)
		os.Exit(1)
	}
	lambda.StartHandlerFunc(handler)
}
