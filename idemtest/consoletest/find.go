package consoletest

import (
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/console"
	"github.com/seed-a1b882c0/idem/store"
)

// FindQuery is the query of the overview's search form for m.
func FindQuery(m clientkey.Material) string {
	return url.Values{"kind": {string(m.Kind)}, "operation": {m.Operation}, "method": {m.Method}, "route": {m.Route},
		"principal": {m.Principal}, "tenant": {m.Tenant}, "topic": {m.Topic}, "key": {m.Key}}.Encode()
}

// Find submits the overview's search form with what a client sent (m) and
// follows the console's redirect to the record page. It fails the test
// unless the console answers 303 to the record page of a live record; it
// returns the store key found.
func (c *Client) Find(m clientkey.Material) string {
	c.T.Helper()
	code, body, h := c.Get("find?" + FindQuery(m))
	if code != http.StatusSeeOther {
		c.T.Fatalf("console find %+v: %d, want 303 to the record\n%s", m, code, body)
	}
	loc, err := url.Parse(h.Get("Location"))
	if err != nil || !strings.HasSuffix(loc.Path, "/record") {
		c.T.Fatalf("console find %+v: redirected to %q, not a record page", m, h.Get("Location"))
	}
	key := loc.Query().Get("key")
	code, body, _ = c.Get("record?" + loc.RawQuery)
	if code != http.StatusOK || strings.Contains(body, "No live record") || !strings.Contains(body, html.EscapeString(key)) {
		c.T.Fatalf("console find %+v: the record page of %s answers %d:\n%s", m, key, code, body)
	}
	return key
}

// FindIn serves a read-only console over s for as long as it takes to
// [Client.Find] m through it, as an operator does from the overview: the
// record an adapter made must be found from the client-side material
// alone. It returns the store key found.
func FindIn(t testing.TB, s store.Store, m clientkey.Material) string {
	t.Helper()
	c, err := console.New(s, &console.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv := httptest.NewServer(c)
	defer srv.Close()
	cl := NewClient(t, srv.URL+"/")
	defer cl.HTTP.CloseIdleConnections()
	return cl.Find(m)
}
