package pgstore_test

import (
	"testing"

	"github.com/seed-a1b882c0/idem/idemtest/clockskew"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/pgstore"
)

// The store tells PostgreSQL's own clock: on this machine, the same as the
// local one within the round trip.
func TestServerTime(t *testing.T) {
	s, _ := newStore(t, pgstore.Config{})
	clockskew.ServerTime(t, s, 0)
}

// Two engines whose clocks are 45s and 5 min apart run an operation once
// on one PostgreSQL: leases are decided on the server's clock.
func TestClockSkew(t *testing.T) {
	clockskew.Run(t, func(t *testing.T) store.Store {
		s, _ := newStore(t, pgstore.Config{})
		return s
	})
}
