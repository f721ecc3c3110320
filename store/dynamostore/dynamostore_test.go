package dynamostore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
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
	"github.com/seed-a1b882c0/idem/idemtest/faultproxy"
	"github.com/seed-a1b882c0/idem/idemtest/storefaults"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

// transport is the one the test clients share (dynamotest.Main closes its
// idle connections before it looks for leaked goroutines).
var transport = dynamotest.Transport

func TestMain(m *testing.M) { dynamotest.Main(m) }

// newTable creates a fresh table for cfg (its Table name is filled in)
// and deletes it when the test ends.
func newTable(t testing.TB, c *dynamodb.Client, cfg dynamostore.Config) dynamostore.Config {
	t.Helper()
	return dynamotest.Table(t, c, "idem_test_", cfg)
}

func newStore(t testing.TB, c *dynamodb.Client, cfg dynamostore.Config) *dynamostore.Store {
	t.Helper()
	s, err := dynamostore.New(c, newTable(t, c, cfg))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const limit = 384 << 10

func TestConformance(t *testing.T) {
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	storetest.Run(t, storetest.Features{MaxResultBytes: limit, StormGoroutines: 256}, func(t *testing.T) store.Store {
		return newStore(t, c, dynamostore.Config{})
	})
}

// The composite-key layout with the status index: every listing path but
// the Scan goes through it.
func TestConformanceCompositeKeyWithStatusIndex(t *testing.T) {
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	storetest.Run(t, storetest.Features{MaxResultBytes: limit, StormGoroutines: 64, LinOps: 2000}, func(t *testing.T) store.Store {
		return newStore(t, c, dynamostore.Config{KeyAttr: "pk", SortKeyAttr: "sk", PartitionValue: "idempotency#orders", StatusIndex: "status-lease"})
	})
}

// counter counts HTTP requests (every attempt, after the retryer) made by
// a client.
type counter struct{ n atomic.Int64 }

func (c *counter) option(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("idem-count", func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			c.n.Add(1)
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
	})
}

// The open index costs no request: it is kept in the writes' own.
func TestRequestsPerCall(t *testing.T) {
	for name, cfg := range map[string]dynamostore.Config{"no index": {}, "open index": {OpenIndex: "open-lease"}} {
		t.Run(name, func(t *testing.T) { testRequestsPerCall(t, cfg) })
	}
}

