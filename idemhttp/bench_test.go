package idemhttp_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// BenchmarkMiddleware measures what the middleware adds to a handler, in
// process (no network): a first request with a new key, and a replay.
func BenchmarkMiddleware(b *testing.B) {
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	defer mem.Close()
	for _, cache := range []bool{false, true} {
		cfg := &idem.Config{Logger: slog.New(slog.DiscardHandler)}
		name := "store"
		if cache {
			cfg.Cache, name = &idem.CacheConfig{}, "cache"
		}
		eng, err := idem.New(mem, cfg)
		if err != nil {
			b.Fatal(err)
		}
		mw, err := idemhttp.New(eng, &idemhttp.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"ord_1","status":"created"}`)
		}))
		serve := func(key string) {
			r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"item":"book","qty":1}`))
			r.Header.Set("Idempotency-Key", key)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusCreated {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
		if !cache {
			b.Run("new", func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					serve("new-" + strconv.Itoa(i))
				}
			})
		}
		b.Run("replay-"+name, func(b *testing.B) {
			serve("replay-" + name)
			b.ReportAllocs()
			for b.Loop() {
				serve("replay-" + name)
			}
		})
	}
}
