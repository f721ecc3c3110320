package dynamostore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem/store"
)

// List implements [store.Lister] for operators. The access path, cheapest
// first:
//
//   - with Config.OpenIndex (and no StatusIndex) and a filter on
//     IN_PROGRESS, FAILED or stuck records: a Query of every shard of the
//     open index (status#shard = S, and lease <= now for stuck records),
//     merged by lease: oldest lease first, so the longest stuck come
//     first. Each page queries the shards it has not finished, in
//     parallel, and reads more of one shard when the merge runs out of it;
//     the cursor holds each shard's position.
//   - with Config.StatusIndex and a status or stuck filter: a Query on the
//     legacy status index (status = S, and lease <= now for stuck records).
//   - with a composite key: a strongly consistent Query on the static
//     partition.
//   - otherwise: a Scan of the table, filtered here. Fine for development
//     and small tables; create the open index for large ones. COMPLETED
//     records are never in the open index: listing them, or everything,
//     takes this path or the previous one.
//
// Global secondary indexes are eventually consistent: through one, a
// record written a moment ago may be missing or show its previous status.
// Every item read is checked here against p ([store.ListParams.Matches])
// by its own status, so the open-index entry of a record completed by a
// writer that does not maintain it (a process without Config.OpenIndex)
// is skipped.
//
// Items idem did not write are skipped; spilled results are not loaded
// (Result is nil). A damaged idem item fails the listing with
// store.ErrCorrupt naming its key. A cursor from another listing (another
// path, status or Config.StatusShards) fails with store.ErrInvalidCursor.
func (s *Store) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	c, err := decodeCursor(p.Cursor)
	if err != nil {
		return store.ListResult{}, err
	}
	if st, ok := s.openListing(p); ok {
		if c.start != nil {
			return store.ListResult{}, invalidCursor("a cursor of a listing that is not through the open index")
		}
		return s.listOpen(ctx, p, st, c.open)
	}
	if c.open != nil {
		return store.ListResult{}, invalidCursor("a cursor of an open-index listing")
	}
	var out store.ListResult
	start := c.start
	limit := p.PageSize()
	var lastItem map[string]types.AttributeValue
	for {
		items, next, err := s.page(ctx, p, start)
		if err != nil {
			return store.ListResult{}, err
		}
		for _, it := range items {
			r, err := s.listed(p, it)
			if err != nil {
				return store.ListResult{}, err
			}
			if r == nil {
				continue
			}
			if len(out.Records) == limit {
				out.Next = cursor{start: s.cursorOf(lastItem, s.useIndex(p))}.encode()
				return out, nil
			}
			out.Records = append(out.Records, r)
			lastItem = it
		}
		if len(next) == 0 {
			return out, nil
		}
		start = next
	}
}

// listed is the record of an item read by a listing when p selects it,
// else nil. Items idem did not write are skipped, and so are those of
// another partition value sharing a composite-key table, which its
// indexes and Scans also hold.
func (s *Store) listed(p store.ListParams, it map[string]types.AttributeValue) (*store.Record, error) {
	if _, ours := it[attrVersion]; !ours {
		return nil, nil
	}
	if pv, _ := strAttr(it[s.cfg.KeyAttr]); s.cfg.SortKeyAttr != "" && pv != s.cfg.PartitionValue {
		return nil, nil
	}
	r, _, err := s.decodeMeta(s.keyOfItem(it), it)
	if err != nil || !p.Matches(r) {
		return nil, err
	}
	return r, nil
}

// useIndex reports whether a listing goes through the legacy status index.
func (s *Store) useIndex(p store.ListParams) bool {
	return s.cfg.StatusIndex != "" && (p.Status.Valid() || p.Stuck)
}

