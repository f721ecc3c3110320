package command

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"
)

var showCommand = command{
	name: "show", args: "KEY | --scope NAME --key MATERIAL [--tenant TENANT]",
	summary: "Show one key's record: status, who holds it since when, its execution, its outcome. Read-only; exit 3 when absent.",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		var k keyFlags
		k.define(fs)
		out := outputFlag("table")
		fs.Var(&out, "o", "output `FORMAT`: table or json")
		return func(ctx context.Context, args []string) error {
			key, err := k.storeKey(args)
			if err != nil {
				return err
			}
			s, closeStore, err := c.openReadOnly(ctx)
			if err != nil {
				return err
			}
			defer closeStore()
			op := c.operator(s)
			st, err := op.Read(ctx, key)
			if err != nil {
				return err
			}
			v := viewOfState(st, op.Now())
			if out == "json" {
				return writeJSON(c.env.Stdout, v)
			}
			tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
			status := v.Status
			if v.Stuck {
				status += " (stuck: past its expected completion)"
			}
			if v.Held {
				status += " (held for an operator: its holder was lost and its takeover policy is Hold; no retry runs it again: resolve or release it)"
			}
			rows := [][2]string{
				{"key", v.Key}, {"status", status}, {"owner", orDash(v.Owner)}, {"fence", fmt.Sprint(v.Fence)},
				{"execution ref", orDash(v.Ref)}, {"created", ts(v.Created)}, {"age", (time.Duration(v.AgeSeconds) * time.Second).String()},
				{"expected completion", ts(v.LeaseUntil)},
			}
			if v.Completed != nil {
				rows = append(rows, [2]string{"completed", ts(*v.Completed)})
			}
			rows = append(rows, [2]string{"expires", ts(v.Expires)}, [2]string{"fingerprint", orDash(v.Fingerprint)})
			if v.Error != nil {
				rows = append(rows, [2]string{"error code", orDash(v.Error.Code)}, [2]string{"error message", v.Error.Message})
			}
			switch {
			case v.Response != nil:
				// A response idemhttp or idem-gateway stored: its body as
				// it was sent (JSON as JSON), not the record's base64.
				rows = append(rows, [2]string{"result", fmt.Sprintf("HTTP %d response (stored by idemhttp or idem-gateway)", v.Response.Status)})
				if len(v.Response.Header) > 0 {
					rows = append(rows, [2]string{"response header", headerLine(v.Response.Header)})
				}
				if v.Response.Body != nil {
					rows = append(rows, [2]string{"response body", oneLine(v.Response.Body)})
				}
			case v.Result != nil:
				rows = append(rows, [2]string{"result", oneLine(v.Result)})
			}
			if len(v.Steps) > 0 {
				rows = append(rows, [2]string{"steps", fmt.Sprintf("%d finished (a takeover resumes after them)", len(v.Steps))})
			}
			// Every value read from the store (a key's owner and ref, an
			// error's text) is printed with its control characters escaped:
			// a record cannot move the operator's cursor or clear the
			// terminal.
			for _, r := range rows {
				fmt.Fprintf(tw, "%s:\t%s\n", r[0], escapeControls(r[1]))
			}
			// One line a step: name, when recorded, outcome; its cells
			// make columns of their own.
			for _, st := range v.Steps {
				var outcome string
				if st.Error != nil {
					outcome = "error " + escapeControls(orDash(st.Error.Code)) + ": " + escapeControls(st.Error.Message)
				} else {
					outcome = fmt.Sprintf("result, %d bytes", *st.ResultBytes)
				}
				fmt.Fprintf(tw, "step %d:\t%s\t%s\t%s\n", st.Index, escapeControls(st.Name), ts(st.Recorded), outcome)
			}
			return tw.Flush()
		}
	},
}
