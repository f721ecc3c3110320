package dynamostore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
)

// rawTable creates a table by hand, with key (HASH, then RANGE when
// given) string attributes and, when ttlAttr is set, TTL on it; deleted
// when t ends.
func rawTable(t *testing.T, c *dynamodb.Client, ttlAttr string, key ...string) string {
	t.Helper()
	ctx := context.Background()
	name := dynamotest.Name("idem_check_")
	in := &dynamodb.CreateTableInput{TableName: aws.String(name), BillingMode: types.BillingModePayPerRequest}
	for i, k := range key {
		kt := types.KeyTypeHash
		if i == 1 {
			kt = types.KeyTypeRange
		}
		in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{AttributeName: aws.String(k), AttributeType: types.ScalarAttributeTypeS})
		in.KeySchema = append(in.KeySchema, types.KeySchemaElement{AttributeName: aws.String(k), KeyType: kt})
	}
	if _, err := c.CreateTable(ctx, in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := c.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(name)}); err != nil {
			t.Errorf("delete table %s: %v", name, err)
		}
	})
	if ttlAttr != "" {
		if _, err := c.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{TableName: aws.String(name),
			TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(ttlAttr), Enabled: aws.Bool(true)}}); err != nil {
			t.Fatal(err)
		}
	}
	return name
}

// TestCheckFindsATableThatDoesNotMatch runs Check against DynamoDB Local
// tables made for it: each mismatch is a *TableError with its own cause,
// matching idem.ErrInvalidConfig and store.ErrMisconfigured, whose message
// says what to fix; a table made by CreateTable passes.
func TestCheckFindsATableThatDoesNotMatch(t *testing.T) {
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	ctx := context.Background()
	check := func(cfg dynamostore.Config) error {
		s, err := dynamostore.New(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s.Check(ctx)
	}
	good := newTable(t, c, dynamostore.Config{OpenIndex: "open"})
	if err := check(good); err != nil {
		t.Fatalf("a table made by CreateTable: %v", err)
	}
	composite := newTable(t, c, dynamostore.Config{SortKeyAttr: "sk"})
	if err := check(composite); err != nil {
		t.Fatalf("a composite table made by CreateTable: %v", err)
	}
	for _, c := range []struct {
		name  string
		cfg   dynamostore.Config
		cause error
		says  []string
	}{
		{"missing", dynamostore.Config{Table: "idem_no_such_table"}, dynamostore.ErrNoTable, []string{"does not exist", "create-table"}},
		{"other hash key", dynamostore.Config{Table: rawTable(t, c, "expiration", "pk")}, dynamostore.ErrKeySchema,
			[]string{"[pk (HASH, S)]", "[id (HASH, S)]", "Config.KeyAttr"}},
		{"hash key only, composite configured", dynamostore.Config{Table: good.Table, SortKeyAttr: "sk"}, dynamostore.ErrKeySchema,
			[]string{"sk (RANGE, S)", "Config.KeyAttr and SortKeyAttr"}},
		{"composite, hash only configured", dynamostore.Config{Table: composite.Table}, dynamostore.ErrKeySchema, []string{"sk (RANGE, S)"}},
		{"no TTL", dynamostore.Config{Table: rawTable(t, c, "", "id")}, dynamostore.ErrTTL,
			[]string{"time to live is DISABLED", "update-time-to-live", "AttributeName=expiration"}},
		{"TTL on another attribute", dynamostore.Config{Table: rawTable(t, c, "ttl", "id")}, dynamostore.ErrTTL,
			[]string{`on attribute "ttl", not the store's expiry attribute "expiration"`}},
		{"open index missing", dynamostore.Config{Table: composite.Table, SortKeyAttr: "sk", OpenIndex: "open"}, dynamostore.ErrNoIndex,
			[]string{"index open is missing"}},
	} {
		err := check(c.cfg)
		var te *dynamostore.TableError
		if !errors.As(err, &te) || !errors.Is(err, c.cause) || !errors.Is(err, idem.ErrInvalidConfig) || !errors.Is(err, store.ErrMisconfigured) {
			t.Errorf("%s: %v, want a *TableError with cause %v", c.name, err, c.cause)
			continue
		}
		for _, other := range []error{dynamostore.ErrNoTable, dynamostore.ErrKeySchema, dynamostore.ErrTTL, dynamostore.ErrNoIndex} {
			if other != c.cause && errors.Is(err, other) {
				t.Errorf("%s: %v also matches %v", c.name, err, other)
			}
		}
		for _, s := range c.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q does not say %q", c.name, err, s)
			}
		}
		t.Logf("%s: %v", c.name, err)
	}
}

// TestCheckOfAnUnreachableServerIsUnavailable: a Check that cannot ask is
// not a configuration fault.
func TestCheckOfAnUnreachableServerIsUnavailable(t *testing.T) {
	c := dynamotest.NewClient("http://127.0.0.1:1", func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
	s, err := dynamostore.New(c, dynamostore.Config{Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Check(ctx); !errors.Is(err, store.ErrUnavailable) || errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("%v, want store.ErrUnavailable", err)
	}
}
