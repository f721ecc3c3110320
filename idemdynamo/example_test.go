package idemdynamo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemdynamo"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
)

// PlaceOrder is the event of a Lambda-style handler: the client's order,
// with its idempotency key.
type PlaceOrder struct {
	Key    string `json:"key"`
	Amount int    `json:"amount"`
}

// orderHandler returns a handler that creates the order item exactly once
// per key: the item and idem's record commit in one transaction, so an
// invocation that dies half way leaves neither, and a retried event
// replays the first answer.
func orderHandler(eng *idem.Engine, s *dynamostore.Store, orders string) func(context.Context, PlaceOrder) (string, error) {
	return func(ctx context.Context, in PlaceOrder) (string, error) {
		payload, err := json.Marshal(in)
		if err != nil {
			return "", err
		}
		req := idem.Request{Operation: "place-order", Key: in.Key, Payload: payload}
		res, err := idemdynamo.DoTx(ctx, eng, s, req, func(ctx context.Context) (string, []types.TransactWriteItem, error) {
			id := "order-" + in.Key
			put := types.TransactWriteItem{Put: &types.Put{
				TableName: aws.String(orders),
				Item: map[string]types.AttributeValue{
					"id":     &types.AttributeValueMemberS{Value: id},
					"amount": &types.AttributeValueMemberN{Value: fmt.Sprint(in.Amount)},
				},
				ConditionExpression: aws.String("attribute_not_exists(id)"),
			}}
			return id, []types.TransactWriteItem{put}, nil
		})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s replayed=%t", res.Value, res.Replayed), nil
	}
}

// A handler that creates an order item exactly once: the same event twice
// (a retried invocation) writes one item and answers the same. It needs
// DynamoDB Local at $IDEM_DYNAMODB_ENDPOINT; TestExampleDoTx runs it.
func ExampleDoTx() {
	ctx := context.Background()
	client := dynamotest.NewClient(os.Getenv("IDEM_DYNAMODB_ENDPOINT"))
	suffix := fmt.Sprintf("%x", rand.Uint32())
	cfg := dynamostore.Config{Table: "idem_example_" + suffix}
	orders := "orders_example_" + suffix
	if err := dynamostore.CreateTable(ctx, client, cfg, time.Minute); err != nil {
		fmt.Println(err)
		return
	}
	defer client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(cfg.Table)})
	if _, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(orders),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	}); err != nil {
		fmt.Println(err)
		return
	}
	defer client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(orders)})

	s, err := dynamostore.New(client, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	eng, err := idem.New(s, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	handle := orderHandler(eng, s, orders)
	for range 2 { // the event, and its retry
		out, err := handle(ctx, PlaceOrder{Key: "42", Amount: 1200})
		fmt.Println(out, err)
	}
	n, err := client.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(orders), Select: types.SelectCount, ConsistentRead: aws.Bool(true)})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("order items:", n.Count)
}

func TestExampleDoTx(t *testing.T) {
	testenv.DynamoDB(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	ExampleDoTx()
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	want := "order-42 replayed=false <nil>\norder-42 replayed=true <nil>\norder items: 1"
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("example printed\n%s\nwant\n%s", got, want)
	}
}
