package command

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/monitor"
	"github.com/seed-a1b882c0/idem/store/boltstore"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// The acceptance scenario of issue 14 on every store: a claim whose
// process died is found stuck by idemctl list --stuck and by the monitor
// within one sweep, resolved with idemctl resolve, and the next duplicate
// replays the resolved outcome.
func TestStuckRecordIsFoundResolvedAndReplayed(t *testing.T) {
	t.Run("bolt", func(t *testing.T) {
		stuckScenario(t, "bolt://"+filepath.Join(t.TempDir(), "idem.db"))
	})
	t.Run("redis", func(t *testing.T) {
		addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
		stuckScenario(t, fmt.Sprintf("redis://%s/0?prefix=idemctl%d:", addr, time.Now().UnixNano()))
	})
	t.Run("redis cluster", func(t *testing.T) {
		stuckScenario(t, clusterURL(t))
	})
	t.Run("postgres", func(t *testing.T) {
		addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
		user := os.Getenv("IDEM_PG_USER")
		if user == "" {
			user = "postgres"
		}
		stuckScenario(t, fmt.Sprintf("postgres://%s@%s/test?table=idemctl_%d", user, addr, time.Now().UnixNano()))
	})
	t.Run("dynamodb", func(t *testing.T) {
		ep := testenv.DynamoDB(t)
		t.Setenv("AWS_ACCESS_KEY_ID", "local")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "local")
		stuckScenario(t, fmt.Sprintf("dynamodb://idemctl_%d?region=us-east-1&endpoint=%s", time.Now().UnixNano(), ep))
	})
}

// clusterURL is a redis+cluster:// URL with a fresh prefix on the Redis
// Cluster scripts/redis-cluster started.
func clusterURL(t *testing.T) string {
	a := testenv.RedisCluster(t)
	return fmt.Sprintf("redis+cluster://%s?addr=%s&prefix=idemctl%d:", a[0], strings.Join(a[1:], "&addr="), time.Now().UnixNano())
}

