package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
)

// TestThreeGatewaysShareOneStore runs three gateway processes over one
// Redis or PostgreSQL store and sends every key to all of them at once:
// each key reaches the upstream exactly once.
func TestThreeGatewaysShareOneStore(t *testing.T) {
	for _, kind := range []string{"redis", "redis-cluster", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			addr, via := sharedStore(t, kind)
			url := via(addr)
			up := newUpstream(t)
			var gws []*proc
			for range 3 {
				gws = append(gws, startGateway(t, "-upstream", up.srv.URL, "-store", url, "-wait", "30s"))
			}
			const keys, perGateway = 20, 3
			var wg sync.WaitGroup
			answers := make(chan answer, keys*len(gws)*perGateway)
			for k := range keys {
				for _, gw := range gws {
					for range perGateway {
						wg.Go(func() {
							answers <- send("POST", gw.url("/orders"), `{"n":1}`, "Idempotency-Key", fmt.Sprintf("k%d", k))
						})
					}
				}
			}
			wg.Wait()
			close(answers)
			replays := 0
			for a := range answers {
				if a.err != nil || a.status != 201 {
					t.Fatalf("answer %+v", a)
				}
				if a.replayed() {
					replays++
				}
			}
			for k := range keys {
				if n := up.count(fmt.Sprintf("k%d", k)); n != 1 {
					t.Errorf("key k%d reached the upstream %d times", k, n)
				}
			}
			if want := keys*len(gws)*perGateway - keys; replays != want {
				t.Errorf("%d replays, want %d", replays, want)
			}
		})
	}
}

// sharedStore gives t a store several gateways can share: a fresh key
// prefix on Redis or on the Redis Cluster, or a fresh table on PostgreSQL
// (kind "redis", "redis-cluster" or "postgres"), removed when t ends. addr is the server's host:port; via
// returns the -store URL that reaches the store through hostport (addr
// itself, or a proxy in front of it).
func sharedStore(t *testing.T, kind string) (addr string, via func(hostport string) string) {
	t.Helper()
	stamp := time.Now().UnixNano()
	switch kind {
	case "redis":
		addr = testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
		via = func(hp string) string { return fmt.Sprintf("redis://%s/0?prefix=gwtest-%d:", hp, stamp) }
		t.Cleanup(func() { deleteAll(t, via(addr)) })
	case "redis-cluster":
		// The proxy, if any, stands in front of the first seed node: the
		// client's first look at the cluster goes through it, the rest
		// straight to the nodes. Every write waits for a replica.
		addrs := clusterAddrs(t)
		addr = addrs[0]
		via = func(hp string) string {
			return fmt.Sprintf("redis+cluster://%s?addr=%s&prefix=gwtest-%d:&waitreplicas=1", hp, strings.Join(addrs[1:], "&addr="), stamp)
		}
		t.Cleanup(func() { deleteAll(t, via(addr)) })
	case "postgres":
		addr = testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
		table := fmt.Sprintf("gwtest_%d", stamp)
		base := func(hp string) string { return fmt.Sprintf("postgres://%s@%s/test", pgUser(), hp) }
		via = func(hp string) string { return base(hp) + "?table=" + table }
		t.Cleanup(func() {
			ctx := context.Background()
			c, err := pgx.Connect(ctx, base(addr))
			if err != nil {
				t.Errorf("cleanup: %v", err)
				return
			}
			defer c.Close(ctx)
			if _, err := c.Exec(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
				t.Errorf("cleanup: dropping %s: %v", table, err)
			}
		})
	default:
		t.Fatalf("sharedStore: no store kind %q", kind)
	}
	return addr, via
}

// listRecords returns every live record of s.
func listRecords(t *testing.T, s store.Store) []*store.Record {
	t.Helper()
	var out []*store.Record
	p := store.ListParams{Now: store.Millis(time.Now()), Limit: 500}
	for {
		page, err := s.(store.Lister).List(context.Background(), p)
		if err != nil {
			t.Errorf("listing records: %v", err)
			return out
		}
		out = append(out, page.Records...)
		if page.Next == "" {
			return out
		}
		p.Cursor = page.Next
	}
}

func pgUser() string {
	if u := os.Getenv("IDEM_PG_USER"); u != "" {
		return u
	}
	return "postgres"
}

// deleteAll deletes every record of the store url names.
func deleteAll(t *testing.T, url string) {
	ctx := context.Background()
	s, closeStore, err := openStore(ctx, url)
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	defer closeStore()
	for _, r := range listRecords(t, s) {
		if err := s.(store.Deleter).Delete(ctx, r.Key); err != nil {
			t.Errorf("cleanup: deleting %s: %v", r.Key, err)
		}
	}
}

// clusterAddrs are the seed nodes of the Redis Cluster scripts/redis-cluster
// started.
func clusterAddrs(t *testing.T) []string { return testenv.RedisCluster(t) }

// Three gateways started at once on a fresh PostgreSQL table all migrate it
// (one advisory lock per schema's migrations) and all start, and every one
// answers.
func TestThreeGatewaysMigrateAFreshTableAtOnce(t *testing.T) {
	addr, via := sharedStore(t, "postgres")
	url := via(addr)
	up := newUpstream(t)
	gws := make([]*proc, 3)
	for i := range gws {
		gws[i] = startListening(t, "-upstream", up.srv.URL, "-store", url)
	}
	for i, gw := range gws {
		select {
		case <-gw.opened:
		case err := <-gw.done:
			t.Fatalf("gateway %d exited while migrating at the same time as two others (%v):\n%s", i, err, gw.logs)
		case <-time.After(60 * time.Second): // another process's start-up
			t.Fatalf("gateway %d's store did not open:\n%s", i, gw.logs)
		}
		if a := send("POST", gw.url("/orders"), `{"n":1}`, "Idempotency-Key", fmt.Sprintf("m%d", i)); a.err != nil || a.status != 201 {
			t.Fatalf("gateway %d: %+v", i, a)
		}
	}
}
