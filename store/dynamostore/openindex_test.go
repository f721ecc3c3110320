package dynamostore_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

// The open index on both key layouts, and with the legacy index beside it
// (the state of a table being migrated, where listings read the legacy
// index): every listing path of the Admin case goes through it or its
// fallbacks.
func TestConformanceOpenIndex(t *testing.T) {
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	for name, cfg := range map[string]dynamostore.Config{
		"open index":                          {OpenIndex: "open-lease"},
		"composite key, open index, 3 shards": {KeyAttr: "pk", SortKeyAttr: "sk", PartitionValue: "idempotency#orders", OpenIndex: "open-lease", StatusShards: 3},
		"open and legacy indexes":             {OpenIndex: "open-lease", StatusIndex: "status-lease"},
	} {
		t.Run(name, func(t *testing.T) {
			storetest.Run(t, storetest.Features{MaxResultBytes: limit, StormGoroutines: 64, LinOps: 2000}, func(t *testing.T) store.Store {
				return newStore(t, c, cfg)
			})
		})
	}
}

// shard is the shard of key among n, computed here with the standard
// library's FNV-1a: the store's own hash must agree with it, so a key's
// shard never changes across releases.
func shard(key string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// storeKey is a realistic store key (operation and SHA-256 digest).
func storeKey(t testing.TB, i int) string {
	t.Helper()
	k, err := idem.NewStoreKey("charge", "", []byte(strconv.Itoa(i)))
	if err != nil {
		t.Fatal(err)
	}
	return k.String()
}

// indexEntries reads the whole open index of cfg's table (a Scan of the
// index): each key it holds and its entry.
func indexEntries(t testing.TB, c *dynamodb.Client, cfg dynamostore.Config) map[string]string {
	t.Helper()
	keyAttr := cfg.KeyAttr
	if cfg.SortKeyAttr != "" {
		keyAttr = cfg.SortKeyAttr
	}
	got := map[string]string{}
	in := &dynamodb.ScanInput{TableName: aws.String(cfg.Table), IndexName: aws.String(cfg.OpenIndex)}
	for {
		out, err := c.Scan(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range out.Items {
			k, okK := it[keyAttr].(*types.AttributeValueMemberS)
			v, okV := it[cfg.OpenAttr].(*types.AttributeValueMemberS)
			if !okK || !okV {
				t.Fatalf("index item without a key or an entry: %v", it)
			}
			got[k.Value] = v.Value
		}
		if len(out.LastEvaluatedKey) == 0 {
			return got
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// Every write keeps the record's entry in the open index in the request
// it makes anyway: open records (IN_PROGRESS, FAILED) are in the index,
// under their status and their key's shard; completed and released ones
// are not, whichever way they got there. And the entries spread over the
// shards.
func TestOpenIndexHoldsOpenRecordsOnly(t *testing.T) {
	ep := testenv.DynamoDB(t)
	var cnt counter
	const shards = 4
	s := newStore(t, dynamotest.NewClient(ep), dynamostore.Config{OpenIndex: "open-lease", StatusShards: shards})
	cfg := s.Config()
	s, _ = dynamostore.New(dynamotest.NewClient(ep, cnt.option), cfg)
	ctx := context.Background()
	now := time.Now().Add(time.Hour).UnixMilli()
	requests := func(want int64, what string, f func() error) {
		t.Helper()
		before := cnt.n.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := cnt.n.Load() - before; n != want {
			t.Errorf("%s made %d requests, want %d", what, n, want)
		}
	}
	claim := func(key, owner string, at, leaseUntil, expiresAt int64) func() error {
		return func() error {
			res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: owner, Fingerprint: "f", Now: at, LeaseUntil: leaseUntil, ExpiresAt: expiresAt})
			if err == nil && !res.Acquired {
				err = fmt.Errorf("not acquired: %+v", res.Record)
			}
			return err
		}
	}
	complete := func(key, owner string, from store.Status, at int64) func() error {
		return func() error {
			return s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: owner, From: from, Now: at}, ExpiresAt: now + 60_000, Result: []byte("r")})
		}
	}
	fail := func(key, owner string, from store.Status, at int64) func() error {
		return func() error {
			return s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: owner, From: from, Now: at}, ExpiresAt: now + 60_000, Err: store.ErrorRecord{Code: "c"}})
		}
	}
	want := map[string]string{} // key → its entry
	entry := func(st store.Status, key string) string { return st.String() + "#" + strconv.Itoa(shard(key, shards)) }
	const n = 9 * 24
	for i := range n {
		key := storeKey(t, i)
		requests(1, "claim", claim(key, "o", now, now+10_000, now+60_000))
		switch i % 9 {
		case 0, 1: // in progress
			want[key] = entry(store.StatusInProgress, key)
		case 2:
			requests(1, "Complete", complete(key, "o", 0, now))
		case 3:
			requests(1, "Fail", fail(key, "o", 0, now))
			want[key] = entry(store.StatusFailed, key)
		case 4:
			requests(1, "Fail", fail(key, "o", 0, now))
			requests(1, "Complete From FAILED", complete(key, "o", store.StatusFailed, now+1))
		case 5:
			requests(1, "Complete", complete(key, "o", 0, now))
			requests(1, "Fail From COMPLETED", fail(key, "o", store.StatusCompleted, now+1))
			want[key] = entry(store.StatusFailed, key)
		case 6:
			requests(1, "Release", func() error {
				return s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now}})
			})
		case 7: // taken over after its lease, then completed by the new claim
			requests(2, "takeover", claim(key, "o2", now+20_000, now+30_000, now+60_000))
			requests(1, "Complete", func() error {
				return s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 2, Owner: "o2", Now: now + 20_000}, ExpiresAt: now + 60_000, Result: []byte("r")})
			})
		case 8: // completed, expired, claimed again: in progress
			requests(1, "Complete", func() error {
				return s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 1, Result: []byte("r")})
			})
			requests(2, "claim of an expired record", claim(key, "o3", now+2, now+10_000, now+60_000))
			requests(1, "Extend", func() error {
				return s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: key, Fence: 2, Owner: "o3", Now: now + 3}, LeaseUntil: now + 20_000, Ref: "x"})
			})
			want[key] = entry(store.StatusInProgress, key)
		}
	}
	got := indexEntries(t, dynamotest.NewClient(ep), cfg)
	if !maps.Equal(got, want) {
		for k, v := range got {
			if want[k] != v {
				r, _ := s.Get(ctx, k)
				t.Errorf("index holds %s under %q, want %q (record %+v)", k, v, want[k], r)
			}
		}
		for k, v := range want {
			if _, ok := got[k]; !ok {
				t.Errorf("index misses %s (want %q)", k, v)
			}
		}
	}
	perShard := make([]int, shards)
	for k := range want {
		perShard[shard(k, shards)]++
	}
	for i, m := range perShard {
		if even := len(want) / shards; m < even/2 || m > even*3/2 {
			t.Errorf("shard %d holds %d of %d entries: %v, want them spread evenly", i, m, len(want), perShard)
		}
	}
}

