package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// TestCompleteBatchOneScript: a batch of Completes is one invocation of
// the batch script, and each write keeps its own answer: done, refused
// (another claim holds the key), absent, too large (not sent), a damaged
// record (its own error alone), done again.
func TestCompleteBatchOneScript(t *testing.T) {
	t.Parallel()
	s, c := newStore(t, redisstore.Config{MaxResultBytes: 64})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	claim := func(key, owner string) {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: owner, Fingerprint: "fp", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000})
		if err != nil || !res.Acquired {
			t.Fatalf("claim %s: %+v, %v", key, res, err)
		}
	}
	claim("ok", "o")
	claim("other", "someone")
	claim("big", "o")
	claim("ok2", "o")
	if err := c.Set(ctx, s.Prefix()+"damaged", "R1:1:o1soon;5:1;2;1;0;", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	complete := func(key string, result []byte) store.CompleteParams {
		return store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 60_000, Result: result}
	}
	ps := []store.CompleteParams{complete("ok", []byte("r0")), complete("other", []byte("r1")), complete("absent", []byte("r2")),
		complete("big", make([]byte, 65)), complete("damaged", []byte("r4")), complete("ok2", []byte("r5"))}
	var cnt counter
	c.AddHook(&cnt)
	errs := s.CompleteBatch(ctx, ps)
	// Once; twice when the script was flushed meanwhile (a parallel test
	// flushes them): EVALSHA refused, then EVAL.
	if n, p := cnt.piped.Load(), cnt.pipes.Load(); n != p || p < 1 || p > 2 {
		t.Errorf("%d commands in %d pipelines, want the batch script once", n, p)
	}
	var te *store.TooLargeError
	switch {
	case errs[0] != nil || errs[5] != nil:
		t.Errorf("the writes the records allow: %v, %v", errs[0], errs[5])
	case !errors.Is(errs[1], store.ErrFenced):
		t.Errorf("a key another claim holds: %v, want ErrFenced", errs[1])
	case !errors.Is(errs[2], store.ErrNotFound):
		t.Errorf("an absent key: %v, want ErrNotFound", errs[2])
	case !errors.As(errs[3], &te):
		t.Errorf("a result too large: %v, want a TooLargeError", errs[3])
	case !errors.Is(errs[4], store.ErrCorrupt):
		t.Errorf("a damaged record: %v, want ErrCorrupt", errs[4])
	}
	for key, want := range map[string]store.Status{"ok": store.StatusCompleted, "ok2": store.StatusCompleted, "other": store.StatusInProgress, "big": store.StatusInProgress} {
		if rec, err := s.Get(ctx, key); err != nil || rec.Status != want {
			t.Errorf("%s: %+v, %v; want %v", key, rec, err, want)
		}
	}
}

