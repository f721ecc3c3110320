package dynamostore_test

import (
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemtest/clockskew"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
)

// The store tells DynamoDB's own clock, from the Date header of a read: on
// this machine, the local time within the header's resolution (half a
// second either way, ServerTime returning the middle of the second) and
// the round trip.
func TestServerTime(t *testing.T) {
	ep := testenv.DynamoDB(t)
	for name, cfg := range map[string]dynamostore.Config{"key only": {}, "sort key": {SortKeyAttr: "sk", PartitionValue: "idem"}} {
		t.Run(name, func(t *testing.T) {
			clockskew.ServerTime(t, newStore(t, dynamotest.NewClient(ep), cfg), 1100*time.Millisecond)
		})
	}
}

// Two engines whose clocks are 45s and 5 min apart run an operation once
// on one DynamoDB Local table: leases are decided on the service's clock
// (its Date header, to the second).
func TestClockSkew(t *testing.T) {
	ep := testenv.DynamoDB(t)
	clockskew.Run(t, func(t *testing.T) store.Store {
		return newStore(t, dynamotest.NewClient(ep), dynamostore.Config{})
	})
}