func testRequestsPerCall(t *testing.T, cfg dynamostore.Config) {
	ep := testenv.DynamoDB(t)
	var cnt counter
	c := dynamotest.NewClient(ep, cnt.option)
	s := newStore(t, dynamotest.NewClient(ep), cfg)
	s, _ = dynamostore.New(c, s.Config())
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	runs := 0
	call := func() idem.Result[string] {
		res, err := idem.Do(ctx, e, idem.Request{Operation: "charge", Key: "k1", Payload: []byte(`{"amount":5}`)},
			func(context.Context) (string, error) { runs++; return "ch_1", nil })
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	before := cnt.n.Load()
	call()
	if got := cnt.n.Load() - before; got != 3 {
		t.Errorf("new call made %d requests, want 3 (the engine's first reading of the service's clock, once per ClockSync interval; claim + complete)", got)
	}
	before = cnt.n.Load()
	res := call()
	if got := cnt.n.Load() - before; got != 1 {
		t.Errorf("duplicate call made %d requests, want 1 (the failed claim returns the item)", got)
	}
	if !res.Replayed || res.Value != "ch_1" || runs != 1 {
		t.Errorf("duplicate: %+v, runs %d; want replayed ch_1 and one run", res, runs)
	}
}

// lossyProxy is a fault proxy to ep whose next reply is lost: the request
// reaches DynamoDB Local and the client's connection is reset instead of
// answered.
func lossyProxy(t *testing.T, ep string) *faultproxy.Proxy {
	p, err := faultproxy.New(strings.TrimPrefix(ep, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	p.DropReplies(1)
	return p
}

func TestLostClaimReplyIsRecognisedAsOwn(t *testing.T) {
	ep := testenv.DynamoDB(t)
	direct := dynamotest.NewClient(ep)
	cfg := newTable(t, direct, dynamostore.Config{})
	p := lossyProxy(t, ep)
	var cnt counter
	// The SDK's standard retryer resends the claim after the reset.
	s, err := dynamostore.New(dynamotest.NewClient("http://"+p.Addr(), cnt.option), cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Add(time.Hour).UnixMilli()
	key := "lost#" + strconv.Itoa(rand.Int())
	res, err := s.Claim(context.Background(), store.ClaimParams{Key: key, Fingerprint: "fp", Owner: "owner-1", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000})
	if err != nil {
		t.Fatalf("claim through a lost reply: %v", err)
	}
	if p.Dropped.Load() != 1 || cnt.n.Load() != 2 {
		t.Fatalf("proxy dropped %d replies, client sent %d requests; want 1 dropped and a retry", p.Dropped.Load(), cnt.n.Load())
	}
	if !res.Acquired || res.Takeover || res.Record.Fence != 1 || res.Record.Owner != "owner-1" {
		t.Fatalf("retried claim = %+v (record %+v); want acquired with fence 1, its own", res, res.Record)
	}
	// The recognised claim is usable: complete it under fence 1.
	if err := s.Complete(context.Background(), store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "owner-1", Now: now + 1}, ExpiresAt: now + 60_000, Result: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	// Another owner with the same fingerprint is still a conflict.
	res, err = s.Claim(context.Background(), store.ClaimParams{Key: key, Fingerprint: "fp", Owner: "owner-2", Now: now + 2, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000})
	if err != nil || res.Acquired || string(res.Record.Result) != "ok" {
		t.Fatalf("claim by another owner = %+v, %v; want the completed record", res, err)
	}
}

// Without the SDK's retries, a lost reply is a typed unavailable error and
// the caller's own retry (same owner) still recognises the claim.
func TestLostClaimReplyWithoutRetries(t *testing.T) {
	ep := testenv.DynamoDB(t)
	direct := dynamotest.NewClient(ep)
	cfg := newTable(t, direct, dynamostore.Config{})
	p := lossyProxy(t, ep)
	s, err := dynamostore.New(dynamotest.NewClient("http://"+p.Addr(), func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }), cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Add(time.Hour).UnixMilli()
	cp := store.ClaimParams{Key: "lost2#k", Fingerprint: "fp", Owner: "owner-1", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000}
	_, err = s.Claim(context.Background(), cp)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("claim with its reply lost: %v, want ErrUnavailable", err)
	}
	res, err := s.Claim(context.Background(), cp)
	if err != nil || !res.Acquired || res.Record.Fence != 1 {
		t.Fatalf("same owner's retry = %+v, %v; want its own claim, fence 1", res, err)
	}
}

// memSpiller is a test Spiller keeping spilled results in memory, each
// Spill in an object of its own.
type memSpiller struct {
	mu   sync.Mutex
	objs map[string][]byte
	seq  int
}

func (m *memSpiller) Spill(_ context.Context, p dynamostore.SpillParams) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq++
	ref := fmt.Sprintf("mem://%s/%d/%s/%d", p.Key, p.Fence, p.Owner, m.seq)
	m.objs[ref] = append([]byte(nil), p.Data...)
	return ref, nil
}

func (m *memSpiller) Load(_ context.Context, ref string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[ref]
	if !ok {
		return nil, fmt.Errorf("no object %s", ref)
	}
	return append([]byte(nil), b...), nil
}

func TestSpillLargeResults(t *testing.T) {
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	sp := &memSpiller{objs: map[string][]byte{}}
	s := newStore(t, c, dynamostore.Config{Spiller: sp, MaxResultBytes: 1000})
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 1<<20) // 1 MiB: far over the 400 KB item limit
	for i := range big {
		big[i] = byte(i % 251)
	}
	runs := 0
	for i := range 2 {
		res, err := idem.Do(context.Background(), e, idem.Request{Operation: "report", Key: "r1"}, func(context.Context) ([]byte, error) {
			runs++
			return big, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Value) != len(big) || res.Value[12345] != big[12345] || res.Replayed != (i == 1) {
			t.Fatalf("call %d: %d bytes, replayed %v", i, len(res.Value), res.Replayed)
		}
	}
	if runs != 1 || len(sp.objs) != 1 {
		t.Fatalf("runs %d, spilled objects %d; want 1 and 1", runs, len(sp.objs))
	}
	// A spilled object that has gone fails closed.
	sp.mu.Lock()
	clear(sp.objs)
	sp.mu.Unlock()
	_, err = idem.Do(context.Background(), e, idem.Request{Operation: "report", Key: "r1"}, func(context.Context) ([]byte, error) {
		runs++
		return nil, nil
	})
	if err == nil || runs != 1 {
		t.Fatalf("replay of a lost spilled object: err %v, runs %d; want an error and no run", err, runs)
	}
}

// The item layout is the Powertools table's: a team can point idem at an
// existing Powertools table and its TTL setting.
func TestPowertoolsCompatibleItem(t *testing.T) {
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	s := newStore(t, c, dynamostore.Config{})
	now := time.Now().UnixMilli() + 1234
	key := "pt#k"
	if _, err := s.Claim(context.Background(), store.ClaimParams{Key: key, Fingerprint: "abc", Owner: "o", Now: now, LeaseUntil: now + 5000, ExpiresAt: now + 3_600_500}); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(context.Background(), store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 7_200_500, Result: []byte(`{"id":1}`)}); err != nil {
		t.Fatal(err)
	}
	out, err := c.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(s.Config().Table), Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: key}}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	it := out.Item
	wantN := map[string]int64{"expiration": (now + 7_200_500 + 999) / 1000, "in_progress_expiration": now + 5000, "fence": 1}
	for name, want := range wantN {
		n, ok := it[name].(*types.AttributeValueMemberN)
		if !ok || n.Value != strconv.FormatInt(want, 10) {
			t.Errorf("attribute %s = %#v, want N %d", name, it[name], want)
		}
	}
	if st, ok := it["status"].(*types.AttributeValueMemberS); !ok || st.Value != "COMPLETED" {
		t.Errorf("status = %#v", it["status"])
	}
	if v, ok := it["validation"].(*types.AttributeValueMemberS); !ok || v.Value != "abc" {
		t.Errorf("validation = %#v", it["validation"])
	}
	if d, ok := it["data"].(*types.AttributeValueMemberB); !ok || string(d.Value) != `{"id":1}` {
		t.Errorf("data = %#v, want binary result", it["data"])
	}
	ttl, err := c.DescribeTimeToLive(context.Background(), &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(s.Config().Table)})
	if err != nil {
		t.Fatal(err)
	}
	if d := ttl.TimeToLiveDescription; d == nil || aws.ToString(d.AttributeName) != "expiration" || d.TimeToLiveStatus != types.TimeToLiveStatusEnabled {
		t.Errorf("TTL = %+v, want enabled on expiration", d)
	}
}