// openListing reports whether a listing goes through the open index, and
// the status whose shards it queries. With StatusIndex also set, listings
// read that one: it holds every record while the open index may still be
// missing the ones written before it.
func (s *Store) openListing(p store.ListParams) (store.Status, bool) {
	if s.cfg.OpenIndex == "" || s.cfg.StatusIndex != "" {
		return 0, false
	}
	switch {
	case p.Stuck:
		return store.StatusInProgress, true
	case p.Status == store.StatusInProgress || p.Status == store.StatusFailed:
		return p.Status, true
	}
	return 0, false
}

// openQueries bounds the Queries one listing sends at once.
const openQueries = 8

// shardRead is one shard's part in a page of an open-index listing.
type shardRead struct {
	items []map[string]types.AttributeValue // read, not yet consumed
	more  bool                              // the shard has items after those read
	start map[string]types.AttributeValue   // where its next Query starts (nil: at its start)
	pos   shardPos                          // where the next page continues: after the last item consumed
}

// listOpen lists the records of status st, or the stuck ones, from every
// shard of the open index, merged by lease. Its cursor c (nil for the
// first page) holds a position per shard. An item is consumed, and its
// shard's position moves past it, when it is listed or skipped; the page
// ends when it holds p's limit and one more record is found, so a page
// with a Next cursor is never followed by an empty one.
func (s *Store) listOpen(ctx context.Context, p store.ListParams, st store.Status, c *openCursor) (store.ListResult, error) {
	n := s.cfg.StatusShards
	if c == nil {
		c = &openCursor{status: st, shards: make([]shardPos, n)}
	} else if err := s.checkOpenCursor(c, st); err != nil {
		return store.ListResult{}, err
	}
	limit := p.PageSize()
	// Enough of every shard for its share of a page, twice over, so the
	// merge seldom has to read a shard again.
	chunk := int32(min(max(2*(limit/n+1), 10), 1000))
	shards := make([]shardRead, n)
	var pending []int
	for i, pos := range c.shards {
		shards[i] = shardRead{pos: pos, more: !pos.done, start: pos.after}
		if !pos.done {
			pending = append(pending, i)
		}
	}
	if err := s.readShards(ctx, p, st, shards, pending, chunk); err != nil {
		return store.ListResult{}, err
	}
	var out store.ListResult
	for {
		i := s.nextShard(shards)
		if i < 0 {
			return out, nil
		}
		sh := &shards[i]
		it := sh.items[0]
		r, err := s.listed(p, it)
		if err != nil {
			return store.ListResult{}, err
		}
		if r != nil {
			if len(out.Records) == limit {
				next := &openCursor{status: st, shards: make([]shardPos, n)}
				for j := range shards {
					next.shards[j] = shards[j].pos
				}
				out.Next = cursor{open: next}.encode()
				return out, nil
			}
			out.Records = append(out.Records, r)
		}
		sh.items, sh.pos = sh.items[1:], shardPos{after: s.openKeyOf(it)}
		if len(sh.items) == 0 {
			if err := s.readShard(ctx, p, st, i, sh, chunk); err != nil {
				return store.ListResult{}, err
			}
			if len(sh.items) == 0 {
				sh.pos = shardPos{done: true}
			}
		}
	}
}

