package ops_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/ops"
	"github.com/seed-a1b882c0/idem/store"
)

// A listing filtered by scope reads at most MaxScan records a call, ends
// its page Short when it stops there, and paging on lists every match
// exactly once; without filters a page holds exactly Limit records.
func TestListIsBoundedAndSkipsNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	for i := range 300 {
		op := "bulk"
		if i%100 == 42 {
			op = "rare"
		}
		if _, err := idem.Do(ctx, f.app, idem.Request{Operation: op, Key: fmt.Sprint(i)}, func(context.Context) (int, error) { return i, nil }); err != nil {
			t.Fatal(err)
		}
	}
	l := f.app.Store().(store.Lister)
	seen := map[string]int{}
	q := ops.Query{Scope: "rare", Limit: 2, MaxScan: 40}
	short := false
	for calls := 0; ; calls++ {
		if calls > 20 {
			t.Fatal("paging does not end")
		}
		p, err := ops.List(ctx, l, q, f.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		if p.Scanned > q.MaxScan {
			t.Fatalf("a call read %d records, MaxScan %d", p.Scanned, q.MaxScan)
		}
		short = short || p.Short
		for _, r := range p.Records {
			seen[r.Key]++
		}
		if p.Next == "" {
			break
		}
		q.Cursor = p.Next
	}
	if len(seen) != 3 || !short {
		t.Fatalf("listed %v (short %v), want the 3 rare records, found over several bounded calls", seen, short)
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("%s listed %d times", k, n)
		}
	}
	p, err := ops.List(ctx, l, ops.Query{Limit: 7}, f.clock.Now())
	if err != nil || len(p.Records) != 7 || p.Next == "" {
		t.Fatalf("unfiltered page: %d records, next %q, %v", len(p.Records), p.Next, err)
	}
	for _, bad := range []ops.Query{{Limit: -1}, {Limit: ops.MaxLimit + 1}, {Scope: "a#b"}, {Stuck: true, Status: store.StatusFailed}, {MaxScan: -1}} {
		if _, err := ops.List(ctx, l, bad, f.clock.Now()); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}
