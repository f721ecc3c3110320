package main

import (
	"context"
	"errors"
	"path/filepath"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/boltstore"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// StoreURLError says what is wrong with a -store URL.
type StoreURLError = storeurl.Error

// defaultStorePath is the embedded store's file when -store is not given:
// gateway.db next to the library's default file ($IDEM_STATE_DIR, else the
// user's state directory).
func defaultStorePath() string {
	return filepath.Join(filepath.Dir(boltstore.DefaultPath()), "gateway.db")
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
