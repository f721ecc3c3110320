package idemdynamo_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemdynamo"
	"github.com/seed-a1b882c0/idem/idemtest/faultproxy"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
)

func TestMain(m *testing.M) { dynamotest.Main(m) }

// fixture is a fresh idem table and a fresh orders table (pk "id"), both
// deleted when the test ends.
type fixture struct {
	c      *dynamodb.Client
	cfg    dynamostore.Config
	orders string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	ctx := context.Background()
	f := &fixture{c: c, cfg: dynamotest.Table(t, c, "idem_tx_", dynamostore.Config{}), orders: dynamotest.Name("orders_")}
	if _, err := c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(f.orders),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := c.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(f.orders)}); err != nil {
			t.Errorf("delete table %s: %v", f.orders, err)
		}
	})
	return f
}

// store opens the idem table through c (the fixture's client when nil).
func (f *fixture) store(t testing.TB, c *dynamodb.Client) *dynamostore.Store {
	t.Helper()
	if c == nil {
		c = f.c
	}
	s, err := dynamostore.New(c, f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func engine(t testing.TB, s store.Store, cfg *idem.Config) *idem.Engine {
	t.Helper()
	if cfg == nil {
		cfg = &idem.Config{}
	}
	cfg.RenewInterval = -1
	e, err := idem.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// putOrder is the write of an order item that must not exist yet.
func (f *fixture) putOrder(id string, amount int) types.TransactWriteItem {
	return types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String(f.orders),
		Item: map[string]types.AttributeValue{
			"id":     &types.AttributeValueMemberS{Value: id},
			"amount": &types.AttributeValueMemberN{Value: fmt.Sprint(amount)},
		},
		ConditionExpression: aws.String("attribute_not_exists(id)"),
	}}
}

func (f *fixture) orderCount(t testing.TB) int {
	t.Helper()
	out, err := f.c.Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(f.orders), ConsistentRead: aws.Bool(true), Select: types.SelectCount})
	if err != nil {
		t.Fatal(err)
	}
	return int(out.Count)
}

func (f *fixture) record(t testing.TB, s *dynamostore.Store, r idem.Request) *store.Record {
	t.Helper()
	id, err := r.Identity()
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(context.Background(), id.StoreKey.String())
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return rec
}

// The order and the record commit together; a duplicate replays without
// running the operation or writing anything.
func TestDoTxCommitsTheOrderWithItsRecord(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.store(t, nil)
	e := engine(t, s, nil)
	ctx := context.Background()
	var runs atomic.Int32
	r := idem.Request{Operation: "order", Key: "o-1"}
	for i := range 2 {
		res, err := idemdynamo.DoTx(ctx, e, s, r, func(ctx context.Context) (string, []types.TransactWriteItem, error) {
			runs.Add(1)
			return "order o-1", []types.TransactWriteItem{f.putOrder("o-1", 100)}, nil
		})
		if err != nil || res.Value != "order o-1" || res.Replayed != (i == 1) {
			t.Fatalf("call %d: %+v, %v", i, res, err)
		}
	}
	if runs.Load() != 1 || f.orderCount(t) != 1 {
		t.Fatalf("runs %d, orders %d; want 1 and 1", runs.Load(), f.orderCount(t))
	}
	if rec := f.record(t, s, r); rec == nil || rec.Status != store.StatusCompleted {
		t.Fatalf("record %+v, want COMPLETED", rec)
	}
}

// A takeover between the claim and the transaction: the transaction is
// refused as the fenced Complete is, and nothing of the zombie's is
// written.
func TestDoTxOfATakenOverClaimWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.store(t, nil)
	e := engine(t, s, nil)
	ctx := context.Background()
	r := idem.Request{Operation: "order", Key: "o-2"}
	_, err := idemdynamo.DoTx(ctx, e, s, r, func(ctx context.Context) (string, []types.TransactWriteItem, error) {
		c, _ := idem.FromContext(ctx)
		rec, err := s.Get(ctx, c.Key)
		if err != nil {
			return "", nil, err
		}
		// Another process takes the key over (its clock past the lease).
		if _, err := s.Claim(ctx, store.ClaimParams{Key: c.Key, Owner: "other", Fingerprint: rec.Fingerprint,
			Now: rec.LeaseUntil, LeaseUntil: rec.LeaseUntil + 30_000, ExpiresAt: rec.ExpiresAt}); err != nil {
			return "", nil, err
		}
		return "zombie", []types.TransactWriteItem{f.putOrder("o-2", 1)}, nil
	})
	var fe *store.FencedError
	if !errors.As(err, &fe) || fe.CurrentOwner != "other" {
		t.Fatalf("zombie's DoTx: %v, want a *FencedError naming the new owner", err)
	}
	if n := f.orderCount(t); n != 0 {
		t.Fatalf("the zombie's order was written (%d items)", n)
	}
	if rec := f.record(t, s, r); rec == nil || rec.Status != store.StatusInProgress || rec.Owner != "other" {
		t.Fatalf("record %+v, want the new holder's claim untouched", rec)
	}
}

