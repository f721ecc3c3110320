package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem/store"
)

// What [Store.Check] finds wrong with a table, each a cause of a
// [*TableError] (errors.Is tells them apart).
var (
	// ErrNoTable: the table does not exist.
	ErrNoTable = errors.New("dynamostore: no such table")
	// ErrKeySchema: the table's primary key is not the one Config names
	// (KeyAttr, SortKeyAttr, both strings).
	ErrKeySchema = errors.New("dynamostore: table key schema differs from the configuration")
	// ErrTTL: time to live is off, or on another attribute than
	// Config.ExpiryAttr: expired records would never be deleted.
	ErrTTL = errors.New("dynamostore: table TTL is not on the expiry attribute")
	// ErrNoIndex: Config.OpenIndex or Config.StatusIndex names an index the
	// table lacks, or one with other keys.
	ErrNoIndex = errors.New("dynamostore: index missing or of another shape")
)

// TableError reports a table that does not match the store's
// configuration: Cause is one of ErrNoTable, ErrKeySchema, ErrTTL and
// ErrNoIndex, and the message says what to fix. It matches its cause,
// store.ErrInvalidConfig and store.ErrMisconfigured (errors.Is).
type TableError struct {
	Table  string
	Cause  error
	Reason string
	// Fix says what to do.
	Fix string
}

func (e *TableError) Error() string {
	return fmt.Sprintf("dynamostore: table %s: %s: %s", e.Table, e.Reason, e.Fix)
}

// Is matches e.Cause, store.ErrInvalidConfig and store.ErrMisconfigured.
func (e *TableError) Is(target error) bool {
	return target == e.Cause || target == store.ErrInvalidConfig || target == store.ErrMisconfigured
}

// DescribeAPI is the part of *dynamodb.Client that [Store.Check] uses.
type DescribeAPI interface {
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	DescribeTimeToLive(ctx context.Context, in *dynamodb.DescribeTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTimeToLiveOutput, error)
}

// Check compares the table with the configuration — it exists, its key
// schema is Config.KeyAttr (and Config.SortKeyAttr), both strings, time to
// live is on Config.ExpiryAttr, and the indexes Config names exist with
// their keys — and, when the Spiller has a Check method (s3spill's),
// checks the spill bucket too. A mismatch is a [*TableError]; a request
// that fails is store.ErrUnavailable. A client without DescribeTable and
// DescribeTimeToLive ([DescribeAPI]) is not checked. storeurl.Open calls
// it.
func (s *Store) Check(ctx context.Context) error {
	if api, ok := s.api.(DescribeAPI); ok {
		if err := s.checkTable(ctx, api); err != nil {
			return err
		}
	}
	if c, ok := s.cfg.Spiller.(interface{ Check(context.Context) error }); ok {
		return c.Check(ctx)
	}
	return nil
}

func (s *Store) checkTable(ctx context.Context, api DescribeAPI) error {
	c := s.cfg
	bad := func(cause error, reason, fix string) error {
		return &TableError{Table: c.Table, Cause: cause, Reason: reason, Fix: fix}
	}
	create := "create it with idemctl create-table, dynamodb://…&create=true, dynamostore.CreateTable or the CloudFormation or Terraform of docs/dynamodb.md"
	out, err := api.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(c.Table)})
	if err != nil {
		var nf *types.ResourceNotFoundException
		if errors.As(err, &nf) {
			return bad(ErrNoTable, "does not exist", create+" (or fix the table name)")
		}
		return fmt.Errorf("dynamostore: describe table %s: %w: %w", c.Table, store.ErrUnavailable, err)
	}
	td := out.Table
	attrTypes := map[string]types.ScalarAttributeType{}
	for _, d := range td.AttributeDefinitions {
		attrTypes[aws.ToString(d.AttributeName)] = d.AttributeType
	}
	want := []string{c.KeyAttr + " (HASH, S)"}
	if c.SortKeyAttr != "" {
		want = append(want, c.SortKeyAttr+" (RANGE, S)")
	}
	var got []string
	for _, k := range td.KeySchema {
		got = append(got, fmt.Sprintf("%s (%s, %s)", aws.ToString(k.AttributeName), k.KeyType, attrTypes[aws.ToString(k.AttributeName)]))
	}
	if !slices.Equal(got, want) {
		keyFlags := "KeyAttr"
		if c.SortKeyAttr != "" {
			keyFlags = "KeyAttr and SortKeyAttr"
		}
		return bad(ErrKeySchema, fmt.Sprintf("its key is %v, the store's configuration wants %v", got, want),
			"set Config."+keyFlags+" to the table's key attributes (both strings), or use a table made for idem ("+create+")")
	}
	indexes := map[string][]string{}
	for _, gsi := range td.GlobalSecondaryIndexes {
		var ks []string
		for _, k := range gsi.KeySchema {
			ks = append(ks, aws.ToString(k.AttributeName))
		}
		indexes[aws.ToString(gsi.IndexName)] = ks
	}
	for name, keys := range map[string][]string{c.OpenIndex: {c.OpenAttr, c.LeaseAttr}, c.StatusIndex: {c.StatusAttr, c.LeaseAttr}} {
		if name == "" {
			continue
		}
		if got, ok := indexes[name]; !ok || !slices.Equal(got, keys) {
			return bad(ErrNoIndex, fmt.Sprintf("index %s is missing or keyed %v, not %v", name, got, keys),
				"add it (docs/dynamodb-status-index.md) or drop the index setting")
		}
	}
	ttl, err := api.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(c.Table)})
	if err != nil {
		return fmt.Errorf("dynamostore: describe time to live of %s: %w: %w", c.Table, store.ErrUnavailable, err)
	}
	d := ttl.TimeToLiveDescription
	fix := fmt.Sprintf("enable time to live on attribute %q (aws dynamodb update-time-to-live --table-name %s "+
		"--time-to-live-specification Enabled=true,AttributeName=%s), or set Config.ExpiryAttr to the table's TTL attribute", c.ExpiryAttr, c.Table, c.ExpiryAttr)
	if d == nil || (d.TimeToLiveStatus != types.TimeToLiveStatusEnabled && d.TimeToLiveStatus != types.TimeToLiveStatusEnabling) {
		status := "DISABLED"
		if d != nil {
			status = string(d.TimeToLiveStatus)
		}
		return bad(ErrTTL, "time to live is "+status+": expired records would never be deleted", fix)
	}
	if a := aws.ToString(d.AttributeName); a != c.ExpiryAttr {
		return bad(ErrTTL, fmt.Sprintf("time to live is on attribute %q, not the store's expiry attribute %q", a, c.ExpiryAttr), fix)
	}
	return nil
}
