package monitor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/monitor"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fixture is a store with an engine and a monitor on one manual clock.
type fixture struct {
	clock  *clocktest.Clock
	store  *memstore.Store
	engine *idem.Engine
	logs   *syncBuffer

	mu     sync.Mutex
	events []monitor.Event
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func setup(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{clock: clocktest.New(t0), logs: &syncBuffer{}}
	f.store = memstore.New(&memstore.Config{SweepInterval: -1, Clock: f.clock})
	t.Cleanup(func() { f.store.Close() })
	var err error
	f.engine, err = idem.New(f.store, &idem.Config{Clock: f.clock, Expiry: 24 * time.Hour, Owner: "worker-7"})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) config(c monitor.Config) *monitor.Config {
	c.Clock = f.clock
	c.Logger = slog.New(slog.NewTextHandler(f.logs, nil))
	c.OnEvent = func(ev monitor.Event) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.events = append(f.events, ev)
	}
	return &c
}

func (f *fixture) takeEvents() []monitor.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	ev := f.events
	f.events = nil
	return ev
}

// begin claims key for work expected to take d, with ref attached.
func (f *fixture) begin(t *testing.T, key string, d time.Duration, ref string) idem.Token {
	t.Helper()
	ctx := context.Background()
	b, err := f.engine.Begin(ctx, idem.Request{Operation: "charge", Key: key}, &idem.BeginOptions{ExpectedCompletion: d})
	if err != nil || !b.Acquired {
		t.Fatalf("begin %s: %+v %v", key, b, err)
	}
	if ref != "" {
		if err := f.engine.Attach(ctx, b.Token, ref); err != nil {
			t.Fatal(err)
		}
	}
	return b.Token
}

func TestSweepCountsAndReportsEachRecordOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.begin(t, "slow", time.Minute, "arn:exec:slow")
	f.clock.Advance(10 * time.Second)
	f.begin(t, "quick", 5*time.Minute, "")
	failed := f.begin(t, "broken", time.Minute, "")
	if err := f.engine.Fail(ctx, failed, idem.Terminal(errors.New("card declined"), "declined")); err != nil {
		t.Fatal(err)
	}
	done := f.begin(t, "done", time.Minute, "")
	if err := f.engine.Complete(ctx, done, "ok"); err != nil {
		t.Fatal(err)
	}
	m, err := monitor.New(f.store, f.config(monitor.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	snap, err := m.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.InProgress != 2 || snap.Stuck != 0 || snap.Failed != 1 || snap.OldestInProgress != 10*time.Second {
		t.Fatalf("first sweep: %+v", snap)
	}
	ev := f.takeEvents()
	if len(ev) != 1 || ev[0].Kind != monitor.Failed || ev[0].ErrCode != "declined" || ev[0].Operation != "charge" {
		t.Fatalf("first sweep events: %+v", ev)
	}

	f.clock.Advance(time.Minute) // "slow" is now past its expected completion
	snap, _ = m.Sweep(ctx)
	if snap.InProgress != 2 || snap.Stuck != 1 || snap.Failed != 1 || snap.OldestInProgress != 70*time.Second {
		t.Fatalf("second sweep: %+v", snap)
	}
	ev = f.takeEvents()
	if len(ev) != 1 || ev[0].Kind != monitor.Stuck || ev[0].Ref != "arn:exec:slow" || !strings.HasPrefix(ev[0].Owner, "worker-7/") ||
		!ev[0].CreatedAt.Equal(t0) || !ev[0].LeaseUntil.Equal(t0.Add(time.Minute)) {
		t.Fatalf("second sweep events: %+v", ev)
	}
	if m.Last() != snap {
		t.Fatalf("Last() = %+v, want %+v", m.Last(), snap)
	}
	logs := f.logs.String()
	for _, want := range []string{"record stuck past its expected completion", "ref=arn:exec:slow", "owner=worker-7/", "record failed", "code=declined"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}

	snap, _ = m.Sweep(ctx)
	if ev := f.takeEvents(); len(ev) != 0 || snap.Stuck != 1 {
		t.Fatalf("third sweep reported again: %+v %+v", snap, ev)
	}
	if n := strings.Count(f.logs.String(), "record stuck"); n != 1 {
		t.Fatalf("the stuck record was logged %d times", n)
	}
}

func TestARecordThatComesBackIsReportedAgain(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	tok := f.begin(t, "k", time.Second, "")
	m, _ := monitor.New(f.store, f.config(monitor.Config{}))
	f.clock.Advance(2 * time.Second)
	if snap, _ := m.Sweep(ctx); snap.Stuck != 1 || len(f.takeEvents()) != 1 {
		t.Fatalf("not stuck: %+v", snap)
	}
	if err := f.engine.Release(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if snap, _ := m.Sweep(ctx); snap.Stuck != 0 || len(f.takeEvents()) != 0 {
		t.Fatalf("after release: %+v", snap)
	}
	f.begin(t, "k", time.Second, "")
	f.clock.Advance(2 * time.Second)
	if snap, _ := m.Sweep(ctx); snap.Stuck != 1 || len(f.takeEvents()) != 1 {
		t.Fatalf("stuck again, not reported: %+v", snap)
	}
}

func TestSweepWorkIsBounded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		f.begin(t, k, time.Second, "")
	}
	l := &countingLister{Lister: f.store}
	m, _ := monitor.New(l, f.config(monitor.Config{MaxRecords: 3, PageSize: 2}))
	f.clock.Advance(time.Minute)
	snap, err := m.Sweep(context.Background())
	if err != nil || !snap.Truncated || snap.InProgress != 3 || snap.Stuck != 3 || l.read > 3 {
		t.Fatalf("%+v %v, read %d records", snap, err, l.read)
	}
	if ev := f.takeEvents(); len(ev) != 3 {
		t.Fatalf("%d events", len(ev))
	}
}

