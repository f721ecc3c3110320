package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/redisnodes"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// ownRedis starts a redis-server of the test's own (never the shared
// one: the tests change its config) with the config directives args, and
// returns its address and a client for it.
func ownRedis(t *testing.T, args ...string) (string, *redis.Client) {
	t.Helper()
	a := redisnodes.Start(t, args...)
	c := redis.NewClient(&redis.Options{Addr: a})
	t.Cleanup(func() { c.Close() })
	return a, c
}

func configSet(t *testing.T, c redis.Cmdable, kv ...string) {
	t.Helper()
	for i := 0; i < len(kv); i += 2 {
		if err := c.ConfigSet(context.Background(), kv[i], kv[i+1]).Err(); err != nil {
			t.Fatalf("CONFIG SET %s %s: %v", kv[i], kv[i+1], err)
		}
	}
}

// logBuffer is a slog text log a test reads back.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// wantEviction fails t unless err is an *EvictionError for the server at
// addr with policy and maxmemory, matching store.ErrMisconfigured and
// idem.ErrInvalidConfig (not ErrUnavailable), whose message says what to
// set.
func wantEviction(t *testing.T, err error, addr, policy string, maxmemory int64) {
	t.Helper()
	var ee *redisstore.EvictionError
	if !errors.As(err, &ee) || ee.Addr != addr || ee.Policy != policy || ee.MaxMemory != maxmemory ||
		!errors.Is(err, store.ErrMisconfigured) || !errors.Is(err, idem.ErrInvalidConfig) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("%v (%#v), want an *EvictionError for %s, %s, maxmemory %d", err, ee, addr, policy, maxmemory)
	}
	for _, s := range []string{"maxmemory-policy noeviction", "ElastiCache parameter group's maxmemory-policy",
		"Memorystore instance's maxmemory-policy configuration", "Azure Cache for Redis's maxmemory-policy setting",
		"a Redis of its own", "alloweviction=true", "operations may run again", policy} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%q does not say %q", err, s)
		}
	}
}

// TestCheckRefusesARedisThatMayEvict: on a Redis of the test's own with
// maxmemory 8mb, volatile-lru (the managed services' default) and then
// allkeys-lru are each an *EvictionError at Check and at CheckSettings;
// noeviction, and any policy with maxmemory 0 (no limit), pass.
func TestCheckRefusesARedisThatMayEvict(t *testing.T) {
	t.Parallel()
	a, admin := ownRedis(t, "--maxmemory", "8mb", "--maxmemory-policy", "volatile-lru")
	s, err := redisstore.Open("redis://"+a+"/0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	settings := func() error {
		t.Helper()
		cs := s.CheckSettings(ctx)
		if len(cs) != 1 || cs[0].Name != "eviction" {
			t.Fatalf("CheckSettings: %+v, want the eviction check", cs)
		}
		return cs[0].Err
	}
	for _, policy := range []string{"volatile-lru", "allkeys-lru", "volatile-ttl", "allkeys-random"} {
		configSet(t, admin, "maxmemory-policy", policy)
		wantEviction(t, s.Check(ctx), a, policy, 8<<20)
		wantEviction(t, settings(), a, policy, 8<<20)
	}
	configSet(t, admin, "maxmemory", "0") // no limit: nothing is evicted
	if err := s.Check(ctx); err != nil {
		t.Fatalf("maxmemory 0 with allkeys-random: %v", err)
	}
	configSet(t, admin, "maxmemory", "8mb", "maxmemory-policy", "noeviction")
	if err := s.Check(ctx); err != nil {
		t.Fatalf("noeviction: %v", err)
	}
	if err := settings(); err != nil {
		t.Fatalf("noeviction: CheckSettings %v", err)
	}
}

// TestAllowEvictionOpensWithAWarning: with Config.AllowEviction a Redis
// that may evict passes Check, which logs, through the configured logger,
// that records may be forgotten and operations may run again; the
// monitor's check then reports nothing.
func TestAllowEvictionOpensWithAWarning(t *testing.T) {
	t.Parallel()
	a, _ := ownRedis(t, "--maxmemory", "8mb", "--maxmemory-policy", "volatile-lru")
	var logs logBuffer
	s, err := redisstore.Open("redis://"+a+"/0", &redisstore.Config{AllowEviction: true, Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Check(context.Background()); err != nil {
		t.Fatalf("Check with AllowEviction: %v", err)
	}
	for _, want := range []string{"level=WARN", "records may be forgotten; operations may run again", "volatile-lru", a} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the warning does not say %q:\n%s", want, logs.String())
		}
	}
	if cs := s.CheckSettings(context.Background()); cs != nil {
		t.Errorf("CheckSettings with AllowEviction: %+v, want none", cs)
	}
}