// listAll pages through a listing with p.Limit, checking each page's
// size, and returns the records in the order listed.
func listAll(t testing.TB, s *dynamostore.Store, p store.ListParams) []*store.Record {
	t.Helper()
	var all []*store.Record
	for range 1000 {
		page, err := s.List(context.Background(), p)
		if err != nil {
			t.Fatalf("List(%+v): %v", p, err)
		}
		if len(page.Records) > p.PageSize() || (len(page.Records) == 0 && page.Next != "") {
			t.Fatalf("List(%+v) returned %d records and cursor %q", p, len(page.Records), page.Next)
		}
		all = append(all, page.Records...)
		if page.Next == "" {
			return all
		}
		p.Cursor = page.Next
	}
	t.Fatal("List never ended")
	return nil
}

func keysOf(rs []*store.Record) []string {
	var ks []string
	for _, r := range rs {
		ks = append(ks, r.Key)
	}
	slices.Sort(ks)
	return ks
}

// Listing through the open index queries every shard and merges them by
// lease: every page size lists each record once, the longest stuck first;
// a page of the whole listing costs one Query per shard; completed records
// come from the Scan; a cursor only continues the listing it came from.
func TestListOpenIndex(t *testing.T) {
	ep := testenv.DynamoDB(t)
	var cnt counter
	const shards = 4
	s := newStore(t, dynamotest.NewClient(ep), dynamostore.Config{OpenIndex: "open-lease", StatusShards: shards})
	s, _ = dynamostore.New(dynamotest.NewClient(ep, cnt.option), s.Config())
	ctx := context.Background()
	now := time.Now().Add(time.Hour).UnixMilli()
	want := map[string][]string{}
	put := func(i int, st store.Status, leaseUntil, expiresAt int64) {
		key := storeKey(t, i)
		if _, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "o", Now: now - 100_000, LeaseUntil: leaseUntil, ExpiresAt: expiresAt}); err != nil {
			t.Fatal(err)
		}
		var err error
		switch st {
		case store.StatusCompleted:
			err = s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now - 100_000}, ExpiresAt: expiresAt, Result: []byte("r")})
		case store.StatusFailed:
			err = s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now - 100_000}, ExpiresAt: expiresAt, Err: store.ErrorRecord{Code: "c"}})
		}
		if err != nil {
			t.Fatal(err)
		}
		if expiresAt > now {
			want[st.String()] = append(want[st.String()], key)
			if st == store.StatusInProgress && leaseUntil <= now {
				want["stuck"] = append(want["stuck"], key)
			}
		}
	}
	i := 0
	for range 30 { // stuck, leases ending at different times, some at the same
		put(i, store.StatusInProgress, now-int64(i%13)*1000, now+60_000)
		i++
	}
	for range 10 { // live
		put(i, store.StatusInProgress, now+10_000+int64(i), now+60_000)
		i++
	}
	for range 3 { // stuck but expired: never listed
		put(i, store.StatusInProgress, now-90_000, now-1)
		i++
	}
	for range 12 {
		put(i, store.StatusFailed, now+10_000, now+60_000)
		i++
	}
	for range 6 {
		put(i, store.StatusCompleted, now+10_000, now+60_000)
		i++
	}
	for name, p := range map[string]store.ListParams{
		"stuck":       {Stuck: true},
		"IN_PROGRESS": {Status: store.StatusInProgress},
		"FAILED":      {Status: store.StatusFailed},
		"COMPLETED":   {Status: store.StatusCompleted},
	} {
		for _, pageSize := range []int{1, 2, 5, 100} {
			p.Now, p.Limit = now, pageSize
			got := listAll(t, s, p)
			if ks, w := keysOf(got), slices.Sorted(slices.Values(want[name])); !slices.Equal(ks, w) {
				t.Errorf("%s, pages of %d: listed %d records %v, want %d: %v", name, pageSize, len(ks), ks, len(w), w)
			}
			if name != "COMPLETED" && !slices.IsSortedFunc(got, func(a, b *store.Record) int { return int(a.LeaseUntil - b.LeaseUntil) }) {
				t.Errorf("%s, pages of %d: not in lease order", name, pageSize)
			}
		}
	}
	before := cnt.n.Load()
	if page, err := s.List(ctx, store.ListParams{Stuck: true, Now: now}); err != nil || len(page.Records) != 30 || page.Next != "" {
		t.Fatalf("stuck records in one page: %d, %q, %v", len(page.Records), page.Next, err)
	}
	if n := cnt.n.Load() - before; n != shards {
		t.Errorf("a listing of every stuck record made %d requests, want %d (one Query per shard)", n, shards)
	}

	// A cursor continues only the listing it came from.
	next := func(p store.ListParams) string {
		t.Helper()
		p.Now, p.Limit = now, 1
		page, err := s.List(ctx, p)
		if err != nil || page.Next == "" {
			t.Fatalf("List(%+v): %v, no cursor", p, err)
		}
		return page.Next
	}
	stuckCursor, completedCursor := next(store.ListParams{Stuck: true}), next(store.ListParams{Status: store.StatusCompleted})
	eight, err := dynamostore.New(dynamotest.NewClient(ep), dynamostore.Config{Table: s.Config().Table, OpenIndex: "open-lease"})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		s *dynamostore.Store
		p store.ListParams
	}{
		"IN_PROGRESS cursor listing FAILED":   {s, store.ListParams{Status: store.StatusFailed, Cursor: stuckCursor}},
		"open-index cursor listing COMPLETED": {s, store.ListParams{Status: store.StatusCompleted, Cursor: stuckCursor}},
		"Scan cursor listing IN_PROGRESS":     {s, store.ListParams{Status: store.StatusInProgress, Cursor: completedCursor}},
		"4-shard cursor with 8 shards":        {eight, store.ListParams{Stuck: true, Cursor: stuckCursor}},
		"garbage":                             {s, store.ListParams{Stuck: true, Cursor: "o.!!"}},
	} {
		tc.p.Now = now
		if _, err := tc.s.List(ctx, tc.p); !errors.Is(err, store.ErrInvalidCursor) {
			t.Errorf("%s: %v, want ErrInvalidCursor", name, err)
		}
	}
}