// A ConditionCheck among the operation's own writes fails: nothing is
// written, the error names the write, and the key is released, so a retry
// runs again.
func TestDoTxUserConditionFailureWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.store(t, nil)
	e := engine(t, s, nil)
	ctx := context.Background()
	if _, err := f.c.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(f.orders), Item: map[string]types.AttributeValue{
		"id": &types.AttributeValueMemberS{Value: "o-3"}, "amount": &types.AttributeValueMemberN{Value: "5"},
	}}); err != nil {
		t.Fatal(err)
	}
	r := idem.Request{Operation: "order", Key: "o-3"}
	var runs int
	op := func(ctx context.Context) (string, []types.TransactWriteItem, error) {
		runs++
		check := types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
			TableName:           aws.String(f.orders),
			Key:                 map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "o-3"}},
			ConditionExpression: aws.String("attribute_not_exists(id)"),
		}}
		return "order", []types.TransactWriteItem{f.putOrder("o-3b", 1), check}, nil
	}
	_, err := idemdynamo.DoTx(ctx, e, s, r, op)
	var te *dynamostore.TxError
	if !errors.As(err, &te) || te.Index != 1 || !errors.Is(err, dynamostore.ErrTxCondition) {
		t.Fatalf("DoTx: %v, want a *TxError for write 1 matching ErrTxCondition", err)
	}
	if n := f.orderCount(t); n != 1 {
		t.Fatalf("%d orders, want only the one put before (nothing of the transaction)", n)
	}
	if rec := f.record(t, s, r); rec != nil {
		t.Fatalf("record %+v after a refused transaction, want the key released", rec)
	}
	if _, err := idemdynamo.DoTx(ctx, e, s, r, op); !errors.Is(err, dynamostore.ErrTxCondition) || runs != 2 {
		t.Fatalf("retry: %v after %d runs, want it to run again and meet the same refusal", err, runs)
	}
}

// 99 writes of the operation's and the record commit together; a 100th is
// refused before any call, and nothing is written.
func TestDoTxTakesNinetyNineWrites(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.store(t, nil)
	e := engine(t, s, nil)
	ctx := context.Background()
	writes := func(prefix string, n int) []types.TransactWriteItem {
		items := make([]types.TransactWriteItem, n)
		for i := range items {
			items[i] = f.putOrder(fmt.Sprintf("%s-%d", prefix, i), i)
		}
		return items
	}
	res, err := idemdynamo.DoTx(ctx, e, s, idem.Request{Operation: "order", Key: "many"}, func(context.Context) (int, []types.TransactWriteItem, error) {
		return dynamostore.MaxTxItems, writes("a", dynamostore.MaxTxItems), nil
	})
	if err != nil || res.Value != 99 {
		t.Fatalf("99 writes: %+v, %v", res, err)
	}
	if n := f.orderCount(t); n != 99 {
		t.Fatalf("%d orders, want 99", n)
	}
	r := idem.Request{Operation: "order", Key: "too-many"}
	_, err = idemdynamo.DoTx(ctx, e, s, r, func(context.Context) (int, []types.TransactWriteItem, error) {
		return 100, writes("b", dynamostore.MaxTxItems+1), nil
	})
	if !errors.Is(err, store.ErrInvalidParams) || !strings.Contains(err.Error(), "100 writes") {
		t.Fatalf("100 writes: %v, want store.ErrInvalidParams naming the count", err)
	}
	if n := f.orderCount(t); n != 99 {
		t.Fatalf("%d orders after the refused call, want 99", n)
	}
	if rec := f.record(t, s, r); rec != nil {
		t.Fatalf("record %+v after a refused call, want the key released", rec)
	}
}

