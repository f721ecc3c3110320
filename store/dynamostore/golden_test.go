package dynamostore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

// TestGoldenLayout: the item DynamoDB holds for each golden record, made
// through the store's operations, is that of testdata/golden (every
// attribute with its type, in DynamoDB's JSON); and an item of those
// attributes reads back as the golden record. A change of the layout (an
// attribute added, renamed or typed otherwise) fails it.
func TestGoldenLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	s := newStore(t, c, dynamostore.Config{})
	other := newStore(t, c, dynamostore.Config{})
	for _, g := range storetest.GoldenRecords() {
		storetest.MakeGolden(t, s, g)
		out, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.Config().Table), ConsistentRead: aws.Bool(true),
			Key: map[string]types.AttributeValue{s.Config().KeyAttr: &types.AttributeValueMemberS{Value: g.Record.Key}}})
		if err != nil || out.Item == nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		enc, err := itemJSON(out.Item)
		if err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		item, err := jsonItem(storetest.GoldenFile(t, filepath.Join("testdata", "golden", g.Name+".json"), enc))
		if err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		if _, err := c.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(other.Config().Table), Item: item}); err != nil {
			t.Fatalf("%s: put the golden item: %v", g.Name, err)
		}
		got, err := other.Get(ctx, g.Record.Key)
		if err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		storetest.CheckGolden(t, g, got)
	}
}

// itemJSON writes an item in DynamoDB's JSON ({"attr": {"S": "…"}}),
// attributes sorted, one line.
func itemJSON(item map[string]types.AttributeValue) ([]byte, error) {
	m := map[string]map[string]any{}
	for name, v := range item {
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			m[name] = map[string]any{"S": v.Value}
		case *types.AttributeValueMemberN:
			m[name] = map[string]any{"N": v.Value}
		case *types.AttributeValueMemberB:
			m[name] = map[string]any{"B": v.Value}
		case *types.AttributeValueMemberBOOL:
			m[name] = map[string]any{"BOOL": v.Value}
		default:
			return nil, fmt.Errorf("attribute %s: type %T not in the golden layout", name, v)
		}
	}
	b, err := json.Marshal(m)
	return append(b, '\n'), err
}

// jsonItem reads an item written by itemJSON.
func jsonItem(b []byte) (map[string]types.AttributeValue, error) {
	var m map[string]struct {
		S, N *string
		B    []byte
		BOOL *bool
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	item := map[string]types.AttributeValue{}
	for name, v := range m {
		switch {
		case v.S != nil:
			item[name] = &types.AttributeValueMemberS{Value: *v.S}
		case v.N != nil:
			item[name] = &types.AttributeValueMemberN{Value: *v.N}
		case v.B != nil:
			item[name] = &types.AttributeValueMemberB{Value: v.B}
		case v.BOOL != nil:
			item[name] = &types.AttributeValueMemberBOOL{Value: *v.BOOL}
		default:
			return nil, fmt.Errorf("attribute %s: no type", name)
		}
	}
	return item, nil
}
