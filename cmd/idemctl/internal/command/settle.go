package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/seed-a1b882c0/idem/ops"
	"github.com/seed-a1b882c0/idem/store"
)

// settleFlags are the flags every command that writes a record shares.
type settleFlags struct {
	keyFlags
	yes, force bool
}

func (f *settleFlags) define(fs *flag.FlagSet) {
	f.keyFlags.define(fs)
	fs.BoolVar(&f.yes, "yes", false, "do it without asking (required when stdin is not a terminal)")
	fs.BoolVar(&f.force, "force", false, "also settle an IN_PROGRESS record still within its expected completion (its holder may be working)")
}

// settle is one manual write through package ops (the console's code
// path too): read the record, check it may be settled, confirm, then
// write only while the record is still exactly the one read (ops.Guard),
// through its claim and status, so that nothing is written if anything
// changed in between.
type settle struct {
	c     *ctl
	flags *settleFlags
	verb  string // "release", for messages
	write ops.Write
	done  string // printed on success, after the key
}

func (s *settle) run(ctx context.Context, args []string) error {
	key, err := s.flags.storeKey(args)
	if err != nil {
		return err
	}
	st, closeStore, err := s.c.open(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	op := s.c.operator(st)
	state, err := op.Read(ctx, key)
	if err != nil {
		return err
	}
	w := s.write
	w.Force = s.flags.force
	if err := w.Allowed(state, op.Now()); err != nil {
		return explainRefusal(err)
	}
	q := fmt.Sprintf("%s %s (%s, fence %d, owner %s, created %s)?", s.verb, key, state.Status, state.Fence, state.Owner, ts(state.CreatedAt))
	if err := s.c.confirm(s.flags.yes, q); err != nil {
		return err
	}
	if err := op.Apply(ctx, state, w); err != nil {
		return explainRefusal(err)
	}
	fmt.Fprintf(s.c.env.Stdout, "%s %s\n", s.done, key)
	return nil
}

// explainRefusal words ops' refusals in idemctl's flags and commands.
func explainRefusal(err error) error {
	var fresh *ops.FreshError
	var changed *ops.ChangedError
	switch {
	case errors.As(err, &fresh):
		return fmt.Errorf("%s is IN_PROGRESS and within its expected completion (%s, in %v): its holder %s may still be working; wait, or pass --force",
			fresh.Key, ts(fresh.LeaseUntil), fresh.Left.Round(time.Second), fresh.Holder)
	case errors.As(err, &changed) && changed.Now != nil:
		return fmt.Errorf("%w (idemctl show %s)", err, changed.Key)
	}
	return err
}

// operator reads and settles records of s, as "idemctl", on idemctl's
// clock corrected to the store's (ops.Operator.Clock): list, show and the
// settling commands judge "stuck" on the store's clock, as leases are.
func (c *ctl) operator(s store.Store) *ops.Operator {
	return &ops.Operator{Store: s, Clock: c.env.Clock, Owner: "idemctl", Logger: c.logger()}
}

var releaseCommand = command{
	name: "release", args: "KEY | --scope NAME --key MATERIAL [--tenant TENANT]",
	summary: "Release a stuck IN_PROGRESS or a FAILED record, so that the next call with the key runs the operation again. Refused if the record changed.",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		var f settleFlags
		f.define(fs)
		s := &settle{c: c, flags: &f, verb: "release", done: "released", write: ops.Write{Action: ops.Release}}
		return s.run
	},
}

var deleteCommand = command{
	name: "delete", args: "KEY | --scope NAME --key MATERIAL [--tenant TENANT]",
	summary: "Delete a record whatever its status: the next call with the key runs the operation again. Refused if the record changed.",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		var f settleFlags
		f.define(fs)
		s := &settle{c: c, flags: &f, verb: "delete", done: "deleted", write: ops.Write{Action: ops.Delete}}
		return s.run
	},
}

// errNoChoice: resolve needs exactly one outcome.
var errNoChoice = usagef("resolve needs an outcome: --result @FILE (or @- or inline JSON) to complete, or --fail CODE:MESSAGE to fail")
