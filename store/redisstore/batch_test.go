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
// Extends, and one of Completes, whose keys fall on every master is one
// invocation of the batch script per master (a batch of claims, one
// pipeline of SET NX GET), and every key's answer is its own.
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
	xs := make([]store.ExtendParams, len(ps))
	for i, p := range ps {
		xs[i] = store.ExtendParams{ClaimRef: store.ClaimRef{Key: p.Key, Fence: 1, Owner: "o", Now: now}, LeaseUntil: now + 20_000 + int64(i)}
	}
	xs[3].Owner = "not the holder"
	pipes, piped := cnt.pipes.Load(), cnt.piped.Load()
	for i, err := range s.ExtendBatch(ctx, xs) {
		refused := i == 3 || i == 7 // not the holder; held by another claim
		if refused != errors.Is(err, store.ErrFenced) || !refused && err != nil {
			t.Errorf("extend %d: %v", i, err)
		}
	}
	if p, n := cnt.pipes.Load()-pipes, cnt.piped.Load()-piped; p != n || p < masters || p > 2*masters {
		t.Errorf("extend: %d pipelines, %d commands for %d masters", p, n, masters)
	}
	for _, i := range []int{0, 3, 47} {
		want := xs[i].LeaseUntil
		if i == 3 {
			want = now + 10_000
		}
		if r, err := s.Get(ctx, xs[i].Key); err != nil || r.LeaseUntil != want {
			t.Errorf("%s after the batch: %+v, %v; want lease %d", xs[i].Key, r, err, want)
		}
	}
	cs := make([]store.CompleteParams, len(ps))
	for i, p := range ps {
		cs[i] = store.CompleteParams{ClaimRef: store.ClaimRef{Key: p.Key, Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 60_000, Result: []byte("r")}
	}
	cs[3].Owner = "not the holder"
	pipes, piped = cnt.pipes.Load(), cnt.piped.Load()
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

// TestExtendBatchOneScript: a batch of Extends is one invocation of the
// batch script, each write keeps its own answer (renewed, refused because
// another claim holds the key, absent, a damaged record: its own error
// alone, a settled From: not sent), and each renewal writes exactly what
// the same Extend alone writes, its lease and ref, the rest of the record
// and the key's expiry kept.
func TestExtendBatchOneScript(t *testing.T) {
	t.Parallel()
	s, c := newStore(t, redisstore.Config{})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	claim := func(key, owner string) {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: owner, Fingerprint: "fp", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000})
		if err != nil || !res.Acquired {
			t.Fatalf("claim %s: %+v, %v", key, res, err)
		}
	}
	for _, k := range []string{"a", "b", "from", "one-a", "one-b"} {
		claim(k, "o")
	}
	claim("other", "someone")
	// A record whose kept fields have no ';': its Extend cannot be written.
	damaged := "R1:1:o1" + fmt.Sprint(now+60_000) + ";3:abc0;"
	if err := c.Set(ctx, s.Prefix()+"damaged", damaged, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	extend := func(key string, until int64, ref string) store.ExtendParams {
		return store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now + 1}, LeaseUntil: until, Ref: ref}
	}
	bad := extend("from", now+50_000, "")
	bad.From = store.StatusCompleted
	ps := []store.ExtendParams{extend("a", now+30_000, ""), extend("other", now+50_000, ""), extend("absent", now+50_000, ""),
		extend("damaged", now+50_000, ""), bad, extend("b", 0, "exec-1")}
	c.ScriptLoad(ctx, "return 1") // the connection is up: the hook counts the batch alone
	var cnt counter
	c.AddHook(&cnt)
	errs := s.ExtendBatch(ctx, ps)
	// Once; twice when the script was flushed meanwhile (a parallel test
	// flushes them): EVALSHA refused, then EVAL.
	if n, p := cnt.piped.Load(), cnt.pipes.Load(); n != p || p < 1 || p > 2 || cnt.cmds.Load() != 0 {
		t.Errorf("%d commands in %d pipelines and %d alone, want the batch script once", n, p, cnt.cmds.Load())
	}
	switch {
	case len(errs) != len(ps):
		t.Fatalf("%d errors for %d Extends", len(errs), len(ps))
	case errs[0] != nil || errs[5] != nil:
		t.Errorf("the renewals the records allow: %v, %v", errs[0], errs[5])
	case !errors.Is(errs[1], store.ErrFenced):
		t.Errorf("a key another claim holds: %v, want ErrFenced", errs[1])
	case !errors.Is(errs[2], store.ErrNotFound):
		t.Errorf("an absent key: %v, want ErrNotFound", errs[2])
	case !errors.Is(errs[3], store.ErrCorrupt):
		t.Errorf("a damaged record: %v, want ErrCorrupt", errs[3])
	case !errors.Is(errs[4], store.ErrInvalidParams):
		t.Errorf("a settled From: %v, want ErrInvalidParams", errs[4])
	}
	// The same renewals one by one, on twins of a and b.
	for _, p := range []store.ExtendParams{extend("one-a", now+30_000, ""), extend("one-b", 0, "exec-1")} {
		if err := s.Extend(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"a", "b"} {
		batch, err1 := c.Get(ctx, s.Prefix()+k).Result()
		one, err2 := c.Get(ctx, s.Prefix()+"one-"+k).Result()
		if err1 != nil || err2 != nil || batch != one {
			t.Errorf("%s renewed in a batch: %q, %v; alone: %q, %v", k, batch, err1, one, err2)
		}
		if ttl := c.PTTL(ctx, s.Prefix()+k).Val(); ttl < 50*time.Second || ttl > 61*time.Second {
			t.Errorf("%s: key expiry %v after the batch, want the claim's (60s)", k, ttl)
		}
	}
	if r, err := s.Get(ctx, "b"); err != nil || r.LeaseUntil != now+10_000 || r.Ref != "exec-1" || r.Fingerprint != "fp" {
		t.Errorf("b: %+v, %v; want its lease kept and ref exec-1", r, err)
	}
	for key, want := range map[string]string{"other": "", "damaged": damaged} {
		v, err := c.Get(ctx, s.Prefix()+key).Result()
		if err != nil || want != "" && v != want {
			t.Errorf("%s after the batch: %q, %v", key, v, err)
		}
	}
	if r, err := s.Get(ctx, "other"); err != nil || r.LeaseUntil != now+10_000 {
		t.Errorf("the refused renewal's record: %+v, %v; want its lease kept", r, err)
	}
}

