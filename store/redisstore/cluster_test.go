package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/redisnodes"
	"github.com/seed-a1b882c0/idem/idemtest/storefaults"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

// clusterAddrs are the seed nodes of the Redis Cluster under test
// (scripts/redis-cluster: 3 masters, 3 replicas), from
// IDEM_REDIS_CLUSTER_ADDRS; outside CI the cluster tests skip without it.
func clusterAddrs(t testing.TB) []string { return testenv.RedisCluster(t) }

// newClusterClient returns a cluster client for the cluster under test,
// closed when the test ends.
func newClusterClient(t testing.TB, opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	o := &redis.ClusterOptions{Addrs: clusterAddrs(t)}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClusterClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// newClusterPrefix returns a key prefix unique to this test, whose keys
// (on every master) are deleted when it ends.
func newClusterPrefix(t testing.TB, c *redis.ClusterClient) string {
	p := fmt.Sprintf("idemtest:%d:%x:", prefixSeq.Add(1), rand.Uint32())
	t.Cleanup(func() { deleteClusterPrefix(c, p) })
	return p
}

func deleteClusterPrefix(c *redis.ClusterClient, p string) {
	ctx := context.Background()
	_ = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		iter := n.Scan(ctx, 0, p+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		return nil
	})
}

func newClusterStore(t testing.TB, cfg redisstore.Config) (*redisstore.Store, *redis.ClusterClient) {
	c := newClusterClient(t)
	if cfg.Prefix == "" {
		cfg.Prefix = newClusterPrefix(t, c)
	}
	s, err := redisstore.New(c, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// The whole contract on a Redis Cluster: every case, Linearizability and
// the batch claims (whose keys fall on every master) among them, and
// listing, which must see every master.
func TestClusterConformance(t *testing.T) {
	storetest.Run(t, storetest.Features{MaxResultBytes: limit, StormGoroutines: 128}, func(t *testing.T) store.Store {
		s, _ := newClusterStore(t, redisstore.Config{MaxResultBytes: limit})
		return s
	})
}

// The contract again, with every write waiting for a replica: on a
// cluster, the WAIT must run on the connection of the master that took the
// write.
func TestClusterConformanceWaitReplicas(t *testing.T) {
	storetest.Run(t, storetest.Features{MaxResultBytes: 1 << 20, StormGoroutines: 32, LinOps: 2000}, func(t *testing.T) store.Store {
		s, _ := newClusterStore(t, redisstore.Config{MaxResultBytes: 1 << 20, WaitReplicas: 1, WaitTimeout: 2000})
		return s
	})
}

// The network-fault suite on a cluster: the fault proxy stands in front of
// the master that serves the test's keys (their prefix carries a hash tag,
// so they share one slot), and the cluster client dials that master
// through it.
func TestClusterFaults(t *testing.T) {
	plain := newClusterClient(t)
	tag := fmt.Sprintf("{f%x}", rand.Uint32())
	node, err := plain.MasterForKey(context.Background(), tag)
	if err != nil {
		t.Fatal(err)
	}
	target := node.Options().Addr
	prefixes := map[string]string{}
	storefaults.Run(t, target, func(t *testing.T, a string) store.Store {
		c := newClusterClient(t, func(o *redis.ClusterOptions) {
			o.ReadTimeout, o.WriteTimeout, o.DialTimeout = storefaults.Timeout, storefaults.Timeout, storefaults.Timeout
			o.MaxRedirects, o.MaxRetries = -1, -1
			o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
				if addr == target {
					addr = a // the proxy, or the master itself
				}
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}
		})
		p, ok := prefixes[t.Name()]
		if !ok {
			p = "idemtest:" + tag + fmt.Sprintf(":%d:", prefixSeq.Add(1))
			prefixes[t.Name()] = p
			t.Cleanup(func() { deleteClusterPrefix(plain, p) })
		}
		s, err := redisstore.New(c, &redisstore.Config{Prefix: p})
		if err != nil {
			t.Fatal(err)
		}
		// Load the map of the slots, the command table and a connection to
		// every master now, so that a fault the case arms hits the store's
		// own call, not the client's first look at the cluster.
		ctx := context.Background()
		if err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "warm"); !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		return s
	})
}

