package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// List implements [idem.Lister] with SCAN over Config.Prefix and one
// pipelined GET per batch (and one pipelined HGETALL for the records of
// the batch in the previous layout). SCAN's promise holds: a record present for
// the whole listing is listed at least once. The cursor is the SCAN cursor
// plus the last key returned from its batch. On Redis Cluster, SCAN sees
// one node: list through a client per primary.
func (s *Store) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	var out store.ListResult
	cur, after, err := parseCursor(p.Cursor)
	if err != nil {
		return out, err
	}
	limit := p.PageSize()
	var lastCur uint64 // the SCAN cursor whose batch held the last record
	for {
		keys, next, err := s.c.Scan(ctx, cur, s.cfg.Prefix+"*", 500).Result()
		if err != nil {
			return store.ListResult{}, s.translate("list", "", err)
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
			return store.ListResult{}, err
		}
		for _, r := range recs {
			if r == nil {
				continue // deleted meanwhile, or not ours to list
			}
			if !p.Matches(r) {
				continue
			}
			if len(out.Records) == limit {
				out.Next = fmt.Sprintf("%d/%s", lastCur, s.rkey(out.Records[limit-1].Key))
				return out, nil
			}
			out.Records = append(out.Records, r)
			lastCur = cur
		}
		if next == 0 {
			return out, nil
		}
		cur = next
	}
}

func parseCursor(c string) (uint64, string, error) {
	if c == "" {
		return 0, "", nil
	}
	n, key, ok := strings.Cut(c, "/")
	cur, err := strconv.ParseUint(n, 10, 64)
	if !ok || err != nil {
		return 0, "", fmt.Errorf("redisstore: invalid list cursor %q: %w", c, idem.ErrInvalidKey)
	}
	return cur, key, nil
}

// getMany reads the records under the Redis keys ks (nil where a key is
// absent or holds something other than a record), in two pipelines at most.
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
	var hashes []int
	for i, k := range ks {
		v, err := gets[i].Result()
		switch {
		case err != nil && isWrongType(err):
			hashes = append(hashes, i)
			continue
		case err != nil || v == "" || v[0] != 'R':
			continue // deleted meanwhile, or not a record: not ours to list
		}
		r, err := decodeValue(strings.TrimPrefix(k, s.cfg.Prefix), v)
		if err != nil {
			return nil, err
		}
		recs[i] = r
	}
	if len(hashes) == 0 {
		return recs, nil
	}
	pipe = s.c.Pipeline()
	all := make([]*redis.MapStringStringCmd, len(hashes))
	for j, i := range hashes {
		all[j] = pipe.HGetAll(ctx, ks[i])
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil && !isWrongType(err) {
		return nil, s.translate("list", "", err)
	}
	for j, i := range hashes {
		m, err := all[j].Result()
		if err != nil || len(m) == 0 {
			continue // deleted meanwhile, or not a hash: not ours to list
		}
		r, err := decodeHash(strings.TrimPrefix(ks[i], s.cfg.Prefix), m)
		if err != nil {
			return nil, err
		}
		recs[i] = r
	}
	return recs, nil
}
