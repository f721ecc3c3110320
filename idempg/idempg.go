// Package idempg runs an operation and its idem record in one PostgreSQL
// transaction: the operation's writes and the COMPLETED record commit
// together or not at all, so a retry finds either both or neither.
//
// It joins the engine (package idem) and the PostgreSQL store
// ([pgstore.Store]) in a module of its own, so that the store depends on
// the store contract alone.
package idempg

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/pgstore"
)

// DoTx is [idem.Do] for an operation that writes to the store's database:
// fn runs inside a transaction begun on the store's DB, and the COMPLETED
// record is written in that same transaction before it commits
// ([pgstore.Store.CompleteInTx]). The business write and the recorded
// outcome commit together or not at all:
//
//   - fn's error, or a panic: the transaction rolls back (nothing of fn's
//     writes remains); the engine then records a terminal error or
//     releases the key, as for Do. fn's error is returned as it is.
//   - the claim was lost (a takeover moved the fence on, or the record
//     expired), before the commit or while fn ran (the engine then cancels
//     fn's context): the transaction rolls back, fn's writes never become
//     visible, and the call returns the [*store.FencedError] or
//     [store.ErrNotFound] (while fn ran: in an error that also matches
//     idem.ErrLeaseLost). Do not retry: the key's new holder answers it.
//   - the value's encoding is over Config.MaxResultBytes: the transaction
//     rolls back, the key is marked FAILED with [idem.CodeResultTooLarge],
//     and this call and every retry get that [*idem.TerminalError]
//     ([idem.ErrResultTooLarge]).
//   - begin or commit fails: an error wrapping [store.ErrUnavailable];
//     the key is released, and a retry runs fn again.
//
// A duplicate is replayed from the record without running fn. An engine
// that runs fn without a claim (Config.Disabled, IDEM_DISABLED, or
// FailOpen after the claim failed) runs it in a transaction of its own
// with no record ([pgstore.Store.WriteInTx]). e must run on s.
func DoTx[T any](ctx context.Context, e *idem.Engine, s *pgstore.Store, r idem.Request, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (idem.Result[T], error) {
	return idem.DoCompleting(ctx, e, r, func(ctx context.Context, c *idem.Completion[T]) (v T, err error) {
		if c.Unprotected() {
			id, err := r.Identity()
			if err != nil {
				return v, err
			}
			err = s.WriteInTx(ctx, id.StoreKey.String(), func(ctx context.Context, tx pgx.Tx) error {
				var ferr error
				v, ferr = fn(ctx, tx)
				return ferr
			})
			return v, err
		}
		claim, ok := idem.FromContext(ctx)
		if !ok {
			return v, errors.New("idempg: DoTx: no claim in the operation's context")
		}
		err = s.CompleteInTx(ctx, claim.Key, func(ctx context.Context, tx pgx.Tx) (store.CompleteParams, error) {
			var ferr error
			if v, ferr = fn(ctx, tx); ferr != nil {
				return store.CompleteParams{}, ferr
			}
			if lost := leaseLost(ctx); lost != nil {
				return store.CompleteParams{}, lost
			}
			p, perr := c.Params(v)
			if perr != nil {
				return p, fmt.Errorf("idempg: DoTx: %w", perr)
			}
			return p, nil
		})
		if errors.Is(err, context.Canceled) {
			// fn's statements, or the completion, met the context the
			// engine cancelled: say why.
			if lost := leaseLost(ctx); lost != nil {
				return v, lost
			}
		}
		return v, err
	})
}

// leaseLost is the cause of ctx's end when the engine ended it because
// the claim was lost (idem.ErrLeaseLost, wrapping the store's refusal),
// else nil.
func leaseLost(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, idem.ErrLeaseLost) {
		return cause
	}
	return nil
}
