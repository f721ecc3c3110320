package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/seed-a1b882c0/idem/store"
)

// TableAPI is the part of *dynamodb.Client that [CreateTable] uses.
type TableAPI interface {
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

// CreateTable creates the table cfg describes, for development and tests:
// on-demand billing, the key schema (composite when cfg.SortKeyAttr is
// set), the open index when cfg.OpenIndex is set and the legacy status
// index when cfg.StatusIndex is set (both projecting every attribute), and
// TTL on cfg.ExpiryAttr. An existing table is left as it is: it gains no
// index. It waits until the table is ACTIVE (at most maxWait).
// Production tables belong in infrastructure code; docs/dynamodb.md has
// CloudFormation and Terraform equivalents. The table is in one Region: to
// make it a global table, give it one writing Region or multi-Region
// strong consistency, never writers in several Regions under eventual
// consistency (see the package doc, "Global tables").
func CreateTable(ctx context.Context, api TableAPI, cfg Config, maxWait time.Duration) error {
	c, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	in := &dynamodb.CreateTableInput{
		TableName:   aws.String(c.Table),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(c.KeyAttr), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{{AttributeName: aws.String(c.KeyAttr), KeyType: types.KeyTypeHash}},
	}
	if c.SortKeyAttr != "" {
		in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{AttributeName: aws.String(c.SortKeyAttr), AttributeType: types.ScalarAttributeTypeS})
		in.KeySchema = append(in.KeySchema, types.KeySchemaElement{AttributeName: aws.String(c.SortKeyAttr), KeyType: types.KeyTypeRange})
	}
	leaseDefined := false
	index := func(name, hashAttr string) {
		in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{AttributeName: aws.String(hashAttr), AttributeType: types.ScalarAttributeTypeS})
		if !leaseDefined {
			in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{AttributeName: aws.String(c.LeaseAttr), AttributeType: types.ScalarAttributeTypeN})
			leaseDefined = true
		}
		in.GlobalSecondaryIndexes = append(in.GlobalSecondaryIndexes, types.GlobalSecondaryIndex{
			IndexName: aws.String(name),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String(hashAttr), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String(c.LeaseAttr), KeyType: types.KeyTypeRange},
			},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
		})
	}
	if c.OpenIndex != "" {
		index(c.OpenIndex, c.OpenAttr)
	}
	if c.StatusIndex != "" {
		index(c.StatusIndex, c.StatusAttr)
	}
	if _, err := api.CreateTable(ctx, in); err != nil {
		var inUse *types.ResourceInUseException
		if !errors.As(err, &inUse) {
			return fmt.Errorf("dynamostore: create table %s: %w", c.Table, err)
		}
	}
	if err := dynamodb.NewTableExistsWaiter(api).Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(c.Table)}, maxWait); err != nil {
		return fmt.Errorf("dynamostore: table %s not active: %w: %w", c.Table, store.ErrUnavailable, err)
	}
	_, err = api.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(c.Table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(c.ExpiryAttr), Enabled: aws.Bool(true),
		},
	})
	if err != nil && !ttlAlreadyOn(err) {
		return fmt.Errorf("dynamostore: enable TTL on %s.%s: %w", c.Table, c.ExpiryAttr, err)
	}
	return nil
}

// ttlAlreadyOn reports DynamoDB's refusal to enable TTL that is enabled.
func ttlAlreadyOn(err error) bool {
	var ae interface{ ErrorMessage() string }
	return errors.As(err, &ae) && containsFold(ae.ErrorMessage(), "already enabled")
}