// TestExtendBatchLongBatch: a batch longer than one invocation decides
// (128 writes) is cut into invocations sent in one pipeline, each write
// with its own answer; a key named twice, in two invocations, gets both
// renewals in order: the later lease.
func TestExtendBatchLongBatch(t *testing.T) {
	t.Parallel()
	s, c := newStore(t, redisstore.Config{})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	ps := make([]store.ClaimParams, 250)
	for i := range ps {
		ps[i] = store.ClaimParams{Key: fmt.Sprint("k", i), Owner: "o", Fingerprint: "fp", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000}
	}
	ps[9].Owner = "another"
	if _, errs := s.ClaimBatch(ctx, ps); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	xs := make([]store.ExtendParams, 300)
	for i := range xs {
		xs[i] = store.ExtendParams{ClaimRef: store.ClaimRef{Key: fmt.Sprint("k", i%250), Fence: 1, Owner: "o", Now: now}, LeaseUntil: now + 20_000 + int64(i)}
	}
	c.ScriptLoad(ctx, "return 1") // the connection is up: the hook counts the batch alone
	var cnt counter
	c.AddHook(&cnt)
	errs := s.ExtendBatch(ctx, xs)
	for i, err := range errs {
		if fenced := i%250 == 9; fenced != errors.Is(err, store.ErrFenced) || !fenced && err != nil {
			t.Errorf("extend %d: %v", i, err)
		}
	}
	if p, n := cnt.pipes.Load(), cnt.piped.Load(); p > 2 || n > 6 {
		t.Errorf("%d pipelines of %d commands: want 3 invocations in one pipeline (two if the script was loaded again)", p, n)
	}
	for key, want := range map[string]int64{"k3": xs[253].LeaseUntil, "k100": xs[100].LeaseUntil, "k9": now + 10_000} {
		if r, err := s.Get(ctx, key); err != nil || r.LeaseUntil != want {
			t.Errorf("%s: %+v, %v; want lease %d", key, r, err, want)
		}
	}
}

// TestBatchesOnAFullRedis: on a Redis (noeviction) out of memory, every
// claim of a batch (a new key and a duplicate alike: Redis refuses a SET
// before it looks at the key) and every Complete and Extend of a batch
// fails on its own as unavailable, never as a damaged record, and changes
// nothing; once memory is freed the same batches go through.
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
	extend := []store.ExtendParams{{ClaimRef: store.ClaimRef{Key: "held", Fence: 1, Owner: "o", Now: now}, LeaseUntil: now + 120_000}}
	for _, err := range s.ExtendBatch(ctx, extend) {
		if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrCorrupt) {
			t.Errorf("extend on a full Redis: %v, want unavailable", err)
		}
	}
	if _, err := s.Get(ctx, "new"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the refused claim: %v, want no record", err)
	}
	if r, err := s.Get(ctx, "held"); err != nil || r.Status != store.StatusInProgress || r.LeaseUntil != now+60_000 {
		t.Errorf("the refused Complete's and Extend's record: %+v, %v; want IN_PROGRESS, its lease kept", r, err)
	}
	unfill(t, admin)
	res, errs := s.ClaimBatch(ctx, claims)
	if errors.Join(errs...) != nil || !res[0].Acquired || res[1].Acquired || res[1].Record.Status != store.StatusCompleted {
		t.Fatalf("claims after memory was freed: %+v, %v", res, errs)
	}
	if err := errors.Join(s.ExtendBatch(ctx, extend)...); err != nil {
		t.Fatalf("Extends after memory was freed: %v", err)
	}
	if err := errors.Join(s.CompleteBatch(ctx, []store.CompleteParams{complete("held"), complete("new")})...); err != nil {
		t.Fatalf("Completes after memory was freed: %v", err)
	}
}