// Listing walks every master, in pages that resume across nodes.
func TestClusterListCoversEveryMaster(t *testing.T) {
	s, c := newClusterStore(t, redisstore.Config{})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	const n = 300
	want := map[string]bool{}
	for i := range n {
		key := fmt.Sprintf("list#%03d", i)
		want[key] = true
		if _, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "o", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 120_000}); err != nil {
			t.Fatal(err)
		}
	}
	// Every master holds some of them.
	perNode := map[string]int{}
	for key := range want {
		node, err := c.MasterForKey(ctx, s.Prefix()+key)
		if err != nil {
			t.Fatal(err)
		}
		perNode[node.Options().Addr]++
	}
	if len(perNode) != 3 {
		t.Fatalf("keys on %d masters, want 3: %v", len(perNode), perNode)
	}
	for _, limit := range []int{1, 7, 100, 1000} {
		got := map[string]int{}
		pages := 0
		p := store.ListParams{Now: now, Limit: limit}
		for {
			page, err := s.List(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			if len(page.Records) > limit {
				t.Fatalf("limit %d: a page of %d", limit, len(page.Records))
			}
			for _, r := range page.Records {
				got[r.Key]++
			}
			if page.Next == "" {
				break
			}
			if pages > 2*n+10 {
				t.Fatalf("limit %d: listing never ends", limit)
			}
			p.Cursor = page.Next
		}
		for key := range want {
			if got[key] != 1 {
				t.Errorf("limit %d: %s listed %d times", limit, key, got[key])
			}
		}
		if len(got) != n {
			t.Errorf("limit %d: listed %d records, want %d", limit, len(got), n)
		}
	}
	for _, bad := range []string{"C/0-99999/x/0/", "C/-/x", "C/a-b/x/0/", "nonsense"} {
		if _, err := s.List(ctx, store.ListParams{Now: now, Cursor: bad}); !errors.Is(err, store.ErrInvalidCursor) {
			t.Errorf("cursor %q: %v, want a typed error", bad, err)
		}
	}
}