// lossyClient is a client to DynamoDB Local through a fault proxy whose
// next reply is lost (the request reaches the server, the connection is
// reset instead of answered), with the SDK's retries off: the caller sees
// the lost reply as a process killed right after sending would.
func lossyClient(t *testing.T) (*dynamodb.Client, *faultproxy.Proxy) {
	t.Helper()
	p, err := faultproxy.New(strings.TrimPrefix(testenv.DynamoDB(t), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return dynamotest.NewClient("http://"+p.Addr(), func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }), p
}

// The transaction is sent and its reply lost (a process that died right
// then): the order and the record are both written, and a retry from
// another engine replays without running the operation.
func TestDoTxLostReplyLeavesBothAndTheRetryReplays(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	lc, proxy := lossyClient(t)
	ls := f.store(t, lc)
	e := engine(t, ls, nil)
	ctx := context.Background()
	r := idem.Request{Operation: "order", Key: "o-4"}
	var runs atomic.Int32
	op := func(context.Context) (string, []types.TransactWriteItem, error) {
		runs.Add(1)
		proxy.DropReplies(1) // the transaction's reply
		return "order o-4", []types.TransactWriteItem{f.putOrder("o-4", 7)}, nil
	}
	if _, err := idemdynamo.DoTx(ctx, e, ls, r, op); err == nil {
		t.Fatal("DoTx with its reply lost returned no error")
	}
	if proxy.Dropped.Load() == 0 {
		t.Fatal("the proxy dropped no reply")
	}
	s := f.store(t, nil)
	if n, rec := f.orderCount(t), f.record(t, s, r); n != 1 || rec == nil || rec.Status != store.StatusCompleted {
		t.Fatalf("after the lost reply: %d orders, record %+v; want both written", n, rec)
	}
	res, err := idemdynamo.DoTx(ctx, engine(t, s, nil), s, r, op)
	if err != nil || !res.Replayed || res.Value != "order o-4" || runs.Load() != 1 {
		t.Fatalf("retry: %+v, %v after %d runs; want a replay", res, err, runs.Load())
	}
}

// The request is lost before it reaches the server: neither is written,
// and a retry after the lease runs the operation once.
func TestDoTxLostRequestLeavesNeither(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	lc, proxy := lossyClient(t)
	ls := f.store(t, lc)
	clock := &offsetClock{}
	e := engine(t, ls, &idem.Config{Lease: time.Second, Clock: clock})
	ctx := context.Background()
	r := idem.Request{Operation: "order", Key: "o-5"}
	var runs atomic.Int32
	_, err := idemdynamo.DoTx(ctx, e, ls, r, func(context.Context) (string, []types.TransactWriteItem, error) {
		runs.Add(1)
		proxy.ResetRequests(1) // the transaction's request
		return "order o-5", []types.TransactWriteItem{f.putOrder("o-5", 7)}, nil
	})
	if err == nil {
		t.Fatal("DoTx with its request lost returned no error")
	}
	s := f.store(t, nil)
	if n := f.orderCount(t); n != 0 {
		t.Fatalf("%d orders after a lost request, want 0", n)
	}
	// The engine released the key, or (the release lost too) it stays
	// IN_PROGRESS until its lease ends: a retry past the lease runs once.
	late := &offsetClock{offset: 2 * time.Second}
	res, err := idemdynamo.DoTx(ctx, engine(t, s, &idem.Config{Lease: time.Second, Clock: late}), s, r,
		func(context.Context) (string, []types.TransactWriteItem, error) {
			runs.Add(1)
			return "order o-5", []types.TransactWriteItem{f.putOrder("o-5", 7)}, nil
		})
	if err != nil || res.Replayed || runs.Load() != 2 || f.orderCount(t) != 1 {
		t.Fatalf("retry: %+v, %v, runs %d, orders %d; want one run and one order", res, err, runs.Load(), f.orderCount(t))
	}
}

// offsetClock is the real clock moved by offset: another process's clock,
// past a lease that this process's clock has not reached.
type offsetClock struct {
	store.SystemClock
	offset time.Duration
}

func (c *offsetClock) Now() time.Time { return time.Now().Add(c.offset) }

// Engines of several processes (one each) run the same key at once: one
// order, one execution, every caller the same answer.
func TestDoTxConcurrentCallersWriteOneOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const callers = 8
	var runs atomic.Int32
	var wg sync.WaitGroup
	values := make([]string, callers)
	errs := make([]error, callers)
	r := idem.Request{Operation: "order", Key: "o-6"}
	for i := range callers {
		s := f.store(t, nil)
		e := engine(t, s, &idem.Config{Wait: 10 * time.Second})
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := idemdynamo.DoTx(context.Background(), e, s, r, func(context.Context) (string, []types.TransactWriteItem, error) {
				n := runs.Add(1)
				return fmt.Sprintf("run %d", n), []types.TransactWriteItem{f.putOrder("o-6", 1)}, nil
			})
			values[i], errs[i] = res.Value, err
		}()
	}
	wg.Wait()
	for i := range callers {
		if errs[i] != nil || values[i] != values[0] {
			t.Fatalf("caller %d: %q, %v; caller 0: %q", i, values[i], errs[i], values[0])
		}
	}
	if runs.Load() != 1 || f.orderCount(t) != 1 {
		t.Fatalf("runs %d, orders %d; want 1 and 1", runs.Load(), f.orderCount(t))
	}
}

