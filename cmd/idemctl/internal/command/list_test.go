package command

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
)

// population makes one record of each kind: stuck (charge/a, with an
// execution), in progress within its lease (charge/b), failed
// (refund/c), completed (charge/d, for tenant t1).
func population(f *fixture) map[string]idem.StoreKey {
	f.t.Helper()
	ctx := context.Background()
	keys := map[string]idem.StoreKey{}
	_, keys["stuck"] = f.begin("charge", "a", time.Minute, "arn:aws:states:exec:a")
	f.clock.Advance(2 * time.Minute)
	_, keys["running"] = f.begin("charge", "b", time.Hour, "")
	tok, k := f.begin("refund", "c", time.Minute, "")
	keys["failed"] = k
	if err := f.app.Fail(ctx, tok, idem.Terminal(errors.New("card declined"), "declined")); err != nil {
		f.t.Fatal(err)
	}
	b, err := f.app.Begin(ctx, idem.Request{Operation: "charge", Tenant: "t1", Key: "d"}, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	keys["completed"] = b.Token.Key
	if err := f.app.Complete(ctx, b.Token, map[string]int{"id": 7}); err != nil {
		f.t.Fatal(err)
	}
	return keys
}

func listedKeys(t *testing.T, out string) []string {
	t.Helper()
	var page struct {
		Records []view `json:"records"`
		Next    string `json:"next"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var ks []string
	for _, v := range page.Records {
		ks = append(ks, v.Key)
	}
	return ks
}

func TestList(t *testing.T) {
	t.Parallel()
	f := setup(t)
	keys := population(f)

	out := f.must("list", "--stuck")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "EXPECTED COMPLETION") || !strings.Contains(lines[0], "EXECUTION REF") {
		t.Fatalf("list --stuck:\n%s", out)
	}
	for _, want := range []string{keys["stuck"].String(), "IN_PROGRESS (stuck)", "worker-7/", "arn:aws:states:exec:a", "2m0s"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("list --stuck row lacks %q:\n%s", want, out)
		}
	}

	for args, want := range map[string][]string{
		"list -o json --status failed":                {keys["failed"].String()},
		"list -o json --status completed":             {keys["completed"].String()},
		"list -o json --status in_progress --stuck":   {keys["stuck"].String()},
		"list -o json --scope refund":                 {keys["failed"].String()},
		"list -o json --scope charge/t1":              {keys["completed"].String()},
		"list -o json --scope charge --older-than 1m": {keys["stuck"].String()},
	} {
		got := listedKeys(t, f.must(strings.Fields(args)...))
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: %v, want %v", args, got, want)
		}
	}
	if got := listedKeys(t, f.must("list", "-o", "json")); len(got) != 4 {
		t.Errorf("list: %v", got)
	}
}

func TestListPages(t *testing.T) {
	t.Parallel()
	f := setup(t)
	population(f)
	seen := map[string]bool{}
	cursor := ""
	for page := 0; ; page++ {
		args := []string{"list", "-o", "json", "--limit", "1", "--scope", "charge"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		var p struct {
			Records []view `json:"records"`
			Next    string `json:"next"`
		}
		if err := json.Unmarshal([]byte(f.must(args...)), &p); err != nil {
			t.Fatal(err)
		}
		if len(p.Records) > 1 {
			t.Fatalf("page of %d records with --limit 1", len(p.Records))
		}
		for _, r := range p.Records {
			if seen[r.Key] {
				t.Fatalf("%s listed twice", r.Key)
			}
			seen[r.Key] = true
		}
		if p.Next == "" {
			break
		}
		if page > 10 {
			t.Fatal("paging does not end")
		}
		cursor = p.Next
	}
	if len(seen) != 3 {
		t.Fatalf("pages listed %d charge records, want 3", len(seen))
	}
	// The table says how to go on.
	if code, _, errOut := f.run("list", "--limit", "1"); code != 0 || !strings.Contains(errOut, "more records: add --cursor ") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}
