package store

import (
	"context"
	"time"
)

// ServerTimer is an optional power of a [Store]: the current time of the
// backend's own clock (Redis TIME, PostgreSQL clock_timestamp(), the Date
// of a DynamoDB response). The engine asks it now and then, measures its
// offset to the store, and corrects every timestamp it writes and compares
// by it, so that leases and expiry are decided on the store's clock and
// callers' clocks need not agree. Find it by type assertion.
//
// ServerTime makes one cheap round trip and returns the store's time, as
// close as the backend tells it to the moment it answered: a backend that
// tells whole seconds (an HTTP Date header) returns the middle of the
// second it names, and documents that resolution. Errors are translated as
// for any store call (an unreachable backend wraps [ErrUnavailable]).
// Stores that run in the caller's process (memory, an embedded file) share
// the caller's clock and do not implement it.
type ServerTimer interface {
	ServerTime(ctx context.Context) (time.Time, error)
}
