package redisstore_test

import (
	"testing"

	"github.com/seed-a1b882c0/idem/idemtest/clockskew"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// The store tells Redis's own clock (TIME): on this machine, the same as
// the local one within the round trip.
func TestServerTime(t *testing.T) {
	s, _ := newStore(t, redisstore.Config{})
	clockskew.ServerTime(t, s, 0)
}

// Two engines whose clocks are 45s and 5 min apart run an operation once
// on one Redis: leases are decided on Redis's clock.
func TestClockSkew(t *testing.T) {
	clockskew.Run(t, func(t *testing.T) store.Store {
		s, _ := newStore(t, redisstore.Config{})
		return s
	})
}

// The same on a real Redis Cluster.
func TestClusterClockSkew(t *testing.T) {
	clockskew.Run(t, func(t *testing.T) store.Store {
		s, _ := newClusterStore(t, redisstore.Config{})
		return s
	})
}
