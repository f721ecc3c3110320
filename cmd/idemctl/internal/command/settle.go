package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/seed-a1b882c0/idem"
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

// settle is one manual write: read the record, check it may be settled,
// confirm, then write through the token of exactly the record read, so
// that the store refuses the write if anything changed in between.
type settle struct {
	c      *ctl
	flags  *settleFlags
	verb   string // "release", for messages
	allow  func(st *idem.State) error
	expiry func(st *idem.State) time.Duration
	write  func(ctx context.Context, e *idem.Engine, t idem.Token) error
	// landed, when set, checks the record after the write: the engine
	// counts a write that finds the record already settled under the same
	// claim as its own (an earlier attempt whose reply was lost), which
	// for an operator's write means the holder settled it in between.
	landed func(st *idem.State) bool
	done   string // printed on success, after the key
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
	reader, err := s.c.engine(st, time.Hour)
	if err != nil {
		return err
	}
	state, err := s.c.readState(ctx, reader, key)
	if err != nil {
		return err
	}
	now := s.c.now()
	if state.Status == idem.StatusInProgress && !state.Overdue(now) && !s.flags.force {
		return fmt.Errorf("%s is IN_PROGRESS and within its expected completion (%s, in %v): its holder %s may still be working; wait, or pass --force",
			key, ts(state.ExpectedCompletion), state.ExpectedCompletion.Sub(now).Round(time.Second), state.LockedBy)
	}
	if s.allow != nil {
		if err := s.allow(state); err != nil {
			return err
		}
	}
	q := fmt.Sprintf("%s %s (%s, fence %d, owner %s, created %s)?", s.verb, key, state.Status, state.Fence, state.LockedBy, ts(state.CreatedAt))
	if err := s.c.confirm(s.flags.yes, q); err != nil {
		return err
	}
	expiry := time.Hour
	if s.expiry != nil {
		expiry = s.expiry(state)
	}
	e, err := s.c.engine(st, expiry)
	if err != nil {
		return err
	}
	if err := s.write(ctx, e, state.Token()); err != nil {
		return explainWrite(key, err)
	}
	if s.landed != nil {
		after, err := s.c.readState(ctx, reader, key)
		if err != nil {
			return fmt.Errorf("%s: the write was accepted but the record cannot be read back: %w", key, err)
		}
		if !s.landed(after) {
			return fmt.Errorf("%s changed underneath: its holder settled it as %s while idemctl was writing; idemctl's outcome was not stored. Run idemctl show %s and decide again",
				key, after.Status, key)
		}
	}
	fmt.Fprintf(s.c.env.Stdout, "%s %s\n", s.done, key)
	return nil
}

// explainWrite turns a refused write into a message an operator can act on.
func explainWrite(key idem.StoreKey, err error) error {
	var stale *idem.StaleTokenError
	if !errors.As(err, &stale) {
		return err
	}
	if stale.Status == 0 {
		return fmt.Errorf("%s changed underneath: it was deleted or expired since it was read; nothing was written", key)
	}
	return fmt.Errorf("%s changed underneath: it is now %s (fence %d, owner %s), not the record that was read; nothing was written. Run idemctl show %s and decide again",
		key, stale.Status, stale.Fence, stale.Owner, key)
}

// windowOf is how long a record settled by hand stays: as long as the
// application kept this one (its expiry less its claim or settling time).
func windowOf(st *idem.State) time.Duration {
	from := st.CreatedAt
	if !st.CompletedAt.IsZero() {
		from = st.CompletedAt
	}
	return st.ExpiresAt.Sub(from)
}

var releaseCommand = command{
	name: "release", args: "KEY | --scope NAME --key MATERIAL [--tenant TENANT]",
	summary: "Release a stuck IN_PROGRESS or a FAILED record, so that the next call with the key runs the operation again. Refused if the record changed.",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		var f settleFlags
		f.define(fs)
		s := &settle{c: c, flags: &f, verb: "release", done: "released",
			allow: func(st *idem.State) error {
				if st.Status == idem.StatusCompleted {
					return fmt.Errorf("%s is COMPLETED: releasing it would discard its stored result and run the operation again; use delete if that is what you want", st.Key)
				}
				return nil
			},
			write: func(ctx context.Context, e *idem.Engine, t idem.Token) error { return e.Release(ctx, t) },
		}
		return s.run
	},
}

var deleteCommand = command{
	name: "delete", args: "KEY | --scope NAME --key MATERIAL [--tenant TENANT]",
	summary: "Delete a record whatever its status: the next call with the key runs the operation again. Refused if the record changed.",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		var f settleFlags
		f.define(fs)
		s := &settle{c: c, flags: &f, verb: "delete", done: "deleted",
			write: func(ctx context.Context, e *idem.Engine, t idem.Token) error { return e.Release(ctx, t) },
		}
		return s.run
	},
}

// errNoChoice: resolve needs exactly one outcome.
var errNoChoice = usagef("resolve needs an outcome: --result @FILE (or @- or inline JSON) to complete, or --fail CODE:MESSAGE to fail")
