package command

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/seed-a1b882c0/idem/ops"
)

var resolveCommand = command{
	name: "resolve", args: "KEY | --scope NAME --key MATERIAL [--tenant TENANT]  (--result @FILE | --fail CODE:MESSAGE)",
	summary: "Settle a record by hand: COMPLETED with a result, or FAILED with an error; later calls with the key replay it. Refused if the record changed.",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		var (
			f              settleFlags
			result, failed string
			raw            bool
			expiry         time.Duration
		)
		f.define(fs)
		fs.StringVar(&result, "result", "", "complete the record with this result: `@FILE`, @- for stdin, or inline JSON")
		fs.BoolVar(&raw, "raw", false, "store --result's bytes even when they are not JSON (an application with another codec)")
		fs.StringVar(&failed, "fail", "", "fail the record with this terminal error: `CODE:MESSAGE`")
		fs.DurationVar(&expiry, "expiry", 0, "how long the settled record is replayed (default: as long as the application kept this record)")
		return func(ctx context.Context, args []string) error {
			if (result == "") == (failed == "") {
				return errNoChoice
			}
			if expiry < 0 {
				return usagef("-expiry %v: want a positive duration", expiry)
			}
			w := ops.Write{Expiry: expiry}
			var done string
			if result != "" {
				b, err := readResult(c.env.Stdin, result)
				if err != nil {
					return err
				}
				if !raw && !json.Valid(b) {
					return usagef("--result is not JSON (pass --raw to store it anyway, for an application with another codec)")
				}
				w.Action, w.Result, done = ops.Complete, b, "completed"
			} else {
				te, err := ops.ParseError(failed)
				if err != nil {
					return usagef("--fail %v", err)
				}
				w.Action, w.Error, done = ops.Fail, te, "failed"
			}
			s := &settle{c: c, flags: &f, verb: "resolve as " + strings.ToUpper(done), done: done, write: w}
			return s.run(ctx, args)
		}
	},
}

// readResult reads --result: @FILE, @- (stdin) or the value itself.
func readResult(stdin io.Reader, v string) ([]byte, error) {
	switch {
	case v == "@-":
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("--result @-: %w", err)
		}
		return b, nil
	case strings.HasPrefix(v, "@"):
		b, err := os.ReadFile(v[1:])
		if err != nil {
			return nil, fmt.Errorf("--result: %w", err)
		}
		return b, nil
	}
	return []byte(v), nil
}
