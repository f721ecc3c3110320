package store_test

import (
	"fmt"

	"github.com/seed-a1b882c0/idem/store"
)

// A store that reads and writes a key atomically (under a lock or in a
// transaction) decides claims and fenced writes with the shared helpers.
func ExampleApplyClaim() {
	const now = 1_000_000
	p := store.ClaimParams{Key: "charge#ab", Owner: "worker-1/7", Now: now, LeaseUntil: now + 30_000, ExpiresAt: now + 3_600_000}
	res, rec := store.ApplyClaim(nil, p) // the key is absent: write rec
	fmt.Println(res.Acquired, rec.Fence, rec.Status)

	// A duplicate while the claim is live gets the record, writes nothing.
	p.Owner = "worker-2/3"
	dup, write := store.ApplyClaim(rec, p)
	fmt.Println(dup.Acquired, write == nil)

	// Only the claim's own (fence, owner) may complete it.
	fmt.Println(store.CheckFence(rec, store.ClaimRef{Key: p.Key, Fence: 1, Owner: "worker-2/3", Now: now + 1}))
	fmt.Println(store.CheckFence(rec, store.ClaimRef{Key: p.Key, Fence: 1, Owner: "worker-1/7", Now: now + 1}))
	// Output:
	// true 1 IN_PROGRESS
	// false true
	// idem: write to charge#ab by claim 1 (worker-2/3) refused: record holds claim 1 (worker-1/7), status IN_PROGRESS
	// <nil>
}
