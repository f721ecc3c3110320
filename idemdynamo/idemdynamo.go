// Package idemdynamo runs an operation and its idem record in one DynamoDB
// transaction: the operation's writes and the COMPLETED record commit
// together or not at all, so a retry finds either both or neither — the
// order item and its replayable answer, never an order without a record.
//
// Without it, a handler that puts an order item and then crashes before
// idem's Complete leaves the order written and the key IN_PROGRESS; after
// the lease a retry puts a second order unless the handler's own write is
// idempotent. With [DoTx] the handler returns its writes instead of making
// them, and they commit in one TransactWriteItems with the record's fenced
// completion.
//
// It joins the engine (package idem) and the DynamoDB store
// ([dynamostore.Store], whose engine-free half is
// [dynamostore.Store.CompleteInTx]) in a module of its own, as idempg does
// for PostgreSQL, so that the store depends on the store contract alone.
//
// # Cost and limits
//
// A transaction costs two write units per item written (the record
// included), where Do and a separate put cost one each: docs/dynamodb.md
// measures it. A transaction takes at most 100 writes: the operation's at
// most [dynamostore.MaxTxItems] (99), each on a different item, 4 MB in all.
// A result over the store's MaxResultBytes is spilled (S3) before the
// transaction, as for any Complete; a transaction that is then cancelled
// leaves an object nothing refers to, which the bucket's lifecycle rule
// removes.
package idemdynamo

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

// DoTx is [idem.Do] for an operation that writes to DynamoDB: fn returns
// its value and its writes (Put, Update, Delete, ConditionCheck entries of
// a TransactWriteItems, at most [dynamostore.MaxTxItems]) instead of making
// them, and DoTx commits them in one transaction with the COMPLETED record
// ([dynamostore.Store.CompleteInTx]). The writes and the recorded outcome
// commit together or not at all:
//
//   - fn's error, or a panic: nothing is written; the engine then records a
//     terminal error or releases the key, as for Do.
//   - the claim was lost (a takeover moved the fence on, or the record
//     expired), before the transaction or while fn ran (the engine then
//     cancels fn's context): none of fn's writes happen, and the call
//     returns the *store.FencedError or store.ErrNotFound (while fn ran:
//     in an error that also matches idem.ErrLeaseLost). Do not retry: the
//     key's new holder answers it.
//   - one of fn's own writes cancelled the transaction (its condition
//     failed): nothing is written and the call returns a
//     [*dynamostore.TxError] (matching [dynamostore.ErrTxCondition]); it is
//     not a terminal error, so the key is released and a retry runs fn
//     again. fn decides what a retry should meet: read first and return an
//     [*idem.TerminalError] to store the refusal.
//   - DynamoDB refused the request because of fn's writes (two on one
//     item, an item over 400 KB, a table that does not exist): nothing is
//     written, the key is released, and the call returns a
//     [*dynamostore.TxError] naming the write and matching
//     store.ErrInvalidParams: a retry meets the same refusal.
//   - the value's encoding is over Config.MaxResultBytes: nothing is
//     written, the key is marked FAILED with [idem.CodeResultTooLarge], and
//     this call and every retry get that [*idem.TerminalError]
//     ([idem.ErrResultTooLarge]).
//   - the reply was lost: the SDK retries the transaction under its client
//     request token, which DynamoDB applies once; a call that still fails
//     leaves the record COMPLETED or IN_PROGRESS with nothing written, and a
//     retry replays or, after the lease, runs fn again.
//
// A duplicate is replayed from the record without running fn. An engine
// that runs fn without a claim (Config.Disabled, IDEM_DISABLED, or
// FailOpen after the claim failed) commits fn's writes in a transaction of
// their own ([dynamostore.Store.WriteInTx]), with no record. e must run on
// s.
func DoTx[T any](ctx context.Context, e *idem.Engine, s *dynamostore.Store, r idem.Request, fn func(ctx context.Context) (T, []types.TransactWriteItem, error)) (idem.Result[T], error) {
	return idem.DoCompleting(ctx, e, r, func(ctx context.Context, c *idem.Completion[T]) (T, error) {
		v, items, err := fn(ctx)
		if err != nil {
			return v, err
		}
		if c.Unprotected() {
			id, err := r.Identity()
			if err != nil {
				return v, err
			}
			return v, s.WriteInTx(ctx, id.StoreKey.String(), items)
		}
		if err := leaseLost(ctx); err != nil {
			return v, err
		}
		p, err := c.Params(v)
		if err != nil {
			return v, fmt.Errorf("idemdynamo: DoTx: %w", err)
		}
		if err := s.CompleteInTx(ctx, p, items); err != nil {
			if lost := leaseLost(ctx); lost != nil {
				return v, lost
			}
			return v, err
		}
		return v, nil
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