// TestCompleteBatchLongBatch: a batch longer than one invocation decides
// (128 writes) is cut into invocations sent in one pipeline, each write
// with its own answer; a key named twice, in two invocations, sees its
// first write.
func TestCompleteBatchLongBatch(t *testing.T) {
	t.Parallel()
	s, c := newStore(t, redisstore.Config{})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	ps := make([]store.ClaimParams, 250)
	for i := range ps {
		ps[i] = store.ClaimParams{Key: fmt.Sprint("k", i), Owner: "o", Fingerprint: "fp", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000}
	}
	if _, errs := s.ClaimBatch(ctx, ps); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	cs := make([]store.CompleteParams, 300)
	for i := range cs {
		cs[i] = store.CompleteParams{ClaimRef: store.ClaimRef{Key: fmt.Sprint("k", i%250), Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 60_000, Result: []byte(fmt.Sprint(i))}
	}
	c.ScriptLoad(ctx, "return 1") // the connection is up: the hook counts the batch alone
	var cnt counter
	c.AddHook(&cnt)
	errs := s.CompleteBatch(ctx, cs)
	for i, err := range errs {
		if (i < 250) != (err == nil) || i >= 250 && !errors.Is(err, store.ErrFenced) {
			t.Errorf("complete %d: %v", i, err)
		}
	}
	if rec, err := s.Get(ctx, "k3"); err != nil || string(rec.Result) != "3" {
		t.Errorf("k3: %+v, %v; want the first write's result", rec, err)
	}
	if p, n := cnt.pipes.Load(), cnt.piped.Load(); p > 2 || n > 6 {
		t.Errorf("%d pipelines of %d commands: want 3 invocations in one pipeline (two if the script was loaded again)", p, n)
	}
}

// TestClusterBatchOneScriptPerMaster: on Redis Cluster a batch of
// Completes whose keys fall on every master is one invocation of the
// batch script per master (a batch of claims, one pipeline of SET NX GET),
// and every key's answer is its own.
func TestClusterBatchOneScriptPerMaster(t *testing.T) {
	t.Parallel()
	var cnt counter
	c := newClusterClient(t)
	c.OnNewNode(func(n *redis.Client) { n.AddHook(&cnt) })
	s, err := redisstore.New(c, &redisstore.Config{Prefix: newClusterPrefix(t, c)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var nm atomic.Int64
	_ = c.ForEachMaster(ctx, func(context.Context, *redis.Client) error { nm.Add(1); return nil })
	masters := nm.Load()
	now := time.Now().UnixMilli()
	ps := make([]store.ClaimParams, 48)
	for i := range ps {
		ps[i] = store.ClaimParams{Key: fmt.Sprint("k", i), Owner: "o", Fingerprint: "fp", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000}
	}
	held := ps[7]
	held.Owner = "earlier"
	if _, err := s.Claim(ctx, held); err != nil { // held before: a conflict in the batch
		t.Fatal(err)
	}
	for round := range 2 {
		if round == 1 {
			for i := range ps {
				ps[i].Owner = "later" // every key held now: conflicts
			}
		}
		pipes, piped := cnt.pipes.Load(), cnt.piped.Load()
		res, errs := s.ClaimBatch(ctx, ps)
		for i := range ps {
			if errs[i] != nil || res[i].Acquired != (round == 0 && i != 7) {
				t.Fatalf("round %d claim %d: %+v, %v", round, i, res[i], errs[i])
			}
		}
		// One pipeline of SET NX GET, which the cluster client splits by
		// master: no script.
		if p, n := cnt.pipes.Load()-pipes, cnt.piped.Load()-piped; p < 1 || p > masters || n != int64(len(ps)) {
			t.Errorf("round %d: %d pipelines, %d commands for %d masters: want %d SET NX GET", round, p, n, masters, len(ps))
		}
	}
	cs := make([]store.CompleteParams, len(ps))
	for i, p := range ps {
		cs[i] = store.CompleteParams{ClaimRef: store.ClaimRef{Key: p.Key, Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 60_000, Result: []byte("r")}
	}
	cs[3].Owner = "not the holder"
	pipes, piped := cnt.pipes.Load(), cnt.piped.Load()
	errs := s.CompleteBatch(ctx, cs)
	for i, err := range errs {
		refused := i == 3 || i == 7 // not the holder; held by another claim
		if refused != errors.Is(err, store.ErrFenced) || !refused && err != nil {
			t.Errorf("complete %d: %v", i, err)
		}
	}
	if p, n := cnt.pipes.Load()-pipes, cnt.piped.Load()-piped; p != n || p < masters || p > 2*masters {
		t.Errorf("complete: %d pipelines, %d commands for %d masters", p, n, masters)
	}
}

// TestBatchesOnAFullRedis: on a Redis (noeviction) out of memory, every
// claim of a batch (a new key and a duplicate alike: Redis refuses a SET
// before it looks at the key) and every Complete of a batch fails on its
// own as unavailable, never as a damaged record, and changes nothing; once
// memory is freed the same batches go through.
func TestBatchesOnAFullRedis(t *testing.T) {
	t.Parallel()
	_, admin := ownRedis(t, "--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
	s, err := redisstore.New(admin, &redisstore.Config{Prefix: "full:"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Now().UnixMilli()
	claim := func(key string) store.ClaimParams {
		return store.ClaimParams{Key: key, Owner: "o", Fingerprint: "fp", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 600_000}
	}
	complete := func(key string) store.CompleteParams {
		return store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 600_000, Result: []byte("r")}
	}
	if _, errs := s.ClaimBatch(ctx, []store.ClaimParams{claim("done"), claim("held")}); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	if err := s.Complete(ctx, complete("done")); err != nil {
		t.Fatal(err)
	}
	fill(t, admin)
	claims := []store.ClaimParams{claim("new"), claim("done")}
	_, errs := s.ClaimBatch(ctx, claims)
	for i, err := range errs {
		if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrCorrupt) {
			t.Errorf("claim %s on a full Redis: %v, want unavailable", claims[i].Key, err)
		}
	}
	for i, err := range s.CompleteBatch(ctx, []store.CompleteParams{complete("held"), complete("new")}) {
		if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrCorrupt) {
			t.Errorf("complete %d on a full Redis: %v, want unavailable", i, err)
		}
	}
	if _, err := s.Get(ctx, "new"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the refused claim: %v, want no record", err)
	}
	if r, err := s.Get(ctx, "held"); err != nil || r.Status != store.StatusInProgress {
		t.Errorf("the refused Complete's record: %+v, %v; want IN_PROGRESS", r, err)
	}
	unfill(t, admin)
	res, errs := s.ClaimBatch(ctx, claims)
	if errors.Join(errs...) != nil || !res[0].Acquired || res[1].Acquired || res[1].Record.Status != store.StatusCompleted {
		t.Fatalf("claims after memory was freed: %+v, %v", res, errs)
	}
	if err := errors.Join(s.CompleteBatch(ctx, []store.CompleteParams{complete("held"), complete("new")})...); err != nil {
		t.Fatalf("Completes after memory was freed: %v", err)
	}
}
