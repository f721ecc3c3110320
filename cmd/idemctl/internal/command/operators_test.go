package command

import (
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
)

// Two operators open the confirmation of the same write on the same
// settled record: one write lands (303), the other is refused (409) and
// writes nothing, on every store — one after the other, and both at once.
// The guard covers the settled result and error, not only the claim and
// status, which a second settlement leaves as they were.
func TestTwoOperatorsSettleOnceOnEveryStore(t *testing.T) {
	onStores(t, func(t *testing.T, f *fixture) {
		keys := f.seed()
		f.getenv[EnvConsoleAuth] = "alice:" + consoleSecret + "\nbob:" + consoleSecret
		base := f.serving("-write")
		a, b := consoletest.NewClient(t, base), consoletest.NewClient(t, base)
		// A connection dialled for a concurrent request and never used
		// would hold serve's shutdown for 5s (net/http counts a new
		// connection active until then).
		t.Cleanup(func() {
			a.HTTP.CloseIdleConnections()
			b.HTTP.CloseIdleConnections()
		})
		a.SignIn("alice", consoleSecret)
		b.SignIn("bob", consoleSecret)
		// confirmation opens key's record and asks to confirm action
		// with fields: the form its "Yes" button posts.
		confirmation := func(c *consoletest.Client, key idem.StoreKey, action string, fields url.Values) url.Values {
			t.Helper()
			_, body, _ := c.Get("record?" + url.Values{"key": {key.String()}}.Encode())
			form := consoletest.Hidden(body, "action", action)
			if form == nil {
				t.Fatalf("%s has no %s form", key, action)
			}
			for k, v := range fields {
				form[k] = v
			}
			code, body, _ := c.Post("confirm", form)
			if code != http.StatusOK {
				t.Fatalf("confirm %s %s: %d\n%s", action, key, code, body)
			}
			return consoletest.Hidden(body, "action", action)
		}
		for _, tc := range []struct {
			name     string
			key      idem.StoreKey
			action   string
			byA, byB url.Values
			at       bool // both at once
		}{
			{name: "resolve a COMPLETED record twice", key: keys.Completed, action: "complete",
				byA: url.Values{"result": {`{"by":"alice"}`}}, byB: url.Values{"result": {`{"by":"bob"}`}}},
			{name: "fail a FAILED record twice", key: keys.Failed, action: "fail",
				byA: url.Values{"code": {"a"}, "message": {"by alice"}}, byB: url.Values{"code": {"b"}, "message": {"by bob"}}},
			{name: "resolve a COMPLETED record twice at once", key: keys.Script, action: "complete", at: true,
				byA: url.Values{"result": {`{"by":"alice"}`}}, byB: url.Values{"result": {`{"by":"bob"}`}}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				yesA := confirmation(a, tc.key, tc.action, tc.byA)
				yesB := confirmation(b, tc.key, tc.action, tc.byB)
				codes := make([]int, 2)
				bodies := make([]string, 2)
				post := func(i int, c *consoletest.Client, form url.Values) {
					codes[i], bodies[i], _ = c.Post("act", form)
				}
				if tc.at {
					var wg sync.WaitGroup
					wg.Go(func() { post(0, a, yesA) })
					wg.Go(func() { post(1, b, yesB) })
					wg.Wait()
				} else {
					post(0, a, yesA)
					post(1, b, yesB)
				}
				won := -1
				for i, code := range codes {
					switch code {
					case http.StatusSeeOther:
						if won >= 0 {
							t.Fatalf("both writes landed: %v", codes)
						}
						won = i
					case http.StatusConflict:
						if !strings.Contains(bodies[i], "changed underneath") || !strings.Contains(bodies[i], "Nothing was written") {
							t.Fatalf("refusal %d:\n%s", i, bodies[i])
						}
					default:
						t.Fatalf("act %d: %d\n%s", i, codes[i], bodies[i])
					}
				}
				if won < 0 {
					t.Fatalf("no write landed: %v", codes)
				}
				if !tc.at && won != 0 {
					t.Fatalf("the second write landed, not the first: %v", codes)
				}
				// The record (read through the console: the bolt file is
				// the serving process's) holds the winner's outcome.
				names := []string{"alice", "bob"}
				shown := func(who string) string {
					if tc.action == "complete" {
						return "&#34;by&#34;: &#34;" + who + "&#34;"
					}
					return `data-field="error_message">by ` + who + "<"
				}
				want, not := shown(names[won]), shown(names[1-won])
				_, body, _ := a.Get("record?" + url.Values{"key": {tc.key.String()}}.Encode())
				if !strings.Contains(body, want) || strings.Contains(body, not) {
					t.Fatalf("the record does not hold the outcome of the write that landed (%s, not %s):\n%s", want, not, body)
				}
			})
		}
	})
}
