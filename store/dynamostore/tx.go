package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

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

// TxError is a transaction of [Store.CompleteInTx] refused because of
// the caller's writes: the write's index among them and DynamoDB's reason.
// Nothing of the transaction was written. A failed condition matches
// [ErrTxCondition]; a reason a retry may mend (TransactionConflict,
// throttling) matches store.ErrUnavailable; any other reason matches
// store.ErrInvalidParams, and a retry of the same writes meets it again:
// two writes to one item, an item over DynamoDB's 400 KB (Code
// "ValidationError"), a table that does not exist ("ResourceNotFound",
// Table names it).
type TxError struct {
	Key string
	// Index is the refused write's index in the caller's items; -1 when
	// DynamoDB refused the request as a whole and no single write could be
	// told (the message then says what was found).
	Index int
	// Code and Message are DynamoDB's reason.
	Code, Message string
	// Table is the table of the refused write, when it is known.
	Table string
	// Item is the item as it was, for a failed condition whose write asked
	// for it (ReturnValuesOnConditionCheckFailure ALL_OLD).
	Item map[string]types.AttributeValue
}

func (e *TxError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dynamostore: transaction completing %s refused: ", e.Key)
	if e.Index >= 0 {
		fmt.Fprintf(&b, "the caller's write %d", e.Index)
	} else {
		b.WriteString("the caller's writes")
	}
	if e.Table != "" {
		fmt.Fprintf(&b, " (table %q)", e.Table)
	}
	fmt.Fprintf(&b, ": %s: %s", e.Code, e.Message)
	return b.String()
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
//     DynamoDB refused it): a [*TxError] naming it, nothing written. So is
//     a request DynamoDB refuses as a whole because of the caller's
//     writes: two writes to one item (the record's included), an item
//     over 400 KB, a table that does not exist; these match
//     store.ErrInvalidParams, and the TxError names the write (or the
//     writes) where it can tell;
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
	tx, err := s.txAPI(p.Key, items)
	if err != nil {
		return err
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
	if errors.As(err, &tce) && len(tce.CancellationReasons) == len(all) {
		own := tce.CancellationReasons[len(items)]
		if aws.ToString(own.Code) == "ConditionalCheckFailed" {
			return s.refused("complete", p.ClaimRef, own.Item)
		}
	}
	return s.txFailed(ctx, p.Key, items, true, err)
}

// WriteInTx commits items (at most [MaxTxItems]) in one TransactWriteItems
// without a record: the writes of an operation that an engine runs
// without a claim (idem's Config.Disabled or FailOpen), which
// idemdynamo.DoTx still commits together. key names the call in errors.
// Its errors are those of [Store.CompleteInTx] but for the record's.
func (s *Store) WriteInTx(ctx context.Context, key string, items []types.TransactWriteItem) error {
	tx, err := s.txAPI(key, items)
	if err != nil || len(items) == 0 {
		return err
	}
	_, err = tx.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
	if err == nil {
		return nil
	}
	return s.txFailed(ctx, key, items, false, err)
}

// txAPI is the client's TransactAPI, for a transaction of items besides
// the record.
func (s *Store) txAPI(key string, items []types.TransactWriteItem) (TransactAPI, error) {
	tx, ok := s.api.(TransactAPI)
	if !ok {
		return nil, fmt.Errorf("dynamostore: complete %s in a transaction: the client (%T) has no TransactWriteItems: %w", key, s.api, store.ErrInvalidParams)
	}
	if len(items) > MaxTxItems {
		return nil, fmt.Errorf("dynamostore: complete %s in a transaction: %d writes, more than the %d a transaction takes besides the record: %w",
			key, len(items), MaxTxItems, store.ErrInvalidParams)
	}
	return tx, nil
}

// txFailed is the error of a transaction of items (followed by the
// record's write, when withRecord) that failed with err, other than a
// refusal of the record's own condition: a [*TxError] for a refusal
// because of the caller's writes, else the store's translation.
func (s *Store) txFailed(ctx context.Context, key string, items []types.TransactWriteItem, withRecord bool, err error) error {
	var tce *types.TransactionCanceledException
	n := len(items)
	if withRecord {
		n++
	}
	if !errors.As(err, &tce) || len(tce.CancellationReasons) != n {
		if te := s.refusedRequest(ctx, key, items, withRecord, err); te != nil {
			return te
		}
		return s.translate("complete", key, err)
	}
	for i, r := range tce.CancellationReasons[:len(items)] {
		if code := aws.ToString(r.Code); code != "" && code != "None" {
			return &TxError{Key: key, Index: i, Code: code, Message: aws.ToString(r.Message), Table: txTable(items[i]), Item: r.Item}
		}
	}
	return s.translate("complete", key, err)
}

// describer is what [Store.CompleteInTx] asks of a client to tell which
// table of a transaction is missing; *dynamodb.Client has it.
type describer interface {
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
}

// refusedRequest is the [*TxError] for a transaction DynamoDB refused as a
// whole (no cancellation reasons) because of the caller's writes (items;
// the record's write follows them when withRecord): two writes to one item, an
// item over 400 KB, a table that does not exist, any other malformed
// write. It is nil for any other refusal, which is the store's to
// translate.
func (s *Store) refusedRequest(ctx context.Context, key string, items []types.TransactWriteItem, withRecord bool, err error) *TxError {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return nil
	}
	all := items
	if withRecord {
		all = append(items[:len(items):len(items)], types.TransactWriteItem{Update: &types.Update{TableName: aws.String(s.cfg.Table), Key: s.itemKey(key)}})
	}
	te := &TxError{Key: key, Index: -1, Message: ae.ErrorMessage()}
	switch {
	case ae.ErrorCode() == "ResourceNotFoundException":
		// The record's table answered the claim: the missing one is among
		// the caller's, unless they are all on the record's table (or there
		// is no record: then every table is the caller's).
		te.Code = "ResourceNotFound"
		i, table, ok := s.missingTable(ctx, items, withRecord)
		if !ok {
			return nil
		}
		te.Index, te.Table = i, table
		if i < 0 {
			te.Message += fmt.Sprintf(" (one of the tables %s)", table)
			te.Table = ""
		}
		return te
	case ae.ErrorCode() != "ValidationException":
		return nil
	case isItemTooLarge(err):
		// The record's own item fits: its result was checked against
		// MaxResultBytes (spilled or refused) before the request.
		te.Code = "ValidationError"
		big := -1
		for i, it := range items {
			if it.Put != nil && itemSize(it.Put.Item) > MaxItemBytes && (big < 0 || itemSize(it.Put.Item) > itemSize(items[big].Put.Item)) {
				big = i
			}
		}
		switch {
		case big >= 0:
			te.Index, te.Table = big, txTable(items[big])
			te.Message += fmt.Sprintf(" (the put carries about %d bytes, over DynamoDB's %d)", itemSize(items[big].Put.Item), MaxItemBytes)
		case slices.ContainsFunc(items, func(it types.TransactWriteItem) bool { return it.Update != nil }):
			te.Message += fmt.Sprintf(" (an update among the caller's writes makes an item over DynamoDB's %d bytes)", MaxItemBytes)
		default:
			return nil // none of the caller's: the record's, translated as Complete's
		}
		return te
	case containsFold(ae.ErrorMessage(), "multiple operations on one item"):
		te.Code = "ValidationError"
		if i, j, ok := sameItem(all); ok {
			te.Index, te.Table = j, txTable(all[j])
			if withRecord && j == len(items) {
				te.Index, te.Table = i, txTable(all[i])
				te.Message += " (the write is to the idem record itself)"
			} else {
				te.Message += fmt.Sprintf(" (write %d is to the same item)", i)
			}
		}
		return te
	}
	// Any other ValidationException: the caller's writes are malformed
	// (the record's write is the store's own, the same in every call).
	te.Code = "ValidationError"
	return te
}

