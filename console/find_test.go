package console_test

import (
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/console"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
)

// The overview's search form sends what the find handler reads: every
// kind clientkey knows, and every part of a Material. A seeded record
// (an explicit key, as idemnats and idemamqp write them) is found from its
// key; material that names no key is a 400 naming the part; a live search
// for an absent key lands on the record page's "no live record".
func TestFindForm(t *testing.T) {
	t.Parallel()
	f := setup(t, console.Config{})
	c := consoletest.NewClient(t, f.srv.URL+"/")
	_, body, _ := c.Get("")
	form := body[strings.Index(body, `action="/find"`):]
	form = form[:strings.Index(form, "</form>")]
	var kinds []clientkey.Kind
	for _, m := range regexp.MustCompile(`<option value="(\w+)"`).FindAllStringSubmatch(form, -1) {
		kinds = append(kinds, clientkey.Kind(m[1]))
	}
	if !slices.Equal(kinds, clientkey.Kinds) {
		t.Errorf("the form offers %v, clientkey knows %v", kinds, clientkey.Kinds)
	}
	for _, name := range []string{"kind", "operation", "method", "route", "principal", "tenant", "topic", "key"} {
		if !strings.Contains(form, `name="`+name+`"`) {
			t.Errorf("the form has no %s field", name)
		}
	}

	// consoletest.Seed's FAILED record: refund-77 under refund/acme.
	if got := c.Find(clientkey.Material{Kind: clientkey.KindKey, Operation: "refund", Tenant: "acme", Key: "refund-77"}); got != f.keys.Failed.String() {
		t.Fatalf("found %s, want %s", got, f.keys.Failed)
	}
	code, body, _ := c.Get("find?" + consoletest.FindQuery(clientkey.Material{Kind: clientkey.KindGateway, Method: "POST", Key: "k"}))
	if code != http.StatusBadRequest || !strings.Contains(body, "route: missing") {
		t.Fatalf("material without a route: %d\n%s", code, body)
	}
	code, _, h := c.Get("find?" + consoletest.FindQuery(clientkey.Material{Kind: clientkey.KindKey, Operation: "refund", Key: "never-sent"}))
	if code != http.StatusSeeOther {
		t.Fatalf("an absent key: %d", code)
	}
	if code, body, _ := c.Get(strings.TrimPrefix(h.Get("Location"), "/")); code != http.StatusNotFound || !strings.Contains(body, "No live record") {
		t.Fatalf("the record page of an absent key: %d", code)
	}
}