// Many IN_PROGRESS records past MaxRecords do not hide the FAILED ones:
// each status is read within a budget of its own, and FAILED is counted
// exactly (issue 32: "Failed 0" with 1,000 FAILED records among 100,000).
func TestFailedAreCountedPastAnInProgressBacklog(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for i := range 8 {
		f.begin(t, fmt.Sprint("open-", i), time.Hour, "")
	}
	ctx := context.Background()
	for i := range 2 {
		tok := f.begin(t, fmt.Sprint("failed-", i), time.Hour, "")
		if err := f.engine.Fail(ctx, tok, &idem.TerminalError{Code: "c", Message: "m"}); err != nil {
			t.Fatal(err)
		}
	}
	m, _ := monitor.New(f.store, f.config(monitor.Config{MaxRecords: 3, PageSize: 2}))
	snap, err := m.Sweep(ctx)
	if err != nil || !snap.Truncated || snap.InProgress != 3 || snap.Failed != 2 {
		t.Fatalf("%+v %v: want 3 IN_PROGRESS read (truncated) and both FAILED counted", snap, err)
	}
}

type countingLister struct {
	store.Lister
	mu   sync.Mutex
	read int
	err  error
}

func (c *countingLister) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return store.ListResult{}, c.err
	}
	res, err := c.Lister.List(ctx, p)
	c.read += len(res.Records)
	return res, err
}

func TestFailedSweepSaysSo(t *testing.T) {
	t.Parallel()
	f := setup(t)
	boom := errors.New("connection refused")
	m, _ := monitor.New(&countingLister{Lister: f.store, err: boom}, f.config(monitor.Config{}))
	snap, err := m.Sweep(context.Background())
	if !errors.Is(err, boom) || !errors.Is(snap.Err, boom) || !strings.Contains(f.logs.String(), "sweep failed") {
		t.Fatalf("%+v %v", snap, err)
	}
}

