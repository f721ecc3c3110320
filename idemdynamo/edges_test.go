package idemdynamo_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemdynamo"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
)

// refusedWrites runs DoTx with writes DynamoDB refuses as a whole and
// checks what every such refusal must leave: a *TxError matching
// ErrInvalidParams (not ErrUnavailable: a retry meets it again) naming
// write want in table, nothing written, the key released.
func refusedWrites(t *testing.T, f *fixture, key string, items []types.TransactWriteItem, want int, table string) *dynamostore.TxError {
	t.Helper()
	s := f.store(t, nil)
	e := engine(t, s, nil)
	r := idem.Request{Operation: "order", Key: key}
	_, err := idemdynamo.DoTx(context.Background(), e, s, r, func(context.Context) (string, []types.TransactWriteItem, error) {
		return "order", items, nil
	})
	var te *dynamostore.TxError
	if !errors.As(err, &te) || !errors.Is(err, store.ErrInvalidParams) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("DoTx: %v, want a *TxError matching store.ErrInvalidParams and not ErrUnavailable", err)
	}
	var tl *store.TooLargeError
	if errors.As(err, &tl) || strings.Contains(err.Error(), f.cfg.Table) {
		t.Fatalf("DoTx: %v names the idem record or its table, not the caller's write", err)
	}
	if te.Index != want || te.Table != table || !strings.Contains(err.Error(), table) {
		t.Fatalf("DoTx: %v (index %d, table %q), want write %d of table %q", err, te.Index, te.Table, want, table)
	}
	if n := f.orderCount(t); n != 0 {
		t.Fatalf("%d orders written by a refused transaction", n)
	}
	if rec := f.record(t, s, r); rec != nil {
		t.Fatalf("record %+v after a refused transaction, want the key released", rec)
	}
	return te
}

// Two writes to one item: DynamoDB refuses the request as a whole.
func TestDoTxTwoWritesToOneItemAreInvalid(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	put := f.putOrder("o-dup", 1)
	put.Put.ConditionExpression = nil
	del := types.TransactWriteItem{Delete: &types.Delete{TableName: aws.String(f.orders),
		Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "o-dup"}}}}
	te := refusedWrites(t, f, "dup", []types.TransactWriteItem{f.putOrder("o-other", 1), put, del}, 2, f.orders)
	if !strings.Contains(te.Error(), "multiple operations on one item") || !strings.Contains(te.Error(), "write 1") {
		t.Fatalf("%v: want DynamoDB's reason and the other write", te)
	}
}

// A write of the caller's to the idem record itself is refused the same
// way, and named.
func TestDoTxWriteToTheRecordIsInvalid(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.store(t, nil)
	e := engine(t, s, nil)
	_, err := idemdynamo.DoTx(context.Background(), e, s, idem.Request{Operation: "order", Key: "self"}, func(ctx context.Context) (string, []types.TransactWriteItem, error) {
		c, _ := idem.FromContext(ctx)
		return "order", []types.TransactWriteItem{{ConditionCheck: &types.ConditionCheck{
			TableName:                aws.String(f.cfg.Table),
			Key:                      map[string]types.AttributeValue{s.Config().KeyAttr: &types.AttributeValueMemberS{Value: c.Key}},
			ConditionExpression:      aws.String("attribute_exists(#k)"),
			ExpressionAttributeNames: map[string]string{"#k": s.Config().KeyAttr},
		}}}, nil
	})
	var te *dynamostore.TxError
	if !errors.As(err, &te) || te.Index != 0 || !errors.Is(err, store.ErrInvalidParams) || !strings.Contains(err.Error(), "idem record itself") {
		t.Fatalf("DoTx: %v, want a *TxError for write 0, on the idem record, matching ErrInvalidParams", err)
	}
}

// An item of the caller's over 400 KB: the error names that write, not
// the idem record.
func TestDoTxItemOverTheLimitNamesTheWrite(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	big := f.putOrder("o-big", 1)
	big.Put.Item["blob"] = &types.AttributeValueMemberS{Value: strings.Repeat("x", dynamostore.MaxItemBytes+1)}
	te := refusedWrites(t, f, "big", []types.TransactWriteItem{f.putOrder("o-small", 1), big}, 1, f.orders)
	if !strings.Contains(te.Error(), "size") {
		t.Fatalf("%v: want DynamoDB's reason", te)
	}
}

// A write to a table that does not exist: the error names it, not the
// idem table (which exists).
func TestDoTxMissingTableNamesIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	missing := dynamotest.Name("missing_")
	w := f.putOrder("o-1", 1)
	w.Put.TableName = aws.String(missing)
	te := refusedWrites(t, f, "missing", []types.TransactWriteItem{f.putOrder("o-0", 1), w}, 1, missing)
	if te.Code != "ResourceNotFound" {
		t.Fatalf("%v: code %q, want ResourceNotFound", te, te.Code)
	}
}