// On a Redis Cluster, list --stuck and the monitor count the stuck records
// of every master, not one master's third.
func TestClusterListAndMonitorCountEveryMaster(t *testing.T) {
	url := clusterURL(t)
	ctx := context.Background()
	clock := clocktest.New(time.Now().Truncate(time.Millisecond))
	f := &fixture{t: t, clock: clock, getenv: map[string]string{EnvStore: url}}
	s, err := storeurl.Open(ctx, url, &storeurl.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err := idem.New(s, &idem.Config{Clock: clock, Owner: "worker-7"})
	if err != nil {
		t.Fatal(err)
	}
	const n = 60
	for i := range n {
		b, err := e.Begin(ctx, idem.Request{Operation: "charge", Key: fmt.Sprint(i)}, &idem.BeginOptions{ExpectedCompletion: time.Minute})
		if err != nil || !b.Acquired {
			t.Fatalf("%+v %v", b, err)
		}
	}
	clock.Advance(2 * time.Minute)
	if got := listedKeys(t, f.must("list", "--stuck", "--limit", "1000", "-o", "json")); len(got) != n {
		t.Fatalf("list --stuck on the cluster: %d records, want %d", len(got), n)
	}
	m, err := monitor.New(s.Lister(), &monitor.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := m.Sweep(ctx)
	if err != nil || snap.Stuck != n {
		t.Fatalf("monitor on the cluster: %+v %v, want %d stuck", snap, err, n)
	}
	for i := range n {
		id, _ := (&idem.Request{Operation: "charge", Key: fmt.Sprint(i)}).Identity()
		f.must("delete", "--yes", id.StoreKey.String())
	}
}

func stuckScenario(t *testing.T, url string) {
	ctx := context.Background()
	clock := clocktest.New(time.Now().Truncate(time.Millisecond))
	f := &fixture{t: t, clock: clock, getenv: map[string]string{EnvStore: url}}
	u, err := storeurl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	switch u.Kind {
	case storeurl.Postgres:
		if out := f.must("migrate"); !strings.Contains(out, "applied") {
			t.Fatalf("migrate: %q", out)
		}
	case storeurl.DynamoDB:
		if out := f.must("create-table"); !strings.Contains(out, "is active") || !strings.Contains(out, "one writing Region") {
			t.Fatalf("create-table: %q, want it to say which global-table setups are safe", out)
		}
	}

	// An application claims the key under the takeover policy Hold, hands
	// the work to an execution, and dies: its claim stays IN_PROGRESS,
	// held for an operator.
	app := func() (*idem.Engine, func()) {
		s, err := storeurl.Open(ctx, url, &storeurl.Options{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		e, err := idem.New(s, &idem.Config{Clock: clock, Owner: "worker-7", Expiry: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return e, func() { s.Close() }
	}
	e, kill := app()
	b, err := e.Begin(ctx, idem.Request{Operation: "charge", Key: "order-1", HoldCrashed: true}, &idem.BeginOptions{ExpectedCompletion: time.Minute})
	if err != nil || !b.Acquired {
		t.Fatalf("%+v %v", b, err)
	}
	if err := e.Attach(ctx, b.Token, "exec-1"); err != nil {
		t.Fatal(err)
	}
	key := b.Token.Key.String()
	kill()
	clock.Advance(2 * time.Minute)

	if got := listedKeys(t, f.must("list", "--stuck", "-o", "json")); len(got) != 1 || got[0] != key {
		t.Fatalf("list --stuck: %v, want %s", got, key)
	}
	if out := f.must("list", "--stuck"); !strings.Contains(out, "exec-1") || !strings.Contains(out, "worker-7/") || !strings.Contains(out, "(stuck, held)") {
		t.Fatalf("list --stuck:\n%s", out)
	}
	var held view
	if err := json.Unmarshal([]byte(f.must("show", "-o", "json", key)), &held); err != nil || !held.Stuck || !held.Held {
		t.Fatalf("show of the held key: %+v %v; want stuck and held", held, err)
	}
	// A retry, with the default policy, is refused: the key waits for a person.
	{
		e, stop := app()
		_, err := idem.Do(ctx, e, idem.Request{Operation: "charge", Key: "order-1"}, func(context.Context) (int, error) {
			t.Error("a held key ran again")
			return 0, nil
		})
		stop()
		if !errors.Is(err, idem.ErrHeld) {
			t.Fatalf("retry of the held key: %v, want idem.ErrHeld", err)
		}
	}

	s, err := storeurl.Open(ctx, url, &storeurl.Options{Passive: true, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	var events []monitor.Event
	m, err := monitor.New(s.Lister(), &monitor.Config{Clock: clock, OnEvent: func(ev monitor.Event) { events = append(events, ev) }})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := m.Sweep(ctx)
	s.Close()
	if err != nil || snap.Stuck != 1 || snap.Held != 1 || len(events) != 1 || events[0].Key != key || events[0].Ref != "exec-1" || !events[0].Held {
		t.Fatalf("monitor: %+v %v %+v", snap, err, events)
	}

	f.must("resolve", "--yes", key, "--result", `{"id":42}`)

	e, stop := app()
	defer stop()
	ran := false
	res, err := idem.Do(ctx, e, idem.Request{Operation: "charge", Key: "order-1"}, func(context.Context) (struct{ ID int }, error) {
		ran = true
		return struct{ ID int }{1}, nil
	})
	if err != nil || ran || !res.Replayed || res.Value.ID != 42 {
		t.Fatalf("duplicate after resolve: %+v %v, ran %v", res, err, ran)
	}
	stop()

	var v view
	if err := json.Unmarshal([]byte(f.must("show", "-o", "json", key)), &v); err != nil || v.Status != "COMPLETED" {
		t.Fatalf("show: %+v %v", v, err)
	}
	f.must("delete", "--yes", key)
	if code, _, _ := f.run("show", key); code != ExitNotFound {
		t.Fatalf("show after delete: exit %d", code)
	}
}

// list, show, find and watch on a bolt file leave its bytes, and its claim
// journal's, as they were — also when a crashed writer left a claim in the
// journal, which they show as stuck without replaying it into the file.
func TestReadOnlyCommandsLeaveABoltFileAsItWas(t *testing.T) {
	dir := t.TempDir()
	crashed, path := filepath.Join(dir, "writer.db"), filepath.Join(dir, "idem.db")
	ctx := context.Background()
	clock := clocktest.New(time.Now().Truncate(time.Millisecond))
	w, err := boltstore.Open(crashed, &boltstore.Config{SweepInterval: -1, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(w, &idem.Config{Clock: clock, Owner: "worker-7"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, e, idem.Request{Operation: "charge", Key: "done"}, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{})
	go func() {
		_, _ = idem.Do(ctx, e, idem.Request{Operation: "charge", Key: "held"}, func(context.Context) (int, error) {
			// The process "crashes" here: its files are copied as they stand.
			for _, suffix := range []string{"", ".claims"} {
				b, err := os.ReadFile(crashed + suffix)
				if err == nil {
					err = os.WriteFile(path+suffix, b, 0o600)
				}
				if err != nil {
					t.Error(err)
				}
			}
			close(held)
			return 2, nil
		})
	}()
	<-held
	defer w.Close()
	sums := func() string {
		out := ""
		for _, suffix := range []string{"", ".claims"} {
			b, err := os.ReadFile(path + suffix)
			if err != nil {
				t.Fatal(err)
			}
			out += fmt.Sprintf("%x ", sha256.Sum256(b))
		}
		return out
	}
	before := sums()
	clock.Advance(time.Minute) // past the held claim's lease (30s), within its expiry (1h)
	f := &fixture{t: t, clock: clock, getenv: map[string]string{EnvStore: "bolt://" + path}}
	got := listedKeys(t, f.must("list", "--stuck", "-o", "json"))
	if len(got) != 1 {
		t.Fatalf("list --stuck: %v, want the crashed writer's held claim", got)
	}
	f.must("list")
	f.must("show", got[0])
	f.must("find", "-message", "-operation", "charge", "-key", "done")
	watchOnce(t, f)
	if after := sums(); after != before {
		t.Fatalf("read-only commands changed the bolt file or its journal:\nbefore %s\nafter  %s", before, after)
	}
}