// readShards reads the first items of the shards pending, at most
// openQueries at once, and marks those read to their end done.
func (s *Store) readShards(ctx context.Context, p store.ListParams, st store.Status, shards []shardRead, pending []int, chunk int32) error {
	errs := make([]error, len(shards))
	sem := make(chan struct{}, openQueries)
	var wg sync.WaitGroup
	for _, i := range pending {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = s.readShard(ctx, p, st, i, &shards[i], chunk)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, i := range pending {
		if len(shards[i].items) == 0 {
			shards[i].pos = shardPos{done: true}
		}
	}
	return nil
}

// readShard reads the next items of shard i into sh, if it has more:
// Queries until one returns items or the shard ends.
func (s *Store) readShard(ctx context.Context, p store.ListParams, st store.Status, i int, sh *shardRead, chunk int32) error {
	cond := "#open = :open"
	vals := map[string]types.AttributeValue{":open": str(openShardValue(st, i))}
	ph := []string{"#open"}
	if p.Stuck {
		cond += " AND #lease <= :now"
		vals[":now"] = num(p.Now)
		ph = append(ph, "#lease")
	}
	for sh.more && len(sh.items) == 0 {
		out, err := s.api.Query(ctx, &dynamodb.QueryInput{
			TableName: aws.String(s.cfg.Table), IndexName: aws.String(s.cfg.OpenIndex),
			KeyConditionExpression: aws.String(cond), ExpressionAttributeNames: s.pick(ph...),
			ExpressionAttributeValues: vals, ExclusiveStartKey: sh.start, Limit: aws.Int32(chunk),
		})
		if err != nil {
			return s.translate("list", "", err)
		}
		sh.items, sh.start, sh.more = out.Items, out.LastEvaluatedKey, len(out.LastEvaluatedKey) > 0
	}
	return nil
}

// nextShard is the shard whose first unconsumed item has the lowest lease
// (the lowest shard among equals); -1 when every shard is consumed.
func (s *Store) nextShard(shards []shardRead) int {
	best, bestLease := -1, int64(0)
	for i := range shards {
		if len(shards[i].items) == 0 {
			continue
		}
		lease, _ := numAttr(shards[i].items[0][s.cfg.LeaseAttr])
		if best < 0 || lease < bestLease {
			best, bestLease = i, lease
		}
	}
	return best
}

// openKeyOf is the open-index ExclusiveStartKey continuing after item.
func (s *Store) openKeyOf(it map[string]types.AttributeValue) map[string]types.AttributeValue {
	k := s.cursorOf(it, false)
	k[s.cfg.OpenAttr], k[s.cfg.LeaseAttr] = it[s.cfg.OpenAttr], it[s.cfg.LeaseAttr]
	return k
}

// checkOpenCursor checks that c continues a listing of status st on this
// store's open index: its shard count, and each position a key of the
// index in its shard. DynamoDB would refuse anything else, as unavailable.
func (s *Store) checkOpenCursor(c *openCursor, st store.Status) error {
	if c.status != st {
		return invalidCursor(fmt.Sprintf("a cursor of a listing of %s records, not %s", c.status, st))
	}
	if len(c.shards) != s.cfg.StatusShards {
		return invalidCursor(fmt.Sprintf("a cursor of %d shards; Config.StatusShards is %d", len(c.shards), s.cfg.StatusShards))
	}
	want := []string{s.cfg.KeyAttr, s.cfg.OpenAttr, s.cfg.LeaseAttr}
	if s.cfg.SortKeyAttr != "" {
		want = append(want, s.cfg.SortKeyAttr)
	}
	for i, sh := range c.shards {
		if sh.after == nil {
			continue
		}
		bad := invalidCursor(fmt.Sprintf("shard %d is not at a key of the open index", i))
		if len(sh.after) != len(want) {
			return bad
		}
		for _, a := range want {
			v := sh.after[a] // nil when missing: neither S nor N
			var ok bool
			switch a {
			case s.cfg.LeaseAttr:
				_, ok = numAttr(v)
			case s.cfg.OpenAttr:
				open, isStr := strAttr(v)
				ok = isStr && open == openShardValue(st, i)
			default:
				_, ok = strAttr(v)
			}
			if !ok {
				return bad
			}
		}
	}
	return nil
}

// page reads one page of candidate items.
func (s *Store) page(ctx context.Context, p store.ListParams, start map[string]types.AttributeValue) ([]map[string]types.AttributeValue, map[string]types.AttributeValue, error) {
	limit := aws.Int32(int32(min(max(p.PageSize()*2, 100), 1000)))
	switch {
	case s.useIndex(p):
		st := p.Status
		if p.Stuck {
			st = store.StatusInProgress
		}
		cond := "#st = :st"
		vals := map[string]types.AttributeValue{":st": str(st.String())}
		names := s.pick("#st")
		if p.Stuck {
			cond += " AND #lease <= :now"
			vals[":now"] = num(p.Now)
			names = s.pick("#st", "#lease")
		}
		out, err := s.api.Query(ctx, &dynamodb.QueryInput{
			TableName: aws.String(s.cfg.Table), IndexName: aws.String(s.cfg.StatusIndex),
			KeyConditionExpression: aws.String(cond), ExpressionAttributeNames: names,
			ExpressionAttributeValues: vals, ExclusiveStartKey: start, Limit: limit,
		})
		if err != nil {
			return nil, nil, s.translate("list", "", err)
		}
		return out.Items, out.LastEvaluatedKey, nil
	case s.cfg.SortKeyAttr != "":
		out, err := s.api.Query(ctx, &dynamodb.QueryInput{
			TableName: aws.String(s.cfg.Table), ConsistentRead: aws.Bool(true),
			KeyConditionExpression:    aws.String("#pk = :pk"),
			ExpressionAttributeNames:  s.pick("#pk"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":pk": str(s.cfg.PartitionValue)},
			ExclusiveStartKey:         start, Limit: limit,
		})
		if err != nil {
			return nil, nil, s.translate("list", "", err)
		}
		return out.Items, out.LastEvaluatedKey, nil
	default:
		out, err := s.api.Scan(ctx, &dynamodb.ScanInput{
			TableName: aws.String(s.cfg.Table), ConsistentRead: aws.Bool(true),
			ExclusiveStartKey: start, Limit: limit,
		})
		if err != nil {
			return nil, nil, s.translate("list", "", err)
		}
		return out.Items, out.LastEvaluatedKey, nil
	}
}

// keyOfItem is the idempotency key an item holds.
func (s *Store) keyOfItem(it map[string]types.AttributeValue) string {
	attr := s.cfg.KeyAttr
	if s.cfg.SortKeyAttr != "" {
		attr = s.cfg.SortKeyAttr
	}
	k, _ := strAttr(it[attr])
	return k
}

// cursorOf is the ExclusiveStartKey continuing after item: the table's key
// attributes, plus the index's when the listing goes through it.
func (s *Store) cursorOf(it map[string]types.AttributeValue, index bool) map[string]types.AttributeValue {
	c := map[string]types.AttributeValue{s.cfg.KeyAttr: it[s.cfg.KeyAttr]}
	if s.cfg.SortKeyAttr != "" {
		c[s.cfg.SortKeyAttr] = it[s.cfg.SortKeyAttr]
	}
	if index {
		c[s.cfg.StatusAttr], c[s.cfg.LeaseAttr] = it[s.cfg.StatusAttr], it[s.cfg.LeaseAttr]
	}
	return c
}

// A cursor is where a listing continues. A listing made of one request
// per page (a Scan, a Query of the partition or of the legacy index)
// continues at an ExclusiveStartKey: base64url JSON, name → {"S": v} or
// {"N": v}. An open-index listing continues at one position per shard:
// "o." and base64url JSON {"st": status, "sh": [position, ...]}, a
// position being {} (not started), {"d": true} (read to its end) or
// {"k": ExclusiveStartKey}. "." is not base64url, so the two forms never
// meet.
type cursor struct {
	start map[string]types.AttributeValue
	open  *openCursor
}

// openCursor is the position of an open-index listing in each shard of
// the status it lists.
type openCursor struct {
	status store.Status
	shards []shardPos
}

// shardPos is a listing's position in one shard: done when the shard is
// read to its end, else after (nil: from the start).
type shardPos struct {
	done  bool
	after map[string]types.AttributeValue
}

// openCursorPrefix starts an open-index listing's cursor.
const openCursorPrefix = "o."

type cursorValue struct {
	S *string `json:"S,omitempty"`
	N *string `json:"N,omitempty"`
}

type openCursorJSON struct {
	Status string      `json:"st"`
	Shards []shardJSON `json:"sh"`
}

type shardJSON struct {
	Done bool                   `json:"d,omitempty"`
	Key  map[string]cursorValue `json:"k,omitempty"`
}

// encode returns the cursor's text; "" for the zero cursor.
func (c cursor) encode() string {
	var v any
	switch {
	case c.open != nil:
		o := openCursorJSON{Status: c.open.status.String(), Shards: make([]shardJSON, len(c.open.shards))}
		for i, sh := range c.open.shards {
			o.Shards[i] = shardJSON{Done: sh.done, Key: keyJSON(sh.after)}
		}
		v = o
	case len(c.start) > 0:
		v = keyJSON(c.start)
	default:
		return ""
	}
	b, _ := json.Marshal(v) // strings, bools and slices of them: cannot fail
	if c.open != nil {
		return openCursorPrefix + base64.RawURLEncoding.EncodeToString(b)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// keyJSON is the JSON form of a key's string and number attributes; nil
// for none.
func keyJSON(k map[string]types.AttributeValue) map[string]cursorValue {
	if len(k) == 0 {
		return nil
	}
	m := make(map[string]cursorValue, len(k))
	for name, v := range k {
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			m[name] = cursorValue{S: aws.String(v.Value)}
		case *types.AttributeValueMemberN:
			m[name] = cursorValue{N: aws.String(v.Value)}
		}
	}
	return m
}

func invalidCursor(why string) error {
	return fmt.Errorf("dynamostore: invalid list cursor (%s): %w", why, store.ErrInvalidCursor)
}

// decodeCursor reads a cursor made by encode; anything else fails with
// store.ErrInvalidCursor.
func decodeCursor(c string) (cursor, error) {
	if c == "" {
		return cursor{}, nil
	}
	if rest, ok := strings.CutPrefix(c, openCursorPrefix); ok {
		o, err := decodeOpenCursor(rest)
		return cursor{open: o}, err
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return cursor{}, invalidCursor("not base64url")
	}
	var m map[string]cursorValue
	if err := json.Unmarshal(b, &m); err != nil || len(m) == 0 {
		return cursor{}, invalidCursor("not a cursor")
	}
	k, err := keyOfJSON(m)
	return cursor{start: k}, err
}

func decodeOpenCursor(c string) (*openCursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return nil, invalidCursor("not base64url")
	}
	var o openCursorJSON
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, invalidCursor("not an open-index cursor")
	}
	st, err := store.ParseStatus(o.Status)
	if err != nil || (st != store.StatusInProgress && st != store.StatusFailed) {
		return nil, invalidCursor(fmt.Sprintf("status %q is not in the open index", o.Status))
	}
	if len(o.Shards) == 0 || len(o.Shards) > MaxStatusShards {
		return nil, invalidCursor(fmt.Sprintf("%d shards, not 1..%d", len(o.Shards), MaxStatusShards))
	}
	oc := &openCursor{status: st, shards: make([]shardPos, len(o.Shards))}
	for i, sh := range o.Shards {
		if sh.Key == nil {
			oc.shards[i].done = sh.Done
			continue
		}
		if sh.Done || len(sh.Key) == 0 {
			return nil, invalidCursor(fmt.Sprintf("shard %d is neither done nor at a key", i))
		}
		if oc.shards[i].after, err = keyOfJSON(sh.Key); err != nil {
			return nil, err
		}
	}
	return oc, nil
}

// keyOfJSON is the key of its JSON form.
func keyOfJSON(m map[string]cursorValue) (map[string]types.AttributeValue, error) {
	k := make(map[string]types.AttributeValue, len(m))
	for name, v := range m {
		switch {
		case v.S != nil && v.N == nil:
			k[name] = str(*v.S)
		case v.N != nil && v.S == nil:
			k[name] = &types.AttributeValueMemberN{Value: *v.N}
		default:
			return nil, invalidCursor("attribute " + name + " is neither S nor N")
		}
	}
	return k, nil
}
