package redisstore_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/failover"
	"github.com/seed-a1b882c0/idem/idemtest/redisnodes"
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
	defer func() { failover.Report(t, "redis-cluster", all) }()
	for i := range failover.Rounds(t) {
		for _, wait := range []int{0, 1} {
			all = append(all, clusterFailoverOnce(t, addrs, dir, wait, i))
		}
	}
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
	redisnodes.WaitHealthy(t, addrs[0], 3, 60*time.Second)
	masters := redisnodes.Masters(t, addrs[0])
	victim := masters[round%len(masters)]
	replica := redisnodes.ReplicaOf(t, addrs[0], victim)

	res := failover.Round{Setting: fmt.Sprintf("WaitReplicas %d", wait), Killed: victim}
	l := failover.Start(e)
	time.Sleep(time.Second) // load before the fault
	killed := time.Now()
	redisnodes.Kill(t, redisnodes.Dir(dir, victim))
	redisnodes.WaitRole(t, replica, "master", 60*time.Second)
	res.FailoverMs = time.Since(killed).Milliseconds()
	// The killed node comes back (as a managed service replaces a node)
	// and rejoins as the new master's replica; until it has synced, that
	// shard has no replica, so WaitReplicas 1 refuses its writes.
	redisnodes.Restart(t, redisnodes.Dir(dir, victim))
	redisnodes.WaitLinked(t, victim, 60*time.Second)
	res.RelinkedMs = time.Since(killed).Milliseconds()
	time.Sleep(2 * time.Second) // load after the cluster healed
	l.Finish(t, s, killed, &res)
	redisnodes.WaitHealthy(t, addrs[0], 3, 60*time.Second)
	return res
}
