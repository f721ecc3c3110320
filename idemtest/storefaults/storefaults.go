// Package storefaults is the network-fault suite shared by the stores that
// talk to a server (Redis, PostgreSQL, DynamoDB): each case puts a
// faultproxy between the store and the real server and checks that the
// call fails closed with idem.ErrUnavailable and that nothing runs twice.
// Test-only.
package storefaults

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/faultproxy"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// Open returns an isolated store that reaches the server at addr
// (host:port), with its cleanup registered on t. Calls through it must time
// out within Timeout when the server does not answer. Every call to Open in
// one case must see the same records.
type Open func(t *testing.T, addr string) store.Store

// Timeout is the client timeout Open must configure (or honour from the
// context); the latency case delays replies by four times as much.
const Timeout = 300 * time.Millisecond

// Run runs every fault case against the server at target.
func Run(t *testing.T, target string, open Open) {
	cases := []struct {
		name string
		run  func(t *testing.T, target string, open Open)
	}{
		{"Unreachable", unreachable},
		{"ResetDuringClaim", resetDuringClaim},
		{"LatencyAboveTimeout", latencyAboveTimeout},
		{"ResetDuringComplete", resetDuringComplete},
		{"ResetsDuringCompletePastTheLease", resetsDuringCompletePastTheLease},
		{"LostCompleteReply", lostCompleteReply},
		{"LostClaimReply", lostClaimReply},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, target, open) })
	}
}

type fixture struct {
	proxy  *faultproxy.Proxy
	via    store.Store // through the proxy
	direct store.Store // straight to the server, same records
	eng    *idem.Engine
	obs    *observe.Counters
	runs   atomic.Int64
}

// setup builds the fixture; cfg (nil for the defaults below) configures the
// engine that goes through the proxy.
func setup(t *testing.T, target string, open Open, cfg *idem.Config) *fixture {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	f := &fixture{proxy: p, obs: &observe.Counters{}}
	f.direct = open(t, target)
	f.via = open(t, p.Addr())
	if cfg == nil {
		// The clock measurement is off: each fault hits the store call
		// its case names, not the engine's once-an-interval TIME.
		cfg = &idem.Config{RenewInterval: -1, WriteTimeout: 4 * Timeout, ClockSync: -1}
	}
	cfg.Observer = f.obs
	if f.eng, err = idem.New(f.via, cfg); err != nil {
		t.Fatal(err)
	}
	return f
}

// record returns the record of r, read straight from the server.
func (f *fixture) record(t *testing.T, r idem.Request) *store.Record {
	t.Helper()
	id, err := r.Identity()
	if err != nil {
		t.Fatal(err)
	}
	rec, err := f.direct.Get(context.Background(), id.StoreKey.String())
	if err != nil {
		t.Fatalf("Get %s: %v", id.StoreKey, err)
	}
	return rec
}

var seq atomic.Int64

func req() idem.Request {
	return idem.Request{Operation: "fault", Key: fmt.Sprintf("k%d-%d", time.Now().UnixNano(), seq.Add(1))}
}

func (f *fixture) do(ctx context.Context, r idem.Request, during func()) (idem.Result[int], error) {
	return idem.Do(ctx, f.eng, r, func(context.Context) (int, error) {
		f.runs.Add(1)
		if during != nil {
			during()
		}
		return 7, nil
	})
}

func wantUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, idem.ErrStore) {
		t.Fatalf("%s: %v, want a store error wrapping idem.ErrUnavailable", what, err)
	}
}

