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
// process (no network): a first request with a new key, and a replay, from
// the store and from the engine's local cache, with the default JSON codec
// and with ResponseCodec; "bare" is the handler alone, with the same
// request and recorder construction.
func BenchmarkMiddleware(b *testing.B) {
	mem := memstore.New(&memstore.Config{SweepInterval: -1})
	defer mem.Close()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ord_1","status":"created"}`)
	})
	serve := func(h http.Handler, key string) {
		r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"item":"book","qty":1}`))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			serve(handler, "bare")
		}
	})
	for _, codec := range []struct {
		name  string
		codec idem.Codec
	}{{"json", idem.JSONCodec{}}, {"response-codec", idemhttp.ResponseCodec{}}} {
		for _, cache := range []bool{false, true} {
			cfg := &idem.Config{Logger: slog.New(slog.DiscardHandler), Codec: codec.codec}
			name := "store"
			if cache {
				cfg.CacheEntries, name = 10_000, "cache"
			}
			eng, err := idem.New(mem, cfg)
			if err != nil {
				b.Fatal(err)
			}
			mw, err := idemhttp.New(eng, &idemhttp.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			h := mw.Handler(handler)
			prefix := codec.name + "/"
			if !cache {
				b.Run(prefix+"new", func(b *testing.B) {
					b.ReportAllocs()
					for i := 0; b.Loop(); i++ {
						serve(h, prefix+"new-"+strconv.Itoa(i))
					}
				})
			}
			b.Run(prefix+"replay-"+name, func(b *testing.B) {
				key := prefix + "replay-" + name
				serve(h, key)
				b.ReportAllocs()
				for b.Loop() {
					serve(h, key)
				}
			})
		}
	}
}
