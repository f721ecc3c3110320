package command

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/redisnodes"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/boltstore"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// doctorOn runs idemctl doctor on url, opened as idemctl opens it but
// through a store that fails the test on any write (and passes on the
// checks doctor makes: Diagnose or Check, ServerTime). It returns the exit
// code, stdout and stderr.
func doctorOn(t *testing.T, url string, args ...string) (int, string, string) {
	t.Helper()
	return doctorAt(t, time.Now(), url, args...)
}

// doctorAt is doctorOn with idemctl's clock at now.
func doctorAt(t *testing.T, now time.Time, url string, args ...string) (int, string, string) {
	t.Helper()
	f := &fixture{t: t, clock: clocktest.New(now), getenv: map[string]string{}}
	var out, errb syncBuffer
	env := f.env(&out, &errb)
	env.OpenReadOnly = func(ctx context.Context, url string) (store.Store, func() error, error) {
		s, err := storeurl.Open(ctx, url, &storeurl.Options{Passive: true, ReadOnly: true})
		if err != nil {
			return nil, nil, err
		}
		return readOnlyChecked(readOnlyStore{Store: s.Store, t: t}), s.Close, nil
	}
	code := Run(context.Background(), append([]string{"doctor", url}, args...), env)
	t.Logf("doctor %s: exit %d\n%s%s", storeurl.Redact(url), code, out.String(), errb.String())
	return code, out.String(), errb.String()
}

// readOnlyChecked is r, which fails the test on any write, with the
// checks doctor makes of r's store (Diagnose, else Check; ServerTime)
// when that store has them.
func readOnlyChecked(r readOnlyStore) store.Store {
	c := checked{readOnlyStore: r}
	if dg, ok := r.Store.(store.Diagnoser); ok {
		if _, timed := r.Store.(store.ServerTimer); timed {
			return diagnosedTimed{diagnosed{c, dg}}
		}
		return diagnosed{c, dg}
	}
	if ch, ok := r.Store.(interface{ Check(context.Context) error }); ok {
		return withCheck{c, ch.Check}
	}
	return c
}

type checked struct{ readOnlyStore }

func (c checked) SystemName() string {
	n, _ := c.Store.(store.SystemNamer)
	if n == nil {
		return ""
	}
	return n.SystemName()
}

type withCheck struct {
	checked
	check func(context.Context) error
}

func (c withCheck) Check(ctx context.Context) error { return c.check(ctx) }

type diagnosed struct {
	checked
	store.Diagnoser
}

type diagnosedTimed struct{ diagnosed }

func (c diagnosedTimed) ServerTime(ctx context.Context) (time.Time, error) {
	return c.Store.(store.ServerTimer).ServerTime(ctx)
}

// wantDoctor checks doctor's exit code and that its output has each of want.
func wantDoctor(t *testing.T, code int, out string, wantCode int, want ...string) {
	t.Helper()
	if code != wantCode {
		t.Errorf("exit %d, want %d", code, wantCode)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q", w)
		}
	}
}

func TestDoctorCommandLine(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.store = readOnlyStore{Store: f.store, t: t}
	wantDoctor(t, firstOf(f.run("doctor")), f.must("doctor"), ExitOK, "ok       round trip", "5 reads", "no problems found")
	if code, _, errOut := f.run("doctor", "a", "b"); code != ExitUsage || !strings.Contains(errOut, "one store URL") {
		t.Errorf("two URLs: exit %d %q", code, errOut)
	}
	if code, _, _ := f.run("doctor", "-probes", "0"); code != ExitUsage {
		t.Errorf("-probes 0: exit %d", code)
	}
	// No URL anywhere: a bad command line, exit 2 as for the other
	// commands, with the usage.
	f.getenv = map[string]string{}
	if code, _, errOut := f.run("doctor"); code != ExitUsage || !strings.Contains(errOut, "no store URL") || !strings.Contains(errOut, "idemctl doctor") {
		t.Errorf("no URL: exit %d %q", code, errOut)
	}
}

func firstOf(code int, _, _ string) int { return code }

