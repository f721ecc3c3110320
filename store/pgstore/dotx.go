package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/seed-a1b882c0/idem"
)

// DoTx is [idem.Do] for an operation that writes to this database: fn runs
// inside a transaction begun on the store's DB, and the COMPLETED record is
// written in that same transaction before it commits. The business write
// and the recorded outcome commit together or not at all:
//
//   - fn's error, or a panic: the transaction rolls back (nothing of fn's
//     writes remains); the engine then records a terminal error or
//     releases the key, as for Do.
//   - the claim was lost (a takeover moved the fence on, or the record
//     expired): CompleteTx is refused, the transaction rolls back, and the
//     call returns the *idem.FencedError or idem.ErrNotFound; fn's writes
//     never become visible.
//
// A duplicate is replayed from the record without running fn.
func DoTx[T any](ctx context.Context, e *idem.Engine, s *Store, r idem.Request, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (idem.Result[T], error) {
	return idem.DoCompleting(ctx, e, r, func(ctx context.Context, c *idem.Completion[T]) (v T, err error) {
		claim, ok := idem.FromContext(ctx)
		if !ok {
			return v, errors.New("pgstore: DoTx: no claim in the operation's context")
		}
		tx, err := s.db.Begin(ctx)
		if err != nil {
			return v, s.translate("begin", claim.Key, err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
		if v, err = fn(ctx, tx); err != nil {
			return v, err
		}
		p, err := c.Params(v)
		if err != nil {
			return v, fmt.Errorf("pgstore: DoTx: %w", err)
		}
		if err := s.CompleteTx(ctx, tx, p); err != nil {
			return v, err
		}
		if err := tx.Commit(ctx); err != nil {
			return v, s.translate("commit", claim.Key, err)
		}
		return v, nil
	})
}