// capacity adds ReturnConsumedCapacity TOTAL to every write and adds up
// the write units DynamoDB reports.
type capacity struct{ units atomic.Int64 }

func (c *capacity) option(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
		return st.Initialize.Add(middleware.InitializeMiddlewareFunc("idemCapacity", func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			switch p := in.Parameters.(type) {
			case *dynamodb.PutItemInput:
				p.ReturnConsumedCapacity = types.ReturnConsumedCapacityTotal
			case *dynamodb.UpdateItemInput:
				p.ReturnConsumedCapacity = types.ReturnConsumedCapacityTotal
			case *dynamodb.TransactWriteItemsInput:
				p.ReturnConsumedCapacity = types.ReturnConsumedCapacityTotal
			}
			out, md, err := next.HandleInitialize(ctx, in)
			var used []types.ConsumedCapacity
			switch r := out.Result.(type) {
			case *dynamodb.PutItemOutput:
				used = append(used, deref(r.ConsumedCapacity)...)
			case *dynamodb.UpdateItemOutput:
				used = append(used, deref(r.ConsumedCapacity)...)
			case *dynamodb.TransactWriteItemsOutput:
				used = append(used, r.ConsumedCapacity...)
			}
			for _, u := range used {
				units := u.WriteCapacityUnits // DynamoDB Local reports CapacityUnits alone for a write
				if units == nil {
					units = u.CapacityUnits
				}
				c.units.Add(int64(aws.ToFloat64(units) * 1000))
			}
			return out, md, err
		}), middleware.After)
	})
}

func deref(c *types.ConsumedCapacity) []types.ConsumedCapacity {
	if c == nil {
		return nil
	}
	return []types.ConsumedCapacity{*c}
}

// TestWriteUnitsPerCall measures what docs/dynamodb.md states: the write
// units of one DoTx (the order and the record in a transaction) against
// Do and a separate put, as DynamoDB Local reports them
// (ReturnConsumedCapacity). Run with -v to read the figures.
func TestWriteUnitsPerCall(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var cap capacity
	c := dynamotest.NewClient(testenv.DynamoDB(t), cap.option)
	s := f.store(t, c)
	e := engine(t, s, nil)
	ctx := context.Background()
	const calls = 20
	for i := range calls {
		if _, err := idemdynamo.DoTx(ctx, e, s, idem.Request{Operation: "order", Key: fmt.Sprint("tx-", i)}, func(context.Context) (int, []types.TransactWriteItem, error) {
			return i, []types.TransactWriteItem{f.putOrder(fmt.Sprint("tx-", i), i)}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	tx := float64(cap.units.Swap(0)) / 1000 / calls
	for i := range calls {
		if _, err := idem.Do(ctx, e, idem.Request{Operation: "order", Key: fmt.Sprint("do-", i)}, func(ctx context.Context) (int, error) {
			put := f.putOrder(fmt.Sprint("do-", i), i).Put
			_, err := c.PutItem(ctx, &dynamodb.PutItemInput{TableName: put.TableName, Item: put.Item, ConditionExpression: put.ConditionExpression})
			return i, err
		}); err != nil {
			t.Fatal(err)
		}
	}
	do := float64(cap.units.Swap(0)) / 1000 / calls
	t.Logf("write units per call: DoTx %.2f, Do + PutItem %.2f (the claim is a write too in both)", tx, do)
	if tx == 0 || do == 0 {
		t.Fatalf("no consumed capacity reported (DoTx %.2f, Do %.2f)", tx, do)
	}
	if tx <= do {
		t.Fatalf("a transaction's writes cost %.2f units, Do and a put %.2f: a transaction must cost more", tx, do)
	}
}
