// Package redisnodes drives the Redis servers the project's scripts start
// for failover tests (scripts/redis-cluster, scripts/redis-replicas): it
// asks them with redis-cli, kills one by the PID in its pid file and starts
// it again with its config file. It needs redis-cli and redis-server on
// PATH, as the scripts do. Test-only.
package redisnodes

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Cli runs redis-cli against the server at addr (host:port) and returns
// its output.
func Cli(addr string, args ...string) (string, error) {
	host, port, ok := strings.Cut(addr, ":")
	if !ok {
		return "", fmt.Errorf("redisnodes: address %q is not host:port", addr)
	}
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).Output()
	return strings.TrimSpace(string(out)), err
}

// Dir is the folder the scripts keep the server at addr in: its port's,
// under dir.
func Dir(dir, addr string) string {
	_, port, _ := strings.Cut(addr, ":")
	return filepath.Join(dir, port)
}

// node is one line of CLUSTER NODES.
type node struct {
	id, addr, flags, master, link string
}

func nodes(t testing.TB, seed string) []node {
	t.Helper()
	out, err := Cli(seed, "cluster", "nodes")
	if err != nil {
		t.Fatalf("cluster nodes on %s: %v", seed, err)
	}
	var ns []node
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		ns = append(ns, node{id: f[0], addr: strings.Split(f[1], "@")[0], flags: f[2], master: f[3], link: f[7]})
	}
	return ns
}

// Masters returns the addresses of the cluster's masters, sorted.
func Masters(t testing.TB, seed string) []string {
	t.Helper()
	var out []string
	for _, n := range nodes(t, seed) {
		if strings.Contains(n.flags, "master") && !strings.Contains(n.flags, "fail") {
			out = append(out, n.addr)
		}
	}
	slices.Sort(out)
	return out
}

// Shard returns the master and a replica of the shard (a cluster master
// and its replicas, or a primary and its replicas) that the server at addr
// belongs to, as the servers themselves say (ROLE), which is current even
// when another node's view of the cluster lags behind a failover.
func Shard(t testing.TB, addr string) (master, replica string) {
	t.Helper()
	role := func(a string) []string {
		out, err := Cli(a, "role")
		if err != nil {
			t.Fatalf("role of %s: %v", a, err)
		}
		return strings.Fields(out)
	}
	r := role(addr)
	master = addr
	if len(r) >= 3 && r[0] == "slave" {
		master = r[1] + ":" + r[2]
		r = role(master)
	}
	// master offset [host port offset]...
	if len(r) < 5 || r[0] != "master" {
		t.Fatalf("%s has no replica: role %v", master, r)
	}
	return master, r[2] + ":" + r[3]
}

// Kill SIGKILLs the server kept in dir, by the PID in its pid file, and
// waits until it is gone.
func Kill(t testing.TB, dir string) {
	t.Helper()
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
	for range 200 {
		if p.Signal(syscall.Signal(0)) != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("redis-server %d still runs", pid)
}

// Restart starts the server kept in dir again, with its config file and
// args (it daemonizes and writes its new PID to the same pid file).
func Restart(t testing.TB, dir string, args ...string) {
	t.Helper()
	out, err := exec.Command("redis-server", append([]string{filepath.Join(dir, "redis.conf")}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("restarting the server in %s: %v: %s", dir, err, out)
	}
}

// WaitRole waits until the server at addr reports role ("master" or
// "slave"). The deadline is another process's: the cluster's or the
// Sentinel's failover.
func WaitRole(t testing.TB, addr, role string, max time.Duration) {
	t.Helper()
	wait(t, max, fmt.Sprintf("%s to become %s", addr, role), func() bool {
		out, err := Cli(addr, "role")
		return err == nil && strings.HasPrefix(out, role)
	})
}

// WaitLinked waits until the server at addr is a replica whose link to its
// master is up.
func WaitLinked(t testing.TB, addr string, max time.Duration) {
	t.Helper()
	wait(t, max, addr+" to be a linked replica", func() bool {
		out, err := Cli(addr, "info", "replication")
		return err == nil && strings.Contains(out, "master_link_status:up")
	})
}

// WaitHealthy waits until the cluster seed belongs to has masters masters
// and as many replicas, none failing, every replica linked, and every node
// says cluster_state:ok.
func WaitHealthy(t testing.TB, seed string, masters int, max time.Duration) {
	t.Helper()
	wait(t, max, "the cluster to heal", func() bool {
		m, r := 0, 0
		for _, n := range nodes(t, seed) {
			if strings.Contains(n.flags, "fail") || n.link != "connected" {
				return false
			}
			if info, err := Cli(n.addr, "cluster", "info"); err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
			if strings.Contains(n.flags, "master") {
				m++
				continue
			}
			if info, err := Cli(n.addr, "info", "replication"); err != nil || !strings.Contains(info, "master_link_status:up") {
				return false
			}
			r++
		}
		return m == masters && r == masters
	})
}

func wait(t testing.TB, max time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		if ok() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("waited %s for %s", max, what)
}
