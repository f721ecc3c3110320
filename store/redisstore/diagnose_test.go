package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/idemtest/redisnodes"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// findingOn returns the finding of check on the server at addr (by the
// address in its What), failing the test when there is none.
func findingOn(t *testing.T, fs []store.Finding, check, addr string) store.Finding {
	t.Helper()
	for _, f := range fs {
		if f.Check == check && strings.Contains(f.What, addr) {
			return f
		}
	}
	t.Fatalf("no %s finding on %s in %+v", check, addr, fs)
	return store.Finding{}
}

func wantFinding(t *testing.T, f store.Finding, sev store.Severity, what ...string) {
	t.Helper()
	if f.Severity != sev {
		t.Errorf("%s: %v, want %v: %+v", f.Check, f.Severity, sev, f)
	}
	for _, w := range what {
		if !strings.Contains(f.What+" fix: "+f.Fix, w) {
			t.Errorf("%s lacks %q: %+v", f.Check, w, f)
		}
	}
}

// Diagnose on a Ring of two servers of the test's own reads each: the
// one with AOF (appendfsync always) is well, the evicting one without
// persistence is a problem twice, each on its own line.
func TestDiagnoseReadsEveryShardOfARing(t *testing.T) {
	t.Parallel()
	a := redisnodes.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	b := redisnodes.Start(t, "--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru")
	r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a, "b": b}})
	t.Cleanup(func() { r.Close() })
	s, err := redisstore.New(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	fs := s.Diagnose(context.Background())
	if fs[0].Check != "configuration" {
		t.Errorf("first finding %+v, want the configuration", fs[0])
	}
	wantFinding(t, fs[0], store.SeverityOK, "ACL")
	wantFinding(t, findingOn(t, fs, "eviction", a), store.SeverityOK, "evicts no key")
	wantFinding(t, findingOn(t, fs, "eviction", b), store.SeverityProblem, "maxmemory-policy allkeys-lru", "fix: Set maxmemory-policy noeviction")
	wantFinding(t, findingOn(t, fs, "persistence", a), store.SeverityOK, "AOF on, appendfsync always")
	wantFinding(t, findingOn(t, fs, "persistence", b), store.SeverityProblem, "a restart forgets every record", "fix: turn on AOF")
	wantFinding(t, findingOn(t, fs, "replicas", a), store.SeverityOK, "0 online")
	wantFinding(t, findingOn(t, fs, "replicas", b), store.SeverityOK, "0 online")
	if len(fs) != 7 {
		t.Errorf("%d findings, want 7: %+v", len(fs), fs)
	}
}

// Diagnose through Sentinel reads the primary: without persistence but
// with a replica (and WaitReplicas 1) it is a warning, since a primary
// restarted before its replica is promoted comes back empty and the
// replica copies it; the replicas are well.
func TestDiagnoseReadsThePrimaryBehindSentinel(t *testing.T) {
	t.Parallel()
	primary := redisnodes.Start(t)
	host, port, _ := strings.Cut(primary, ":")
	replica := redisnodes.Start(t, "--replicaof", host, port)
	redisnodes.WaitLinked(t, replica, 10*time.Second)
	sentinel := redisnodes.StartSentinel(t, primary, "idem")
	s, err := redisstore.Open("redis+sentinel://"+sentinel+"?master_name=idem", &redisstore.Config{WaitReplicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fs := s.Diagnose(context.Background())
	wantFinding(t, findingOn(t, fs, "persistence", primary), store.SeverityWarning, "1 replica(s)", "comes back empty", "fix: turn on AOF")
	// The primary may count its replica online a moment after the replica
	// says its link is up.
	for i := 0; findingOn(t, fs, "replicas", primary).Severity != store.SeverityOK && i < 100; i++ {
		time.Sleep(20 * time.Millisecond) // another process's replication handshake
		fs = s.Diagnose(context.Background())
	}
	wantFinding(t, findingOn(t, fs, "replicas", primary), store.SeverityOK, "1 online, WaitReplicas 1")
}

// A user that may not run CONFIG: the save points are unknown, and a
// server without AOF or replicas is then a warning that says so.
func TestDiagnoseWithoutCONFIG(t *testing.T) {
	t.Parallel()
	a := redisnodes.Start(t)
	if out, err := redisnodes.Cli(a, "acl", "setuser", "noconfig", "on", ">pw", "~*", "+@all", "-config"); err != nil || out != "OK" {
		t.Fatalf("ACL SETUSER: %q %v", out, err)
	}
	s, err := redisstore.Open("redis://noconfig:pw@"+a+"/0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fs := s.Diagnose(context.Background())
	wantFinding(t, fs[0], store.SeverityOK, "its ACL lets the store's user")
	wantFinding(t, findingOn(t, fs, "persistence", a), store.SeverityWarning, "RDB save points could not be read", "NOPERM")
}
