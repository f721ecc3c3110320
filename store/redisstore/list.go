package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/store"
)

// List implements [store.Lister] with SCAN over Config.Prefix and one
// pipelined GET per batch. SCAN's promise holds: a record present for the
// whole listing is listed at least once (a record may be listed twice).
//
// On Redis Cluster, SCAN sees one node, so List scans every master in
// turn, in the order of their lowest slot. The cursor names the slots whose
// masters have been scanned whole, the master being scanned (its node ID),
// its SCAN cursor and the last key returned. A listing resumed after the
// topology changed (a failover, a resharding) goes on from the lowest slot
// not yet covered: if another node serves it now, that node is scanned
// from the start, so a record whose slot had not been covered is still
// listed (perhaps twice), never skipped.
func (s *Store) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	if s.cluster != nil {
		return s.listCluster(ctx, p)
	}
	cur, after, err := parseCursor(p.Cursor)
	if err != nil {
		return store.ListResult{}, err
	}
	var out store.ListResult
	next, done, err := s.scanNode(ctx, s.c, p, cur, after, &out)
	if err != nil || done {
		return out, err
	}
	out.Next = next
	return out, nil
}

// scanNode lists the records of one node (c: a plain client, or one
// master of a cluster) from SCAN cursor cur, after the Redis key after,
// into out until out holds a page. It returns done when the node's SCAN
// ended before the page filled; otherwise the node cursor to resume from,
// "cur/key".
func (s *Store) scanNode(ctx context.Context, c redis.Cmdable, p store.ListParams, cur uint64, after string, out *store.ListResult) (next string, done bool, err error) {
	limit := p.PageSize()
	// Where to resume: the SCAN cursor whose batch held the last record
	// this node added to the page, and that record's key; until it adds
	// one, where this call started.
	resumeCur, resumeAfter := cur, after
	for {
		keys, nextCur, err := c.Scan(ctx, cur, s.cfg.Prefix+"*", 500).Result()
		if err != nil {
			return "", false, s.translate("list", "", err)
		}
		slices.Sort(keys)
		keys = slices.Compact(keys)
		if after != "" {
			i, _ := slices.BinarySearch(keys, after)
			for i < len(keys) && keys[i] <= after {
				i++
			}
			keys, after = keys[i:], ""
		}
		recs, err := s.getMany(ctx, keys)
		if err != nil {
			return "", false, err
		}
		for _, r := range recs {
			if r == nil || !p.Matches(r) {
				continue // deleted meanwhile, not ours to list, or not asked for
			}
			if len(out.Records) == limit {
				return fmt.Sprintf("%d/%s", resumeCur, resumeAfter), false, nil
			}
			out.Records = append(out.Records, r)
			resumeCur, resumeAfter = cur, s.rkey(r.Key)
		}
		if nextCur == 0 {
			return "", true, nil
		}
		cur = nextCur
	}
}

func parseCursor(c string) (uint64, string, error) {
	if c == "" {
		return 0, "", nil
	}
	n, key, ok := strings.Cut(c, "/")
	cur, err := strconv.ParseUint(n, 10, 64)
	if !ok || err != nil {
		return 0, "", badCursor(c)
	}
	return cur, key, nil
}

func badCursor(c string) error {
	return fmt.Errorf("redisstore: invalid list cursor %q: %w", c, store.ErrInvalidCursor)
}

// clusterCursorTag starts a cursor of a cluster listing:
// "C/" covered "/" nodeID "/" node cursor, where covered is the slot ranges
// already listed ("0-5460,10923-16383", or "-" for none) and the node
// cursor is scanNode's ("cur/key"; "0/" to start a node).
const clusterCursorTag = "C/"

// listCluster lists a Redis Cluster master by master: see [Store.List].
func (s *Store) listCluster(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	var covered slotSet
	nodeID, nodeCur := "", "0/"
	if p.Cursor != "" {
		parts := strings.SplitN(strings.TrimPrefix(p.Cursor, clusterCursorTag), "/", 3)
		var err error
		if !strings.HasPrefix(p.Cursor, clusterCursorTag) || len(parts) != 3 {
			return store.ListResult{}, badCursor(p.Cursor)
		}
		if covered, err = parseSlotSet(parts[0]); err != nil {
			return store.ListResult{}, badCursor(p.Cursor)
		}
		nodeID, nodeCur = parts[1], parts[2]
	}
	masters, err := s.masters(ctx)
	if err != nil {
		return store.ListResult{}, err
	}
	var out store.ListResult
	for {
		slot, ok := covered.firstMissing()
		if !ok {
			return out, nil
		}
		m := masters.owner(slot)
		if m == nil {
			return store.ListResult{}, fmt.Errorf("redisstore: list: no master serves slot %d: %w", slot, store.ErrUnavailable)
		}
		if m.id != nodeID { // the next master, or another node serves the slot now
			nodeID, nodeCur = m.id, "0/"
		}
		cur, after, err := parseCursor(nodeCur)
		if err != nil {
			return store.ListResult{}, badCursor(p.Cursor)
		}
		next, done, err := s.scanNode(ctx, m.client, p, cur, after, &out)
		if err != nil {
			return store.ListResult{}, err
		}
		if !done {
			out.Next = clusterCursorTag + covered.String() + "/" + m.id + "/" + next
			return out, nil
		}
		covered = covered.add(m.slots...)
	}
}

