package dynamostore

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem/store"
)

// MaxTxItems is the most writes of its caller's that [Store.CompleteInTx]
// commits with a record: DynamoDB's limit of 100 actions in one
// TransactWriteItems, less the record's own.
const MaxTxItems = 99

// TransactAPI is what [Store.CompleteInTx] needs of the client besides
// [API]. *dynamodb.Client has it; an API without it cannot complete in a
// transaction.
type TransactAPI interface {
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

// ErrTxCondition: a condition of one of the caller's own writes in
// [Store.CompleteInTx] failed, so the transaction wrote nothing.
var ErrTxCondition = errors.New("dynamostore: a condition of the transaction's own writes failed")

// TxError is a transaction of [Store.CompleteInTx] cancelled by one of the
// caller's writes: its index among them and DynamoDB's reason. Nothing of
// the transaction was written. A failed condition matches [ErrTxCondition];
// a reason a retry may mend (TransactionConflict, throttling) matches
// store.ErrUnavailable; any other reason (ValidationError: two writes to
// one item, an item over the size limit) matches store.ErrInvalidParams.
type TxError struct {
	Key string
	// Index is the cancelling write's index in the caller's items.
	Index int
	// Code and Message are DynamoDB's cancellation reason.
	Code, Message string
	// Item is the item as it was, for a failed condition whose write asked
	// for it (ReturnValuesOnConditionCheckFailure ALL_OLD).
	Item map[string]types.AttributeValue
}

func (e *TxError) Error() string {
	return fmt.Sprintf("dynamostore: transaction completing %s cancelled by its write %d: %s: %s", e.Key, e.Index, e.Code, e.Message)
}

// Is matches ErrTxCondition, store.ErrUnavailable or store.ErrInvalidParams,
// by the reason's code.
func (e *TxError) Is(target error) bool {
	switch e.Code {
	case "ConditionalCheckFailed":
		return target == ErrTxCondition
	case "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded":
		return target == store.ErrUnavailable
	}
	return target == store.ErrInvalidParams
}

// CompleteInTx writes items and completes the record of p's claim in one
// TransactWriteItems: the caller's writes (Put, Update, Delete,
// ConditionCheck on any table, at most [MaxTxItems]) and the COMPLETED
// record commit together or not at all. The record's write carries the
// condition of [Store.Complete] (the claim's fence and owner, IN_PROGRESS,
// not expired), so a holder whose claim was taken over commits none of its
// writes.
//
//   - the claim was lost: the transaction is cancelled, nothing is written,
//     and the refusal is returned as Complete returns it (a
//     [*store.FencedError] or store.ErrNotFound);
//   - one of the caller's writes cancelled it (its condition failed, or
//     DynamoDB refused it): a [*TxError] naming it, nothing written;
//   - more than MaxTxItems items, or an API without [TransactAPI]:
//     store.ErrInvalidParams, before any call;
//   - a result over Config.MaxResultBytes goes to the Spiller before the
//     transaction, as for Complete, and the record holds its reference:
//     spilling is not part of the transaction, so a cancelled one leaves
//     an object nothing refers to, which the spiller's expiry removes. With
//     no Spiller the result is refused with a [*store.TooLargeError];
//   - any other failure is store.ErrUnavailable, as for the store's other
//     calls. The SDK retries a transaction under one client request token,
//     so a retry after a lost reply does not apply it twice.
//
// It is the engine-free half of idemdynamo.DoTx, which runs an operation
// and its record in one transaction. A transaction costs two write units
// per item written.
func (s *Store) CompleteInTx(ctx context.Context, p store.CompleteParams, items []types.TransactWriteItem) error {
	tx, ok := s.api.(TransactAPI)
	if !ok {
		return fmt.Errorf("dynamostore: complete %s in a transaction: the client (%T) has no TransactWriteItems: %w", p.Key, s.api, store.ErrInvalidParams)
	}
	if len(items) > MaxTxItems {
		return fmt.Errorf("dynamostore: complete %s in a transaction: %d writes, more than the %d a transaction takes besides the record: %w",
			p.Key, len(items), MaxTxItems, store.ErrInvalidParams)
	}
	set, vals, ph, err := s.completeUpdate(ctx, p)
	if err != nil {
		return err
	}
	all := make([]types.TransactWriteItem, len(items), len(items)+1)
	copy(all, items)
	all = append(all, types.TransactWriteItem{Update: &types.Update{
		TableName:                           aws.String(s.cfg.Table),
		Key:                                 s.itemKey(p.Key),
		UpdateExpression:                    aws.String(set),
		ConditionExpression:                 aws.String(fencedCond),
		ExpressionAttributeNames:            s.pick(append(ph, "#st", "#fence", "#owner", "#expms")...),
		ExpressionAttributeValues:           fencedValues(vals, p.ClaimRef),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}})
	_, err = tx.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: all})
	if err == nil {
		return nil
	}
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) || len(tce.CancellationReasons) != len(all) {
		return s.translate("complete", p.Key, err)
	}
	own := tce.CancellationReasons[len(items)]
	if aws.ToString(own.Code) == "ConditionalCheckFailed" {
		return s.refused("complete", p.ClaimRef, own.Item)
	}
	for i, r := range tce.CancellationReasons[:len(items)] {
		if code := aws.ToString(r.Code); code != "" && code != "None" {
			return &TxError{Key: p.Key, Index: i, Code: code, Message: aws.ToString(r.Message), Item: r.Item}
		}
	}
	return s.translate("complete", p.Key, err)
}
