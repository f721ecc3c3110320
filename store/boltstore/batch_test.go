package boltstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/boltstore"
)

// TestExtendBatchOneCommit: a batch of Extends is one group commit (one
// transaction, one write per key renewed), each renewal with its own
// answer; a held Local claim renewed in the batch is in the file
// afterwards, as after Extend; a key named twice gets both renewals, in
// order.
func TestExtendBatchOneCommit(t *testing.T) {
	t.Parallel()
	s := open(t, &boltstore.Config{SweepInterval: -1})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	claim := func(key, owner string, local bool) {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: owner, Fingerprint: "fp", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000, Local: local})
		if err != nil || !res.Acquired {
			t.Fatalf("claim %s: %+v, %v", key, res, err)
		}
	}
	claim("held", "o", true)
	claim("begun", "o", false)
	claim("other", "someone", false)
	extend := func(key string, until int64, ref string) store.ExtendParams {
		return store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now + 1}, LeaseUntil: until, Ref: ref}
	}
	bad := extend("begun", now+500_000, "")
	bad.From = store.StatusFailed
	ps := []store.ExtendParams{extend("held", now+120_000, ""), extend("other", now+500_000, ""), extend("begun", now+130_000, ""),
		extend("absent", now+500_000, ""), bad, extend("begun", 0, "exec-1")}
	commits, writes := s.CommitStats()
	errs := s.ExtendBatch(ctx, ps)
	if c, w := s.CommitStats(); c != commits+1 || w != writes+2 {
		t.Errorf("the batch made %d commits of %d writes, want 1 of 2", c-commits, w-writes)
	}
	switch {
	case len(errs) != len(ps):
		t.Fatalf("%d errors for %d Extends", len(errs), len(ps))
	case errs[0] != nil || errs[2] != nil || errs[5] != nil:
		t.Errorf("the renewals the records allow: %v, %v, %v", errs[0], errs[2], errs[5])
	case !errors.Is(errs[1], store.ErrFenced):
		t.Errorf("a key another claim holds: %v, want ErrFenced", errs[1])
	case !errors.Is(errs[3], store.ErrNotFound):
		t.Errorf("an absent key: %v, want ErrNotFound", errs[3])
	case !errors.Is(errs[4], store.ErrInvalidParams):
		t.Errorf("a settled From: %v, want ErrInvalidParams", errs[4])
	}
	c, err := boltstore.Open(copyFile(t, s.Path()), &boltstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for key, want := range map[string]struct {
		lease int64
		ref   string
	}{"held": {now + 120_000, ""}, "begun": {now + 130_000, "exec-1"}, "other": {now + 60_000, ""}} {
		for name, st := range map[string]*boltstore.Store{"store": s, "file": c} {
			if r, err := st.Get(ctx, key); err != nil || r.Status != store.StatusInProgress || r.LeaseUntil != want.lease || r.Ref != want.ref {
				t.Errorf("%s in the %s: %+v, %v; want lease %d, ref %q", key, name, r, err, want.lease, want.ref)
			}
		}
	}
	if errs := s.ExtendBatch(ctx, nil); len(errs) != 0 {
		t.Errorf("empty batch: %v", errs)
	}
}

// TestExtendBatchesConcurrent: batches naming the same keys in opposite
// orders, and single Extends of them, run at once: none waits for another
// for ever (a batch takes its keys' slots in key order), and every
// renewal of the holder is made.
func TestExtendBatchesConcurrent(t *testing.T) {
	t.Parallel()
	s := open(t, &boltstore.Config{SweepInterval: -1})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	keys := make([]string, 8)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		if _, err := s.Claim(ctx, store.ClaimParams{Key: keys[i], Owner: "o", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000, Local: i%2 == 0}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			ps := make([]store.ExtendParams, len(keys))
			for i := range ps {
				k := keys[i]
				if g%2 == 1 {
					k = keys[len(keys)-1-i]
				}
				ps[i] = store.ExtendParams{ClaimRef: store.ClaimRef{Key: k, Fence: 1, Owner: "o", Now: now}, LeaseUntil: now + 120_000}
			}
			for range 10 {
				if g == 0 {
					for _, p := range ps {
						if err := s.Extend(ctx, p); err != nil {
							t.Errorf("extend %s: %v", p.Key, err)
						}
					}
					continue
				}
				if err := errors.Join(s.ExtendBatch(ctx, ps)...); err != nil {
					t.Errorf("batch %d: %v", g, err)
				}
			}
		})
	}
	wg.Wait()
	for _, k := range keys {
		if r, err := s.Get(ctx, k); err != nil || r.LeaseUntil != now+120_000 {
			t.Errorf("%s: %+v, %v", k, r, err)
		}
	}
}
