package redisstore_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/redisnodes"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// waitCounter counts the WAIT commands a client sends, alone or in a
// pipeline.
type waitCounter struct{ n atomic.Int64 }

func (c *waitCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *waitCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "wait" {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *waitCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if cmd.Name() == "wait" {
				c.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// With WaitReplicas, a replay writes nothing and so waits for no replica:
// on a real primary whose replica died, a replay (single and batched,
// through the engine too) sends no WAIT, while a new claim still waits and
// fails as unavailable. The WAITs are counted through the client's hook.
func TestReplayDoesNotWaitForReplicas(t *testing.T) {
	primary := redisnodes.Start(t, "--repl-diskless-sync-delay", "0")
	replicaDir := t.TempDir()
	replica := redisnodes.StartIn(t, replicaDir, "--replicaof", strings.Replace(primary, ":", " ", 1))
	rc := newClient(t, replica)
	for i := 0; ; i++ {
		info, err := rc.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			break
		}
		if i == 1000 {
			t.Fatalf("the replica did not link: %s %v", info, err)
		}
		time.Sleep(10 * time.Millisecond) // another process syncing
	}
	pc := newClient(t, primary, func(o *redis.Options) { o.ReadTimeout, o.WriteTimeout = 0, 0 })
	replicas := func() string {
		info, err := pc.Info(context.Background(), "replication").Result()
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	for i := 0; !strings.Contains(replicas(), "connected_slaves:1") || !strings.Contains(replicas(), "state=online"); i++ {
		if i == 1000 {
			t.Fatalf("the replica did not link: %s", replicas())
		}
		time.Sleep(10 * time.Millisecond) // another process syncing
	}
	var waits waitCounter
	pc.AddHook(&waits)
	s, err := redisstore.New(pc, &redisstore.Config{Prefix: "limits:", WaitReplicas: 1, WaitTimeout: 1000})
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	runs := 0
	call := func(key string) (idem.Result[int], error) {
		return idem.Do(ctx, e, idem.Request{Operation: "pay", Key: key}, func(context.Context) (int, error) { runs++; return 7, nil })
	}
	if _, err := call("a"); err != nil { // loads the scripts too
		t.Fatalf("call a with the replica up: %v", err)
	}
	before := waits.n.Load()
	if _, err := call("b"); err != nil {
		t.Fatalf("call b with the replica up: %v", err)
	}
	if n := waits.n.Load() - before; n != 2 {
		t.Fatalf("a new call sent %d WAITs, want 2 (its claim's and its complete's)", n)
	}
	now := time.Now().UnixMilli()
	claim := func(key string) store.ClaimParams {
		return store.ClaimParams{Key: key, Owner: "o" + key, Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 600_000}
	}
	if _, err := s.Claim(ctx, claim("live")); err != nil {
		t.Fatal(err)
	}
	if n := waits.n.Load() - before; n != 3 {
		t.Fatalf("after a new claim: %d WAITs, want 3", n)
	}

	if r, err := s.Replication(ctx); err != nil || r.WaitReplicas != 1 || len(r.Masters) != 1 || r.Masters[0] != (redisstore.MasterReplication{Addr: primary, Role: "master", Online: 1}) {
		t.Fatalf("replication with the replica up: %+v %v", r, err)
	}

	redisnodes.Kill(t, replicaDir)
	for i := 0; !strings.Contains(replicas(), "connected_slaves:0"); i++ {
		if i == 1000 {
			t.Fatalf("the primary still counts its replica: %s", replicas())
		}
		time.Sleep(10 * time.Millisecond) // the primary noticing another process's death
	}
	if r, err := s.Replication(ctx); err != nil || len(r.Masters) != 1 || r.Masters[0].Online != 0 {
		t.Fatalf("replication with the replica down: %+v %v", r, err)
	}

	before = waits.n.Load()
	for _, k := range []string{"a", "b"} {
		res, err := call(k)
		if err != nil || !res.Replayed || res.Value != 7 {
			t.Fatalf("replay of %s with the replica down: %+v %v", k, res, err)
		}
	}
	if runs != 2 {
		t.Fatalf("the operation ran %d times, want 2", runs)
	}
	conflict := claim("live")
	conflict.Owner = "another"
	if res, err := s.Claim(ctx, conflict); err != nil || res.Acquired || res.Record.Owner != "olive" {
		t.Fatalf("conflict with a live claim: %+v %v", res, err)
	}
	res, errs := s.ClaimBatch(ctx, []store.ClaimParams{conflict})
	if errs[0] != nil || res[0].Acquired {
		t.Fatalf("batch conflict: %+v %v", res, errs)
	}
	if n := waits.n.Load() - before; n != 0 {
		t.Fatalf("replays and conflicts sent %d WAITs, want none", n)
	}

	// A new claim still waits, and fails as unavailable: the replica is gone.
	if _, err := s.Claim(ctx, claim("new")); !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "0 of 1 replicas") {
		t.Fatalf("new claim with the replica down: %v, want unavailable (0 of 1 replicas)", err)
	}
	_, errs = s.ClaimBatch(ctx, []store.ClaimParams{conflict, claim("new2")})
	if errs[0] != nil || !errors.Is(errs[1], store.ErrUnavailable) {
		t.Fatalf("batch of a conflict and a new claim: %v", errs)
	}
	if n := waits.n.Load() - before; n != 2 {
		t.Fatalf("a new claim and a batch with one sent %d WAITs, want 2", n)
	}
}

// A Redis out of connections (maxclients) refuses new clients: every call
// of a store that cannot connect fails as unavailable, never as a damaged
// record; the engine runs nothing; the record another client holds stays
// as it was, and calls work again once a connection is free.
func TestMaxClientsIsUnavailable(t *testing.T) {
	r := redisnodes.Start(t, "--maxclients", "3")
	ctx := context.Background()
	a := newClient(t, r, func(o *redis.Options) { o.ReadTimeout, o.WriteTimeout, o.PoolSize = 0, 0, 1 })
	sa, err := redisstore.New(a, &redisstore.Config{Prefix: "limits:"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	claim := func(key, owner string) store.ClaimParams {
		return store.ClaimParams{Key: key, Owner: owner, Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 600_000}
	}
	if res, err := sa.Claim(ctx, claim("k", "a")); err != nil || !res.Acquired {
		t.Fatalf("claim by a: %+v %v", res, err)
	}
	// Two more connections take the server's last places.
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		if n, err := c.Read(buf); err != nil || string(buf[:n]) != "+PONG\r\n" {
			t.Fatalf("held connection: %q %v", buf[:n], err)
		}
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()

	b := newClient(t, r, func(o *redis.Options) { o.ReadTimeout, o.WriteTimeout = 0, 0 })
	sb, err := redisstore.New(b, &redisstore.Config{Prefix: "limits:"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(sb, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, key := range []string{"k", "new"} {
		_, err := idem.Do(ctx, e, idem.Request{Operation: "op", Key: key}, func(context.Context) (int, error) { ran++; return 1, nil })
		// Redis answers "max number of clients reached" and closes the
		// connection: the client sees that, or the closed connection.
		if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("call for %s out of connections: %v, want unavailable", key, err)
		}
	}
	for name, err := range map[string]error{
		"claim":    second(sb.Claim(ctx, claim("k", "b"))),
		"complete": sb.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "a", Now: now}, ExpiresAt: now + 600_000, Result: []byte("b")}),
		"get":      second(sb.Get(ctx, "k")),
	} {
		if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrCorrupt) || errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s out of connections: %v, want unavailable", name, err)
		}
	}
	if ran != 0 {
		t.Fatalf("the operation ran %d times without a claim", ran)
	}
	rec, err := sa.Get(ctx, "k")
	if err != nil || rec.Status != store.StatusInProgress || rec.Fence != 1 || rec.Owner != "a" {
		t.Fatalf("a's record after the refusals: %+v %v", rec, err)
	}
	if _, err := sa.Get(ctx, "new"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused claim left a record: %v", err)
	}

	held[0].Close()
	held = held[1:]
	var res store.ClaimResult
	for i := 0; ; i++ { // the server frees the place once it saw the close
		if res, err = sb.Claim(ctx, claim("k", "b")); err == nil || i == 500 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil || res.Acquired || res.Record.Owner != "a" || res.Record.Fence != 1 {
		t.Fatalf("claim by b once a connection is free: %+v %v, want a's live claim", res, err)
	}
	if err := sa.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "a", Now: now}, ExpiresAt: now + 600_000, Result: []byte("a")}); err != nil {
		t.Fatalf("a completes: %v", err)
	}
}

// Replication on the 3+3 cluster: every master, each with its replica.
func TestClusterReplication(t *testing.T) {
	s, _ := newClusterStore(t, redisstore.Config{WaitReplicas: 1})
	r, err := s.Replication(context.Background())
	if err != nil || r.WaitReplicas != 1 || len(r.Masters) != 3 {
		t.Fatalf("%+v %v", r, err)
	}
	for _, m := range r.Masters {
		if m.Role != "master" || m.Online < 1 || m.Addr == "" {
			t.Errorf("master %+v", m)
		}
	}
}
