package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/failover"
	"github.com/seed-a1b882c0/idem/idemtest/redisnodes"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

// replicaSet is the primary, its replica and the Sentinel watching them
// (scripts/redis-replicas), from IDEM_REDIS_SENTINEL_ADDR and
// IDEM_REDIS_REPLICAS_DIR; outside CI the tests skip without them. Which
// server is the primary is asked of the Sentinel: a failover test swaps
// them.
type replicaSet struct {
	sentinel, dir    string
	primary, replica string
}

func replicas(t testing.TB) replicaSet {
	s, dir := os.Getenv("IDEM_REDIS_SENTINEL_ADDR"), os.Getenv("IDEM_REDIS_REPLICAS_DIR")
	if s == "" || dir == "" {
		testenv.Missing(t, "no Redis primary, replica and Sentinel: set IDEM_REDIS_SENTINEL_ADDR and IDEM_REDIS_REPLICAS_DIR (scripts/redis-replicas run go test ./...)")
	}
	rs := replicaSet{sentinel: s, dir: dir}
	c := redis.NewSentinelClient(&redis.Options{Addr: s})
	defer c.Close()
	a, err := c.GetMasterAddrByName(context.Background(), "idem").Result()
	if err != nil {
		t.Fatalf("asking the Sentinel for the primary: %v", err)
	}
	rs.primary = net.JoinHostPort(a[0], a[1])
	for _, p := range []string{os.Getenv("IDEM_REDIS_PRIMARY_ADDR"), os.Getenv("IDEM_REDIS_REPLICA_ADDR")} {
		if p != rs.primary {
			rs.replica = p
		}
	}
	return rs
}

func (rs replicaSet) sentinelURL() string {
	return "redis+sentinel://" + rs.sentinel + "?master_name=idem"
}

