package command

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/seed-a1b882c0/idem/ops"
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
			limit, maxScan        int
			out                   = outputFlag("table")
		)
		fs.StringVar(&status, "status", "", "only records in `STATUS`: in_progress, failed or completed")
		fs.BoolVar(&stuck, "stuck", false, "only IN_PROGRESS records past their expected completion")
		fs.StringVar(&scope, "scope", "", "only keys of operation `NAME` (or NAME/TENANT)")
		fs.DurationVar(&olderThan, "older-than", 0, "only records claimed more than `DURATION` ago")
		fs.IntVar(&limit, "limit", 100, "`N` records a page (up to 2N-1 with --scope or --older-than, which are applied after reading, so that none is skipped); a cursor for the next page follows on stderr")
		fs.IntVar(&maxScan, "max-scan", 5000, "read at most `N` records to fill a page with --scope or --older-than; the page then ends early with a cursor to go on")
		fs.StringVar(&cursor, "cursor", "", "continue a listing from the `CURSOR` a previous page gave")
		fs.Var(&out, "o", "output `FORMAT`: table or json")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("list takes no arguments, got %q", args)
			}
			if limit <= 0 || limit > ops.MaxLimit {
				return usagef("-limit %d: want 1 to %d", limit, ops.MaxLimit)
			}
			if maxScan <= 0 {
				return usagef("-max-scan %d: want a positive number", maxScan)
			}
			if olderThan < 0 {
				return usagef("-older-than %v: want a positive duration", olderThan)
			}
			p := ops.Query{Stuck: stuck, Scope: scope, OlderThan: olderThan, Limit: limit, Cursor: cursor, MaxScan: maxScan}
			if status != "" {
				s, err := store.ParseStatus(strings.ToUpper(status))
				if err != nil {
					return usagef("-status %q: want in_progress, failed or completed", status)
				}
				p.Status = s
			}
			if ops.CheckScope(scope) != nil {
				return usagef("-scope %q is not an operation name (or NAME/TENANT)", scope)
			}
			if err := p.Validate(); err != nil {
				return usagef("%v", err)
			}
			return c.list(ctx, p, string(out))
		}
	},
}

func (c *ctl) list(ctx context.Context, q ops.Query, out string) error {
	s, closeStore, err := c.openReadOnly(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	l, err := lister(s)
	if err != nil {
		return err
	}
	op := c.operator(s)
	if err := op.Sync(ctx); err != nil {
		return err
	}
	now := op.Now() // the store's: stuck as the engine decides leases
	page, err := ops.List(ctx, l, q, now)
	if err != nil {
		return err
	}
	views := make([]view, 0, len(page.Records))
	for _, r := range page.Records {
		views = append(views, viewOfRecord(r, now, false))
	}
	cursor := page.Next
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
	if page.Short {
		fmt.Fprintf(c.env.Stderr, "read %d records (--max-scan) without filling the page\n", page.Scanned)
	}
	if cursor != "" {
		fmt.Fprintf(c.env.Stderr, "more records: add --cursor %s\n", cursor)
	}
	return nil
}
