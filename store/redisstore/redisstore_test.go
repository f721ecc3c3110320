package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/faultproxy"
	"github.com/seed-a1b882c0/idem/idemtest/httpasync"
	"github.com/seed-a1b882c0/idem/idemtest/storefaults"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// addr is the Redis under test (see testenv for when tests skip).
func addr(t testing.TB) string {
	return testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
}

var prefixSeq atomic.Int64

// newClient returns a client for a, closed (and the prefix's keys deleted)
// when the test ends.
func newClient(t testing.TB, a string, opts ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: a, ReadTimeout: storefaults.Timeout, WriteTimeout: storefaults.Timeout, DialTimeout: storefaults.Timeout, MaxRetries: -1}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// newPrefix returns a key prefix unique to this test, whose keys are
// deleted when it ends.
func newPrefix(t testing.TB, c redis.UniversalClient) string {
	p := fmt.Sprintf("idemtest:%d:%x:", prefixSeq.Add(1), rand.Uint32())
	t.Cleanup(func() { deletePrefix(c, p) })
	return p
}

// deletePrefix deletes the keys under p of the server c reaches (one
// server, not a cluster: see deleteClusterPrefix).
func deletePrefix(c redis.UniversalClient, p string) {
	ctx := context.Background()
	iter := c.Scan(ctx, 0, p+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
}

// newStore returns a store on the Redis under test, with a client that
// has go-redis's default timeouts (3s): the fault suite's short timeout
// (newClient's default) is for a server that does not answer, and on a
// busy machine a healthy Redis sometimes answers later than that.
func newStore(t testing.TB, cfg redisstore.Config) (*redisstore.Store, *redis.Client) {
	c := newClient(t, addr(t), func(o *redis.Options) { o.ReadTimeout, o.WriteTimeout = 0, 0 })
	cfg.Prefix = newPrefix(t, c)
	s, err := redisstore.New(c, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

const limit = 4 << 20

// idemhttp's asynchronous mode over Redis: a claim handed off with its
// reference, a status resource read back, and a worker in another engine
// settling the key through its token.
func TestIdemHTTPAsync(t *testing.T) {
	httpasync.Run(t, func(t *testing.T) store.Store {
		s, _ := newStore(t, redisstore.Config{})
		return s
	})
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Features{MaxResultBytes: limit, StormGoroutines: 256}, func(t *testing.T) store.Store {
		s, _ := newStore(t, redisstore.Config{MaxResultBytes: limit})
		return s
	})
}

func TestFaults(t *testing.T) {
	target := addr(t)
	prefixes := map[string]string{}
	storefaults.Run(t, target, func(t *testing.T, a string) store.Store {
		c := newClient(t, a)
		p, ok := prefixes[t.Name()]
		if !ok {
			p = newPrefix(t, c)
			prefixes[t.Name()] = p
		}
		s, err := redisstore.New(c, &redisstore.Config{Prefix: p})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// counter counts commands and pipelines sent by a client (not what sets
// up a new connection: HELLO, CLIENT SETINFO).
type counter struct{ cmds, pipes, piped atomic.Int64 } // piped: the commands in pipelines

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n != "hello" && n != "client" {
			c.cmds.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := cmds[0].Name(); n != "hello" && n != "client" {
			c.pipes.Add(1)
			c.piped.Add(int64(len(cmds)))
		}
		return next(ctx, cmds)
	}
}

func TestOneRoundTripPerOperation(t *testing.T) {
	s, c := newStore(t, redisstore.Config{})
	c.ScriptFlush(context.Background()) // the first calls must load on a miss
	var cnt counter
	c.AddHook(&cnt)
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	call := func(key string) idem.Result[string] {
		res, err := idem.Do(context.Background(), e, idem.Request{Operation: "charge", Key: key}, func(context.Context) (string, error) { runs++; return "ok", nil })
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// The engine's first call also reads Redis's clock (TIME), once per
	// Config.ClockSync interval; then claim: SET NX GET; complete: EVALSHA
	// misses, EVAL loads.
	call("k0")
	if n := cnt.cmds.Load(); n != 4 {
		t.Errorf("first call after SCRIPT FLUSH sent %d commands, want 4 (TIME, SET, EVALSHA+EVAL)", n)
	}
	for _, want := range []struct {
		key  string
		cmds int64
	}{{"k1", 2}, {"k1", 1}} {
		before := cnt.cmds.Load()
		call(want.key)
		if n := cnt.cmds.Load() - before; n != want.cmds {
			t.Errorf("call %s: %d commands, want %d", want.key, n, want.cmds)
		}
	}
	if runs != 2 {
		t.Errorf("runs %d, want 2", runs)
	}
}

// TestClaimBatch: a batch of claims is one pipeline of SET NX GET, one
// per claim, and no script: new keys acquired, held and completed keys
// answered with their live records. A record whose lease passed goes to
// the claim script in a second pipeline (loaded on NOSCRIPT), and a later
// claim of its key in the same batch with it, so that it sees the
// takeover.
func TestClaimBatch(t *testing.T) {
	s, c := newStore(t, redisstore.Config{})
	ctx := context.Background()
	c.ScriptFlush(ctx)
	var cnt counter
	c.AddHook(&cnt)
	now := time.Now().Add(time.Hour).UnixMilli()
	mk := func(i int, owner string) store.ClaimParams {
		return store.ClaimParams{Key: fmt.Sprintf("b#%02d", i), Owner: owner, Fingerprint: "fp", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000}
	}
	// Five keys held by someone else, one completed; one whose lease has
	// passed.
	for i := range 5 {
		if _, err := s.Claim(ctx, mk(i, "other")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "b#00", Fence: 1, Owner: "other", Now: now}, ExpiresAt: now + 60_000, Result: []byte("done")}); err != nil {
		t.Fatal(err)
	}
	stale := mk(10, "gone")
	stale.Now, stale.LeaseUntil = now-20_000, now-10_000
	if _, err := s.Claim(ctx, stale); err != nil {
		t.Fatal(err)
	}
	ps := make([]store.ClaimParams, 12)
	for i := range 10 {
		ps[i] = mk(i, "batch")
	}
	ps[10], ps[11] = mk(10, "batch"), mk(10, "batch-b")
	pipes, piped := cnt.pipes.Load(), cnt.piped.Load()
	res, errs := s.ClaimBatch(ctx, ps)
	for i := range ps {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		if res[i].Acquired != (i >= 5 && i <= 10) {
			t.Errorf("claim %d: acquired %v", i, res[i].Acquired)
		}
	}
	if string(res[0].Record.Result) != "done" || res[1].Record.Owner != "other" {
		t.Errorf("conflicts did not return the live records: %+v, %+v", res[0].Record, res[1].Record)
	}
	if !res[10].Takeover || res[10].Record.Fence != 2 {
		t.Errorf("the claim of a record whose lease passed: %+v, want a takeover at fence 2", res[10])
	}
	if r := res[11].Record; r == nil || r.Owner != "batch" || r.Fence != 2 {
		t.Errorf("the key named again: %+v, want the takeover's claim", r)
	}
	// The SETs; then the claim script for the last two claims (twice:
	// EVALSHA missed, scripts were flushed, then EVAL; once if another
	// client of the server loaded it meanwhile).
	if p, n := cnt.pipes.Load()-pipes, cnt.piped.Load()-piped; !(p == 3 && n == 12+2+2 || p == 2 && n == 12+2) {
		t.Errorf("batch: %d pipelines of %d commands, want 3 of 16 (12 SET, 2 EVALSHA, 2 EVAL)", p, n)
	}
	for i := range ps {
		ps[i].Owner = "batch-2"
	}
	pipes, piped = cnt.pipes.Load(), cnt.piped.Load()
	res, errs = s.ClaimBatch(ctx, ps)
	if n := cnt.pipes.Load() - pipes; n != 1 || errors.Join(errs...) != nil || res[7].Acquired {
		t.Errorf("second batch: %d pipelines, errs %v; want 1 pipeline and all conflicts", n, errs)
	}
	if n := cnt.piped.Load() - piped; n != int64(len(ps)) {
		t.Errorf("second batch: %d commands, want %d (a SET NX GET each)", n, len(ps))
	}
}

func TestNativeExpiryFollowsRecord(t *testing.T) {
	s, c := newStore(t, redisstore.Config{})
	now := time.Now().UnixMilli()
	if _, err := s.Claim(context.Background(), store.ClaimParams{Key: "x#1", Owner: "o", Now: now, LeaseUntil: now + 1000, ExpiresAt: now + 50_000}); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(context.Background(), store.CompleteParams{ClaimRef: store.ClaimRef{Key: "x#1", Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 900_000, Result: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	at, err := c.PExpireTime(context.Background(), s.Prefix()+"x#1").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got := at.Milliseconds(); got != now+900_000 {
		t.Fatalf("key expires at %d, want the record's expiry %d", got, now+900_000)
	}
}

func TestDamagedRecordFailsClosed(t *testing.T) {
	s, c := newStore(t, redisstore.Config{})
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, damage := range map[string]func(k string){
		"fence not a number": func(k string) { c.HSet(ctx, k, "st", 2, "f", "x", "l", 1, "e", 1<<50, "c", 1, "v", 1, "r", "{}") },
		"no result":          func(k string) { c.HSet(ctx, k, "st", 2, "f", 1, "l", 1, "e", 1<<50, "c", 1, "v", 1) },
		"unknown status":     func(k string) { c.HSet(ctx, k, "st", 9, "f", 1, "l", 1, "e", 1<<50, "c", 1, "v", 1) },
		"not a hash":         func(k string) { c.Set(ctx, k, "garbage", 0) },
	} {
		r := idem.Request{Operation: "charge", Key: name}
		id, _ := r.Identity()
		damage(s.Prefix() + id.StoreKey.String())
		ran := false
		_, err := idem.Do(ctx, e, r, func(context.Context) (int, error) { ran = true; return 1, nil })
		if !errors.Is(err, store.ErrCorrupt) || ran {
			t.Errorf("%s: %v, ran %v; want ErrCorrupt and no run", name, err, ran)
		}
	}
}

func TestOpenURLAndConfig(t *testing.T) {
	a := addr(t)
	s, err := redisstore.Open("redis://"+a+"/0", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := redisstore.Open("http://nope", nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("bad URL: %v", err)
	}
	if _, err := redisstore.New(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil client: %v", err)
	}
}

// WAIT counts the replicas holding its own connection's writes, so every
// write goes in one pipeline with its WAIT (one connection); without
// replicas, the write fails closed.
func TestWaitReplicasWithoutReplicasFailsClosed(t *testing.T) {
	s, c := newStore(t, redisstore.Config{WaitReplicas: 1, WaitTimeout: 50})
	now := time.Now().UnixMilli()
	ctx := context.Background()
	_, _ = s.Claim(ctx, store.ClaimParams{Key: "w#0", Owner: "o", Now: now, LeaseUntil: now + 1000, ExpiresAt: now + 5000}) // the client's first connection
	var cnt counter
	c.AddHook(&cnt)
	_, err := s.Claim(ctx, store.ClaimParams{Key: "w#1", Owner: "o", Now: now, LeaseUntil: now + 1000, ExpiresAt: now + 5000})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("claim waiting for a replica that does not exist: %v, want ErrUnavailable", err)
	}
	if cnt.pipes.Load() != 0 || cnt.cmds.Load() != 2 {
		t.Errorf("claim sent %d pipelines and %d lone commands, want the write, then its WAIT", cnt.pipes.Load(), cnt.cmds.Load())
	}
	err = s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "w#1", Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 5000, Result: []byte("r")})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("complete waiting for a replica that does not exist: %v, want ErrUnavailable", err)
	}
	_, errs := s.ClaimBatch(ctx, []store.ClaimParams{{Key: "w#2", Owner: "o", Now: now, LeaseUntil: now + 1000, ExpiresAt: now + 5000}})
	if !errors.Is(errs[0], store.ErrUnavailable) {
		t.Fatalf("batch claim waiting for a replica that does not exist: %v, want ErrUnavailable", errs[0])
	}
}

// A settled record corrected by its claim (From) keeps nothing of its
// former status: the payload (result or error) is replaced whole, and the
// claim's own fields (lease, reference) are kept.
func TestResettleRemovesOldFields(t *testing.T) {
	s, c := newStore(t, redisstore.Config{})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	k := s.Prefix() + "rs#1"
	get := func() *store.Record {
		t.Helper()
		r, err := s.Get(ctx, "rs#1")
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if _, err := s.Claim(ctx, store.ClaimParams{Key: "rs#1", Owner: "o", Fingerprint: "fp", Now: now, LeaseUntil: now + 1000, ExpiresAt: now + 50_000}); err != nil {
		t.Fatal(err)
	}
	if err := s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: "rs#1", Fence: 1, Owner: "o", Now: now}, Ref: "exec-1"}); err != nil {
		t.Fatal(err)
	}
	if r := get(); r.Ref != "exec-1" || r.LeaseUntil != now+1000 || r.Fingerprint != "fp" || r.CreatedAt != now {
		t.Fatalf("after attaching: %+v; want ref exec-1 and lease, fingerprint, created unchanged", r)
	}
	if err := s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: "rs#1", Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 60_000, Err: store.ErrorRecord{Code: "c", Message: "m", Body: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "rs#1", Fence: 1, Owner: "o", From: store.StatusFailed, Now: now + 1}, ExpiresAt: now + 70_000, Result: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	raw, err := c.Get(ctx, k).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(raw, strconv.FormatInt(now+1, 10)+";r") {
		t.Errorf("COMPLETED from FAILED: value %q, want the result alone after the completion time", raw)
	}
	if r := get(); r.Err != nil || string(r.Result) != "r" || r.Ref != "exec-1" || r.Fingerprint != "fp" || r.CompletedAt != now+1 {
		t.Errorf("COMPLETED from FAILED: %+v", r)
	}
	if err := s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: "rs#1", Fence: 1, Owner: "o", From: store.StatusCompleted, Now: now + 2}, ExpiresAt: now + 80_000, Err: store.ErrorRecord{Code: "c"}}); err != nil {
		t.Fatal(err)
	}
	if r := get(); r.Result != nil || r.Err == nil || r.Err.Code != "c" || r.Err.Message != "" || r.Err.Body != nil {
		t.Errorf("FAILED from COMPLETED: %+v", r)
	}
	at, err := c.PExpireTime(ctx, k).Result()
	if err != nil {
		t.Fatal(err)
	}
	if got := at.Milliseconds(); got != now+80_000 {
		t.Errorf("key expires at %d, want the corrected record's expiry %d", got, now+80_000)
	}
}

