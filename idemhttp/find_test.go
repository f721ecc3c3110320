package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// A support engineer has what the client sent — POST /orders with
// Idempotency-Key "order-42", as acme — and finds the record from that
// alone, in the console, through clientkey.HTTP: the function the
// middleware keys its records with.
func TestRecordIsFoundFromWhatTheClientSent(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(t0)
	s := memstore.New(&memstore.Config{SweepInterval: -1, Clock: clock})
	t.Cleanup(func() { s.Close() })
	eng, err := idem.New(s, &idem.Config{Clock: clock, Expiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(eng, &idemhttp.Config{Operation: "orders", Principal: func(r *http.Request) (string, error) {
		return r.Header.Get("X-Account"), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"sku":"x"}`))
	r.Header.Set(idemhttp.HeaderName, `"order-42"`)
	r.Header.Set("X-Account", "acme")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	// The header value as the client sent it (quoted), or the key in it.
	for _, key := range []string{`"order-42"`, "order-42"} {
		m := clientkey.Material{Kind: clientkey.KindHTTP, Operation: "orders", Method: "POST", Route: "/orders", Principal: "acme", Key: key}
		found := consoletest.FindIn(t, s, m)
		if want, _ := m.StoreKey(); found != want.String() {
			t.Fatalf("%s: found %s, clientkey says %s", key, found, want)
		}
	}
}
