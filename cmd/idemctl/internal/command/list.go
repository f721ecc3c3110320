package command

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

var listCommand = command{
	name: "list", args: "",
	summary: "List records: --stuck finds IN_PROGRESS work past its expected completion, --status failed the failed work. Read-only.",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		var (
			status, scope, cursor string
			stuck                 bool
			olderThan             time.Duration
			limit                 int
			out                   = outputFlag("table")
		)
		fs.StringVar(&status, "status", "", "only records in `STATUS`: in_progress, failed or completed")
		fs.BoolVar(&stuck, "stuck", false, "only IN_PROGRESS records past their expected completion")
		fs.StringVar(&scope, "scope", "", "only keys of operation `NAME` (or NAME/TENANT)")
		fs.DurationVar(&olderThan, "older-than", 0, "only records claimed more than `DURATION` ago")
		fs.IntVar(&limit, "limit", 100, "at most `N` records; a cursor for the next page follows on stderr")
		fs.StringVar(&cursor, "cursor", "", "continue a listing from the `CURSOR` a previous page gave")
		fs.Var(&out, "o", "output `FORMAT`: table or json")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("list takes no arguments, got %q", args)
			}
			p := listQuery{stuck: stuck, scope: scope, olderThan: olderThan, limit: limit, cursor: cursor}
			if status != "" {
				s, err := store.ParseStatus(strings.ToUpper(status))
				if err != nil {
					return usagef("-status %q: want in_progress, failed or completed", status)
				}
				p.status = s
			}
			if limit <= 0 {
				return usagef("-limit %d: want a positive number", limit)
			}
			if olderThan < 0 {
				return usagef("-older-than %v: want a positive duration", olderThan)
			}
			if scope != "" {
				op, tenant, hasTenant := strings.Cut(scope, "/")
				if _, err := idem.NewStoreKey(op, tenant, nil); err != nil || (hasTenant && tenant == "") {
					return usagef("-scope %q is not an operation name (or NAME/TENANT)", scope)
				}
			}
			return c.list(ctx, p, string(out))
		}
	},
}

type listQuery struct {
	status        store.Status
	stuck         bool
	scope, cursor string
	olderThan     time.Duration
	limit         int
}

// matches applies the filters the store does not: scope and age.
func (q listQuery) matches(r *store.Record, now time.Time) bool {
	if q.scope != "" {
		sk, err := idem.ParseStoreKey(r.Key)
		if err != nil || (sk.Scope() != q.scope && (strings.Contains(q.scope, "/") || sk.Operation != q.scope)) {
			return false
		}
	}
	return q.olderThan == 0 || now.Sub(store.FromMillis(r.CreatedAt)) > q.olderThan
}

func (c *ctl) list(ctx context.Context, q listQuery, out string) error {
	s, closeStore, err := c.openReadOnly(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	l, err := lister(s)
	if err != nil {
		return err
	}
	now := c.now()
	// Pages are asked for what is still missing, so the listing never
	// returns more than the limit, and the cursor continues exactly
	// after the last record read.
	var views []view
	cursor := q.cursor
	for {
		res, err := l.List(ctx, store.ListParams{Status: q.status, Stuck: q.stuck, Now: store.Millis(now), Limit: q.limit - len(views), Cursor: cursor})
		if err != nil {
			return fmt.Errorf("listing: %w", err)
		}
		for _, r := range res.Records {
			if q.matches(r, now) {
				views = append(views, viewOfRecord(r, now, false))
			}
		}
		if res.Next == cursor && cursor != "" {
			return fmt.Errorf("listing: the store returned the same cursor again")
		}
		cursor = res.Next
		if cursor == "" || len(views) >= q.limit {
			break
		}
	}
	if out == "json" {
		if views == nil {
			views = []view{}
		}
		return writeJSON(c.env.Stdout, struct {
			Records []view `json:"records"`
			Next    string `json:"next,omitempty"`
		}{views, cursor})
	}
	if err := writeTable(c.env.Stdout, views); err != nil {
		return err
	}
	if cursor != "" {
		fmt.Fprintf(c.env.Stderr, "more records: add --cursor %s\n", cursor)
	}
	return nil
}