// TestCheckNeedsINFO: a user the ACL refuses INFO cannot tell whether
// Redis may evict: an *ACLError naming INFO at Check, with the ACL SETUSER
// that allows it; to the monitor (CheckSettings), a setting it cannot
// read.
func TestCheckNeedsINFO(t *testing.T) {
	t.Parallel()
	a, admin := ownRedis(t)
	if err := admin.Do(context.Background(), "acl", "setuser", "app", "reset", "on", ">pw", "~*", "+@all", "-info").Err(); err != nil {
		t.Fatal(err)
	}
	s, err := redisstore.Open("redis://app:pw@"+a+"/0", &redisstore.Config{Prefix: "p:"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Check(context.Background())
	var ae *redisstore.ACLError
	if !errors.As(err, &ae) || ae.Command != "INFO" || ae.User != "app" || !errors.Is(err, store.ErrMisconfigured) ||
		!strings.Contains(err.Error(), "ACL SETUSER app +evalsha +eval +get +set +del +scan +info ~p:*") {
		t.Fatalf("%v, want an *ACLError refusing INFO to app", err)
	}
	// To the monitor, a setting it cannot read: unavailable, not wrong.
	cs := s.CheckSettings(context.Background())
	if len(cs) != 1 || !errors.Is(cs[0].Err, store.ErrUnavailable) || errors.Is(cs[0].Err, store.ErrMisconfigured) ||
		!strings.Contains(cs[0].Err.Error(), "ACL SETUSER app") {
		t.Fatalf("CheckSettings: %+v, want the eviction check unavailable, saying how to allow INFO", cs)
	}
}

// TestCheckReadsEveryMasterOfTheCluster: on the shared 3+3 cluster (all
// noeviction) Check passes, having read INFO memory on each of the three
// masters; its configuration is not changed.
func TestCheckReadsEveryMasterOfTheCluster(t *testing.T) {
	t.Parallel()
	c := newClusterClient(t)
	var (
		mu   sync.Mutex
		info = map[string]int{}
	)
	c.OnNewNode(func(n *redis.Client) {
		addr := n.Options().Addr
		n.AddHook(infoHook(func() { mu.Lock(); info[addr]++; mu.Unlock() }))
	})
	s, err := redisstore.New(c, &redisstore.Config{Prefix: newClusterPrefix(t, c)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(context.Background()); err != nil {
		t.Fatalf("Check on the cluster: %v", err)
	}
	masters := map[string]bool{}
	_ = c.ForEachMaster(context.Background(), func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		masters[n.Options().Addr] = true
		mu.Unlock()
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(masters) != 3 || len(info) != 3 {
		t.Fatalf("INFO read on %v, want the 3 masters %v", info, masters)
	}
	for m := range masters {
		if info[m] != 1 {
			t.Errorf("INFO read %d times on master %s, want once", info[m], m)
		}
	}
}

// infoHook calls seen for each INFO a client sends.
type infoHook func()

func (h infoHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h infoHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "info" {
			h()
		}
		return next(ctx, cmd)
	}
}
func (h infoHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestCheckFindsTheClusterMasterThatMayEvict: on a 3-master cluster of
// the test's own, one master set to evict makes Check fail with an
// *EvictionError naming that master; two, with one for each; none, pass.
// Through a redis+cluster:// URL, as storeurl opens it.
func TestCheckFindsTheClusterMasterThatMayEvict(t *testing.T) {
	t.Parallel()
	addrs := redisnodes.StartCluster(t, 3, "--maxmemory", "8mb")
	s, err := redisstore.Open("redis+cluster://"+addrs[0]+"?addr="+addrs[1]+"&addr="+addrs[2], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Check(ctx); err != nil {
		t.Fatalf("every master noeviction: %v", err)
	}
	node := func(a string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { c.Close() })
		return c
	}
	configSet(t, node(addrs[1]), "maxmemory-policy", "volatile-lru")
	wantEviction(t, s.Check(ctx), addrs[1], "volatile-lru", 8<<20)
	configSet(t, node(addrs[2]), "maxmemory-policy", "allkeys-lru")
	err = s.Check(ctx)
	for _, a := range addrs[1:] {
		if !strings.Contains(err.Error(), "Redis at "+a+" may evict") {
			t.Errorf("%v does not name %s", err, a)
		}
	}
	if strings.Contains(err.Error(), "Redis at "+addrs[0]+" ") || !errors.Is(err, store.ErrMisconfigured) {
		t.Errorf("%v: want the two masters that may evict, matching ErrMisconfigured", err)
	}
	configSet(t, node(addrs[1]), "maxmemory-policy", "noeviction")
	configSet(t, node(addrs[2]), "maxmemory-policy", "noeviction")
	if err := s.Check(ctx); err != nil {
		t.Fatalf("every master noeviction again: %v", err)
	}
}

// TestCheckReadsThePrimaryBehindSentinel: through a redis+sentinel://
// URL, Check reads the primary the Sentinel names (a primary and a
// Sentinel of the test's own): volatile-lru there is an *EvictionError
// naming the primary's address; noeviction passes.
func TestCheckReadsThePrimaryBehindSentinel(t *testing.T) {
	t.Parallel()
	primary, admin := ownRedis(t, "--maxmemory", "8mb", "--maxmemory-policy", "volatile-lru")
	sentinel := redisnodes.StartSentinel(t, primary, "idem")
	s, err := redisstore.Open("redis+sentinel://"+sentinel+"?master_name=idem", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	wantEviction(t, s.Check(ctx), primary, "volatile-lru", 8<<20)
	configSet(t, admin, "maxmemory-policy", "noeviction")
	if err := s.Check(ctx); err != nil {
		t.Fatalf("noeviction: %v", err)
	}
}

// TestCheckReadsEveryShardOfARing: a store on a go-redis Ring of two
// servers of the test's own reads each: the one that may evict is named.
func TestCheckReadsEveryShardOfARing(t *testing.T) {
	t.Parallel()
	a, _ := ownRedis(t)
	b, _ := ownRedis(t, "--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru")
	r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a, "b": b}})
	t.Cleanup(func() { r.Close() })
	s, err := redisstore.New(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantEviction(t, s.CheckSettings(context.Background())[0].Err, b, "allkeys-lru", 8<<20)
}

// fullRedisEngine returns an engine over a store on the Redis at a (of the
// test's own), with writeTimeout, a lease long enough to outlast the test
// and the outcome counts.
func fullRedisEngine(t *testing.T, c redis.UniversalClient, writeTimeout time.Duration) (*idem.Engine, *redisstore.Store, *counters) {
	t.Helper()
	s, err := redisstore.New(c, &redisstore.Config{Prefix: "full:"})
	if err != nil {
		t.Fatal(err)
	}
	obs := &counters{}
	e, err := idem.New(s, &idem.Config{WriteTimeout: writeTimeout, Lease: 5 * time.Minute, Expiry: time.Hour,
		Observer: obs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return e, s, obs
}

// TestFullRedisRunsNothingTwice: Redis with maxmemory 8mb and noeviction,
// filled by 16 workers calling idem.Do on 3,000 keys with 4 KiB results,
// then every key retried while it is full and again once it has room. A
// claim that finds Redis full fails as unavailable (an *idem.StoreError
// matching store.ErrUnavailable) and the operation does not run; a
// Complete that finds it full leaves Result.Recorded zero and the key
// IN_PROGRESS, so its retry is an *idem.InProgressError; every COMPLETED
// key replays. No operation runs twice.
func TestFullRedisRunsNothingTwice(t *testing.T) {
	// Not parallel: 16 busy workers would slow the timing-sensitive tests
	// (the fault suite's short timeouts) running beside it.
	_, c := ownRedis(t, "--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
	e, s, _ := fullRedisEngine(t, c, 300*time.Millisecond)
	const keys, workers = 3000, 16
	value := strings.Repeat("v", 4<<10)
	var runs [keys]atomic.Int32
	call := func(k int) (idem.Result[string], error) {
		return idem.Do(context.Background(), e, idem.Request{Operation: "fill", Key: fmt.Sprint(k)}, func(context.Context) (string, error) {
			runs[k].Add(1)
			return value, nil
		})
	}
	type outcome int
	const (
		recorded outcome = iota + 1
		claimFull
		completeFull
	)
	first := make([]outcome, keys)
	storeKey := make([]string, keys)
	var fails []string
	var mu sync.Mutex
	failf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(fails) < 10 {
			fails = append(fails, fmt.Sprintf(format, args...))
		}
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for k := range work {
				res, err := call(k)
				var se *idem.StoreError
				switch {
				case err != nil && errors.As(err, &se) && errors.Is(err, store.ErrUnavailable) && !errors.Is(err, store.ErrCorrupt) &&
					strings.Contains(err.Error(), "OOM") && runs[k].Load() == 0:
					first[k] = claimFull
				case err != nil:
					failf("key %d: %v (ran %d times)", k, err, runs[k].Load())
				case res.Recorded == idem.StatusCompleted && !res.Replayed && res.Value == value:
					first[k] = recorded
				case res.Recorded == 0 && errors.Is(res.Unrecorded, store.ErrUnavailable) && res.Value == value:
					first[k], storeKey[k] = completeFull, res.StoreKey
				default:
					failf("key %d: %+v", k, res)
				}
			}
		})
	}
	for k := range keys {
		work <- k
	}
	close(work)
	wg.Wait()
	if len(fails) > 0 {
		t.Fatalf("first calls:\n%s", strings.Join(fails, "\n"))
	}
	count := map[outcome]int{}
	for _, o := range first {
		count[o]++
	}
	t.Logf("first calls: %d recorded, %d claims refused (full), %d completes refused (full)", count[recorded], count[claimFull], count[completeFull])
	if count[recorded] == 0 || count[claimFull] == 0 {
		t.Fatalf("Redis did not fill up: %v", count)
	}
	for k, o := range first {
		if o != completeFull {
			continue
		}
		r, err := s.Get(context.Background(), storeKey[k])
		if err != nil || r.Status != store.StatusInProgress {
			t.Fatalf("key %d, whose Complete found Redis full: %+v, %v; want IN_PROGRESS", k, r, err)
		}
	}

	// Still full: every retry fails as unavailable, nothing runs.
	for k := range keys {
		if _, err := call(k); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("key %d retried on a full Redis: %v, want unavailable", k, err)
		}
	}
	// Room again: COMPLETED keys replay, IN_PROGRESS ones (their lease
	// runs) are in progress, the keys never claimed run now, once.
	configSet(t, c, "maxmemory", "0")
	for k := range keys {
		res, err := call(k)
		var ip *idem.InProgressError
		switch first[k] {
		case recorded:
			if err != nil || !res.Replayed || res.Value != value {
				t.Fatalf("key %d: %+v, %v; want a replay", k, res, err)
			}
		case completeFull:
			if !errors.As(err, &ip) {
				t.Fatalf("key %d: %+v, %v; want in progress", k, res, err)
			}
		case claimFull:
			if err != nil || res.Replayed || res.Recorded != idem.StatusCompleted {
				t.Fatalf("key %d: %+v, %v; want it run and recorded now", k, res, err)
			}
		}
	}
	for k := range keys {
		if n := runs[k].Load(); n != 1 {
			t.Errorf("key %d ran %d times", k, n)
		}
	}
}

// counters counts outcomes (observe.Observer).
type counters struct {
	mu sync.Mutex
	by map[string]int
}

func (c *counters) Observe(_ string, o observe.Outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string]int{}
	}
	c.by[o.String()]++
}

func (c *counters) StoreCall(observe.StoreOp, time.Duration, error) {}

func (c *counters) count(o string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.by[o]
}

// fill fills Redis (noeviction): it writes 2 MiB under filler: and sets
// maxmemory 1 MiB below the memory then used, so that Redis refuses every
// write as out of memory (OOM) until the filler is deleted, however its
// buffers shrink meanwhile.
func fill(t *testing.T, c *redis.Client) {
	t.Helper()
	ctx := context.Background()
	big := strings.Repeat("x", 64<<10)
	for i := range 32 {
		if err := c.Set(ctx, fmt.Sprintf("filler:%d", i), big, 0).Err(); err != nil {
			t.Errorf("filling: %v", err)
		}
	}
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		t.Error(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			used, _ := strconv.Atoi(v)
			configSet(t, c, "maxmemory", strconv.Itoa(used-1<<20))
		}
	}
	if err := c.Set(ctx, "filler:probe", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Errorf("a write to a full Redis: %v, want OOM", err)
	}
}

