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
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/boltstore"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// doctorOn runs idemctl doctor on url, opened as idemctl opens it but
// through a store that fails the test on any write (and passes on the
// checks doctor makes: Check, DiskFree, Durability). It returns the exit
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
// checks doctor makes of r's store (Check, DiskFree, Durability) when that
// store has them.
func readOnlyChecked(r readOnlyStore) store.Store {
	c := checked{readOnlyStore: r}
	ch, hasCheck := r.Store.(interface{ Check(context.Context) error })
	switch real := r.Store.(type) {
	case diskFreer:
		return checkedBolt{c, real}
	case durabler:
		return checkedPG{withCheck{c, ch.Check}, real}
	case replicator:
		return checkedRedis{withCheck{c, ch.Check}, real}
	}
	if hasCheck {
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

type checkedBolt struct {
	checked
	diskFreer
}

type checkedPG struct {
	withCheck
	durabler
}

func (c checkedPG) ServerTime(ctx context.Context) (time.Time, error) {
	return c.Store.(store.ServerTimer).ServerTime(ctx)
}

type checkedRedis struct {
	withCheck
	replicator
}

func (c checkedRedis) ServerTime(ctx context.Context) (time.Time, error) {
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
	f.getenv = map[string]string{}
	if code, out, _ := f.run("doctor"); code != ExitError || !strings.Contains(out, "no store URL") {
		t.Errorf("no URL: exit %d %q", code, out)
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

// doctor on Redis: all well on the server under test; a server that does
// not answer is a problem (exit 1) with what to check.
func TestDoctorRedis(t *testing.T) {
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	code, out, _ := doctorOn(t, fmt.Sprintf("redis://%s/0?prefix=idemctl-doctor%d:", addr, time.Now().UnixNano()))
	wantDoctor(t, code, out, ExitOK, "ok       configuration", "ok       round trip", "ok       clock", "ok       replicas", "0 online, WaitReplicas 0", "no problems found")

	// This machine's clock 5 minutes ahead of the store's: an engine here
	// would take over no claim.
	code, out, _ = doctorAt(t, time.Now().Add(5*time.Minute), fmt.Sprintf("redis://%s/0?prefix=idemctl-doctor%d:", addr, time.Now().UnixNano()))
	wantDoctor(t, code, out, ExitError, "PROBLEM  clock", "from the store's, beyond the 1m0s", "fix: synchronise this machine's clock")

	// WaitReplicas above the replicas the server has: every write fails.
	code, out, _ = doctorOn(t, fmt.Sprintf("redis://%s/0?waitreplicas=1&prefix=idemctl-doctor%d:", addr, time.Now().UnixNano()))
	wantDoctor(t, code, out, ExitError, "PROBLEM  replicas", "0 replica(s) online, WaitReplicas is 1", "fix: bring its replicas back")

	code, out, errOut := doctorOn(t, "redis://127.0.0.1:1/0")
	wantDoctor(t, code, out, ExitError, "PROBLEM  open", "fix: unless the message above names something to create, check that the server runs")
	if !strings.Contains(errOut, "1 problem(s) found") {
		t.Errorf("stderr %q", errOut)
	}
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
	wantDoctor(t, code, out, ExitOK, "ok       configuration", "ok       clock", "ok       synchronous_commit", "ok       standbys", "no problems found")

	code, out, _ = doctorOn(t, url+"&synchronous_commit=off")
	wantDoctor(t, code, out, ExitError, "PROBLEM  synchronous_commit", "off: a crash of the server can lose outcomes", "ALTER ROLE")

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
