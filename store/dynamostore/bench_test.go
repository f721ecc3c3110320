package dynamostore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
)

// Reproduce: scripts/dynamodb-local run sh -c 'cd store/dynamostore && go test -run "^$" -bench . -benchmem -benchtime 2s'
// The server is DynamoDB Local (a Java process on loopback, in memory), so
// the figures measure the client and the request count, not AWS latency.

func benchStore(b *testing.B) store.Store {
	return newStore(b, dynamotest.NewClient(testenv.DynamoDB(b)), dynamostore.Config{})
}

func BenchmarkNewCall(b *testing.B) { benchkit.NewCallBenchmarks(b, benchStore, 1, 16) }

func BenchmarkDuplicateCall(b *testing.B) {
	benchkit.DuplicateCallBenchmarks(b, benchStore, 200, 1, 16)
}

// BenchmarkRaw is the same client making the raw requests with no library:
// a new call is a conditional PutItem (attribute_not_exists) and an
// UpdateItem storing the result; a duplicate is the conditional PutItem
// failing with the item returned (ALL_OLD).
func BenchmarkRaw(b *testing.B) {
	key := func(i int) string {
		k, _ := idem.NewStoreKey("charge", "", []byte(strconv.Itoa(i)))
		return k.String()
	}
	put := func(c *dynamodb.Client, table, k string) error {
		_, err := c.PutItem(context.Background(), &dynamodb.PutItemInput{
			TableName: aws.String(table),
			Item: map[string]types.AttributeValue{
				"id": &types.AttributeValueMemberS{Value: k}, "status": &types.AttributeValueMemberS{Value: "IN_PROGRESS"},
				"fence": &types.AttributeValueMemberN{Value: "1"}, "in_progress_expiration": &types.AttributeValueMemberN{Value: "1800000000000"},
				"expiration": &types.AttributeValueMemberN{Value: "1800000000"},
			},
			ConditionExpression:                 aws.String("attribute_not_exists(id)"),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		return err
	}
	update := func(c *dynamodb.Client, table, k string) error {
		_, err := c.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
			TableName: aws.String(table), Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: k}},
			UpdateExpression:          aws.String("SET #s = :s, #d = :d"),
			ConditionExpression:       aws.String("fence = :f"),
			ExpressionAttributeNames:  map[string]string{"#s": "status", "#d": "data"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":s": &types.AttributeValueMemberS{Value: "COMPLETED"}, ":d": &types.AttributeValueMemberB{Value: []byte(`{"id":"r-1","amount":1000}`)}, ":f": &types.AttributeValueMemberN{Value: "1"}},
		})
		return err
	}
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("new/c=%d", conc), func(b *testing.B) {
			c := dynamotest.NewClient(testenv.DynamoDB(b))
			cfg := newTable(b, c, dynamostore.Config{})
			benchkit.Run(b, conc, func(i int) error {
				if err := put(c, cfg.Table, key(i)); err != nil {
					return err
				}
				return update(c, cfg.Table, key(i))
			})
		})
	}
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("dup/c=%d", conc), func(b *testing.B) {
			c := dynamotest.NewClient(testenv.DynamoDB(b))
			cfg := newTable(b, c, dynamostore.Config{})
			const keys = 200
			for i := range keys { // completed items, as the library's duplicates meet
				if err := errors.Join(put(c, cfg.Table, key(i)), update(c, cfg.Table, key(i))); err != nil {
					b.Fatal(err)
				}
			}
			benchkit.Run(b, conc, func(i int) error {
				err := put(c, cfg.Table, key(i%keys))
				var cf *types.ConditionalCheckFailedException
				if !errors.As(err, &cf) || len(cf.Item) == 0 {
					return fmt.Errorf("duplicate put: %v", err)
				}
				return nil
			})
		})
	}
}