func unfill(t *testing.T, c *redis.Client) {
	t.Helper()
	ctx := context.Background()
	iter := c.Scan(ctx, 0, "filler:*", 1000).Iterator()
	for iter.Next(ctx) {
		if err := c.Del(ctx, iter.Val()).Err(); err != nil {
			t.Error(err)
		}
	}
}

// TestCompleteOnAFullRedis: an operation that ran while Redis (noeviction)
// filled up: its Complete is refused (OOM), classified unavailable, never
// a damaged record, and retried while the lease is kept.
//
//   - memory freed while the engine retries: the Complete lands, the
//     outcome is COMPLETED and replays;
//   - never freed: after WriteTimeout the call returns its value with
//     Result.Recorded zero and Result.Unrecorded unavailable,
//     complete_failed counted; the key stays IN_PROGRESS (until its
//     lease ends), so a retry is in progress and does not run it again,
//     after memory is freed too.
func TestCompleteOnAFullRedis(t *testing.T) {
	t.Parallel()
	t.Run("freed while retried", func(t *testing.T) {
		t.Parallel()
		_, admin := ownRedis(t, "--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
		c := redis.NewClient(&redis.Options{Addr: admin.Options().Addr})
		t.Cleanup(func() { c.Close() })
		var refused atomic.Int32
		c.AddHook(oomHook(func() {
			if refused.Add(1) == 1 {
				unfill(t, admin) // the first refusal frees the memory
			}
		}))
		e, _, _ := fullRedisEngine(t, c, 10*time.Second)
		var runs atomic.Int32
		op := func(context.Context) (string, error) { runs.Add(1); fill(t, admin); return "done", nil }
		req := idem.Request{Operation: "full", Key: "k"}
		res, err := idem.Do(context.Background(), e, req, op)
		if err != nil || res.Recorded != idem.StatusCompleted || refused.Load() == 0 {
			t.Fatalf("%+v, %v (%d refusals); want COMPLETED after a refusal", res, err, refused.Load())
		}
		res, err = idem.Do(context.Background(), e, req, op)
		if err != nil || !res.Replayed || res.Value != "done" || runs.Load() != 1 {
			t.Fatalf("retry: %+v, %v, %d runs; want a replay", res, err, runs.Load())
		}
	})
	t.Run("never freed", func(t *testing.T) {
		t.Parallel()
		_, admin := ownRedis(t, "--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
		c := redis.NewClient(&redis.Options{Addr: admin.Options().Addr})
		t.Cleanup(func() { c.Close() })
		var refused atomic.Int32
		c.AddHook(oomHook(func() { refused.Add(1) }))
		e, s, obs := fullRedisEngine(t, c, time.Second)
		var runs atomic.Int32
		op := func(context.Context) (string, error) { runs.Add(1); fill(t, admin); return "done", nil }
		req := idem.Request{Operation: "full", Key: "k"}
		res, err := idem.Do(context.Background(), e, req, op)
		// Unrecorded is the last attempt's error: OOM, or on a busy
		// machine the attempt's own deadline.
		if err != nil || res.Value != "done" || res.Recorded != 0 || !errors.Is(res.Unrecorded, store.ErrUnavailable) ||
			errors.Is(res.Unrecorded, store.ErrCorrupt) {
			t.Fatalf("%+v, %v; want the value, nothing recorded, unavailable", res, err)
		}
		if n := refused.Load(); n < 2 {
			t.Errorf("%d Completes refused as out of memory, want the Complete retried", n)
		}
		if n, m := obs.count("complete_failed"), obs.count("store_error"); n != 1 || m != 1 {
			t.Errorf("complete_failed counted %d times, store_error %d, want 1 each", n, m)
		}
		r, err := s.Get(context.Background(), res.StoreKey)
		if err != nil || r.Status != store.StatusInProgress || r.Fence != res.Fence {
			t.Fatalf("record %+v, %v; want IN_PROGRESS under the call's claim", r, err)
		}
		unfill(t, admin)
		_, err = idem.Do(context.Background(), e, req, op)
		var ip *idem.InProgressError
		if !errors.As(err, &ip) || runs.Load() != 1 {
			t.Fatalf("retry: %v, %d runs; want in progress, run once", err, runs.Load())
		}
	})
}

// oomHook calls refused for each fenced write (EVALSHA, EVAL) that Redis
// refuses as out of memory.
type oomHook func()

func (h oomHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h oomHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); n != "evalsha" && n != "eval" {
			return err
		}
		oom := cmd.Err() != nil && strings.HasPrefix(cmd.Err().Error(), "OOM")
		if raw, ok := cmd.(*redis.RawCmd); ok { // the store reads its fenced writes' replies raw
			b, _ := raw.Result()
			oom = bytes.HasPrefix(b, []byte("-OOM"))
		}
		if oom {
			h()
		}
		return err
	}
}
func (h oomHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
