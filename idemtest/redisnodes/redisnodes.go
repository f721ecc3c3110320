// Package redisnodes drives the Redis servers the project's scripts start
// for failover tests (scripts/redis-cluster, scripts/redis-replicas): it
// asks them with redis-cli, kills one by the PID in its pid file and starts
// it again with its config file. It also starts servers (and small
// clusters) of a test's own, for tests that change a server's config. It needs redis-cli and redis-server on
// PATH, as the scripts do. Test-only.
package redisnodes

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemtest/testenv"
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

// Start starts a redis-server of the test's own on a free loopback port,
// with no persistence, in a temporary folder, and the extra config
// directives args ("--maxmemory", "8mb", …); it returns its address once
// it answers, and stops it (by its PID) when the test ends. A test that
// must change a server's config (CONFIG SET maxmemory-policy) uses one,
// never a shared server. Without redis-server the test skips, or fails
// in CI (testenv.Missing).
func Start(t testing.TB, args ...string) string {
	t.Helper()
	return start(t, t.TempDir(), freePort(t, false), args...)
}

// StartIn is Start with the server's folder dir (a t.TempDir of the
// test's), where it keeps its pid file, so that Kill(t, dir) can end it
// while the test runs.
func StartIn(t testing.TB, dir string, args ...string) string {
	t.Helper()
	return start(t, dir, freePort(t, false), append([]string{"--pidfile", filepath.Join(dir, "pid")}, args...)...)
}

// StartCluster starts a Redis Cluster of the test's own with masters
// masters and no replicas (each a server as Start starts them, with
// cluster-enabled), creates it with redis-cli --cluster create, waits until
// every node says cluster_state:ok, and returns the masters' addresses.
// The servers stop when the test ends.
func StartCluster(t testing.TB, masters int, args ...string) []string {
	t.Helper()
	var addrs []string
	for range masters {
		a := start(t, t.TempDir(), freePort(t, true), append([]string{"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"}, args...)...)
		addrs = append(addrs, a)
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create %v: %v: %s", addrs, err, out)
	}
	wait(t, 30*time.Second, "the cluster to form", func() bool {
		for _, a := range addrs {
			if info, err := Cli(a, "cluster", "info"); err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		return true
	})
	return addrs
}

// StartSentinel starts a Redis Sentinel of the test's own that watches
// the primary at primary under the name master, waits until it knows the
// primary, and returns its address; it stops when the test ends.
func StartSentinel(t testing.TB, primary, master string) string {
	t.Helper()
	dir := t.TempDir()
	host, port, _ := strings.Cut(primary, ":")
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("sentinel monitor %s %s %s 1\n", master, host, port)), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startWith(t, dir, freePort(t, false), []string{conf, "--sentinel"})
	wait(t, 10*time.Second, "the Sentinel to know "+master, func() bool {
		out, err := Cli(a, "sentinel", "get-master-addr-by-name", master)
		return err == nil && strings.Fields(out) != nil && strings.Join(strings.Fields(out), ":") == primary
	})
	return a
}

// freePort returns a loopback port nothing listens on (and, for a cluster
// node, nothing on its bus port, port+10000, either).
func freePort(t testing.TB, bus bool) int {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !bus {
			return port
		}
		if port+10000 > 65535 {
			continue
		}
		if bl, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+10000)); err == nil {
			bl.Close()
			return port
		}
	}
	t.Fatal("no free port with a free bus port")
	return 0
}

func start(t testing.TB, dir string, port int, args ...string) string {
	t.Helper()
	return startWith(t, dir, port, nil, append([]string{"--save", "", "--appendonly", "no"}, args...)...)
}

// startWith starts redis-server with the arguments first (a config file),
// then its port, folder and log, then args.
func startWith(t testing.TB, dir string, port int, first []string, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Missing(t, "redis-server is not on PATH")
		return ""
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	argv := append(first, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--daemonize", "no", "--logfile", filepath.Join(dir, "log"))
	cmd := exec.Command(bin, append(argv, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server on %s: %v", addr, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	wait(t, 10*time.Second, "redis-server on "+addr+" to answer", func() bool {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "log"))
			t.Fatalf("redis-server on %s exited: %v: %s", addr, err, log)
		default:
		}
		out, err := Cli(addr, "ping")
		return err == nil && out == "PONG"
	})
	return addr
}