// The holder's lease is lost while its operation runs (another process
// took the key over, the renewal is refused and the engine cancels the
// operation's context): the call returns the store's refusal, as for a
// zombie, and nothing is written.
func TestDoTxLeaseLostWhileRunningIsFenced(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.store(t, nil)
	e, err := idem.New(s, &idem.Config{Lease: 3 * time.Second, RenewInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r := idem.Request{Operation: "order", Key: "lost"}
	_, err = idemdynamo.DoTx(context.Background(), e, s, r, func(ctx context.Context) (string, []types.TransactWriteItem, error) {
		c, _ := idem.FromContext(ctx)
		rec, err := s.Get(ctx, c.Key)
		if err != nil {
			return "", nil, err
		}
		// Another process, its clock well past the lease (a renewal may
		// move the lease on meanwhile), takes the key over.
		now := rec.LeaseUntil + 20_000
		res, err := s.Claim(ctx, store.ClaimParams{Key: c.Key, Owner: "other", Fingerprint: rec.Fingerprint,
			Now: now, LeaseUntil: now + 30_000, ExpiresAt: rec.ExpiresAt})
		if err != nil {
			return "", nil, err
		}
		if !res.Acquired {
			return "", nil, errors.New("the other process did not take the key over")
		}
		select { // the next renewal is refused and ends the context
		case <-ctx.Done():
		case <-time.After(30 * time.Second):
			return "", nil, errors.New("the operation's context was not cancelled after the takeover")
		}
		return "zombie", []types.TransactWriteItem{f.putOrder("o-lost", 1)}, nil
	})
	var fe *store.FencedError
	if !errors.As(err, &fe) || fe.CurrentOwner != "other" || !errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("DoTx: %v, want a *FencedError naming the new owner (and ErrLeaseLost), not ErrUnavailable", err)
	}
	if n := f.orderCount(t); n != 0 {
		t.Fatalf("the holder that lost its lease wrote %d orders", n)
	}
	if rec := f.record(t, s, r); rec == nil || rec.Owner != "other" || rec.Status != store.StatusInProgress {
		t.Fatalf("record %+v, want the new holder's claim untouched", rec)
	}
}

// A disabled engine runs the operation and commits its writes, in a
// transaction of their own, with no record.
func TestDoTxDisabledWritesWithoutARecord(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.store(t, nil)
	e := engine(t, s, &idem.Config{Disabled: true})
	r := idem.Request{Operation: "order", Key: "off"}
	for i := range 2 {
		res, err := idemdynamo.DoTx(context.Background(), e, s, r, func(context.Context) (string, []types.TransactWriteItem, error) {
			return "order", []types.TransactWriteItem{f.putOrder("o-off-"+string(rune('a'+i)), 1)}, nil
		})
		if err != nil || res.Value != "order" || res.Replayed {
			t.Fatalf("call %d: %+v, %v; want the operation run", i, res, err)
		}
	}
	if n := f.orderCount(t); n != 2 {
		t.Fatalf("%d orders, want 2 (every call runs)", n)
	}
	if rec := f.record(t, s, r); rec != nil {
		t.Fatalf("record %+v written by a disabled engine", rec)
	}
	// The writes still commit together: a refused one refuses them all.
	_, err := idemdynamo.DoTx(context.Background(), e, s, r, func(context.Context) (string, []types.TransactWriteItem, error) {
		return "order", []types.TransactWriteItem{f.putOrder("o-off-c", 1), f.putOrder("o-off-a", 1)}, nil
	})
	var te *dynamostore.TxError
	if !errors.As(err, &te) || te.Index != 1 || !errors.Is(err, dynamostore.ErrTxCondition) || f.orderCount(t) != 2 {
		t.Fatalf("refused write: %v, %d orders; want a *TxError for write 1 and nothing written", err, f.orderCount(t))
	}
}

// A value over the engine's MaxResultBytes: nothing is written, the key
// is FAILED with CodeResultTooLarge, and a retry gets the same error
// without running.
func TestDoTxResultOverMaxResultBytesFails(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.store(t, nil)
	e := engine(t, s, &idem.Config{MaxResultBytes: 64})
	r := idem.Request{Operation: "order", Key: "large"}
	runs := 0
	op := func(context.Context) (string, []types.TransactWriteItem, error) {
		runs++
		return strings.Repeat("x", 100), []types.TransactWriteItem{f.putOrder("o-large", 1)}, nil
	}
	for i := range 2 {
		_, err := idemdynamo.DoTx(context.Background(), e, s, r, op)
		var term *idem.TerminalError
		if !errors.Is(err, idem.ErrResultTooLarge) || !errors.As(err, &term) || term.Code != idem.CodeResultTooLarge {
			t.Fatalf("call %d: %v, want ErrResultTooLarge", i, err)
		}
	}
	if runs != 1 {
		t.Fatalf("%d runs, want 1 (the retry replays the stored error)", runs)
	}
	if n := f.orderCount(t); n != 0 {
		t.Fatalf("%d orders written with a result that was not stored", n)
	}
	if rec := f.record(t, s, r); rec == nil || rec.Status != store.StatusFailed || rec.Err == nil || rec.Err.Code != idem.CodeResultTooLarge || rec.Result != nil {
		t.Fatalf("record %+v, want FAILED with %s and no result", rec, idem.CodeResultTooLarge)
	}
}
