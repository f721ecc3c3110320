package dynamostore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

// An engine over a DynamoDB table; the second call with the key replays the
// first one's result. The client here talks to DynamoDB Local on its
// default port, with placeholder credentials; in AWS, make it with
// dynamodb.NewFromConfig from aws-sdk-go-v2/config's LoadDefaultConfig, and
// create the table in infrastructure code rather than with CreateTable.
// (It needs a DynamoDB, so it is compiled but not run by go test.)
func ExampleNew() {
	ctx := context.Background()
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String("http://localhost:8000"),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local"}, nil
		}),
	})
	cfg := dynamostore.Config{Table: "idempotency"}
	if err := dynamostore.CreateTable(ctx, client, cfg, time.Minute); err != nil { // succeeds if it exists
		fmt.Println(err)
		return
	}
	store, err := dynamostore.New(client, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	eng, err := idem.New(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	req := idem.Request{Operation: "send-invoice", Key: "invoice-7"}
	send := func(ctx context.Context) (string, error) { return "sent", nil }
	for range 2 {
		res, err := idem.Do(ctx, eng, req, send)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s replayed=%t\n", res.Value, res.Replayed)
	}
}
