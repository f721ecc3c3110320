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
// pipelined HGETALL per batch. SCAN's promise holds: a record present for
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
		pipe := s.c.Pipeline()
		cmds := make([]*redis.MapStringStringCmd, len(keys))
		for i, k := range keys {
			cmds[i] = pipe.HGetAll(ctx, k)
		}
		if len(keys) > 0 {
			if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
				return store.ListResult{}, s.translate("list", "", err)
			}
		}
		for i, k := range keys {
			m, err := cmds[i].Result()
			if err != nil || len(m) == 0 {
				continue // deleted meanwhile, or not a hash: not ours to list
			}
			r, err := decodeMap(strings.TrimPrefix(k, s.cfg.Prefix), m)
			if err != nil {
				return store.ListResult{}, err
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
