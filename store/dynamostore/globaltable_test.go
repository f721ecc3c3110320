package dynamostore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

// fakeMRSCConflict is a fake of one behaviour of a global table with
// multi-Region strong consistency that DynamoDB Local cannot show: a write
// racing a write to the same item from another Region fails with
// ReplicatedWriteConflictException. Every other method is absent (nil).
type fakeMRSCConflict struct {
	dynamostore.API
	writes int
}

func (f *fakeMRSCConflict) PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	f.writes++
	return nil, &types.ReplicatedWriteConflictException{Message: new("conflict with a write in another Region")}
}

// A conflict with another Region's write is no decision of the store: the
// claim fails closed as unavailable, and the operation does not run
// (docs/failover.md, DynamoDB).
func TestReplicatedWriteConflictFailsClosed(t *testing.T) {
	api := &fakeMRSCConflict{}
	s, err := dynamostore.New(api, dynamostore.Config{Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s, &idem.Config{RenewInterval: -1, ClockSync: -1}) // the fake answers writes only
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = idem.Do(context.Background(), e, idem.Request{Operation: "pay", Key: "k"}, func(context.Context) (int, error) { ran = true; return 1, nil })
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, idem.ErrStore) || ran || api.writes == 0 {
		t.Fatalf("claim meeting a replicated write conflict: %v (ran %v, writes %d), want a store error wrapping ErrUnavailable and no run", err, ran, api.writes)
	}
}