// A Redis that cannot be reached fails every key of a batch with
// ErrUnavailable.
func TestClaimBatchUnavailable(t *testing.T) {
	t.Parallel()
	c := newClient(t, "127.0.0.1:1")
	s, err := redisstore.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	ps := []store.ClaimParams{{Key: "a", Owner: "o", Now: now, LeaseUntil: now + 1, ExpiresAt: now + 2}, {Key: "b", Owner: "o", Now: now, LeaseUntil: now + 1, ExpiresAt: now + 2}, {Key: "a", Owner: "p", Now: now, LeaseUntil: now + 1, ExpiresAt: now + 2}}
	res, errs := s.ClaimBatch(context.Background(), ps)
	for i := range ps {
		if !errors.Is(errs[i], store.ErrUnavailable) || res[i].Acquired || res[i].Record != nil {
			t.Errorf("claim %d: %+v, %v; want ErrUnavailable and no record", i, res[i], errs[i])
		}
	}
}

// Owners and fingerprints are stored with their lengths: separators in
// them do not confuse the layout or the scripts' comparison of claims.
func TestOddOwnersAndFingerprints(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redisstore.Config{})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	owners := []string{"", "R1:2:", "a;b:c", "1", "11", "ü:;R\n", strings.Repeat("x", 300)}
	for i, o := range owners {
		key := "odd#" + strconv.Itoa(i)
		fp := o + ";fp:"
		res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: o, Fingerprint: fp, Now: now, LeaseUntil: now + 1000, ExpiresAt: now + 50_000})
		if err != nil || !res.Acquired {
			t.Fatalf("%q: %+v, %v", o, res, err)
		}
		// Another owner that is a prefix or an extension of this one is
		// fenced out.
		for _, other := range []string{o + "x", o + ":", "x" + o} {
			var fe *store.FencedError
			if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: other, Now: now}, ExpiresAt: now + 60_000, Result: []byte("no")}); !errors.As(err, &fe) || fe.CurrentOwner != o {
				t.Fatalf("%q completed by %q: %v, want FencedError naming %q", o, other, err, o)
			}
		}
		if err := s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: o, Now: now}, LeaseUntil: now + 2000, Ref: o + "ref"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: o, Now: now}, ExpiresAt: now + 60_000, Result: []byte(o)}); err != nil {
			t.Fatalf("%q: %v", o, err)
		}
		r, err := s.Get(ctx, key)
		if err != nil || r.Owner != o || r.Fingerprint != fp || string(r.Result) != o || r.Ref != o+"ref" || r.LeaseUntil != now+2000 {
			t.Fatalf("%q: %+v, %v", o, r, err)
		}
	}
}

