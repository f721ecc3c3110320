package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/seed-a1b882c0/idem"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// StoreURLError says what is wrong with a -store URL.
type StoreURLError = storeurl.Error

// defaultStorePath is the embedded store's file when -store is not given:
// gateway.db next to the library's default file ($IDEM_STATE_DIR, else the
// user's state directory).
func defaultStorePath() string {
	return filepath.Join(filepath.Dir(storeurl.DefaultBoltPath()), "gateway.db")
}

// openStore opens the store a -store URL names (the forms of package
// storeurl, which idemctl shares), bolt:// alone meaning defaultStorePath.
// The returned closer is nil-safe to call and releases what the store
// holds.
func openStore(ctx context.Context, raw string) (store.Store, func() error, error) {
	s, err := storeurl.Open(ctx, raw, &storeurl.Options{DefaultBoltPath: defaultStorePath()})
	if err != nil {
		return nil, nil, err
	}
	return s.Store, s.Close, nil
}

// openStoreWait opens the store a -store URL names in the background, as
// openStore does, retrying while it fails for a reason that may heal (the
// server down or starting) for at most wait; each retry is logged. log also
// receives a Redis client's own lines (storeurl.Options.Logger), so every
// line of the gateway's log stays JSON.
func openStoreWait(ctx context.Context, raw string, wait time.Duration, log *slog.Logger) *storeurl.Opening {
	return storeurl.StartOpen(ctx, raw, &storeurl.Options{DefaultBoltPath: defaultStorePath(), Logger: log}, storeurl.WaitOptions{
		Wait: wait,
		OnRetry: func(r storeurl.Retry) {
			log.Warn("store not open yet; covered requests get 503 until it is", "store", storeurl.Redact(raw),
				"attempt", r.Attempt, "retry_in", r.Next.Round(time.Millisecond).String(), "wait_left", r.Left.Round(time.Second).String(), "err", r.Err)
		},
	})
}

// storeFailed is the gateway's exit error when its store did not open:
// what happened and what to do.
func storeFailed(o *options, err error) error {
	var we *storeurl.WaitError
	switch {
	case errors.As(err, &we):
		return fmt.Errorf("%w; start the gateway once the store is up and reachable from here, or raise -store-wait (%v)", err, o.storeWait)
	case errors.Is(err, idem.ErrInvalidConfig):
		return fmt.Errorf("store %s: %w; fix the store or the -store URL (no retry: waiting would not mend this)", storeurl.Redact(o.store), err)
	}
	return fmt.Errorf("store %s: %w", storeurl.Redact(o.store), err)
}

// healthKey is a key no request can produce (a scope with no operation
// behind it); reading it proves the store answers.
const healthKey = "idem-gateway:healthz#0000000000000000000000000000000000000000000000000000000000000000"

// checkStore reads healthKey: absent or present, the store answered.
func checkStore(ctx context.Context, s store.Store) error {
	_, err := s.Get(ctx, healthKey)
	if err == nil || errors.Is(err, store.ErrNotFound) {
		return nil
	}
	return err
}