func unreachable(t *testing.T, target string, open Open) {
	f := setup(t, target, open, nil)
	f.proxy.Down()
	_, err := f.do(context.Background(), req(), nil)
	wantUnavailable(t, "claim with the server unreachable", err)
	if f.runs.Load() != 0 {
		t.Fatal("the operation ran with the store unreachable")
	}
	if err := f.proxy.Up(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.do(context.Background(), req(), nil); err != nil || f.runs.Load() != 1 {
		t.Fatalf("after the server came back: %v, runs %d", err, f.runs.Load())
	}
}

func resetDuringClaim(t *testing.T, target string, open Open) {
	f := setup(t, target, open, nil)
	r := req()
	f.proxy.ResetRequests(1)
	_, err := f.do(context.Background(), r, nil)
	wantUnavailable(t, "claim reset before the server saw it", err)
	if f.runs.Load() != 0 || f.proxy.Reset.Load() != 1 {
		t.Fatalf("runs %d, resets %d; want 0 and 1", f.runs.Load(), f.proxy.Reset.Load())
	}
	res, err := f.do(context.Background(), r, nil)
	if err != nil || res.Replayed || f.runs.Load() != 1 {
		t.Fatalf("retry after the reset: %+v, %v, runs %d; want one run", res, err, f.runs.Load())
	}
}

func latencyAboveTimeout(t *testing.T, target string, open Open) {
	f := setup(t, target, open, nil)
	r := req()
	f.proxy.SetLatency(4 * Timeout)
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	_, err := f.do(ctx, r, nil)
	cancel()
	wantUnavailable(t, "claim slower than the client timeout", err)
	f.proxy.SetLatency(0)
	if f.runs.Load() != 0 {
		t.Fatal("the operation ran although its claim timed out")
	}
	// The claim may have been applied on the server: a retry either finds
	// it (in progress: no second execution) or runs the operation once.
	_, err = f.do(context.Background(), r, nil)
	if err != nil && !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("retry after the timeout: %v", err)
	}
	if f.runs.Load() > 1 {
		t.Fatalf("runs %d", f.runs.Load())
	}
}

// resetDuringComplete: a Complete reset on the wire is retried and lands;
// the record is COMPLETED and a retry replays.
func resetDuringComplete(t *testing.T, target string, open Open) {
	f := setup(t, target, open, nil)
	r := req()
	res, err := f.do(context.Background(), r, func() { f.proxy.ResetRequests(2) })
	if err != nil || res.Value != 7 || f.runs.Load() != 1 {
		t.Fatalf("call whose Complete was reset: %+v, %v, runs %d", res, err, f.runs.Load())
	}
	if f.proxy.Reset.Load() != 2 || f.obs.Count(observe.OutcomeWriteRetried) < 1 || f.obs.Count(observe.OutcomeCompleteFailed) != 0 {
		t.Fatalf("resets %d, observer %v; want 2 resets, retried, nothing failed", f.proxy.Reset.Load(), f.obs.Snapshot())
	}
	if rec := f.record(t, r); rec.Status != store.StatusCompleted {
		t.Fatalf("record after a retried Complete: %+v; want COMPLETED", rec)
	}
	again, err := f.do(context.Background(), r, nil)
	if err != nil || !again.Replayed || again.Value != 7 || f.runs.Load() != 1 {
		t.Fatalf("retry: %+v, %v, runs %d; want the replay", again, err, f.runs.Load())
	}
}