// A record whose claim prefix is intact but whose other fields are damaged
// fails every fenced write closed.
func TestDamagedValueFailsFencedWrites(t *testing.T) {
	t.Parallel()
	s, c := newStore(t, redisstore.Config{})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	for name, v := range map[string]string{
		"expiry not a number": "R1:1:o1soon;5:1;2;1;0;",
		"no keep length":      "R1:1:o1" + strconv.FormatInt(now+60_000, 10) + ";",
		"unknown status":      "R1:1:o9" + strconv.FormatInt(now+60_000, 10) + ";9:1;2;1;0:0;",
	} {
		if err := c.Set(ctx, s.Prefix()+name, v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: name, Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 60_000, Result: []byte("r")})
		if !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("%s: complete %v, want ErrCorrupt", name, err)
		}
		if _, err := s.Get(ctx, name); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("%s: get %v, want ErrCorrupt", name, err)
		}
	}
}

// TestEngineBatchesCompletesOverRedis: the engine over this store sends
// the Completes of calls that finish together in one pipeline
// (store.BatchCompleter): with 20 ms on every reply, sixteen operations of
// a batch finish while the first Complete is in flight, and the rest of
// their Completes share one round trip instead of fifteen. Every outcome
// is recorded.
func TestEngineBatchesCompletesOverRedis(t *testing.T) {
	px, err := faultproxy.New(addr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	s, c := newStoreAt(t, px.Addr(), redisstore.Config{})
	px.SetLatency(20 * time.Millisecond)
	defer px.SetLatency(0) // the cleanup's scan runs at full speed
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]idem.Identity, 16)
	for i := range ids {
		r := idem.Request{Operation: "batched", Key: fmt.Sprint("k", i)}
		if ids[i], err = r.Identity(); err != nil {
			t.Fatal(err)
		}
	}
	var cnt counter
	c.AddHook(&cnt)
	start := time.Now()
	res, errs := idem.DoBatch(context.Background(), e, ids, nil, func(_ context.Context, i int) (int, error) { return i, nil })
	for i := range ids {
		if errs[i] != nil || res[i].Recorded != store.StatusCompleted {
			t.Fatalf("call %d: Recorded %v, %v", i, res[i].Recorded, errs[i])
		}
	}
	// One pipeline claims the batch; the Completes go one alone and the
	// rest in pipelines, far fewer round trips than sixteen.
	alone, pipes := cnt.cmds.Load(), cnt.pipes.Load()
	t.Logf("DoBatch %v; %d alone, %d pipelines", time.Since(start), alone, pipes)
	if pipes < 2 || alone+pipes-1 > 8 {
		t.Errorf("%d Completes alone and %d pipelines (claims included): want the Completes batched", alone, pipes)
	}
}
