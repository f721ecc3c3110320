package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/failover"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// TestClusterFailoverUnderLoad is the failover measurement of
// docs/failover.md, a benchmark-style test: 16 callers run Do on fresh keys
// through the cluster while one master is SIGKILLed; once its replica has
// taken over and the callers have run on for 3 s, every acknowledged outcome
// (Do returned it and Result.Recorded is COMPLETED) must replay: a missing
// or IN_PROGRESS record counts as lost. The killed node is restarted as
// soon as its replica has taken over (it rejoins as the new master's
// replica), and the callers run on until 2 s after it has synced.
//
// IDEM_FAILOVER_ROUNDS rounds (default 1) run with WaitReplicas 0 and as
// many with WaitReplicas 1, on a store opened as a user would open it (a
// redis+cluster:// URL with its defaults). The one assertion is the goal:
// no acknowledged outcome lost with WaitReplicas 1. The figures are logged,
// and written as JSON to IDEM_FAILOVER_OUT when set.
func TestClusterFailoverUnderLoad(t *testing.T) {
	addrs := clusterAddrs(t)
	dir := os.Getenv("IDEM_REDIS_CLUSTER_DIR")
	if dir == "" {
		t.Fatal("IDEM_REDIS_CLUSTER_DIR is not set: run the cluster with scripts/redis-cluster")
	}
	var all []failover.Round
	for i := range failover.Rounds(t) {
		for _, wait := range []int{0, 1} {
			all = append(all, clusterFailoverOnce(t, addrs, dir, wait, i))
		}
	}
	failover.Report(t, "redis-cluster", all)
	for _, r := range all {
		if r.Setting != "WaitReplicas 0" && r.Lost > 0 {
			t.Errorf("%s: %d acknowledged outcomes lost in a failover: %v", r.Setting, r.Lost, r.LostKeys)
		}
	}
}

func clusterFailoverOnce(t *testing.T, addrs []string, dir string, wait, round int) failover.Round {
	u := "redis+cluster://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	c, err := redisstore.NewClient(u)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cc := c.(*redis.ClusterClient)
	prefix := fmt.Sprintf("idemtest:failover:%d:%x:", wait, rand.Uint32())
	defer deleteClusterPrefix(cc, prefix)
	s, err := redisstore.New(c, &redisstore.Config{Prefix: prefix, WaitReplicas: wait})
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}

	// The master to kill: one in turn, and its replica.
	masters := clusterMasters(t, cc)
	victim := masters[round%len(masters)]
	replica := replicaOf(t, victim)

	res := failover.Round{Setting: fmt.Sprintf("WaitReplicas %d", wait), Killed: victim}
	l := failover.Start(e)
	time.Sleep(time.Second) // load before the fault
	killed := time.Now()
	killNode(t, nodeDir(dir, victim))
	waitRole(t, replica, "master", 60*time.Second)
	res.FailoverMs = time.Since(killed).Milliseconds()
	// The killed node comes back (as a managed service replaces a node)
	// and rejoins as the new master's replica; until it has synced, that
	// shard has no replica, so WaitReplicas 1 refuses its writes.
	restartNode(t, nodeDir(dir, victim))
	waitLinked(t, victim, 60*time.Second)
	res.RelinkedMs = time.Since(killed).Milliseconds()
	time.Sleep(2 * time.Second) // load after the cluster healed
	l.Finish(t, s, killed, &res)
	waitClusterHealthy(t, addrs[0])
	return res
}

// clusterMasters lists the masters' addresses, sorted.
func clusterMasters(t *testing.T, c *redis.ClusterClient) []string {
	slots, err := c.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range slots {
		if !slices.Contains(out, s.Nodes[0].Addr) {
			out = append(out, s.Nodes[0].Addr)
		}
	}
	slices.Sort(out)
	return out
}

func replicaOf(t *testing.T, master string) string {
	ctx := context.Background()
	m := redis.NewClient(&redis.Options{Addr: master})
	defer m.Close()
	id, err := m.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatal(err)
	}
	reps, err := m.Do(ctx, "cluster", "replicas", id).StringSlice()
	if err != nil || len(reps) == 0 {
		t.Fatalf("replicas of %s: %v %v", master, reps, err)
	}
	return strings.Split(strings.Fields(reps[0])[1], "@")[0]
}

func nodeDir(dir, addr string) string {
	_, port, _ := strings.Cut(addr, ":")
	return filepath.Join(dir, port)
}

// killNode SIGKILLs the server whose folder is dir, by the PID its pid file
// holds (a project script started it), and waits until it is gone.
func killNode(t *testing.T, dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if err := p.Signal(nil); err != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// restartNode starts the server whose folder is dir again, with its config
// file and args (it daemonizes and writes its new PID to the same pid
// file).
func restartNode(t *testing.T, dir string, args ...string) {
	out, err := exec.Command("redis-server", append([]string{filepath.Join(dir, "redis.conf")}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("restarting %s: %v: %s", dir, err, out)
	}
}

// waitRole waits until the node at addr reports role (master or slave).
func waitRole(t *testing.T, addr, role string, max time.Duration) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(max) // the cluster's own failover: another process's deadline
	for time.Now().Before(deadline) {
		if v, err := c.Do(ctx, "role").Slice(); err == nil && len(v) > 0 && v[0] == role {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s did not become %s within %s", addr, role, max)
}

// waitLinked waits until the node at addr is a replica whose link to its
// master is up.
func waitLinked(t *testing.T, addr string, max time.Duration) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		if info, err := c.Info(ctx, "replication").Result(); err == nil && strings.Contains(info, "master_link_status:up") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s did not rejoin as a linked replica within %s", addr, max)
}

// waitClusterHealthy waits until the cluster has 3 masters and 3 replicas,
// every one linked, and every node says cluster_state:ok.
func waitClusterHealthy(t *testing.T, seed string) {
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if clusterHealthy(ctx, seed) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("the cluster did not heal within 60s")
}

func clusterHealthy(ctx context.Context, seed string) bool {
	c := redis.NewClient(&redis.Options{Addr: seed})
	defer c.Close()
	nodes, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return false
	}
	masters, replicas := 0, 0
	for line := range strings.SplitSeq(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || strings.Contains(f[2], "fail") || f[7] != "connected" {
			return false
		}
		addr := strings.Split(f[1], "@")[0]
		n := redis.NewClient(&redis.Options{Addr: addr})
		info, err := n.Info(ctx, "replication").Result()
		state, err2 := n.ClusterInfo(ctx).Result()
		n.Close()
		if err != nil || err2 != nil || !strings.Contains(state, "cluster_state:ok") {
			return false
		}
		switch {
		case strings.Contains(f[2], "master"):
			masters++
		case strings.Contains(info, "master_link_status:up"):
			replicas++
		default:
			return false
		}
	}
	return masters == 3 && replicas == 3
}
