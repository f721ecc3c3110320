package command

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/seed-a1b882c0/idem"
)

// True fields, proven: in a real browser, every field of the record page
// and of the confirmation page of every seeded record equals what
// `idemctl show -o json` prints for the same record, on every store. A
// field the page leaves blank ("-") while show has it fails, as the
// owner once did.
func TestBrowserFieldsMatchShow(t *testing.T) {
	onStores(t, func(t *testing.T, f *fixture) {
		ctx := browser(t)
		keys := f.seed()
		records := map[string]idem.StoreKey{"completed": keys.Completed, "failed": keys.Failed, "stuck": keys.Stuck,
			"fresh": keys.Fresh, "script": keys.Script, "binary": keys.Binary}
		// show first: the bolt file is the serving process's alone.
		views := map[string]view{}
		for name, k := range records {
			var v view
			if err := json.Unmarshal([]byte(f.must("show", "-o", "json", k.String())), &v); err != nil {
				t.Fatal(err)
			}
			views[name] = v
		}
		f.getenv[EnvConsoleAuth] = "ops:" + consoleSecret
		base := f.serving("-write")
		do(t, ctx, chromedp.Navigate(base), chromedp.WaitVisible(css("#secret")),
			chromedp.SendKeys(css("#user"), "ops"), chromedp.SendKeys(css("#secret"), consoleSecret))
		navigate(t, ctx, chromedp.Submit(css("#secret")))
		for name, k := range records {
			t.Run(name, func(t *testing.T) {
				v := views[name]
				want := fieldsOf(t, v)
				if navigate(t, ctx, chromedp.Navigate(base+"record?"+url.Values{"key": {k.String()}}.Encode())) != 200 {
					t.Fatal("record page")
				}
				compareFields(t, "record page", shownFields(t, ctx), want)
				// The confirmation of a fail (forced where the holder may
				// still be at work) shows the record as it is now.
				do(t, ctx, chromedp.SendKeys(css("#code"), "x"), chromedp.SendKeys(css("#message"), "y"))
				if v.Status == "IN_PROGRESS" && !v.Stuck {
					do(t, ctx, chromedp.Click(chromedp.Search(`//form[.//input[@name="action" and @value="fail"]]//input[@name="force"]`)))
				}
				if code := navigate(t, ctx, chromedp.Click(button("fail"))); code != 200 {
					t.Fatalf("confirmation: %d\n%s", code, text(t, ctx))
				}
				compareFields(t, "confirmation page", shownFields(t, ctx), want)
			})
		}
	})
}

// shownField is one data-field of a page: its text, and for a body its
// kind (JSON, text, binary (hex)).
type shownField struct{ Text, Kind string }

// shownFields reads every data-field of the page.
func shownFields(t *testing.T, ctx context.Context) map[string]shownField {
	t.Helper()
	return get(t, ctx, chromedp.Evaluate[map[string]shownField](`Object.fromEntries([...document.querySelectorAll("[data-field]")].map(e => [e.dataset.field, {Text: e.textContent, Kind: e.dataset.kind || ""}]))`))
}

// fieldsOf is what a page must show of v: each field show prints, in the
// pages' forms (times to the second, UTC); "" for a field a page must not
// show (a dash instead).
func fieldsOf(t *testing.T, v view) map[string]string {
	t.Helper()
	at := func(tm time.Time) string { return tm.UTC().Format("2006-01-02 15:04:05Z") }
	m := map[string]string{"key": v.Key, "status": v.Status, "owner": v.Owner, "fence": strconv.FormatUint(v.Fence, 10),
		"execution_ref": v.Ref, "fingerprint": v.Fingerprint, "created": at(v.Created), "lease_until": at(v.LeaseUntil),
		"expires": at(v.Expires), "completed": "-", "stuck": "", "error_code": "", "error_message": "", "result": string(v.Result)}
	if v.Completed != nil {
		m["completed"] = at(*v.Completed)
	}
	if v.Stuck {
		m["stuck"] = "stuck"
	}
	if v.Error != nil {
		m["error_code"], m["error_message"] = v.Error.Code, v.Error.Message
	}
	if v.Owner == "" {
		t.Fatalf("%s: show has no owner", v.Key)
	}
	return m
}

// compareFields checks every field of want against the page's.
func compareFields(t *testing.T, page string, got map[string]shownField, want map[string]string) {
	t.Helper()
	for name, w := range want {
		g, ok := got[name]
		switch {
		case w == "" && ok:
			t.Errorf("%s shows %s %q; show has none", page, name, g.Text)
		case w == "":
		case !ok:
			t.Errorf("%s does not show %s; show says %q", page, name, w)
		case name == "result":
			if !sameResult(t, g, w) {
				t.Errorf("%s shows the result (%s) %q; show says %s", page, g.Kind, g.Text, w)
			}
		case name == "stuck":
			if !strings.HasPrefix(g.Text, "stuck") {
				t.Errorf("%s: stuck shown as %q", page, g.Text)
			}
		case strings.TrimSpace(g.Text) != w:
			t.Errorf("%s shows %s %q; show says %q", page, name, g.Text, w)
		}
	}
}

// sameResult compares a shown result with show's JSON one: JSON compared
// compact, text as the string show prints, binary as the hex dump of
// show's base64 bytes.
func sameResult(t *testing.T, g shownField, w string) bool {
	switch g.Kind {
	case "JSON":
		var a, b any
		return json.Unmarshal([]byte(g.Text), &a) == nil && json.Unmarshal([]byte(w), &b) == nil && reflect.DeepEqual(a, b)
	case "text":
		var s string
		return json.Unmarshal([]byte(w), &s) == nil && s == g.Text
	case "binary (hex)":
		var b struct{ Base64 string }
		if json.Unmarshal([]byte(w), &b) != nil {
			return false
		}
		raw, err := base64.StdEncoding.DecodeString(b.Base64)
		return err == nil && hex.Dump(raw) == g.Text
	}
	t.Errorf("result of unknown kind %q", g.Kind)
	return false
}