// addOpenIndex adds the open index to an existing table, as an operator
// does (UpdateTable), and waits until it is ACTIVE.
func addOpenIndex(t *testing.T, c *dynamodb.Client, cfg dynamostore.Config) {
	t.Helper()
	ctx := context.Background()
	_, err := c.UpdateTable(ctx, &dynamodb.UpdateTableInput{
		TableName: aws.String(cfg.Table),
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(cfg.OpenAttr), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(cfg.LeaseAttr), AttributeType: types.ScalarAttributeTypeN},
		},
		GlobalSecondaryIndexUpdates: []types.GlobalSecondaryIndexUpdate{{Create: &types.CreateGlobalSecondaryIndexAction{
			IndexName: aws.String(cfg.OpenIndex),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String(cfg.OpenAttr), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String(cfg.LeaseAttr), KeyType: types.KeyTypeRange},
			},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(cfg.Table)})
		if err != nil {
			t.Fatal(err)
		}
		for _, gsi := range out.Table.GlobalSecondaryIndexes {
			if aws.ToString(gsi.IndexName) == cfg.OpenIndex && gsi.IndexStatus == types.IndexStatusActive {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("index %s not ACTIVE after a minute", cfg.OpenIndex)
		}
		time.Sleep(100 * time.Millisecond) // DynamoDB's pace, not the test's clock
	}
}

