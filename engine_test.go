// Tests of the engine: its setup for every test file, replays, a store
// that is down, configuration.

package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

type env struct {
	store *faultstore.Store
	mem   *memstore.Store
	clock *clocktest.Clock
	clk   store.Clock // the clock the engines use
	obs   *observe.Counters
	eng   *idem.Engine
}

// setup builds an engine over a counting memstore with a manual clock.
func setup(t *testing.T, cfg idem.Config) *env {
	t.Helper()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	en := &env{store: faultstore.New(mem), mem: mem, clock: clocktest.New(t0), obs: &observe.Counters{}}
	if cfg.Clock == nil {
		cfg.Clock = en.clock
	}
	en.clk = cfg.Clock
	cfg.Observer = en.obs
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var err error
	if en.eng, err = idem.New(en.store, &cfg); err != nil {
		t.Fatal(err)
	}
	return en
}

// another returns a second engine (another process) over the same store.
func (en *env) another(t *testing.T, cfg idem.Config) *idem.Engine {
	t.Helper()
	cfg.Clock = en.clk
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := idem.New(en.store, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func req(key string) idem.Request {
	return idem.Request{Operation: "charge", Key: key, Payload: []byte(`{"amount":100,"currency":"EUR"}`)}
}

func TestReplayIsAFlagNotAnError(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	ctx := context.Background()
	runs := 0
	fn := func(ctx context.Context) (string, error) { runs++; return "receipt-1", nil }
	r1, err := idem.Do(ctx, en.eng, req("k"), fn)
	if err != nil || r1.Replayed || r1.Value != "receipt-1" || r1.Fence != 1 {
		t.Fatalf("first: %+v %v", r1, err)
	}
	r2, err := idem.Do(ctx, en.eng, req("k"), fn)
	if err != nil || !r2.Replayed || r2.Value != "receipt-1" || r2.Fence != 0 || r2.StoreKey != r1.StoreKey {
		t.Fatalf("second: %+v %v", r2, err)
	}
	if runs != 1 {
		t.Fatalf("ran %d times", runs)
	}
	if en.obs.Count(observe.OutcomeAcquired) != 1 || en.obs.Count(observe.OutcomeReplayed) != 1 {
		t.Fatalf("observer: %v", en.obs.Snapshot())
	}
}

func TestStoreDownFailsClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	down := fmt.Errorf("dial tcp 127.0.0.1:1: connection refused: %w", store.ErrUnavailable)
	en := setup(t, idem.Config{})
	en.store.FailAlways("claim", down)
	ran := false
	_, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { ran = true; return 1, nil })
	var se *idem.StoreError
	if !errors.As(err, &se) || se.Op != "claim" || !errors.Is(err, store.ErrUnavailable) || ran {
		t.Fatalf("store down: %v ran=%v; want a claim *StoreError and no execution", err, ran)
	}
	open := setup(t, idem.Config{FailOpen: true})
	open.store.FailAlways("claim", down)
	r, err := idem.Do(ctx, open.eng, req("k"), func(context.Context) (int, error) { return 3, nil })
	if err != nil || r.Value != 3 || open.obs.Count(observe.OutcomeUnprotected) != 1 {
		t.Fatalf("FailOpen: %+v %v %v", r, err, open.obs.Snapshot())
	}
}

func TestDisabledByEnvironment(t *testing.T) {
	t.Setenv("IDEM_DISABLED", "true")
	en := setup(t, idem.Config{})
	runs := 0
	for range 3 {
		if _, err := idem.Do(context.Background(), en.eng, req("k"), func(context.Context) (int, error) { runs++; return 0, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if runs != 3 || en.store.Total() != 0 {
		t.Fatalf("disabled engine: runs=%d store calls=%d", runs, en.store.Total())
	}
}

func TestCancelledContextDoesNotClaim(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := idem.Do(ctx, en.eng, req("k"), func(context.Context) (int, error) { return 1, nil })
	if !errors.Is(err, context.Canceled) || en.store.Total() != 0 {
		t.Fatalf("cancelled: %v, %d store calls", err, en.store.Total())
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	bad := []idem.Config{
		{Expiry: time.Millisecond},
		{Lease: time.Hour, Expiry: time.Minute},
		{Lease: time.Second, RenewInterval: 2 * time.Second},
		{Wait: -1},
		{MaxResultBytes: -1},
	}
	for _, c := range bad {
		if _, err := idem.New(mem, &c); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("New(%+v): %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := idem.New(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil store: %v", err)
	}
	if _, err := idem.New(mem, nil); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