// master is one master of a cluster: its node ID, its client and the slot
// ranges it serves.
type master struct {
	id     string
	client *redis.Client
	slots  []slotRange
}

type masterSet []master

// owner returns the master serving slot, or nil.
func (ms masterSet) owner(slot int) *master {
	for i := range ms {
		for _, r := range ms[i].slots {
			if r.lo <= slot && slot <= r.hi {
				return &ms[i]
			}
		}
	}
	return nil
}

// masters reads the cluster's masters and their slots (CLUSTER SLOTS)
// and finds the client of each among the cluster client's own. Right
// after a failover two nodes can disagree on who serves a slot for a
// moment (the news spreads by gossip): masters asks again, for a second at
// most, before it fails with ErrUnavailable.
func (s *Store) masters(ctx context.Context) (masterSet, error) {
	var err error
	for range 10 {
		var ms masterSet
		if ms, err = s.mastersOnce(ctx); err == nil || !errors.Is(err, errTopologyChanging) {
			return ms, err
		}
		s.refresh()
		select {
		case <-ctx.Done():
			return nil, s.translate("list", "", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("redisstore: list: %w: %w", store.ErrUnavailable, err)
}

var errTopologyChanging = errors.New("the cluster's map of the slots is changing")

func (s *Store) mastersOnce(ctx context.Context) (masterSet, error) {
	// CLUSTER SLOTS, not CLUSTER SHARDS: go-redis builds its map of the
	// nodes from CLUSTER SLOTS, so its addresses are the ones to match, and
	// it answers on Redis before 7.0 too.
	//lint:ignore SA1019 see above
	slots, err := s.cluster.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, s.translate("list", "", err)
	}
	clients := map[string]*redis.Client{}
	var mu sync.Mutex
	err = s.cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		clients[c.Options().Addr] = c
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, s.translate("list", "", err)
	}
	var ms masterSet
	at := map[string]int{}
	for _, sl := range slots {
		if len(sl.Nodes) == 0 {
			continue
		}
		n := sl.Nodes[0]
		c := clients[n.Addr]
		if c == nil {
			return nil, fmt.Errorf("%w: master %s (slots %d-%d) not yet known to the client", errTopologyChanging, n.Addr, sl.Start, sl.End)
		}
		i, ok := at[n.ID]
		if !ok {
			i = len(ms)
			at[n.ID] = i
			ms = append(ms, master{id: n.ID, client: c})
		}
		ms[i].slots = append(ms[i].slots, slotRange{sl.Start, sl.End})
	}
	var all slotSet
	for _, m := range ms {
		all = all.add(m.slots...)
	}
	if slot, missing := all.firstMissing(); missing {
		return nil, fmt.Errorf("%w: no master serves slot %d", errTopologyChanging, slot)
	}
	return ms, nil
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// slotRange is the hash slots lo..hi, both included.
type slotRange struct{ lo, hi int }

// slotSet is a set of hash slots: sorted, disjoint, non-adjacent ranges.
type slotSet []slotRange

func (s slotSet) add(rs ...slotRange) slotSet {
	out := append(slices.Clone(s), rs...)
	slices.SortFunc(out, func(a, b slotRange) int { return a.lo - b.lo })
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 && r.lo <= merged[n-1].hi+1 {
			merged[n-1].hi = max(merged[n-1].hi, r.hi)
			continue
		}
		merged = append(merged, r)
	}
	return merged
}

// firstMissing returns the lowest slot not in s.
func (s slotSet) firstMissing() (int, bool) {
	slot := 0
	for _, r := range s {
		if r.lo > slot {
			break
		}
		slot = max(slot, r.hi+1)
	}
	return slot, slot < clusterSlots
}

func (s slotSet) String() string {
	if len(s) == 0 {
		return "-"
	}
	var b strings.Builder
	for i, r := range s {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d-%d", r.lo, r.hi)
	}
	return b.String()
}

func parseSlotSet(v string) (slotSet, error) {
	var s slotSet
	if v == "-" {
		return s, nil
	}
	for part := range strings.SplitSeq(v, ",") {
		a, b, ok := strings.Cut(part, "-")
		lo, err1 := strconv.Atoi(a)
		hi, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || lo < 0 || hi < lo || hi >= clusterSlots {
			return nil, fmt.Errorf("bad slot range %q", part)
		}
		s = s.add(slotRange{lo, hi})
	}
	return s, nil
}

// getMany reads the records under the Redis keys ks (nil where a key is
// absent or holds something other than a record), in one pipeline (which a
// cluster client splits by node).
func (s *Store) getMany(ctx context.Context, ks []string) ([]*store.Record, error) {
	recs := make([]*store.Record, len(ks))
	if len(ks) == 0 {
		return recs, nil
	}
	pipe := s.c.Pipeline()
	gets := make([]*redis.StringCmd, len(ks))
	for i, k := range ks {
		gets[i] = pipe.Get(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil && !isWrongType(err) {
		return nil, s.translate("list", "", err)
	}
	for i, k := range ks {
		v, err := gets[i].Result()
		if err != nil || v == "" || v[0] != 'R' {
			continue // deleted meanwhile, or not a record: not ours to list
		}
		r, err := decodeValue(strings.TrimPrefix(k, s.cfg.Prefix), v)
		if err != nil {
			return nil, err
		}
		recs[i] = r
	}
	return recs, nil
}