// resetsDuringCompletePastTheLease: every request is reset for longer
// than the lease, from the moment the operation returns; the engine keeps
// retrying the Complete (and renewing the lease) within WriteTimeout, the
// Complete lands once the faults stop, and a retry after the original
// lease replays: 0 second executions.
func resetsDuringCompletePastTheLease(t *testing.T, target string, open Open) {
	const lease = 4 * Timeout
	f := setup(t, target, open, &idem.Config{Lease: lease, RenewInterval: lease / 4, WriteTimeout: 10 * lease})
	other, err := idem.New(f.direct, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := req()
	var start time.Time
	res, err := f.do(context.Background(), r, func() {
		start = time.Now()
		f.proxy.ResetRequests(1 << 30)
		time.AfterFunc(lease*3/2, func() { f.proxy.ResetRequests(0) })
	})
	if err != nil || res.Value != 7 {
		t.Fatalf("call whose Complete met resets: %+v, %v", res, err)
	}
	if el := time.Since(start); el < lease {
		t.Fatalf("Complete landed after %v, while every request was reset for %v", el, lease*3/2)
	}
	if f.obs.Count(observe.OutcomeCompleteFailed) != 0 || f.obs.Count(observe.OutcomeWriteRetried) == 0 {
		t.Fatalf("observer %v; want retries and no failed complete", f.obs.Snapshot())
	}
	if rec := f.record(t, r); rec.Status != store.StatusCompleted {
		t.Fatalf("record: %+v; want COMPLETED", rec)
	}
	// Another process, long after the original lease, replays.
	again, err := idem.Do(context.Background(), other, r, func(context.Context) (int, error) {
		f.runs.Add(1)
		return 8, nil
	})
	if err != nil || !again.Replayed || again.Value != 7 || f.runs.Load() != 1 {
		t.Fatalf("retry after the lease: %+v, %v, runs %d; want the replay and 1 execution", again, err, f.runs.Load())
	}
}

// lostCompleteReply: the Complete reaches the server and its reply is
// lost; the retry meets its own COMPLETED record and takes it as done.
func lostCompleteReply(t *testing.T, target string, open Open) {
	f := setup(t, target, open, nil)
	// Prime the connection (scripts loaded, statements prepared) so the
	// next request on the wire is the Complete itself.
	if _, err := f.do(context.Background(), req(), nil); err != nil {
		t.Fatal(err)
	}
	f.runs.Store(0)
	r := req()
	res, err := f.do(context.Background(), r, func() { f.proxy.DropReplies(1) })
	if err != nil || res.Value != 7 || f.proxy.Dropped.Load() != 1 {
		t.Fatalf("call whose Complete reply was lost: %+v, %v, dropped %d", res, err, f.proxy.Dropped.Load())
	}
	if n := f.obs.Count(observe.OutcomeCompleteFailed) + f.obs.Count(observe.OutcomeFenced); n != 0 {
		t.Fatalf("own COMPLETED record counted as a failure: %v", f.obs.Snapshot())
	}
	if rec := f.record(t, r); rec.Status != store.StatusCompleted {
		t.Fatalf("record: %+v; want COMPLETED", rec)
	}
	// The store call itself reports a reset as unavailable.
	r2 := req()
	id, _ := r2.Identity()
	now := time.Now().UnixMilli()
	c, err := f.direct.Claim(context.Background(), store.ClaimParams{Key: id.StoreKey.String(), Owner: "o", Now: now, LeaseUntil: now + 30_000, ExpiresAt: now + 60_000})
	if err != nil {
		t.Fatal(err)
	}
	f.proxy.ResetRequests(1)
	err = f.via.Complete(context.Background(), store.CompleteParams{ClaimRef: store.ClaimRef{Key: id.StoreKey.String(), Fence: c.Record.Fence, Owner: "o", Now: now}, ExpiresAt: now + 60_000, Result: []byte("7")})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Complete reset on the wire: %v, want ErrUnavailable", err)
	}
}

func lostClaimReply(t *testing.T, target string, open Open) {
	f := setup(t, target, open, nil)
	// Prime the connection (scripts loaded, session set up) so the next
	// request on the wire is the claim itself.
	if _, err := f.do(context.Background(), req(), nil); err != nil {
		t.Fatal(err)
	}
	r := req()
	id, _ := r.Identity()
	now := time.Now().UnixMilli()
	p := store.ClaimParams{Key: id.StoreKey.String(), Owner: "owner-1", Fingerprint: "fp", Now: now, LeaseUntil: now + 30_000, ExpiresAt: now + 60_000}
	f.proxy.DropReplies(1)
	_, err := f.via.Claim(context.Background(), p)
	if f.proxy.Dropped.Load() != 1 {
		t.Fatalf("proxy dropped %d replies (err %v)", f.proxy.Dropped.Load(), err)
	}
	if err != nil {
		wantUnavailable(t, "claim whose reply was lost", &idem.StoreError{Op: observe.StoreClaim, Err: err})
	}
	res, err := f.via.Claim(context.Background(), p)
	if err != nil || !res.Acquired || res.Record.Fence != 1 || res.Record.Owner != "owner-1" {
		t.Fatalf("the same owner's retry: %+v, %v; want its own claim with fence 1", res, err)
	}
	p.Owner = "owner-2"
	res, err = f.via.Claim(context.Background(), p)
	if err != nil || res.Acquired {
		t.Fatalf("another owner's claim: %+v, %v; want a conflict", res, err)
	}
}
