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
//     releases the key, as for Do.
//   - the claim was lost (a takeover moved the fence on, or the record
//     expired): the completion is refused, the transaction rolls back, and
//     the call returns the [*store.FencedError] or [store.ErrNotFound];
//     fn's writes never become visible.
//
// A duplicate is replayed from the record without running fn. e must run
// on s.
func DoTx[T any](ctx context.Context, e *idem.Engine, s *pgstore.Store, r idem.Request, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (idem.Result[T], error) {
	return idem.DoCompleting(ctx, e, r, func(ctx context.Context, c *idem.Completion[T]) (v T, err error) {
		claim, ok := idem.FromContext(ctx)
		if !ok {
			return v, errors.New("idempg: DoTx: no claim in the operation's context")
		}
		err = s.CompleteInTx(ctx, claim.Key, func(ctx context.Context, tx pgx.Tx) (store.CompleteParams, error) {
			var ferr error
			if v, ferr = fn(ctx, tx); ferr != nil {
				return store.CompleteParams{}, ferr
			}
			p, perr := c.Params(v)
			if perr != nil {
				return p, fmt.Errorf("idempg: DoTx: %w", perr)
			}
			return p, nil
		})
		return v, err
	})
}
