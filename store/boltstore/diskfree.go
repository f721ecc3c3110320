package boltstore

import (
	"fmt"
	"path/filepath"

	"github.com/seed-a1b882c0/idem/store"
)

// DiskFullError is a claim refused because the file system holding the
// store's file has less free space than Config.MinFreeBytes. It matches
// store.ErrUnavailable (errors.Is): the call fails closed, the operation
// does not run, and claims are accepted again once space is freed.
type DiskFullError struct {
	// Key is the key whose claim was refused; Path the store's file.
	Key, Path string
	// Free is the free space found, Min Config.MinFreeBytes, in bytes.
	Free, Min int64
}

func (e *DiskFullError) Error() string {
	return fmt.Sprintf("boltstore: claim %s refused: the file system of %s has %d bytes free, under the %d kept for outcomes (Config.MinFreeBytes): free some space",
		e.Key, e.Path, e.Free, e.Min)
}

// Is makes errors.Is(err, store.ErrUnavailable) true.
func (e *DiskFullError) Is(target error) bool { return target == store.ErrUnavailable }

// DiskFree reports the free space of the file system holding the store's
// file (the space an unprivileged process may use) and the minimum a new
// claim needs (Config.MinFreeBytes). ok is false where the platform does
// not say (free is then 0), or when the check is disabled.
func (s *Store) DiskFree() (free, min int64, ok bool, err error) {
	if s.cfg.MinFreeBytes < 0 {
		return 0, s.cfg.MinFreeBytes, false, nil
	}
	free, ok, err = diskFree(filepath.Dir(s.db.Path()))
	return free, s.cfg.MinFreeBytes, ok, err
}

// roomForClaim refuses a claim of key with a *DiskFullError when the file
// system has less than Config.MinFreeBytes free. A failure to ask is no
// refusal: the write itself then says whether there is room.
func (s *Store) roomForClaim(key string) error {
	free, min, ok, err := s.DiskFree()
	if err != nil || !ok || free >= min {
		return nil
	}
	return &DiskFullError{Key: key, Path: s.db.Path(), Free: free, Min: min}
}