// doctor on a bolt file: all well, and the file's bytes as they were; on a
// file system under MinFreeBytes it reports the disk (exit 1).
func TestDoctorBolt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := boltstore.Open(path, &boltstore.Config{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	sum := func() [32]byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return sha256.Sum256(b)
	}
	before := sum()
	code, out, _ := doctorOn(t, "bolt://"+path)
	wantDoctor(t, code, out, ExitOK, "ok       open", "ok       round trip", "ok       disk", "free (new claims need 16.0 MiB)", "no problems found")
	if sum() != before {
		t.Error("doctor changed the bolt file")
	}
	// As idemctl runs it: the store opened by System's opener.
	f := &fixture{t: t, clock: clocktest.New(time.Now()), getenv: map[string]string{}}
	if out := f.must("doctor", "bolt://"+path); !strings.Contains(out, "ok       disk") {
		t.Errorf("doctor with idemctl's own opener:\n%s", out)
	}
	if sum() != before {
		t.Error("doctor changed the bolt file")
	}

	t.Run("full disk", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "disk")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err != nil {
			testenv.Missing(t, "cannot mount a size-limited tmpfs ("+err.Error()+"): run as root")
		}
		defer func() {
			if err := syscall.Unmount(dir, 0); err != nil {
				t.Errorf("unmount: %v", err)
			}
		}()
		path := filepath.Join(dir, "idem.db")
		s, err := boltstore.Open(path, &boltstore.Config{SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		code, out, _ := doctorOn(t, "bolt://"+path)
		wantDoctor(t, code, out, ExitError, "PROBLEM  disk", "under the 16.0 MiB new claims need", "fix: free space")
	})
}

// doctor on Redis servers of the test's own, one line per check and
// every check run whatever an earlier one found: a server with AOF and
// appendfsync always is well; one without persistence forgets every
// record on a restart; eviction, no persistence and waitreplicas above
// the replicas are reported together; alloweviction=true is a warning
// (exit 0); a server that does not answer is a problem with what to check.
func TestDoctorRedis(t *testing.T) {
	url := func(addr, query string) string {
		return fmt.Sprintf("redis://%s/0?%sprefix=idemctl-doctor%d:", addr, query, time.Now().UnixNano())
	}
	durable := redisnodes.Start(t, "--appendonly", "yes", "--appendfsync", "always")

	t.Run("well", func(t *testing.T) {
		code, out, _ := doctorOn(t, url(durable, ""))
		wantDoctor(t, code, out, ExitOK, "ok       configuration", "ok       eviction", "ok       persistence", "AOF on, appendfsync always",
			"ok       round trip", "ok       clock", "ok       replicas", "0 online, WaitReplicas 0", "no problems found")
		if strings.Contains(out, "WARNING") || strings.Contains(out, "PROBLEM") {
			t.Errorf("findings on a well server:\n%s", out)
		}
	})

	t.Run("clock ahead", func(t *testing.T) {
		// This machine's clock 5 minutes ahead of the store's: an engine
		// here would take over no claim.
		code, out, _ := doctorAt(t, time.Now().Add(5*time.Minute), url(durable, ""))
		wantDoctor(t, code, out, ExitError, "PROBLEM  clock", "from the store's, beyond the 1m0s", "fix: synchronise this machine's clock")
	})

	t.Run("no persistence", func(t *testing.T) {
		code, out, errOut := doctorOn(t, url(redisnodes.Start(t), ""))
		wantDoctor(t, code, out, ExitError, "PROBLEM  persistence", "no persistence (AOF off, no RDB save point) and no replica: a restart forgets every record",
			"fix: turn on AOF with appendfsync always", "ok       eviction", "ok       replicas")
		if !strings.Contains(errOut, "1 problem(s) found") {
			t.Errorf("stderr %q", errOut)
		}
	})

	t.Run("RDB snapshots only", func(t *testing.T) {
		code, out, _ := doctorOn(t, url(redisnodes.Start(t, "--save", "3600 1"), ""))
		wantDoctor(t, code, out, ExitOK, "WARNING  persistence", `RDB snapshots (save "3600 1") without AOF and no replica: a restart loses every write since the last snapshot`,
			"fix: turn on AOF", "no problems found; 1 warning(s) above")
	})

	t.Run("every check reported", func(t *testing.T) {
		evicting := redisnodes.Start(t, "--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru")
		code, out, errOut := doctorOn(t, url(evicting, "waitreplicas=1&"))
		wantDoctor(t, code, out, ExitError,
			"PROBLEM  eviction", "maxmemory-policy allkeys-lru", "fix: Set maxmemory-policy noeviction",
			"PROBLEM  persistence", "a restart forgets every record",
			"PROBLEM  replicas", "0 replica(s) online, WaitReplicas is 1", "fix: bring its replicas back",
			"ok       configuration", "ok       round trip", "ok       clock")
		if !strings.Contains(errOut, "3 problem(s) found") {
			t.Errorf("stderr %q", errOut)
		}
	})

	t.Run("eviction accepted", func(t *testing.T) {
		evicting := redisnodes.Start(t, "--maxmemory", "8mb", "--maxmemory-policy", "volatile-lru", "--appendonly", "yes", "--appendfsync", "always")
		code, out, _ := doctorOn(t, url(evicting, "alloweviction=true&"))
		wantDoctor(t, code, out, ExitOK, "WARNING  eviction", "maxmemory-policy volatile-lru", "alloweviction=true (Config.AllowEviction) accepts that risk",
			"fix: set maxmemory-policy noeviction", "ok       persistence", "no problems found; 1 warning(s) above")
		if strings.Contains(out, "ok       eviction") {
			t.Errorf("the accepted risk printed as ok:\n%s", out)
		}
	})

	t.Run("unreachable", func(t *testing.T) {
		code, out, errOut := doctorOn(t, "redis://127.0.0.1:1/0")
		wantDoctor(t, code, out, ExitError, "PROBLEM  open", "fix: check that the server runs")
		if !strings.Contains(errOut, "1 problem(s) found") {
			t.Errorf("stderr %q", errOut)
		}
	})
}

