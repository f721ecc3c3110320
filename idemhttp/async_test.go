package idemhttp_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemtest/httpasync"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// The asynchronous mode over the in-memory store; store/redisstore runs
// the same suite over a real Redis.
func TestAsync(t *testing.T) {
	httpasync.Run(t, func(t *testing.T) store.Store {
		s := memstore.New(&memstore.Config{SweepInterval: -1})
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// Accept hands nothing off outside a covered request, or without
// asynchronous mode, and says which.
func TestAcceptNeedsACoveredRequestInAsyncMode(t *testing.T) {
	t.Parallel()
	errs := make(chan error, 1)
	accept := func(w http.ResponseWriter, r *http.Request) {
		_, err := idemhttp.Accept(w, r)
		errs <- err
		w.WriteHeader(http.StatusCreated)
	}
	for _, c := range []struct {
		name   string
		mcfg   *idemhttp.Config
		method string
		header []string
		want   error
	}{
		{"no key", &idemhttp.Config{StatusPath: "/status/"}, "POST", nil, idemhttp.ErrNotCovered},
		{"method not covered", &idemhttp.Config{StatusPath: "/status/"}, "PUT", []string{"Idempotency-Key", "k"}, idemhttp.ErrNotCovered},
		{"no StatusPath", &idemhttp.Config{}, "POST", []string{"Idempotency-Key", "k"}, idemhttp.ErrNotAsync},
	} {
		t.Run(c.name, func(t *testing.T) {
			en := setup(t, idem.Config{}, c.mcfg, accept)
			if a := en.do(t, c.method, "/orders", "", c.header...); a.status != http.StatusCreated || a.header.Get("Location") != "" {
				t.Fatalf("%+v", a)
			}
			if err := <-errs; !errors.Is(err, c.want) {
				t.Fatalf("Accept: %v, want %v", err, c.want)
			}
		})
	}
	// Outside any middleware.
	if _, err := idemhttp.Accept(httptest.NewRecorder(), httptest.NewRequest("POST", "/", nil)); !errors.Is(err, idemhttp.ErrNotCovered) {
		t.Fatalf("Accept outside the middleware: %v", err)
	}
	if _, err := idemhttp.AcceptContext(context.Background()); !errors.Is(err, idemhttp.ErrNotCovered) {
		t.Fatalf("AcceptContext outside the middleware: %v", err)
	}
}

func TestAsyncConfigValidation(t *testing.T) {
	t.Parallel()
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	eng, err := idem.New(mem, &idem.Config{Expiry: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []idemhttp.Config{
		{StatusPath: "status/"},
		{StatusPath: "/status"},
		{StatusPath: "/status/?x=1/"},
		{StatusPath: "/status/", ExpectedCompletion: -time.Second},
		{StatusPath: "/status/", ExpectedCompletion: 2 * time.Hour},
	} {
		if _, err := idemhttp.New(eng, &c); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", c, err)
		}
	}
	for _, c := range []idemhttp.Config{
		{StatusPath: "/status/", ExpectedCompletion: time.Hour},
		{StatusPath: "/status/"},            // 10 minutes
		{ExpectedCompletion: 2 * time.Hour}, // not used without StatusPath
	} {
		if _, err := idemhttp.New(eng, &c); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	// The default is capped at a shorter Expiry.
	short, err := idem.New(mem, &idem.Config{Expiry: time.Minute, Lease: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idemhttp.New(short, &idemhttp.Config{StatusPath: "/status/"}); err != nil {
		t.Fatalf("default ExpectedCompletion with a 1m Expiry: %v", err)
	}
}
