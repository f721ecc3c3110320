package pgstore

import (
	"context"
	"time"
)

// ServerTime implements [store.ServerTimer]: PostgreSQL's
// clock_timestamp(), the server's clock when the statement reads it
// (now() would be the start of the transaction), in microseconds.
func (s *Store) ServerTime(ctx context.Context) (time.Time, error) {
	var t time.Time
	if err := s.db.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t); err != nil {
		return time.Time{}, s.translate("time", "", err)
	}
	return t, nil
}