// missingTable names the table of items that does not exist, and the
// index of the first write to it: asked of DynamoDB (DescribeTable) when
// the client can, else the tables of the caller's writes, listed, with
// index -1. ok is false when every write is on the record's table.
func (s *Store) missingTable(ctx context.Context, items []types.TransactWriteItem, withRecord bool) (index int, table string, ok bool) {
	var tables []string
	first := map[string]int{}
	for i, it := range items {
		t := txTable(it)
		if _, seen := first[t]; !seen && (t != s.cfg.Table || !withRecord) {
			first[t] = i
			tables = append(tables, t)
		}
	}
	if len(tables) == 0 {
		return 0, "", false
	}
	if d, can := s.api.(describer); can {
		for _, t := range tables {
			_, err := d.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(t)})
			var nf *types.ResourceNotFoundException
			if errors.As(err, &nf) {
				return first[t], t, true
			}
		}
	}
	if len(tables) == 1 {
		return first[tables[0]], tables[0], true
	}
	return -1, strings.Join(tables, ", "), true
}

// txTable is the table a transaction's write names.
func txTable(it types.TransactWriteItem) string {
	switch {
	case it.Put != nil:
		return aws.ToString(it.Put.TableName)
	case it.Update != nil:
		return aws.ToString(it.Update.TableName)
	case it.Delete != nil:
		return aws.ToString(it.Delete.TableName)
	case it.ConditionCheck != nil:
		return aws.ToString(it.ConditionCheck.TableName)
	}
	return ""
}