func TestStartSweepsOnTheClockUntilClose(t *testing.T) {
	t.Parallel()
	f := setup(t)
	sweeps := make(chan monitor.Snapshot, 10)
	cfg := f.config(monitor.Config{Interval: time.Minute})
	cfg.OnSweep = func(s monitor.Snapshot) { sweeps <- s }
	m, err := monitor.Start(f.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s := <-sweeps; s.InProgress != 0 || !s.At.Equal(t0) {
		t.Fatalf("first sweep: %+v", s)
	}
	f.begin(t, "k", time.Second, "")
	for f.clock.Waiters() == 0 { // the monitor waits for its next sweep
		runtime.Gosched()
	}
	f.clock.Advance(time.Minute)
	if s := <-sweeps; s.Stuck != 1 || !s.At.Equal(t0.Add(time.Minute)) {
		t.Fatalf("second sweep: %+v", s)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	if _, err := monitor.New(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if _, err := monitor.New(memstore.New(&memstore.Config{SweepInterval: -1}), &monitor.Config{Interval: -time.Second}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatal(err)
	}
}

// The per-operation counts add up to the totals the gauges show.
func TestSweepCountsByOperation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.begin(t, "a", time.Minute, "") // charge, stuck below
	b, err := f.engine.Begin(ctx, idem.Request{Operation: "refund", Key: "r"}, &idem.BeginOptions{ExpectedCompletion: time.Hour})
	if err != nil || !b.Acquired {
		t.Fatal(b, err)
	}
	failed, err := f.engine.Begin(ctx, idem.Request{Operation: "refund", Key: "f"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.engine.Fail(ctx, failed.Token, idem.Terminal(errors.New("no"), "declined")); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(2 * time.Minute)
	m, err := monitor.New(f.store, f.config(monitor.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	snap, err := m.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]monitor.Counts{
		"charge": {InProgress: 1, Stuck: 1, OldestInProgress: 2 * time.Minute},
		"refund": {InProgress: 1, Failed: 1, OldestInProgress: 2 * time.Minute},
	}
	if got := snap.ByOperation(); len(got) != len(want) || got["charge"] != want["charge"] || got["refund"] != want["refund"] {
		t.Fatalf("by operation: %+v, want %+v", got, want)
	}
	if snap.InProgress != 2 || snap.Stuck != 1 || snap.Failed != 1 {
		t.Fatalf("totals: %+v", snap)
	}
}

// settingsStore is a memstore whose CheckSettings answers what the test
// sets: the monitor's side of store.SettingsChecker, with no backend
// behind it (redisstore's TestMonitorSeesEvictionTurnedOn runs it on a
// real Redis).
type settingsStore struct {
	*memstore.Store
	mu  sync.Mutex
	err error
}

func (s *settingsStore) set(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

func (s *settingsStore) CheckSettings(context.Context) []store.SettingCheck {
	s.mu.Lock()
	defer s.mu.Unlock()
	return []store.SettingCheck{{Name: "eviction", Err: s.err}}
}

// TestSweepReportsASettingThatTurnsWrong: every sweep asks a
// store.SettingsChecker; a check that starts failing with
// ErrMisconfigured is logged once (Error), a check that cannot be read
// (ErrUnavailable) is logged once (Warn) and leaves it wrong, and the
// check passing again is logged once (Info). Every snapshot carries the
// answers.
func TestSweepReportsASettingThatTurnsWrong(t *testing.T) {
	f := setup(t)
	s := &settingsStore{Store: f.store}
	m, err := monitor.New(s, f.config(monitor.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sweep := func(want bool) monitor.Snapshot {
		t.Helper()
		snap, err := m.Sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := snap.Settings(); len(got) != 1 || got[0].Name != "eviction" || snap.Misconfigured() != want {
			t.Fatalf("snapshot settings %+v, misconfigured %v; want one eviction check, misconfigured %v", got, snap.Misconfigured(), want)
		}
		return snap
	}
	const wrongLine = "a store setting lets records be forgotten before their expiry; operations may run again"
	sweep(false)
	if strings.Contains(f.logs.String(), "store setting") {
		t.Fatalf("logged with every setting right: %s", f.logs)
	}
	s.set(fmt.Errorf("Redis at 127.0.0.1:1 evicts: %w", store.ErrMisconfigured))
	snap := sweep(true)
	if err := snap.Settings()[0].Err; !errors.Is(err, store.ErrMisconfigured) {
		t.Fatalf("snapshot check error %v", err)
	}
	sweep(true)
	s.set(fmt.Errorf("cannot read: %w", store.ErrUnavailable))
	sweep(false)
	sweep(false)
	if n := strings.Count(f.logs.String(), "cannot read a store setting"); n != 1 {
		t.Fatalf("%d lines saying the setting cannot be read, want 1:\n%s", n, f.logs)
	}
	s.set(fmt.Errorf("Redis at 127.0.0.1:1 evicts: %w", store.ErrMisconfigured))
	sweep(true)
	logs := f.logs.String()
	if n := strings.Count(logs, wrongLine); n != 1 || !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, "check=eviction") {
		t.Fatalf("%d lines saying the setting is wrong, want 1 at ERROR naming the check:\n%s", n, logs)
	}
	s.set(nil)
	sweep(false)
	sweep(false)
	if n := strings.Count(f.logs.String(), "the store setting is right again"); n != 1 {
		t.Fatalf("%d lines saying the setting is right again, want 1:\n%s", n, f.logs)
	}
	// A store without the power: no checks, nothing misconfigured.
	plain, err := monitor.New(f.store, f.config(monitor.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	if snap, err := plain.Sweep(ctx); err != nil || snap.Settings() != nil || snap.Misconfigured() {
		t.Fatalf("a store with no setting checks: %+v, %v", snap.Settings(), err)
	}
}

// clockStore is a memstore that tells a clock of its own, off the system
// clock by off, or fails to (err).
type clockStore struct {
	*memstore.Store
	off time.Duration
	err error
}

func (s clockStore) ServerTime(context.Context) (time.Time, error) {
	if s.err != nil {
		return time.Time{}, s.err
	}
	return time.Now().Add(s.off), nil
}

// A monitor whose clock runs five minutes ahead of its store's counts a
// record stuck on the store's clock only; one that cannot read the
// store's clock counts nothing and says why. (Redis, PostgreSQL and
// DynamoDB: cmd/idemctl's TestStuckIsDecidedOnTheStoresClock.)
func TestStuckIsDecidedOnTheStoresClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	storeNow := time.Now().Add(-time.Hour) // the store's clock: an hour behind this machine's
	claim := func(name string, at, leaseUntil time.Time) {
		if res, err := mem.Claim(ctx, store.ClaimParams{Key: "charge#" + name, Owner: name, Now: store.Millis(at),
			LeaseUntil: store.Millis(leaseUntil), ExpiresAt: store.Millis(storeNow.Add(24 * time.Hour))}); err != nil || !res.Acquired {
			t.Fatalf("%+v %v", res, err)
		}
	}
	claim("live", storeNow, storeNow.Add(2*time.Minute))
	claim("passed", storeNow.Add(-10*time.Minute), storeNow.Add(-time.Minute))
	quiet := slog.New(slog.DiscardHandler)

	m, err := monitor.New(clockStore{Store: mem, off: -time.Hour}, &monitor.Config{Clock: clocktest.NewSkewed(5 * time.Minute), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := m.Sweep(ctx)
	if err != nil || snap.InProgress != 2 || snap.Stuck != 1 {
		t.Fatalf("sweep on the store's clock: %+v %v, want 1 stuck of 2", snap, err)
	}
	if d := snap.At.Sub(storeNow); d < 0 || d > time.Minute {
		t.Fatalf("snapshot At %v, want the store's time (about %v)", snap.At, storeNow)
	}

	m, err = monitor.New(clockStore{Store: mem, err: store.ErrUnavailable}, &monitor.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	snap, err = m.Sweep(ctx)
	if !errors.Is(err, store.ErrUnavailable) || snap.InProgress != 0 || snap.Stuck != 0 {
		t.Fatalf("sweep without the store's clock: %+v %v, want ErrUnavailable and nothing counted", snap, err)
	}
}

// A stuck record held for an operator (the takeover policy Hold) is
// counted as stuck and as held, in the snapshot and by operation, and its
// event and log line say so; a plain stuck record is not held.
func TestHeldRecordIsStuckWithItsReason(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	if b, err := f.engine.Begin(ctx, idem.Request{Operation: "charge", Key: "held", HoldCrashed: true}, &idem.BeginOptions{ExpectedCompletion: time.Second}); err != nil || !b.Acquired {
		t.Fatalf("begin: %+v %v", b, err)
	}
	f.begin(t, "plain", time.Second, "")
	m, _ := monitor.New(f.store, f.config(monitor.Config{}))
	f.clock.Advance(2 * time.Second)
	snap, err := m.Sweep(ctx)
	if err != nil || snap.Stuck != 2 || snap.Held != 1 || snap.ByOperation()["charge"].Held != 1 {
		t.Fatalf("sweep: %+v %v; want 2 stuck, 1 held", snap, err)
	}
	held := 0
	for _, ev := range f.takeEvents() {
		if ev.Held {
			held++
		}
	}
	if held != 1 || !strings.Contains(f.logs.String(), "held for an operator") {
		t.Fatalf("%d held events; logs:\n%s", held, f.logs.String())
	}
}
