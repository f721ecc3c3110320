package command

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/monitor"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// "Stuck" is decided on the store's clock, as leases are: with idemctl's
// clock five minutes ahead of the store's, list --stuck, show, release,
// the monitor and the console neither list nor settle live work (its
// lease ends in two minutes on the store's clock); five minutes behind,
// they list and settle work whose lease ended a minute ago on the store's
// clock. Redis, PostgreSQL and DynamoDB tell their time; memstore and a
// bolt file have no clock of their own: their records' holders run in
// this process or on this machine and wrote their leases by its clock,
// which the tools then use as it is (the records here are written by it).
func TestStuckIsDecidedOnTheStoresClock(t *testing.T) {
	for name, off := range map[string]time.Duration{"Ahead5m": 5 * time.Minute, "Behind5m": -5 * time.Minute} {
		t.Run(name, func(t *testing.T) {
			onStoresWith(t, clocktest.NewSkewed(off), stuckOnTheStoresClock)
		})
	}
}

func stuckOnTheStoresClock(t *testing.T, f *fixture) {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	open := func(passive bool) (store.Store, func() error) {
		if f.store != nil {
			return f.store, func() error { return nil }
		}
		s, err := storeurl.Open(ctx, f.getenv[EnvStore], &storeurl.Options{Passive: passive, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		return s.Store, s.Close
	}

	// Two claims, timed by the store's clock (this machine's local clock
	// for a store without one): live, its lease ending in two minutes;
	// passed, claimed ten minutes ago, its lease ended a minute ago.
	s, closeStore := open(false)
	now := f.local.Now()
	if st, ok := s.(store.ServerTimer); ok {
		var err error
		if now, err = st.ServerTime(ctx); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(name string, at, leaseUntil time.Time) string {
		id, err := (&idem.Request{Operation: "charge", Key: name}).Identity()
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Claim(ctx, store.ClaimParams{Key: id.StoreKey.String(), Fingerprint: id.Fingerprint, Owner: "worker-7/" + name,
			Now: store.Millis(at), LeaseUntil: store.Millis(leaseUntil), ExpiresAt: store.Millis(now.Add(24 * time.Hour))})
		if err != nil || !res.Acquired {
			t.Fatalf("claim %s: %+v %v", name, res, err)
		}
		return id.StoreKey.String()
	}
	live := claim("live", now, now.Add(2*time.Minute))
	passed := claim("passed", now.Add(-10*time.Minute), now.Add(-time.Minute))
	closeStore()

	// idemctl.
	if got := listedKeys(t, f.must("list", "--stuck", "-o", "json")); !slices.Equal(got, []string{passed}) {
		t.Errorf("list --stuck: %v, want only the record whose lease passed on the store's clock, %s", got, passed)
	}
	if out := f.must("show", live); strings.Contains(out, "stuck") {
		t.Errorf("show of the live record says stuck:\n%s", out)
	}
	if out := f.must("show", passed); !strings.Contains(out, "(stuck") {
		t.Errorf("show of the record whose lease passed does not say stuck:\n%s", out)
	}
	if code, _, errOut := f.run("release", "--yes", live); code != ExitError || !strings.Contains(errOut, "within its expected completion") {
		t.Errorf("release of the live record without --force: exit %d, %s; want it refused", code, errOut)
	}

	// The monitor.
	s, closeStore = open(true)
	var events []monitor.Event
	m, err := monitor.New(s.(store.Lister), &monitor.Config{Clock: f.local, Logger: quiet, OnEvent: func(ev monitor.Event) { events = append(events, ev) }})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := m.Sweep(ctx)
	closeStore()
	if err != nil || snap.InProgress != 2 || snap.Stuck != 1 || len(events) != 1 || events[0].Key != passed {
		t.Errorf("monitor sweep: %+v %v, events %+v; want 1 stuck (%s) of 2 in progress", snap, err, events, passed)
	}

	// The console (last: it holds a bolt file until the test ends).
	f.getenv[EnvConsoleAuth] = "ops:" + consoleSecret
	c := consoletest.NewClient(t, f.serving("-write"))
	c.SignIn("ops", consoleSecret)
	if _, body, _ := c.Get("records?stuck=1"); !strings.Contains(body, passed) || strings.Contains(body, live) {
		t.Errorf("console records?stuck=1: want %s listed and %s not:\n%s", passed, live, body)
	}
	rec := func(k string) string { return "record?" + url.Values{"key": {k}}.Encode() }
	if _, body, _ := c.Get(rec(live)); strings.Contains(body, "stuck: past") || !strings.Contains(body, "its holder may be working") {
		t.Errorf("console record of the live record: want it within its expected completion, not stuck:\n%s", body)
	}
	if _, body, _ := c.Get(rec(passed)); !strings.Contains(body, "stuck: past its expected completion") {
		t.Errorf("console record of the record whose lease passed: not stuck:\n%s", body)
	}
	key := func(k string) idem.StoreKey {
		sk, err := idem.ParseStoreKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return sk
	}
	if code, body := c.Act(key(live), "release", nil); code != http.StatusConflict || !strings.Contains(body, "within its expected completion") {
		t.Errorf("console release of the live record without force: %d\n%s\nwant 409, refused", code, body)
	}
	if code, loc := c.Act(key(passed), "release", nil); code != http.StatusSeeOther {
		t.Errorf("console release of the record whose lease passed: %d %s, want it done", code, loc)
	}
	if code, body, _ := c.Get(rec(live)); code != http.StatusOK || !strings.Contains(body, "IN_PROGRESS") {
		t.Errorf("the live record after the refused writes: %d, want it still IN_PROGRESS:\n%s", code, body)
	}
}
