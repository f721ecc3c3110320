package pgstore

import (
	"context"
	"errors"

	"github.com/seed-a1b882c0/idem/store"
)

// List implements [store.Lister], in key order (the cursor is the last key
// of the previous page). A status or stuck filter uses the (status,
// lease_until) index.
func (s *Store) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	q := "SELECT " + columns + " FROM " + s.table + " WHERE expires_at > $1 AND key > $2"
	args := []any{p.Now, p.Cursor}
	switch {
	case p.Stuck:
		q += " AND status = 1 AND lease_until <= $1"
		if p.Status.Valid() && p.Status != store.StatusInProgress {
			return store.ListResult{}, nil
		}
	case p.Status.Valid():
		q += " AND status = $4"
		args = append(args, nil, int16(p.Status))
	}
	limit := p.PageSize()
	if len(args) == 2 {
		args = append(args, limit+1)
	} else {
		args[2] = limit + 1
	}
	q += " ORDER BY key LIMIT $3"
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return store.ListResult{}, s.translate("list", "", err)
	}
	defer rows.Close()
	var out store.ListResult
	for rows.Next() {
		r, _, err := scanRecord(rows, nil)
		var ce *store.CorruptError
		if errors.As(err, &ce) {
			return store.ListResult{}, err
		}
		if err != nil {
			return store.ListResult{}, s.translate("list", "", err)
		}
		if len(out.Records) == limit {
			out.Next = out.Records[limit-1].Key
			break
		}
		out.Records = append(out.Records, r)
	}
	if err := rows.Err(); err != nil {
		return store.ListResult{}, s.translate("list", "", err)
	}
	return out, nil
}

// Reap deletes rows expired at now (ms), ReapBatch per statement, and
// returns how many. It stops early when the store is closed.
func (s *Store) Reap(ctx context.Context, now int64) (int, error) {
	total := 0
	for {
		tag, err := s.db.Exec(ctx, s.sql.reap, now, s.cfg.ReapBatch)
		if err != nil {
			return total, s.translate("reap", "", err)
		}
		n := int(tag.RowsAffected())
		total += n
		if n < s.cfg.ReapBatch {
			return total, nil
		}
		select {
		case <-s.stop:
			return total, nil
		default:
		}
	}
}