// Items idem cannot read fail closed: the engine neither replays them nor
// runs the operation.
func TestDamagedItemFailsClosed(t *testing.T) {
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	s := newStore(t, c, dynamostore.Config{})
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	req := idem.Request{Operation: "charge", Key: "bad"}
	id, err := req.Identity()
	if err != nil {
		t.Fatal(err)
	}
	far := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	for name, item := range map[string]map[string]types.AttributeValue{
		"fence not a number": {"fence": &types.AttributeValueMemberS{Value: "x"}, "status": &types.AttributeValueMemberS{Value: "COMPLETED"}},
		"unknown status":     {"fence": &types.AttributeValueMemberN{Value: "1"}, "status": &types.AttributeValueMemberS{Value: "INPROGRESS"}},
		"result not binary":  {"fence": &types.AttributeValueMemberN{Value: "1"}, "status": &types.AttributeValueMemberS{Value: "COMPLETED"}, "data": &types.AttributeValueMemberS{Value: "{}"}},
		"record version 9":   {"fence": &types.AttributeValueMemberN{Value: "1"}, "status": &types.AttributeValueMemberS{Value: "COMPLETED"}, "v": &types.AttributeValueMemberN{Value: "9"}},
	} {
		item["id"] = &types.AttributeValueMemberS{Value: id.StoreKey.String()}
		for _, a := range []string{"in_progress_expiration", "expiration_ms", "created_ms"} {
			item[a] = &types.AttributeValueMemberN{Value: far}
		}
		if _, ok := item["v"]; !ok {
			item["v"] = &types.AttributeValueMemberN{Value: "1"}
		}
		if _, err := c.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(s.Config().Table), Item: item}); err != nil {
			t.Fatal(err)
		}
		ran := false
		_, err := idem.Do(context.Background(), e, req, func(context.Context) (string, error) { ran = true; return "", nil })
		if !errors.Is(err, store.ErrCorrupt) || ran {
			t.Errorf("%s: err %v, ran %v; want ErrCorrupt and no run", name, err, ran)
		}
		if _, err := s.Get(context.Background(), id.StoreKey.String()); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("%s: Get: %v, want ErrCorrupt", name, err)
		}
	}
}

func TestUnreachableFailsClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	s, err := dynamostore.New(dynamotest.NewClient("http://"+addr, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }), dynamostore.Config{Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = idem.Do(context.Background(), e, idem.Request{Operation: "s", Key: "k"}, func(context.Context) (int, error) { ran = true; return 1, nil })
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, idem.ErrStore) || ran {
		t.Fatalf("unreachable store: err %v, ran %v; want ErrUnavailable and no run", err, ran)
	}
}

func TestMissingTableIsUnavailable(t *testing.T) {
	s, err := dynamostore.New(dynamotest.NewClient(testenv.DynamoDB(t)), dynamostore.Config{Table: "idem_no_such_table"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Get(context.Background(), "k")
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Get on a missing table: %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	c := dynamotest.NewClient("http://127.0.0.1:1")
	for name, cfg := range map[string]dynamostore.Config{
		"no table":        {},
		"same name twice": {Table: "t", DataAttr: "status"},
		"clash with idem": {Table: "t", ValidationAttr: "fence"},
		"limit too big":   {Table: "t", MaxResultBytes: dynamostore.MaxItemBytes + 1},
		"negative shards": {Table: "t", OpenIndex: "o", StatusShards: -1},
		"too many shards": {Table: "t", OpenIndex: "o", StatusShards: dynamostore.MaxStatusShards + 1},
		"one index twice": {Table: "t", OpenIndex: "i", StatusIndex: "i"},
		"open attr clash": {Table: "t", OpenIndex: "o", OpenAttr: "status"},
	} {
		if _, err := dynamostore.New(c, cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := dynamostore.New(nil, dynamostore.Config{Table: "t"}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil client: %v", err)
	}
}

func TestListStuckThroughStatusIndex(t *testing.T) {
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	s := newStore(t, c, dynamostore.Config{StatusIndex: "by-status"})
	now := time.Now().Add(time.Hour).UnixMilli()
	for i := range 25 {
		leaseLeft := int64(10_000)
		if i%5 == 0 {
			leaseLeft = -1 // stuck
		}
		_, err := s.Claim(context.Background(), store.ClaimParams{Key: fmt.Sprintf("k%02d", i), Owner: "o", Now: now - 100, LeaseUntil: now + leaseLeft, ExpiresAt: now + 60_000})
		if err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	p := store.ListParams{Stuck: true, Now: now, Limit: 2}
	for {
		page, err := s.List(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			got = append(got, r.Key)
		}
		if page.Next == "" {
			break
		}
		p.Cursor = page.Next
	}
	if len(got) != 5 {
		t.Fatalf("stuck records listed: %v, want the 5 stuck ones", got)
	}
	if _, err := s.List(context.Background(), store.ListParams{Cursor: "!!"}); !errors.Is(err, store.ErrInvalidCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
}

// Stores with other partition values may share a composite-key table, and
// its status index: a listing holds only the store's own records.
func TestListSkipsOtherPartitions(t *testing.T) {
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	orders := newStore(t, c, dynamostore.Config{KeyAttr: "pk", SortKeyAttr: "sk", PartitionValue: "orders", StatusIndex: "status-lease"})
	cfg := orders.Config()
	cfg.PartitionValue = "payments"
	payments, err := dynamostore.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Add(time.Hour).UnixMilli()
	for _, s := range []*dynamostore.Store{orders, payments} {
		if _, err := s.Claim(context.Background(), store.ClaimParams{Key: "k-" + s.Config().PartitionValue, Owner: "o", Now: now - 100, LeaseUntil: now - 1, ExpiresAt: now + 60_000}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []store.ListParams{{Stuck: true}, {Status: store.StatusInProgress}, {}} {
		p.Now = now
		page, err := orders.List(context.Background(), p)
		if err != nil || len(page.Records) != 1 || page.Records[0].Key != "k-orders" {
			t.Errorf("List(%+v) = %+v, %v; want k-orders alone", p, page.Records, err)
		}
	}
}

func TestFaults(t *testing.T) {
	ep := testenv.DynamoDB(t)
	tables := map[string]dynamostore.Config{}
	storefaults.Run(t, strings.TrimPrefix(ep, "http://"), func(t *testing.T, addr string) store.Store {
		c := dynamotest.NewClient("http://"+addr, func(o *dynamodb.Options) {
			o.RetryMaxAttempts = 1
			o.HTTPClient = &http.Client{Transport: transport, Timeout: storefaults.Timeout}
		})
		cfg, ok := tables[t.Name()]
		if !ok {
			cfg = newTable(t, dynamotest.NewClient(ep), dynamostore.Config{})
			tables[t.Name()] = cfg
		}
		s, err := dynamostore.New(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// interleaving is an API that calls between(n) before the n-th write
// (from 0) sent through it, so a test can commit another process's write
// between a claim's requests; n counts the writes.
type interleaving struct {
	dynamostore.API
	n       int
	between func(n int)
}

func (a *interleaving) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	a.between(a.n)
	a.n++
	return a.API.PutItem(ctx, in, opts...)
}

func (a *interleaving) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	a.between(a.n)
	a.n++
	return a.API.UpdateItem(ctx, in, opts...)
}

// A claim whose view of the item is outdated by the time it writes still
// decides, on the current item: here another process takes the item over
// between the claim's two requests. The claim used to retry on the fence
// it had seen and could lose that race every round (32 of them, then
// ErrUnavailable).
func TestClaimDecidesWhenTheItemChangesUnderIt(t *testing.T) {
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	const t0 = int64(1_000_000)
	for _, tc := range []struct {
		name      string
		lease     int64 // of the claims taken between the racer's requests
		wantFence uint64
		wantOwner string
	}{
		{"current item claimable: taken over", 1, 3, "racer"},
		{"current item live: conflict", 1_000, 2, "other-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, c, dynamostore.Config{})
			ctx := context.Background()
			claim := func(s *dynamostore.Store, owner string, now, leaseUntil int64) store.ClaimResult {
				t.Helper()
				res, err := s.Claim(ctx, store.ClaimParams{Key: "k", Owner: owner, Fingerprint: "f", Now: now, LeaseUntil: leaseUntil, ExpiresAt: t0 + 3_600_000})
				if err != nil {
					t.Fatalf("claim by %s: %v", owner, err)
				}
				return res
			}
			claim(s, "first", t0, t0+1)
			api := &interleaving{API: c}
			api.between = func(n int) {
				if n >= 1 { // before every write after the first
					now := t0 + 10 + int64(n)
					if res := claim(s, fmt.Sprintf("other-%d", n), now, now+tc.lease); !res.Takeover {
						t.Fatalf("claim %d between the racer's requests did not take over: %+v", n, res)
					}
				}
			}
			racer, err := dynamostore.New(api, s.Config())
			if err != nil {
				t.Fatal(err)
			}
			res := claim(racer, "racer", t0+100, t0+200)
			if res.Acquired != (tc.wantOwner == "racer") || res.Takeover != res.Acquired || res.Record.Owner != tc.wantOwner || res.Record.Fence != tc.wantFence {
				t.Fatalf("claim = %+v, record %+v; want owner %s, fence %d", res, res.Record, tc.wantOwner, tc.wantFence)
			}
			got, err := s.Get(ctx, "k")
			if err != nil || got.Owner != tc.wantOwner || got.Fence != tc.wantFence || got.LeaseUntil != res.Record.LeaseUntil {
				t.Errorf("item after the claim %+v, %v; want the answer's record %+v", got, err, res.Record)
			}
			if api.n != 2 {
				t.Errorf("claim sent %d writes, want 2", api.n)
			}
		})
	}
}

// A settled item corrected by its claim (From) keeps no attribute of its
// former outcome, whether the result is inline or spilled: decodeMeta
// reads the result only of a COMPLETED item and the error only of a FAILED
// one, so the conformance suite cannot see an attribute left behind. Every
// fenced write, Extend with a Ref, a lease, both or neither included, is
// one request.
func TestResettleSpilledResult(t *testing.T) {
	ep := testenv.DynamoDB(t)
	var cnt counter
	sp := &memSpiller{objs: map[string][]byte{}}
	s := newStore(t, dynamotest.NewClient(ep), dynamostore.Config{Spiller: sp, MaxResultBytes: 1000})
	s, _ = dynamostore.New(dynamotest.NewClient(ep, cnt.option), s.Config())
	ctx := context.Background()
	now := time.Now().UnixMilli()
	const key = "rs#1"
	big := []byte(strings.Repeat("x", 5000))
	item := func() map[string]types.AttributeValue {
		t.Helper()
		out, err := dynamotest.NewClient(ep).GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.Config().Table),
			Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: key}}, ConsistentRead: aws.Bool(true)})
		if err != nil {
			t.Fatal(err)
		}
		return out.Item
	}
	has := func(what string, want, absent []string) {
		t.Helper()
		it := item()
		for _, a := range want {
			if _, ok := it[a]; !ok {
				t.Errorf("%s: no attribute %s", what, a)
			}
		}
		for _, a := range absent {
			if _, ok := it[a]; ok {
				t.Errorf("%s: attribute %s left behind", what, a)
			}
		}
	}
	oneRequest := func(what string, err error, before int64) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := cnt.n.Load() - before; n != 1 {
			t.Errorf("%s made %d requests, want 1", what, n)
		}
	}
	if _, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "o", Fingerprint: "f", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 3_600_000}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []store.ExtendParams{{Ref: "exec-1"}, {LeaseUntil: now + 20_000}, {LeaseUntil: now + 30_000, Ref: "exec-2"}, {}} {
		p.Key, p.Fence, p.Owner, p.Now = key, 1, "o", now
		before := cnt.n.Load()
		oneRequest(fmt.Sprintf("Extend %+v", p), s.Extend(ctx, p), before)
	}
	if r, err := s.Get(ctx, key); err != nil || r.Ref != "exec-2" || r.LeaseUntil != now+30_000 {
		t.Fatalf("after the Extends: %+v, %v; want ref exec-2 and lease %d", r, err, now+30_000)
	}
	before := cnt.n.Load()
	oneRequest("Fail", s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 3_600_000, Err: store.ErrorRecord{Code: "c", Message: "m", Body: []byte("b")}}), before)

	before = cnt.n.Load()
	oneRequest("spilled Complete From FAILED", s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", From: store.StatusFailed, Now: now + 1}, ExpiresAt: now + 3_600_001, Result: big}), before)
	has("spilled COMPLETED from FAILED", []string{"data_ref", "ref"}, []string{"data", "error_code", "error_message", "error_body"})
	r, err := s.Get(ctx, key)
	if err != nil || r.Status != store.StatusCompleted || string(r.Result) != string(big) || r.Err != nil || r.Ref != "exec-2" {
		t.Fatalf("spilled COMPLETED from FAILED: %v, %v", r, err)
	}

	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", From: store.StatusCompleted, Now: now + 2}, ExpiresAt: now + 3_600_002, Result: []byte("small")}); err != nil {
		t.Fatal(err)
	}
	has("inline COMPLETED from spilled COMPLETED", []string{"data"}, []string{"data_ref"})
	if r := mustGet(t, s, key); string(r.Result) != "small" {
		t.Fatalf("inline COMPLETED from spilled COMPLETED: result %q", r.Result)
	}
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", From: store.StatusCompleted, Now: now + 3}, ExpiresAt: now + 3_600_003, Result: big}); err != nil {
		t.Fatal(err)
	}
	has("spilled COMPLETED from inline COMPLETED", []string{"data_ref"}, []string{"data"})
	// A refused write spills first: its object must not replace the one
	// the item holds.
	other := []byte(strings.Repeat("y", 5000))
	err = s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", From: store.StatusFailed, Now: now + 4}, ExpiresAt: now + 3_600_004, Result: other})
	var fe *store.FencedError
	if !errors.As(err, &fe) || fe.Status != store.StatusCompleted {
		t.Fatalf("spilled Complete From FAILED of a COMPLETED item: %v, want a *FencedError with status COMPLETED", err)
	}
	if r := mustGet(t, s, key); string(r.Result) != string(big) {
		t.Fatalf("a refused spilled Complete changed the result to %.10q…", r.Result)
	}

	if err := s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", From: store.StatusCompleted, Now: now + 4}, ExpiresAt: now + 3_600_004, Err: store.ErrorRecord{Code: "c"}}); err != nil {
		t.Fatal(err)
	}
	has("FAILED from spilled COMPLETED", []string{"error_code", "ref"}, []string{"data", "data_ref"})
	if r := mustGet(t, s, key); r.Status != store.StatusFailed || r.Result != nil || r.Err == nil || r.Err.Code != "c" {
		t.Fatalf("FAILED from spilled COMPLETED: %+v", r)
	}
	// Settled: a write that expects IN_PROGRESS is refused with the item's
	// status, in one request.
	before = cnt.n.Load()
	err = s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now + 5}, Ref: "exec-3"})
	if !errors.As(err, &fe) || fe.Status != store.StatusFailed || cnt.n.Load()-before != 1 {
		t.Errorf("Extend of a FAILED item: %v, %d requests; want a *FencedError with status FAILED in 1", err, cnt.n.Load()-before)
	}
}

func mustGet(t *testing.T, s *dynamostore.Store, key string) *store.Record {
	t.Helper()
	r, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