// WaitReplicas against a real replica (a primary with one replicaof
// replica): the whole contract with every write waiting for the replica,
// and each acknowledged write is on the replica when the call returns.
func TestWaitReplicasOnAReplica(t *testing.T) {
	rs := replicas(t)
	storetest.Run(t, storetest.Features{MaxResultBytes: 1 << 20, StormGoroutines: 32, LinOps: 2000}, func(t *testing.T) store.Store {
		s, _ := newStoreAt(t, rs.primary, redisstore.Config{MaxResultBytes: 1 << 20, WaitReplicas: 1, WaitTimeout: 2000})
		return s
	})
	t.Run("OnTheReplicaWhenAcknowledged", func(t *testing.T) {
		s, _ := newStoreAt(t, rs.primary, redisstore.Config{WaitReplicas: 1, WaitTimeout: 2000})
		r := newClient(t, rs.replica)
		e, err := idem.New(s, &idem.Config{RenewInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for i := range 200 {
			req := idem.Request{Operation: "pay", Key: fmt.Sprint(i)}
			res, err := idem.Do(ctx, e, req, func(context.Context) (int, error) { return i, nil })
			if err != nil || res.Recorded != idem.StatusCompleted {
				t.Fatalf("call %d: %+v %v", i, res, err)
			}
			id, _ := req.Identity()
			v, err := r.Get(ctx, s.Prefix()+id.StoreKey.String()).Result()
			if err != nil || v == "" || v[0] != 'R' {
				t.Fatalf("call %d acknowledged, but the replica has %q, %v", i, v, err)
			}
		}
	})
	t.Run("MoreReplicasThanThereAre", func(t *testing.T) {
		s, _ := newStoreAt(t, rs.primary, redisstore.Config{WaitReplicas: 2, WaitTimeout: 50})
		now := time.Now().UnixMilli()
		_, err := s.Claim(context.Background(), store.ClaimParams{Key: "two", Owner: "o", Now: now, LeaseUntil: now + 1000, ExpiresAt: now + 5000})
		if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "1 of 2 replicas") {
			t.Fatalf("waiting for 2 replicas of 1: %v", err)
		}
	})
}

// newStoreAt is newStore on the Redis at a.
func newStoreAt(t testing.TB, a string, cfg redisstore.Config) (*redisstore.Store, *redis.Client) {
	c := newClient(t, a, func(o *redis.Options) { o.ReadTimeout, o.WriteTimeout = 0, 0 })
	cfg.Prefix = newPrefix(t, c)
	s, err := redisstore.New(c, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// The store through Sentinel (a redis+sentinel:// URL): the contract, with
// WaitReplicas 1.
func TestSentinel(t *testing.T) {
	rs := replicas(t)
	storetest.Run(t, storetest.Features{MaxResultBytes: 1 << 20, StormGoroutines: 32, LinOps: 2000}, func(t *testing.T) store.Store {
		c, err := redisstore.NewClient(rs.sentinelURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		p := newPrefix(t, c)
		s, err := redisstore.New(c, &redisstore.Config{Prefix: p, MaxResultBytes: 1 << 20, WaitReplicas: 1, WaitTimeout: 2000})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
	if _, err := redisstore.Open("redis+sentinel://"+rs.sentinel, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("a Sentinel URL without master_name: %v, want ErrInvalidConfig", err)
	}
}

// TestSentinelFailoverUnderLoad is TestClusterFailoverUnderLoad under
// Sentinel: the primary is SIGKILLed, the Sentinel promotes the replica,
// the client (go-redis's failover client, from a redis+sentinel:// URL)
// follows, and every acknowledged outcome must replay. The killed server
// is restarted as the new primary's replica, as an operator (or a
// supervisor with Sentinel's rewritten configuration) would: a primary
// without persistence that came back as a primary would come back empty,
// and the Sentinel could fail back to it.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	var all []failover.Round
	defer func() { failover.Report(t, "redis-sentinel", all) }()
	for i := range 2 * failover.Rounds(t) {
		wait := i % 2
		rs := replicas(t)
		c, err := redisstore.NewClient(rs.sentinelURL())
		if err != nil {
			t.Fatal(err)
		}
		prefix := fmt.Sprintf("idemtest:sfailover:%d:%x:", wait, rand.Uint32())
		s, err := redisstore.New(c, &redisstore.Config{Prefix: prefix, WaitReplicas: wait})
		if err != nil {
			t.Fatal(err)
		}
		e, err := idem.New(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		res := failover.Round{Setting: fmt.Sprintf("WaitReplicas %d", wait), Killed: rs.primary}
		dir := redisnodes.Dir(rs.dir, rs.primary)
		l := failover.Start(e)
		time.Sleep(time.Second)
		killed := time.Now()
		redisnodes.Kill(t, dir)
		redisnodes.WaitRole(t, rs.replica, "master", 60*time.Second)
		res.FailoverMs = time.Since(killed).Milliseconds()
		host, rport, _ := strings.Cut(rs.replica, ":")
		redisnodes.Restart(t, dir, "--replicaof", host, rport)
		redisnodes.WaitLinked(t, rs.primary, 60*time.Second)
		res.RelinkedMs = time.Since(killed).Milliseconds()
		time.Sleep(2 * time.Second)
		l.Finish(t, s, killed, &res)
		all = append(all, res)
		if wait > 0 && res.Lost > 0 {
			t.Errorf("WaitReplicas %d: %d acknowledged outcomes lost: %v", wait, res.Lost, res.LostKeys)
		}
		// The round's keys go, or every later resync copies them all again.
		deletePrefix(c, prefix)
		c.Close()
	}
}

// A store that reaches a replica (a failover client still pointed at a
// demoted primary, an address that became a replica) must not take the
// replica's copy for the record: every write, a fenced one that finds the
// key absent included, fails as unavailable (READONLY), and the engine
// retries it until it reaches the primary. The Sentinel failover test
// found Completes answered "not found" by a restarted, still-empty replica.
func TestWritesRefusedOnAReplica(t *testing.T) {
	rs := replicas(t)
	s, _ := newStoreAt(t, rs.replica, redisstore.Config{})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	for name, err := range map[string]error{
		"claim":    second(s.Claim(ctx, store.ClaimParams{Key: "r", Owner: "o", Now: now, LeaseUntil: now + 1000, ExpiresAt: now + 5000})),
		"complete": s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "absent", Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 5000, Result: []byte("r")}),
		"release":  s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: "absent", Fence: 1, Owner: "o", Now: now}}),
		"extend":   s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: "absent", Fence: 1, Owner: "o", Now: now}, LeaseUntil: now + 2000}),
	} {
		if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s on a replica: %v, want ErrUnavailable (READONLY)", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }
