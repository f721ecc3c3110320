// Package boltstore is the embedded idem store: one bbolt file, durable on
// return, no server. It is the default wherever one machine is enough.
//
// # Durability
//
// Every write is committed with fsync before the call returns. Concurrent
// writes are group-committed with bbolt's DB.Batch: many claims and
// completions share one transaction and one fsync, which is what makes the
// store fast under concurrency. A crash (even SIGKILL mid-write) never loses
// an acknowledged write and never leaves a half-written record; records
// carry a CRC-32C and a damaged one fails closed with idem.ErrCorrupt, never
// a replay of garbage.
//
// # Caveats
//
//   - Single process: bbolt locks the file. A second process opening it
//     waits Config.LockTimeout and then fails with [ErrLocked]; it never
//     hangs. Processes on several machines need a shared store (DynamoDB,
//     Redis, PostgreSQL).
//   - Expired records are deleted by a sweeper goroutine that stops on
//     Close; until then they still take space (not correctness: expiry is
//     decided from timestamps on every read).
//   - The file does not shrink after deletions; bbolt reuses its free pages.
package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// ErrLocked is returned by [Open] when another process holds the file
// (wrapping idem.ErrUnavailable).
var ErrLocked = fmt.Errorf("boltstore: file is locked by another process (the file store is single-process): %w", store.ErrUnavailable)

// Config configures a [Store]. A nil *Config means all defaults.
type Config struct {
	// Bucket is the bbolt bucket holding the records. Default "idem".
	Bucket string
	// LockTimeout is how long Open waits for the file lock. Default 1s.
	LockTimeout time.Duration
	// MaxResultBytes bounds a record's payload (result or error). Default
	// 16 MiB.
	MaxResultBytes int
	// SweepInterval is how often expired records are deleted. Default 1m;
	// negative disables the sweeper.
	SweepInterval time.Duration
	// SweepBatch is how many records one sweep transaction deletes at most.
	// Default 1,000.
	SweepBatch int
	// MaxBatchDelay is how long a write waits for others to share its
	// commit. Default 500µs. (bbolt's own default is 10ms.)
	MaxBatchDelay time.Duration
	// Clock drives the sweeper. Default idem.SystemClock.
	Clock idem.Clock
}

// Store is an [idem.Store] in one bbolt file. It also implements
// [idem.Lister] and [idem.Deleter].
type Store struct {
	db     *bolt.DB
	bucket []byte
	cfg    Config

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.Lister  = (*Store)(nil)
	_ store.Deleter = (*Store)(nil)
)

// Open opens (creating if needed) the store file at path and starts its
// sweeper. The directory is created if missing.
func Open(path string, cfg *Config) (*Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Bucket == "" {
		c.Bucket = "idem"
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = time.Second
	}
	if c.MaxResultBytes <= 0 {
		c.MaxResultBytes = 16 << 20
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Minute
	}
	if c.SweepBatch <= 0 {
		c.SweepBatch = 1000
	}
	if c.MaxBatchDelay <= 0 {
		c.MaxBatchDelay = 500 * time.Microsecond
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: c.LockTimeout})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s", ErrLocked, path)
	}
	if err != nil {
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	db.MaxBatchDelay = c.MaxBatchDelay
	s := &Store{db: db, bucket: []byte(c.Bucket), cfg: c, stop: make(chan struct{}), done: make(chan struct{})}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(s.bucket)
		return err
	}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("boltstore: create bucket %q: %w", c.Bucket, err)
	}
	if c.SweepInterval > 0 {
		go store.Every(s.stop, s.done, s.cfg.Clock.After, s.cfg.SweepInterval, func() {
			_, _ = s.Sweep(store.Millis(s.cfg.Clock.Now()))
		})
	} else {
		close(s.done)
	}
	return s, nil
}

// Path returns the file's path.
func (s *Store) Path() string { return s.db.Path() }

// Close stops the sweeper, waits for it, and closes the file.
func (s *Store) Close() error {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	return s.db.Close()
}

// DefaultPath returns the default file location: $IDEM_STATE_DIR/idem.db,
// else the user's state directory ($XDG_STATE_HOME, ~/.local/state)
// /idem/idem.db, else the temporary directory.
func DefaultPath() string {
	if d := os.Getenv("IDEM_STATE_DIR"); d != "" {
		return filepath.Join(d, "idem.db")
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "idem", "idem.db")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "idem", "idem.db")
	}
	return filepath.Join(os.TempDir(), "idem", "idem.db")
}

// translate maps bbolt's errors to idem's at the store boundary.
func translate(err error) error {
	if err == nil {
		return nil
	}
	var ce *store.CorruptError
	var fe *store.FencedError
	var tl *store.TooLargeError
	switch {
	case errors.As(err, &ce), errors.As(err, &fe), errors.As(err, &tl), errors.Is(err, store.ErrNotFound):
		return err
	case errors.Is(err, bolterrors.ErrDatabaseNotOpen):
		return fmt.Errorf("boltstore: store is closed: %w", store.ErrUnavailable)
	}
	return fmt.Errorf("boltstore: %v: %w", err, store.ErrUnavailable)
}

// read decodes the record under key in tx, nil when absent.
func (s *Store) read(tx *bolt.Tx, key string) (*store.Record, error) {
	v := tx.Bucket(s.bucket).Get([]byte(key))
	if v == nil {
		return nil, nil
	}
	r, err := store.UnmarshalRecord(v) // copies out of the mmap
	if err != nil {
		var ce *store.CorruptError
		if errors.As(err, &ce) {
			ce.Key = key
		}
		return nil, err
	}
	if r.Key != key {
		return nil, &store.CorruptError{Key: key, Reason: "record stored under another key (" + r.Key + ")"}
	}
	return r, nil
}

func (s *Store) write(tx *bolt.Tx, r *store.Record) error {
	return tx.Bucket(s.bucket).Put([]byte(r.Key), store.MarshalRecord(r))
}

// batch runs fn in a group-committed write transaction. fn may be run more
// than once, so it must set its results afresh each time.
func (s *Store) batch(ctx context.Context, fn func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return translate(s.db.Batch(fn))
}

// Claim implements [idem.Store]. A claim that meets a live record is
// answered from a read-only transaction (a committed snapshot), with no
// write and no fsync; only claims that write go through a group commit.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	var res store.ClaimResult
	conflict := false
	err := s.db.View(func(tx *bolt.Tx) error {
		old, err := s.read(tx, p.Key)
		if err != nil || old == nil {
			return err
		}
		var write *store.Record
		res, write = store.ApplyClaim(old, p)
		conflict = write == nil
		return nil
	})
	if err != nil {
		return store.ClaimResult{}, translate(err)
	}
	if conflict {
		return res, nil
	}
	err = s.batch(ctx, func(tx *bolt.Tx) error {
		old, err := s.read(tx, p.Key)
		if err != nil {
			return err
		}
		var write *store.Record
		res, write = store.ApplyClaim(old, p)
		if write != nil {
			return s.write(tx, write)
		}
		return nil
	})
	if err != nil {
		return store.ClaimResult{}, err
	}
	return res, nil
}

// fenced runs a fenced write: change modifies the held record, or returns
// true to delete it.
func (s *Store) fenced(ctx context.Context, key string, fence uint64, owner string, from store.Status, now int64, change func(r *store.Record) (del bool)) error {
	var refused error
	err := s.batch(ctx, func(tx *bolt.Tx) error {
		refused = nil
		r, err := s.read(tx, key)
		if err != nil {
			return err
		}
		if refused = store.CheckFence(r, key, fence, owner, from, now); refused != nil {
			return nil // an answer, not a failure: keep the batch going
		}
		if change(r) {
			return tx.Bucket(s.bucket).Delete([]byte(key))
		}
		return s.write(tx, r)
	})
	if err != nil {
		return err
	}
	return refused
}

// Complete implements [idem.Store].
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	if len(p.Result) > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: len(p.Result), Limit: s.cfg.MaxResultBytes}
	}
	return s.fenced(ctx, p.Key, p.Fence, p.Owner, p.From, p.Now, func(r *store.Record) bool {
		store.ApplyComplete(r, p)
		return false
	})
}

// Fail implements [idem.Store].
func (s *Store) Fail(ctx context.Context, p store.FailParams) error {
	if n := p.Err.Size(); n > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: n, Limit: s.cfg.MaxResultBytes}
	}
	return s.fenced(ctx, p.Key, p.Fence, p.Owner, p.From, p.Now, func(r *store.Record) bool {
		store.ApplyFail(r, p)
		return false
	})
}

// Release implements [idem.Store].
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	return s.fenced(ctx, p.Key, p.Fence, p.Owner, p.From, p.Now, func(*store.Record) bool { return true })
}

// Extend implements [idem.Store].
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	return s.fenced(ctx, p.Key, p.Fence, p.Owner, 0, p.Now, func(r *store.Record) bool {
		store.ApplyExtend(r, p)
		return false
	})
}

// Get implements [idem.Store].
func (s *Store) Get(ctx context.Context, key string) (*store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var r *store.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		r, err = s.read(tx, key)
		return err
	})
	if err != nil {
		return nil, translate(err)
	}
	if r == nil {
		return nil, store.ErrNotFound
	}
	return r, nil
}

// List implements [idem.Lister]: records in key order; the cursor is the
// last key of the previous page. A damaged record fails the listing with
// idem.ErrCorrupt naming its key.
func (s *Store) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	if err := ctx.Err(); err != nil {
		return store.ListResult{}, err
	}
	var out store.ListResult
	limit := p.PageSize()
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(s.bucket).Cursor()
		k, v := c.First()
		if p.Cursor != "" {
			k, v = c.Seek([]byte(p.Cursor))
			if k != nil && bytes.Equal(k, []byte(p.Cursor)) {
				k, v = c.Next()
			}
		}
		for ; k != nil; k, v = c.Next() {
			r, err := store.UnmarshalRecord(v)
			if err != nil {
				return &store.CorruptError{Key: string(k), Reason: err.Error()}
			}
			if !p.Matches(r) {
				continue
			}
			if len(out.Records) == limit {
				out.Next = out.Records[limit-1].Key
				return nil
			}
			out.Records = append(out.Records, r)
		}
		return nil
	})
	if err != nil {
		return store.ListResult{}, translate(err)
	}
	return out, nil
}

// Delete implements [idem.Deleter].
func (s *Store) Delete(ctx context.Context, key string) error {
	found := false
	err := s.batch(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(s.bucket)
		found = b.Get([]byte(key)) != nil
		if !found {
			return nil
		}
		return b.Delete([]byte(key))
	})
	if err != nil {
		return err
	}
	if !found {
		return store.ErrNotFound
	}
	return nil
}

// Sweep deletes records expired at now (ms), SweepBatch per transaction,
// and returns how many. Damaged records are left for an operator.
func (s *Store) Sweep(now int64) (int, error) {
	total := 0
	for {
		n := 0
		err := s.db.Update(func(tx *bolt.Tx) error {
			n = 0
			c := tx.Bucket(s.bucket).Cursor()
			for k, v := c.First(); k != nil && n < s.cfg.SweepBatch; {
				r, err := store.UnmarshalRecord(v)
				if err == nil && r.Expired(now) {
					kc := append([]byte(nil), k...)
					if err := c.Delete(); err != nil {
						return err
					}
					n++
					k, v = c.Seek(kc) // the first key after the deleted one
					continue
				}
				k, v = c.Next()
			}
			return nil
		})
		if err != nil {
			return total, translate(err)
		}
		total += n
		if n < s.cfg.SweepBatch {
			return total, nil
		}
		select {
		case <-s.stop:
			return total, nil
		default:
		}
	}
}