// The migration from the legacy status index, step by step, on a table
// the old layout made (composite key, so another partition shares it):
// add the open index, write with both indexes (listings still read the
// legacy one), backfill with MigrateStatusIndex, then list through the
// open index alone. A completed record whose entry a process without
// the open index left behind is skipped by listings and cleaned up by the
// migration; lowering StatusShards needs the migration too.
func TestMigrateStatusIndex(t *testing.T) {
	ep := testenv.DynamoDB(t)
	c := dynamotest.NewClient(ep)
	ctx := context.Background()
	oldCfg := newTable(t, c, dynamostore.Config{KeyAttr: "pk", SortKeyAttr: "sk", PartitionValue: "orders", StatusIndex: "status-lease"})
	open := func(cfg dynamostore.Config) *dynamostore.Store {
		t.Helper()
		s, err := dynamostore.New(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	old := open(oldCfg)
	otherCfg := oldCfg
	otherCfg.PartitionValue = "payments"
	other := open(otherCfg)
	now := time.Now().Add(time.Hour).UnixMilli()
	want := map[string][]string{}
	put := func(s *dynamostore.Store, key string, st store.Status, leaseUntil int64) {
		t.Helper()
		if _, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "o", Now: now - 100_000, LeaseUntil: leaseUntil, ExpiresAt: now + 60_000}); err != nil {
			t.Fatal(err)
		}
		var err error
		switch st {
		case store.StatusCompleted:
			err = s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now - 100_000}, ExpiresAt: now + 60_000, Result: []byte("r")})
		case store.StatusFailed:
			err = s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: key, Fence: 1, Owner: "o", Now: now - 100_000}, ExpiresAt: now + 60_000, Err: store.ErrorRecord{Code: "c"}})
		}
		if err != nil {
			t.Fatal(err)
		}
		if s == other {
			return
		}
		want[st.String()] = append(want[st.String()], key)
		if st == store.StatusInProgress && leaseUntil <= now {
			want["stuck"] = append(want["stuck"], key)
		}
	}
	i := 0
	for _, n := range []struct {
		st    store.Status
		lease int64
		n     int
	}{{store.StatusInProgress, now - 1, 5}, {store.StatusInProgress, now + 10_000, 7}, {store.StatusFailed, now + 10_000, 6}, {store.StatusCompleted, now + 10_000, 4}} {
		for range n.n {
			put(old, storeKey(t, i), n.st, n.lease)
			i++
		}
	}
	put(other, storeKey(t, 1000), store.StatusInProgress, now-1)
	check := func(what string, s *dynamostore.Store) {
		t.Helper()
		for name, p := range map[string]store.ListParams{
			"stuck": {Stuck: true}, "IN_PROGRESS": {Status: store.StatusInProgress},
			"FAILED": {Status: store.StatusFailed}, "COMPLETED": {Status: store.StatusCompleted},
		} {
			p.Now, p.Limit = now, 3
			if got, w := keysOf(listAll(t, s, p)), slices.Sorted(slices.Values(want[name])); !slices.Equal(got, w) {
				t.Errorf("%s: %s listed %d records, want %d", what, name, len(got), len(w))
			}
		}
	}
	check("old layout", old)

	// 1. Add the index; 2. every process writes with both indexes set.
	bothCfg := oldCfg
	bothCfg.OpenIndex = "open-lease"
	both := open(bothCfg)
	bothCfg = both.Config()
	addOpenIndex(t, c, bothCfg)
	for range 2 {
		put(both, storeKey(t, i), store.StatusInProgress, now-1)
		i++
	}
	// A record completed by a process still without the open index keeps
	// its entry.
	stale := storeKey(t, i)
	if _, err := both.Claim(ctx, store.ClaimParams{Key: stale, Owner: "o", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000}); err != nil {
		t.Fatal(err)
	}
	if err := old.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: stale, Fence: 1, Owner: "o", Now: now}, ExpiresAt: now + 60_000, Result: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	want["COMPLETED"] = append(want["COMPLETED"], stale)
	check("both indexes, listing the legacy one", both)

	openCfg := bothCfg
	openCfg.StatusIndex = ""
	openOnly := open(openCfg)
	newOnes := want["stuck"][len(want["stuck"])-2:]
	if entries := indexEntries(t, c, bothCfg); len(entries) != 3 || entries[newOnes[0]] == "" || entries[newOnes[1]] == "" || entries[stale] == "" {
		t.Errorf("before the backfill, the open index holds %v, want the 2 records written with it and the stale entry", entries)
	}
	// The stale entry is skipped: it is not the record's status.
	if got := keysOf(listAll(t, openOnly, store.ListParams{Status: store.StatusInProgress, Now: now})); !slices.Equal(got, slices.Sorted(slices.Values(newOnes))) {
		t.Errorf("before the backfill, the open index lists %v, want the 2 records written with it", got)
	}

	// 3. Backfill, beside another partition's items, which stay as they are.
	if _, err := old.MigrateStatusIndex(ctx, dynamostore.MigrateParams{}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("MigrateStatusIndex without an open index: %v, want ErrInvalidConfig", err)
	}
	res, err := both.MigrateStatusIndex(ctx, dynamostore.MigrateParams{Now: now})
	if wantRes := (dynamostore.MigrateResult{Scanned: 5 + 7 + 6 + 2 + 1, Updated: 5 + 7 + 6 + 1}); err != nil || res != wantRes {
		t.Errorf("MigrateStatusIndex = %+v, %v; want %+v", res, err, wantRes)
	}
	entries := indexEntries(t, c, bothCfg)
	if _, ok := entries[stale]; ok || len(entries) != len(want["IN_PROGRESS"])+len(want["FAILED"]) {
		t.Errorf("after the backfill, the open index holds %d entries (stale one: %v), want %d", len(entries), ok, len(want["IN_PROGRESS"])+len(want["FAILED"]))
	}
	// 4. List through the open index alone (and drop the legacy index).
	check("open index after the backfill", openOnly)
	if res, err := both.MigrateStatusIndex(ctx, dynamostore.MigrateParams{Now: now}); err != nil || res.Updated != 0 || res.Raced != 0 {
		t.Errorf("second MigrateStatusIndex = %+v, %v; want nothing to do", res, err)
	}

	// Fewer shards: the entries in the shards dropped are moved.
	twoCfg := openCfg
	twoCfg.StatusShards = 2
	two := open(twoCfg)
	res, err = two.MigrateStatusIndex(ctx, dynamostore.MigrateParams{Now: now, Segment: 0, TotalSegments: 1})
	if err != nil || res.Updated == 0 {
		t.Errorf("MigrateStatusIndex to 2 shards = %+v, %v; want entries moved", res, err)
	}
	check("open index, 2 shards", two)
	for k, v := range indexEntries(t, c, twoCfg) {
		if !strings.HasSuffix(v, "#"+strconv.Itoa(shard(k, 2))) {
			t.Errorf("%s is under %s after the migration to 2 shards", k, v)
		}
	}
}