// A listing resumed after a failover (the replica of the master being
// listed took over, by CLUSTER FAILOVER) still lists every record.
func TestClusterListSurvivesFailover(t *testing.T) {
	s, c := newClusterStore(t, redisstore.Config{})
	ctx := context.Background()
	now := time.Now().UnixMilli()
	const n = 120
	for i := range n {
		if _, err := s.Claim(ctx, store.ClaimParams{Key: fmt.Sprintf("fo#%03d", i), Owner: "o", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 120_000}); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]bool{}
	p := store.ListParams{Now: now, Limit: 10}
	page, err := s.List(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range page.Records {
		got[r.Key] = true
	}
	// The master being listed hands its slots to its replica.
	listed, err := c.MasterForKey(ctx, s.Prefix()+page.Records[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	manualFailover(t, c, listed.Options().Addr)
	p.Cursor = page.Next
	for p.Cursor != "" {
		page, err := s.List(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			got[r.Key] = true
		}
		p.Cursor = page.Next
	}
	if len(got) != n {
		t.Fatalf("after a failover mid-listing, listed %d of %d records", len(got), n)
	}
}

// manualFailover makes the replica of the master at addr take over
// (CLUSTER FAILOVER on the replica: no write is lost) and waits until the
// cluster agrees and the client knows. Redis lets a manual failover that
// follows another too closely expire, so it asks again, every 5s, until
// the replica has taken over.
func manualFailover(t *testing.T, c *redis.ClusterClient, addr string) {
	t.Helper()
	seed := clusterAddrs(t)[0]
	addr, replica := redisnodes.Shard(t, addr) // the client's map may lag behind the last failover
	is := func(a, role string) bool { out, _ := redisnodes.Cli(a, "role"); return strings.HasPrefix(out, role) }
	deadline := time.Now().Add(60 * time.Second) // the cluster's own election: another process's deadline
	var asked time.Time
	for !is(replica, "master") || !is(addr, "slave") {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s did not take over from %s", replica, addr)
		}
		if is(replica, "slave") && time.Since(asked) > 5*time.Second {
			if out, err := redisnodes.Cli(replica, "cluster", "failover"); err != nil || out != "OK" {
				t.Fatalf("cluster failover on %s: %q %v", replica, out, err)
			}
			asked = time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	redisnodes.WaitHealthy(t, seed, 3, 60*time.Second)
	c.ReloadState(context.Background())
}

// WaitReplicas on a cluster: a claim, its completion and a batch of claims
// across every master are acknowledged by a replica (before the fix, WAIT
// went to a random node's connection and most writes failed with "0 of 1
// replicas").
func TestClusterWaitReplicas(t *testing.T) {
	s, _ := newClusterStore(t, redisstore.Config{WaitReplicas: 1, WaitTimeout: 2000})
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 60 {
		res, err := idem.Do(ctx, e, idem.Request{Operation: "pay", Key: fmt.Sprint(i)}, func(context.Context) (int, error) { return i, nil })
		if err != nil || res.Recorded != idem.StatusCompleted {
			t.Fatalf("call %d with WaitReplicas 1: %+v %v", i, res, err)
		}
	}
	now := time.Now().UnixMilli()
	ps := make([]store.ClaimParams, 30)
	for i := range ps {
		ps[i] = store.ClaimParams{Key: fmt.Sprintf("batch#%d", i), Owner: "o", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000}
	}
	res, errs := s.ClaimBatch(ctx, ps)
	for i := range ps {
		if errs[i] != nil || !res[i].Acquired {
			t.Errorf("batch claim %d: %+v %v", i, res[i], errs[i])
		}
	}
	// Waiting for more replicas than the cluster has is still reported.
	s2, _ := newClusterStore(t, redisstore.Config{WaitReplicas: 2, WaitTimeout: 50})
	_, err = s2.Claim(ctx, store.ClaimParams{Key: "two", Owner: "o", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000})
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "1 of 2 replicas") {
		t.Fatalf("waiting for 2 replicas of 1: %v", err)
	}
}

// The cluster URL opens a cluster client.
func TestClusterOpenURL(t *testing.T) {
	addrs := clusterAddrs(t)
	u := "redis+cluster://" + addrs[0] + "?addr=" + addrs[1] + "&cluster_state_reload_interval=2s&dial_timeout=1s"
	s, err := redisstore.Open(u, &redisstore.Config{Prefix: "idemtest:url:"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := redisstore.NewClient(u)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cc, ok := c.(*redis.ClusterClient)
	if !ok || cc.Options().ClusterStateReloadInterval != 2*time.Second {
		t.Fatalf("%s opened a %T", u, c)
	}
	// Without the parameter, the map of the slots is refreshed every 5s,
	// not go-redis's 60s (docs/failover.md).
	d, err := redisstore.NewClient("redis+cluster://" + addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got := d.(*redis.ClusterClient).Options().ClusterStateReloadInterval; got != 5*time.Second {
		t.Errorf("default ClusterStateReloadInterval %v, want 5s", got)
	}
	for _, bad := range []string{"redis+cluster://" + addrs[0] + "?cluster_state_reload_interval=soon", "redis+sentinel://127.0.0.1:1/0", "redis+ring://x", "mysql://x"} {
		if _, err := redisstore.Open(bad, nil); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// A store over go-redis's AutoPipeliner of a cluster client, told the
// cluster client in Config.Cluster, lists every master too.
func TestClusterAutoPipeliner(t *testing.T) {
	c := newClusterClient(t)
	ap, err := c.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ap.Close() })
	s, err := redisstore.New(ap, &redisstore.Config{Prefix: newClusterPrefix(t, c), Cluster: c})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Now().UnixMilli()
	for i := range 60 {
		if _, err := s.Claim(ctx, store.ClaimParams{Key: fmt.Sprintf("ap#%d", i), Owner: "o", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 120_000}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for p := (store.ListParams{Now: now, Limit: 25}); ; {
		page, err := s.List(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		n += len(page.Records)
		if p.Cursor = page.Next; p.Cursor == "" {
			break
		}
	}
	if n != 60 {
		t.Fatalf("listed %d of 60 records through an AutoPipeliner", n)
	}
}