// txKey is the key of the item a keyed write (Update, Delete,
// ConditionCheck) names, and for a Put its whole item (of which its key is
// a part: the key schema is not known here).
func txKey(it types.TransactWriteItem) (key map[string]types.AttributeValue, put bool) {
	switch {
	case it.Put != nil:
		return it.Put.Item, true
	case it.Update != nil:
		return it.Update.Key, false
	case it.Delete != nil:
		return it.Delete.Key, false
	case it.ConditionCheck != nil:
		return it.ConditionCheck.Key, false
	}
	return nil, false
}

// sameItem finds two writes of all on one item (i < j): two keyed writes
// with equal keys, or a Put whose item holds a keyed write's key. Two Puts
// are told apart only through a keyed write on their table.
func sameItem(all []types.TransactWriteItem) (i, j int, ok bool) {
	for j := range all {
		for i := range j {
			if txTable(all[i]) != txTable(all[j]) {
				continue
			}
			ki, pi := txKey(all[i])
			kj, pj := txKey(all[j])
			switch {
			case !pi && !pj:
				ok = sameAttrs(ki, kj, ki)
			case pi && !pj:
				ok = sameAttrs(ki, kj, kj)
			case !pi && pj:
				ok = sameAttrs(ki, kj, ki)
			}
			if ok {
				return i, j, true
			}
		}
	}
	return 0, 0, false
}

// sameAttrs reports whether a and b hold equal values for every attribute
// of key (non-empty).
func sameAttrs(a, b, key map[string]types.AttributeValue) bool {
	if len(key) == 0 {
		return false
	}
	for name := range key {
		va, ok1 := a[name]
		vb, ok2 := b[name]
		if !ok1 || !ok2 || !reflect.DeepEqual(va, vb) {
			return false
		}
	}
	return true
}

// itemSize is an item's size as DynamoDB counts it against its 400 KB,
// closely enough to tell which write is over: each attribute's name and
// value (numbers counted by their digits, nested values with their names
// and 3 bytes of overhead).
func itemSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, v := range item {
		n += len(name) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return (len(v.Value)+1)/2 + 1
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberBOOL, *types.AttributeValueMemberNULL:
		return 1
	case *types.AttributeValueMemberSS:
		n := 0
		for _, s := range v.Value {
			n += len(s)
		}
		return n
	case *types.AttributeValueMemberNS:
		n := 0
		for _, s := range v.Value {
			n += (len(s)+1)/2 + 1
		}
		return n
	case *types.AttributeValueMemberBS:
		n := 0
		for _, b := range v.Value {
			n += len(b)
		}
		return n
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += 1 + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberM:
		return 3 + len(v.Value) + itemSize(v.Value)
	}
	return 0
}