// doctor on PostgreSQL: a migrated table on the server under test is well
// (synchronous_commit on, no standby); synchronous_commit off is a
// problem; a database that does not exist is one, found at once, with
// what to create.
func TestDoctorPostgres(t *testing.T) {
	addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
	user := os.Getenv("IDEM_PG_USER")
	if user == "" {
		user = "postgres"
	}
	table := fmt.Sprintf("idemctl_doctor_%d", time.Now().UnixNano())
	url := fmt.Sprintf("postgres://%s@%s/test?table=%s", user, addr, table)
	f := &fixture{t: t, clock: clocktest.New(time.Now()), getenv: map[string]string{EnvStore: url}}
	f.must("migrate")

	code, out, _ := doctorOn(t, url)
	wantDoctor(t, code, out, ExitOK, "ok       configuration", "ok       clock", "ok       primary", "ok       synchronous_commit", "ok       standbys", "no problems found")

	code, out, _ = doctorOn(t, url+"&synchronous_commit=off")
	wantDoctor(t, code, out, ExitError, "PROBLEM  synchronous_commit", "off: a crash of the server can lose outcomes", "ALTER ROLE")

	// A database without the table: idemctl migrate creates it.
	code, out, _ = doctorOn(t, fmt.Sprintf("postgres://%s@%s/test?table=idemctl_doctor_notable_%d", user, addr, time.Now().UnixNano()))
	wantDoctor(t, code, out, ExitError, "PROBLEM  open", "does not exist", "fix: create it with idemctl migrate on this store's URL")
	if strings.Contains(out, "check that the server runs") {
		t.Errorf("a missing table sends the operator to the server:\n%s", out)
	}

	start := time.Now()
	code, out, _ = doctorOn(t, fmt.Sprintf("postgres://%s@%s/idemctl_nodb_%d?table=%s", user, addr, time.Now().UnixNano(), table))
	wantDoctor(t, code, out, ExitError, "PROBLEM  open", "3D000", "CREATE DATABASE", "no retry mends it")
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("a missing database took %v to report", d)
	}
}

// doctor on DynamoDB: a table made by create-table is well; a table that
// does not exist is a problem saying how to create it.
func TestDoctorDynamoDB(t *testing.T) {
	ep := testenv.DynamoDB(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "local")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "local")
	url := fmt.Sprintf("dynamodb://idemctl_doctor_%d?region=us-east-1&endpoint=%s", time.Now().UnixNano(), ep)
	f := &fixture{t: t, clock: clocktest.New(time.Now()), getenv: map[string]string{EnvStore: url}}
	f.must("create-table")
	code, out, _ := doctorOn(t, url)
	wantDoctor(t, code, out, ExitOK, "ok       configuration", "ok       round trip", "no problems found")

	code, out, _ = doctorOn(t, fmt.Sprintf("dynamodb://idemctl_nosuchtable_%d?region=us-east-1&endpoint=%s", time.Now().UnixNano(), ep))
	if code != ExitError || !strings.Contains(out, "PROBLEM") || !strings.Contains(out, "create") {
		t.Errorf("missing table: exit %d\n%s", code, out)
	}
}

// doctor on the 3+3 Redis Cluster with WaitReplicas 1: every master has
// its replica; with WaitReplicas 0 the asynchronous replicas are a problem.
func TestDoctorRedisCluster(t *testing.T) {
	url := clusterURL(t)
	code, out, _ := doctorOn(t, url+"&waitreplicas=1")
	wantDoctor(t, code, out, ExitOK, "ok       replicas", "1 online, WaitReplicas 1", "no problems found")
	if n := strings.Count(out, "ok       replicas"); n != 3 {
		t.Errorf("%d masters reported, want 3", n)
	}
	code, out, _ = doctorOn(t, url)
	wantDoctor(t, code, out, ExitError, "PROBLEM  replicas", "WaitReplicas is 0: replication is asynchronous", "set waitreplicas=1")
}
