package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"time"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

var doctorCommand = command{
	name: "doctor", args: "[URL]",
	summary: "Check a live store against the settings that keep idem's promise (docs/production.md): that it opens, " +
		"a round trip, its clock, and every check the store makes of itself (store.Diagnoser: configuration, eviction, persistence, replicas, durability, room); " +
		"print one line per check and how to fix what is wrong. Read-only; exit 0 when no problem was found (warnings, risks the configuration accepts, leave it 0), " +
		"1 when one was (an unreachable store is one), 2 for a bad command line (no URL).",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		probes := fs.Int("probes", 5, "round trips to time (reads of an absent key)")
		return func(ctx context.Context, args []string) error {
			switch len(args) {
			case 0:
			case 1:
				c.store = args[0]
			default:
				return usagef("doctor takes one store URL, got %d arguments", len(args))
			}
			if *probes < 1 {
				return usagef("-probes must be at least 1")
			}
			if c.storeURL() == "" {
				return usagef("no store URL: give it as the argument, with -store, or in $%s", EnvStore)
			}
			d := &doctor{c: c}
			d.run(ctx, *probes)
			if d.problems > 0 {
				return fmt.Errorf("%d problem(s) found; fixes above", d.problems)
			}
			if d.warnings > 0 {
				fmt.Fprintf(c.env.Stdout, "no problems found; %d warning(s) above: risks the configuration accepts\n", d.warnings)
				return nil
			}
			fmt.Fprintln(c.env.Stdout, "no problems found")
			return nil
		}
	},
}

// doctor is one run of idemctl doctor: it prints one line per check.
type doctor struct {
	c                  *ctl
	problems, warnings int
}

// report prints f: its severity, check and what was found, and under a
// warning or a problem its fix.
func (d *doctor) report(f store.Finding) {
	label := "ok"
	switch f.Severity {
	case store.SeverityWarning:
		d.warnings++
		label = "WARNING"
	case store.SeverityProblem:
		d.problems++
		label = "PROBLEM"
	}
	fmt.Fprintf(d.c.env.Stdout, "%-8s %-18s %s\n", label, f.Check, f.What)
	if f.Severity != store.SeverityOK && f.Fix != "" {
		fmt.Fprintf(d.c.env.Stdout, "         %-18s fix: %s\n", "", f.Fix)
	}
}

func (d *doctor) ok(check, format string, args ...any) {
	d.report(store.Finding{Check: check, What: fmt.Sprintf(format, args...)})
}

// problem reports what is wrong and, when fix is not empty, how to fix it.
func (d *doctor) problem(check, what, fix string) {
	d.report(store.Finding{Check: check, Severity: store.SeverityProblem, What: what, Fix: fix})
}

// run opens the store, then runs every check, whatever an earlier one
// found: a round trip, the clock, and the store's own (store.Diagnoser),
// or, for a store without them, its Check.
func (d *doctor) run(ctx context.Context, probes int) {
	fmt.Fprintf(d.c.env.Stdout, "store    %s\n", storeurl.Redact(d.c.storeURL()))
	start := time.Now()
	s, closeStore, err := d.c.openReadOnly(ctx)
	if err != nil {
		d.report(store.FindingOf("open", err))
		return
	}
	defer closeStore()
	system := "a store"
	if n, ok := s.(store.SystemNamer); ok && n.SystemName() != "" {
		system = n.SystemName()
	}
	d.ok("open", "%s, opened and answered in %v", system, time.Since(start).Round(time.Millisecond))

	switch c := s.(type) {
	case store.Diagnoser:
		for _, f := range c.Diagnose(ctx) {
			d.report(f)
		}
	case interface{ Check(context.Context) error }:
		if err := c.Check(ctx); err != nil {
			d.report(store.FindingOf("configuration", err))
		} else {
			d.ok("configuration", "the store's own check passed")
		}
	}
	d.roundTrip(ctx, s, probes)
	if t, ok := s.(store.ServerTimer); ok {
		d.clock(ctx, t)
	}
}

// maxClockOffset is the engine's default Config.MaxClockOffset: beyond it
// an engine takes over no claim (docs/state-machine.md, "One clock").
const maxClockOffset = time.Minute

// clock compares this machine's clock (idemctl's) with the store's: an
// engine corrects its timestamps by the offset, but takes over no claim
// whose lease has passed while the offset is beyond MaxClockOffset.
func (d *doctor) clock(ctx context.Context, t store.ServerTimer) {
	before := d.c.now()
	at, err := t.ServerTime(ctx)
	if err != nil {
		f := store.FindingOf("clock", err)
		f.What = "cannot read the store's clock: " + f.What
		d.report(d.after(f))
		return
	}
	after := d.c.now()
	offset := at.Sub(before.Add(after.Sub(before) / 2)).Round(time.Millisecond)
	if offset > maxClockOffset || offset < -maxClockOffset {
		d.problem("clock", fmt.Sprintf("this machine's clock is %v from the store's, beyond the %v within which an engine here takes over claims whose lease has passed (it still runs nothing twice)", offset, maxClockOffset),
			"synchronise this machine's clock (NTP), or raise Config.MaxClockOffset")
		return
	}
	d.ok("clock", "%v from the store's (engines correct their timestamps by it)", offset)
}

// after is f, a check that failed after others had found problems: those
// are the likely cause, and its fix says so.
func (d *doctor) after(f store.Finding) store.Finding {
	if d.problems > 0 {
		f.Fix = "mend the problem(s) above first; " + f.Fix
	}
	return f
}

// roundTrip times probes reads of a key no call uses.
func (d *doctor) roundTrip(ctx context.Context, s store.Store, probes int) {
	times := make([]time.Duration, 0, probes)
	for range probes {
		start := time.Now()
		_, err := s.Get(ctx, "idemctl-doctor#probe")
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			f := store.FindingOf("round trip", err)
			f.What = "a read failed: " + f.What
			d.report(d.after(f))
			return
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	d.ok("round trip", "%d reads: median %v, max %v", probes, times[len(times)/2].Round(10*time.Microsecond), times[len(times)-1].Round(10*time.Microsecond))
}
