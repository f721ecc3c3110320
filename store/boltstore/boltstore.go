// Package boltstore is the embedded idem store: one bbolt file, no server.
// It is the default wherever one machine is enough.
//
// # Durability
//
// Every write but one kind is committed with fdatasync before the call
// returns. Concurrent writes are group-committed: one goroutine runs bbolt
// write transactions back to back, each taking every write that arrived
// while the previous one was on its way to the disk, so 64 calls in flight
// share one transaction and its two fdatasyncs, and a lone call waits for
// nobody. A crash (even SIGKILL mid-write) never loses an acknowledged
// write and never leaves a half-written record; records carry a CRC-32C and
// a damaged one fails closed with store.ErrCorrupt, never a replay of
// garbage.
//
// One exception, the default: a claim made by Do (a claim with
// [store.ClaimParams.Local] set: its holder is this process) is held in
// memory and appended to the claim journal, not written to the file, and
// so costs no commit: a new call writes the file once, when its outcome is
// stored. Every later write of that claim — its Complete or Fail, an
// Extend (a lease renewal, a hand-off), a Release — goes to the file with
// fdatasync before it returns, and from then on the claim is as durable as
// any other record (a Release of a claim over nothing has nothing to
// write). Claims made through Begin (tokens handed to work elsewhere) are
// written and synced at once. Config.SyncEveryClaim turns the exception
// off: every claim written and synced, two commits per new call, about
// half the new calls per second under load.
//
// # The claim journal
//
// The journal is an append-only file beside the store's (its path plus
// ".claims"). A held claim is appended with write(2), not fsynced, before
// its Claim returns; appends are grouped (the first caller that finds no
// write under way writes every entry queued, so claims made together share
// one write). An entry is its length, its CRC-32C and the claim's record.
// When a held claim is settled, released, deleted or forgotten by the
// sweeper, the committer appends a drop entry for its key after the
// commit, so that a key let go of is never brought back. Open replays the journal (the last entry of a key wins),
// restores each claim as an IN_PROGRESS record in the file (one synced
// commit) unless the file has a later state of the key (a record of the
// claim's fence or a higher one: the claim settled, extended, or taken
// over), then empties the journal; reading stops at the first entry that
// is short or fails its CRC. Close writes the held claims to the file and
// empties the journal. Past Config.ClaimJournalMaxBytes (64 MiB) the
// committer writes every held claim into the file (one synced commit,
// between two batches, so no other write interleaves) and empties it.
//
// # Power loss and crashes
//
// A crash of the process (SIGKILL, a panic, the OOM killer) takes away
// nothing: the file holds every fsynced commit, and the journal's writes
// returned before the claims they carry were acknowledged, so they are in
// the kernel's page cache, which outlives the process. The next Open
// finds the crashed calls' claims IN_PROGRESS: their keys are held off
// until their leases end and are listed as stuck (idemctl list --stuck),
// as on every other store. A crash of the machine (power loss, kernel
// panic) can take the journal's unsynced tail, and so the Local claims of
// the calls that were running; nothing any call was told had been
// stored, because every outcome is fsynced. With SyncEveryClaim it takes
// nothing.
//
//   - The file holds only fsynced bbolt commits. bbolt writes a commit's
//     pages, fdatasyncs, then writes the checksummed meta page and
//     fdatasyncs again, and never overwrites a page the previous commit
//     still uses; after power loss it opens on the newest meta page whose
//     checksum holds, the last commit that completed. (The freelist is not
//     written, bbolt's NoFreelistSync as etcd runs it: it is rebuilt from
//     the tree on open, so there is no freelist to tear.)
//   - A journal torn by power loss (a short entry, garbage, zeros) is read
//     up to its first bad entry; the claims after it are lost. A journal
//     claim is restored only over an absent record or one of a lower
//     fence, so a stale journal can never write over a later state that
//     the file synced; a dropped claim lost with the tail is restored
//     only where the file has nothing later, as a claim IN_PROGRESS that
//     expires with its lease.
//   - A Local claim lost with the machine is lost with its holder: the
//     operation that held it was running in the machine that died. The key
//     is then as it was before the claim: absent, or the expired or
//     abandoned record the claim had replaced. This is a claim released
//     (store.Store.Release): the next call claims the key afresh and runs
//     the operation, at once instead of after the lease. As after any crash
//     mid-operation, the operation may have had effects before the crash,
//     which is why downstream calls take [github.com/seed-a1b882c0/idem.Claim.DownstreamKey].
//   - The dead holder can never write over its successor: its owner is
//     unique to its engine instance, the successor's claim has another
//     owner (at fence 1 again when the key was absent), and every fenced
//     write checks both fence and owner (see store.Store.Complete). And it
//     cannot try: it died with the machine.
//
// # Caveats
//
//   - Single process: bbolt locks the file (and so its journal). A second process opening it
//     waits Config.LockTimeout and then fails with [ErrLocked]; it never
//     hangs. Processes on several machines need a shared store (DynamoDB,
//     Redis, PostgreSQL).
//   - Expired records are deleted by a sweeper goroutine that stops on
//     Close; until then they still take space (not correctness: expiry is
//     decided from timestamps on every read).
//   - The file does not shrink after deletions; bbolt reuses its free pages.
//     Open scans the file to rebuild the list of free pages, the price of
//     not writing it on every commit (about 0.2 s for a 210 MB file of
//     400,000 records, warm cache).
package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/seed-a1b882c0/idem/store"
)

// ErrReadOnly is returned by every write of a store opened with
// Config.ReadOnly.
var ErrReadOnly = errors.New("boltstore: the store was opened read-only")

// ErrLocked is returned by [Open] when another process holds the file
// (wrapping store.ErrUnavailable).
var ErrLocked = fmt.Errorf("boltstore: file is locked by another process (the file store is single-process): %w", store.ErrUnavailable)

// errClosed is what a write to a closed store returns.
var errClosed = fmt.Errorf("boltstore: store is closed: %w", store.ErrUnavailable)

// Config configures a [Store]. A nil *Config means all defaults.
type Config struct {
	// Bucket is the bbolt bucket holding the records. Default "idem".
	Bucket string
	// LockTimeout is how long Open waits for the file lock. Default 1s.
	LockTimeout time.Duration
	// MaxResultBytes bounds a record's payload (result or error, or its
	// steps taken together). Default 16 MiB.
	MaxResultBytes int
	// SweepInterval is how often expired records are deleted. Default 1m;
	// negative disables the sweeper.
	SweepInterval time.Duration
	// SweepBatch is how many records one sweep transaction deletes at most.
	// Default 1,000.
	SweepBatch int
	// MaxBatchDelay, when positive, makes each commit wait this long after
	// its first write for others to join it. Default 0: no wait. Commits
	// run back to back and each takes every write that arrived while the
	// previous one was being synced, which shares commits under load and
	// costs a lone call nothing.
	MaxBatchDelay time.Duration
	// Clock drives the sweeper. Default store.SystemClock.
	Clock store.Clock
	// SyncEveryClaim writes every claim to the file with fdatasync before
	// Claim returns, a Do's claims ([store.ClaimParams.Local]) included: two
	// synced commits per new call, and no claim journal. Default false: a
	// Do's claim is held in memory and appended, unsynced, to the claim
	// journal beside the file, so a new call writes the file once (about
	// twice the new calls per second under load) and the claim still
	// outlives a crash of the process; only power loss or an OS crash can
	// take it, with its holder (see the package doc).
	SyncEveryClaim bool
	// ReadOnly opens the file for reading only, for tools that inspect a
	// store another process owns or owned (idemctl list, show, watch):
	// bbolt's read-only open (a shared lock, the file opened O_RDONLY, so a
	// file the user may only read opens too), no bucket created, no
	// sweeper, no committer. The claim journal is read but neither replayed
	// into the file nor truncated: the claims a crashed writer held are
	// shown as its next Open would restore them. Every write fails with
	// [ErrReadOnly]; the file and the journal keep their bytes. A writer
	// holding the file keeps a read-only open waiting, as another writer.
	ReadOnly bool
	// ClaimJournalMaxBytes is the size past which the committer writes the
	// held claims into the file (one synced commit) and empties the claim
	// journal. Default 64 MiB.
	ClaimJournalMaxBytes int64
	// MinFreeBytes is the free space (on Linux and macOS: statfs, the
	// space an unprivileged process may use) the file system holding the
	// file must keep for a new claim to be written: below it a claim that
	// would write is refused with a [*DiskFullError] (store.ErrUnavailable)
	// and the operation does not run, since its outcome might not fit and
	// would be lost after it ran. Replays, conflicts and the writes of
	// claims already made (Complete, Fail, Release, Extend) go on, into
	// the space kept. Default 16 MiB; negative disables the check.
	MinFreeBytes int64
}

// Store is an [store.Store] in one bbolt file. It also implements
// [store.Lister], [store.Deleter] and [store.BatchExtender].
type Store struct {
	readOnly bool // Config.ReadOnly: every write fails with ErrReadOnly
	db       *bolt.DB
	bucket   []byte
	cfg      Config

	// mu guards slots: one per key that an operation is working on or
	// whose Local claim is held in memory.
	mu    sync.Mutex
	slots map[string]*slot

	commits committer

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// SystemName implements store.SystemNamer: the backend's db.system.name in
// the OpenTelemetry database semantic conventions, a bbolt file, which the conventions do not list: "bbolt".
func (s *Store) SystemName() string { return "bbolt" }

// slot serializes the operations on one key, from the moment they read
// the key's state to the moment their write is durable, and holds the
// key's Local claim while it is kept in memory. A held claim stands in
// front of whatever the file has under the key.
type slot struct {
	mu   sync.Mutex
	refs int // guarded by Store.mu
	held atomic.Pointer[store.Record]
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.Lister  = (*Store)(nil)
	_ store.Deleter = (*Store)(nil)
	_ store.Stepper = (*Store)(nil)
)

// Open opens (creating if needed) the store file at path and starts its
// sweeper and its committer. The directory is created if missing.
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
	if c.Clock == nil {
		c.Clock = store.SystemClock{}
	}
	if c.ClaimJournalMaxBytes <= 0 {
		c.ClaimJournalMaxBytes = 64 << 20
	}
	if c.MinFreeBytes == 0 {
		c.MinFreeBytes = 16 << 20
	}
	if c.ReadOnly {
		return openReadOnly(path, c)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: c.LockTimeout,
		// The freelist is rebuilt from the tree on open rather than written
		// by every commit (as etcd runs bbolt): a commit of 64 records
		// writes one page run less and spends a third less CPU.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s", ErrLocked, path)
	}
	if err != nil {
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	s := &Store{db: db, bucket: []byte(c.Bucket), cfg: c, slots: map[string]*slot{}, stop: make(chan struct{}), done: make(chan struct{})}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(s.bucket)
		return err
	}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("boltstore: create bucket %q: %w", c.Bucket, err)
	}
	// Claims a crashed process held come back from the journal (whatever
	// the mode now: the last run may have held claims).
	jpath := journalPath(path)
	if _, err := s.restore(jpath); err != nil {
		_ = db.Close()
		return nil, err
	}
	if !c.SyncEveryClaim {
		f, err := os.OpenFile(jpath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("boltstore: open claim journal: %w", err)
		}
		s.commits.j = newJournal(f, c.ClaimJournalMaxBytes)
		s.commits.check = s.checkpoint
	}
	s.commits.start(db, c.MaxBatchDelay)
	if c.SweepInterval > 0 {
		go store.Every(s.stop, s.done, s.cfg.Clock.After, s.cfg.SweepInterval, func() {
			_, _ = s.Sweep(store.Millis(s.cfg.Clock.Now()))
		})
	} else {
		close(s.done)
	}
	return s, nil
}

// openReadOnly opens path for Config.ReadOnly: see there.
func openReadOnly(path string, c Config) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: c.LockTimeout, ReadOnly: true})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s", ErrLocked, path)
	}
	if err != nil {
		return nil, fmt.Errorf("boltstore: open %s read-only: %w", path, err)
	}
	s := &Store{db: db, bucket: []byte(c.Bucket), cfg: c, readOnly: true, slots: map[string]*slot{}, stop: make(chan struct{}), done: make(chan struct{})}
	close(s.done)
	// The claims a crashed writer held, where its next Open would restore
	// them (see restore), stand as held claims in front of the file.
	b, err := os.ReadFile(journalPath(path))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		_ = db.Close()
		return nil, fmt.Errorf("boltstore: read claim journal: %w", err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		for _, j := range parseJournal(b) {
			if j == nil {
				continue
			}
			if r, err := s.read(tx, j.Key); err == nil && (r == nil || r.Fence < j.Fence) {
				sl := &slot{}
				sl.held.Store(j)
				s.slots[j.Key] = sl
			}
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("boltstore: read %s: %w", path, err)
	}
	return s, nil
}

// Path returns the file's path.
func (s *Store) Path() string { return s.db.Path() }

// Close stops the sweeper, stops the committer, writes the Local claims
// still held in memory to the file (one synced commit, so that a clean
// shutdown keeps them), empties the claim journal and closes the file. Calls still running when Close is
// called fail with store.ErrUnavailable.
func (s *Store) Close() error {
	if s.readOnly {
		return s.db.Close()
	}
	first := false
	s.once.Do(func() { first = true; close(s.stop) })
	<-s.done
	if !first {
		return s.db.Close() // bbolt: a second Close is a no-op
	}
	s.commits.close()
	if j := s.commits.j; j != nil {
		// Appends under way finish first; later ones fail on the closed file.
		defer j.hold()()
	}
	held := s.heldClaims()
	var err error
	if len(held) > 0 {
		err = s.db.Update(func(tx *bolt.Tx) error {
			for _, r := range held {
				if err := s.write(tx, r); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			err = fmt.Errorf("boltstore: writing %d held claims on close: %w", len(held), err)
		}
	}
	if j := s.commits.j; j != nil {
		if err == nil {
			// The file has every held claim: the journal holds nothing more.
			if terr := j.truncate(); terr != nil {
				err = fmt.Errorf("boltstore: truncate claim journal: %w", terr)
			}
		}
		err = errors.Join(err, j.f.Close())
	}
	return errors.Join(err, s.db.Close())
}

// heldClaims returns the Local claims held in memory now.
func (s *Store) heldClaims() []*store.Record {
	var held []*store.Record
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sl := range s.slots {
		if r := sl.held.Load(); r != nil {
			held = append(held, r)
		}
	}
	return held
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
	case errors.As(err, &ce), errors.As(err, &fe), errors.As(err, &tl), errors.Is(err, store.ErrNotFound), errors.Is(err, errClosed):
		return err
	case errors.Is(err, bolterrors.ErrDatabaseNotOpen):
		return errClosed
	}
	return fmt.Errorf("boltstore: %v: %w", err, store.ErrUnavailable)
}

// lock returns key's slot, locked: the caller owns the key until unlock.
func (s *Store) lock(key string) *slot {
	s.mu.Lock()
	sl := s.slots[key]
	if sl == nil {
		sl = &slot{}
		s.slots[key] = sl
	}
	sl.refs++
	s.mu.Unlock()
	sl.mu.Lock()
	return sl
}

// unlock releases key's slot, forgetting it when nobody else waits for it
// and it holds no claim.
func (s *Store) unlock(key string, sl *slot) {
	sl.mu.Unlock()
	s.mu.Lock()
	// With no reference left nobody can change held: read it now, not
	// before the unlock, when another caller could still set it.
	if sl.refs--; sl.refs == 0 && sl.held.Load() == nil {
		delete(s.slots, key)
	}
	s.mu.Unlock()
}

// current returns key's record as the caller (holding its slot) sees it:
// the held claim, else the file's record, nil when absent.
func (s *Store) current(sl *slot, key string) (*store.Record, error) {
	if r := sl.held.Load(); r != nil {
		return r.Clone(), nil
	}
	var r *store.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		r, err = s.read(tx, key)
		return err
	})
	return r, translate(err)
}

// read decodes the record under key in tx, nil when absent.
func (s *Store) read(tx *bolt.Tx, key string) (*store.Record, error) {
	b := tx.Bucket(s.bucket)
	if b == nil { // a read-only open of a file no writer has set up
		return nil, nil
	}
	v := b.Get([]byte(key))
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

// commit writes r under key (or deletes key when r is nil) in a group
// commit, durable when it returns. The caller holds key's slot.
func (s *Store) commit(ctx context.Context, key string, r *store.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var v []byte
	if r != nil {
		v = store.MarshalRecord(r)
	}
	return translate(s.commits.do(func(tx *bolt.Tx) error {
		b := tx.Bucket(s.bucket)
		if v == nil {
			return b.Delete([]byte(key))
		}
		return b.Put([]byte(key), v)
	}))
}

// Claim implements [store.Store]. A claim that meets a live record writes
// nothing. A Local claim that acquires is held in memory (see the package
// doc); any other is committed before Claim returns.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	if s.readOnly {
		return store.ClaimResult{}, ErrReadOnly
	}
	if err := ctx.Err(); err != nil {
		return store.ClaimResult{}, err
	}
	sl := s.lock(p.Key)
	defer s.unlock(p.Key, sl)
	old, err := s.current(sl, p.Key)
	if err != nil {
		return store.ClaimResult{}, err
	}
	res, w := store.ApplyClaim(old, p)
	if w == nil {
		return res, nil
	}
	if err := s.roomForClaim(p.Key); err != nil {
		return store.ClaimResult{}, err
	}
	if p.Local && !s.cfg.SyncEveryClaim {
		// Held before its journal entry is written: a checkpoint between
		// the two writes it to the file, never misses it.
		if s.commits.isClosed() {
			return store.ClaimResult{}, errClosed
		}
		prev := sl.held.Swap(w)
		if err := s.commits.j.append(claimEntry(w)); err != nil {
			sl.held.Store(prev)
			return store.ClaimResult{}, fmt.Errorf("boltstore: claim journal: %v: %w", err, store.ErrUnavailable)
		}
		if s.commits.j.due() {
			s.commits.nudge()
		}
		return res, nil
	}
	v := store.MarshalRecord(w)
	r := &request{fn: func(tx *bolt.Tx) error { return tx.Bucket(s.bucket).Put([]byte(p.Key), v) }}
	if h := sl.held.Load(); h != nil {
		// The file's record replaces a held claim it took over.
		r.post, r.drop, r.dropping = dropEntry(p.Key), sl, h
	}
	if err := s.commits.send(r); err != nil {
		return store.ClaimResult{}, translate(err)
	}
	return res, nil
}

// fenced runs a fenced write: change modifies the held record, or returns
// true to delete it; an error from change refuses the write, and nothing
// is written. The write is durable when fenced returns, the held claim it
// settles included.
func (s *Store) fenced(ctx context.Context, c store.ClaimRef, change func(r *store.Record) (del bool, err error)) error {
	if s.readOnly {
		return ErrReadOnly
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sl := s.lock(c.Key)
	defer s.unlock(c.Key, sl)
	r, err := s.current(sl, c.Key)
	if err != nil {
		return err
	}
	if err := store.CheckFence(r, c); err != nil {
		return err
	}
	del, err := change(r)
	if err != nil {
		return err
	}
	h := sl.held.Load()
	if h == nil {
		if del {
			r = nil
		}
		return s.commit(ctx, c.Key, r)
	}
	// Settling a held claim: the write, then its drop in the journal.
	req := &request{post: dropEntry(c.Key), drop: sl, dropping: h}
	if !del {
		v := store.MarshalRecord(r)
		req.fn = func(tx *bolt.Tx) error { return tx.Bucket(s.bucket).Put([]byte(c.Key), v) }
	} else {
		// A held claim may stand in front of an older record in the file
		// (the expired or abandoned one it replaced): delete that too, or
		// the release would bring it back. Over nothing, there is nothing
		// to commit, unless a checkpoint wrote the claim meanwhile.
		req.checkpoints = s.commits.rotations.Load()
		below, err := s.inFile(c.Key)
		if err != nil {
			return err
		}
		rm := func(tx *bolt.Tx) error { return tx.Bucket(s.bucket).Delete([]byte(c.Key)) }
		if below {
			req.fn = rm
		} else {
			req.ifCheckpointed = rm
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return translate(s.commits.send(req))
}

// inFile reports whether the file has a record under key.
func (s *Store) inFile(key string) (bool, error) {
	found := false
	err := s.db.View(func(tx *bolt.Tx) error {
		found = tx.Bucket(s.bucket).Get([]byte(key)) != nil
		return nil
	})
	return found, translate(err)
}

// Complete implements [store.Store].
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	if len(p.Result) > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: len(p.Result), Limit: s.cfg.MaxResultBytes}
	}
	return s.fenced(ctx, p.ClaimRef, func(r *store.Record) (bool, error) {
		store.ApplyComplete(r, p)
		return false, nil
	})
}

// Fail implements [store.Store].
func (s *Store) Fail(ctx context.Context, p store.FailParams) error {
	if err := p.Check(); err != nil {
		return err
	}
	if n := p.Err.Size(); n > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: n, Limit: s.cfg.MaxResultBytes}
	}
	return s.fenced(ctx, p.ClaimRef, func(r *store.Record) (bool, error) {
		store.ApplyFail(r, p)
		return false, nil
	})
}

// Release implements [store.Store].
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	return s.fenced(ctx, p.ClaimRef, func(*store.Record) (bool, error) { return true, nil })
}

// Extend implements [store.Store]. Extending a held Local claim writes it to
// the file: from then on it survives a crash.
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	if err := p.Check(); err != nil {
		return err
	}
	return s.fenced(ctx, p.ClaimRef, func(r *store.Record) (bool, error) {
		store.ApplyExtend(r, p)
		return false, nil
	})
}

// errStepped is RecordStep's answer to a step recorded already: nothing
// to write.
var errStepped = errors.New("boltstore: step recorded already")

// RecordStep implements [store.Stepper]: the record with the step
// appended, written as every fenced write is (a held Local claim with it,
// durable when RecordStep returns). MaxResultBytes bounds the record's
// steps taken together.
func (s *Store) RecordStep(ctx context.Context, p store.StepParams) error {
	if err := p.Check(); err != nil {
		return err
	}
	err := s.fenced(ctx, p.ClaimRef, func(r *store.Record) (bool, error) {
		changed, err := store.ApplyStep(r, p, s.cfg.MaxResultBytes)
		if err == nil && !changed {
			err = errStepped
		}
		return false, err
	})
	if err == errStepped {
		return nil
	}
	return err
}

// Get implements [store.Store].
func (s *Store) Get(ctx context.Context, key string) (*store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sl := s.lock(key)
	defer s.unlock(key, sl)
	r, err := s.current(sl, key)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, store.ErrNotFound
	}
	return r, nil
}

// heldAfter returns copies of the held claims with keys after cursor, in
// key order.
func (s *Store) heldAfter(cursor string) []*store.Record {
	var out []*store.Record
	s.mu.Lock()
	for k, sl := range s.slots {
		if k <= cursor && cursor != "" {
			continue
		}
		if r := sl.held.Load(); r != nil {
			out = append(out, r.Clone())
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b *store.Record) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// List implements [store.Lister]: records in key order, the held Local
// claims among them; the cursor is the last key of the previous page. A
// damaged record fails the listing with store.ErrCorrupt naming its key.
func (s *Store) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	if err := ctx.Err(); err != nil {
		return store.ListResult{}, err
	}
	var out store.ListResult
	limit := p.PageSize()
	held := s.heldAfter(p.Cursor)
	err := s.db.View(func(tx *bolt.Tx) error {
		var (
			c    *bolt.Cursor
			k, v []byte
		)
		// No bucket: a read-only open of a file no writer has set up; its
		// held claims only (k stays nil, so c is never used).
		if b := tx.Bucket(s.bucket); b != nil {
			c = b.Cursor()
			k, v = c.First()
			if p.Cursor != "" {
				k, v = c.Seek([]byte(p.Cursor))
				if k != nil && bytes.Equal(k, []byte(p.Cursor)) {
					k, v = c.Next()
				}
			}
		}
		for k != nil || len(held) > 0 {
			var r *store.Record
			switch {
			case k == nil || len(held) > 0 && held[0].Key <= string(k):
				if k != nil && held[0].Key == string(k) {
					k, v = c.Next() // the held claim stands in front of the file's record
				}
				r, held = held[0], held[1:]
			default:
				var err error
				if r, err = store.UnmarshalRecord(v); err != nil {
					return &store.CorruptError{Key: string(k), Reason: err.Error()}
				}
				k, v = c.Next()
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

// Delete implements [store.Deleter].
func (s *Store) Delete(ctx context.Context, key string) error {
	if s.readOnly {
		return ErrReadOnly
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sl := s.lock(key)
	defer s.unlock(key, sl)
	h := sl.held.Load()
	checkpoints := s.commits.rotations.Load()
	found, err := s.inFile(key)
	if err != nil {
		return err
	}
	if h == nil {
		if !found {
			return store.ErrNotFound
		}
		return s.commit(ctx, key, nil)
	}
	rm := func(tx *bolt.Tx) error { return tx.Bucket(s.bucket).Delete([]byte(key)) }
	req := &request{post: dropEntry(key), drop: sl, dropping: h, checkpoints: checkpoints}
	if found {
		req.fn = rm
	} else {
		req.ifCheckpointed = rm
	}
	return translate(s.commits.send(req))
}

// Sweep deletes records expired at now (ms), SweepBatch per transaction,
// and forgets held claims expired at now; it returns how many. Damaged
// records are left for an operator.
func (s *Store) Sweep(now int64) (int, error) {
	if s.readOnly {
		return 0, ErrReadOnly
	}
	total := s.sweepHeld(now)
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

// sweepHeld forgets the held claims expired at now: holders that never
// settled. What the file may have below one (the record it replaced) is
// then the key's record again, expired or abandoned, as after a crash.
func (s *Store) sweepHeld(now int64) int {
	var keys []string
	s.mu.Lock()
	for k, sl := range s.slots {
		if r := sl.held.Load(); r != nil && r.Expired(now) {
			keys = append(keys, k)
		}
	}
	s.mu.Unlock()
	n := 0
	for _, k := range keys {
		sl := s.lock(k)
		if r := sl.held.Load(); r != nil && r.Expired(now) {
			// Its drop in the journal, so that a crash does not bring it back
			// (expired, but over the record it had replaced).
			if s.commits.send(&request{post: dropEntry(k), drop: sl, dropping: r}) != nil {
				sl.held.Store(nil) // closed: the journal is no more
			}
			n++
		}
		s.unlock(k, sl)
	}
	return n
}

// committer group-commits writes: one goroutine runs bbolt write
// transactions back to back, each with every write queued while the
// previous one ran. It also writes the drops of the held claims a batch
// settled to the claim journal (when there is one), in one write after its
// transaction, and runs the journal's checkpoints.
type committer struct {
	db    *bolt.DB
	delay time.Duration
	j     *journal     // nil: no Local claim is held
	check func() error // writes the held claims to the file and empties j

	mu      sync.Mutex
	queue   []*request
	closed  atomic.Bool   // set under mu
	wake    chan struct{} // cap 1: the queue is not empty, or closed
	stopped chan struct{}

	commits, writes atomic.Int64 // for tests and benchmarks
	rotations       atomic.Int64 // checkpoints run: see request.ifCheckpointed
}

type request struct {
	fn func(*bolt.Tx) error // the write to commit, nil for none
	// ifCheckpointed replaces a nil fn when a checkpoint ran since
	// checkpoints was read (it may have written the claim being dropped).
	ifCheckpointed func(*bolt.Tx) error
	checkpoints    int64
	post           []byte // journal entry written after the commit succeeded
	// drop, when set, is forgotten from its slot once the write succeeded,
	// before the reply: a checkpoint never sees a claim already settled.
	drop     *slot
	dropping *store.Record
	err      error
	done     chan error
}

func (c *committer) start(db *bolt.DB, delay time.Duration) {
	c.db, c.delay = db, delay
	c.wake, c.stopped = make(chan struct{}, 1), make(chan struct{})
	go c.run()
}

// do runs fn in a group commit and returns when the commit is durable. fn
// may run more than once (alone, after a batch failed), so it must set its
// results afresh each time.
func (c *committer) do(fn func(*bolt.Tx) error) error {
	return c.send(&request{fn: fn})
}

// send queues r and returns its outcome.
func (c *committer) send(r *request) error {
	// Not pooled: a channel made inside a synctest bubble must not be
	// used outside it.
	r.done = make(chan error, 1)
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return errClosed
	}
	c.queue = append(c.queue, r)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return <-r.done
}

func (c *committer) isClosed() bool { return c.closed.Load() }

// nudge wakes the committer with nothing queued: it checks whether the
// journal is due for a checkpoint.
func (c *committer) nudge() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// close refuses new writes, lets the queued ones commit, and waits for the
// committer to stop.
func (c *committer) close() {
	c.mu.Lock()
	c.closed.Store(true)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	<-c.stopped
}

func (c *committer) run() {
	defer close(c.stopped)
	var batch []*request
	for range c.wake {
		if c.delay > 0 {
			time.Sleep(c.delay)
		}
		for {
			c.mu.Lock()
			batch, c.queue = c.queue, batch[:0]
			closed := c.closed.Load()
			c.mu.Unlock()
			if len(batch) == 0 {
				if closed {
					return
				}
				if c.j != nil && c.j.due() {
					_ = c.check() // retried after the next batch if it failed
				}
				break
			}
			c.process(batch)
			clear(batch)
		}
	}
}

// process runs one batch: its transaction, the journal entries of the held
// claims it settled, then a checkpoint when the journal is over its size or
// a journal write failed.
func (c *committer) process(batch []*request) {
	var txs []*request
	for _, r := range batch {
		if r.fn == nil && r.ifCheckpointed != nil && c.rotations.Load() != r.checkpoints {
			r.fn = r.ifCheckpointed
		}
		if r.err == nil && r.fn != nil {
			txs = append(txs, r)
		}
	}
	if len(txs) > 0 {
		c.commit(txs)
	}
	var buf []byte
	failed := false
	for _, r := range batch {
		if r.err == nil {
			buf = append(buf, r.post...)
			if r.drop != nil {
				r.drop.held.CompareAndSwap(r.dropping, nil)
			}
		}
	}
	if c.j != nil && len(buf) > 0 {
		if err := c.j.append(buf); err != nil {
			failed = true
		}
	}
	if c.j != nil && (failed || c.j.due()) {
		// A failed write may have left a torn entry that would hide every
		// later one, or a drop unwritten: start the journal afresh.
		if err := c.check(); err != nil && failed {
			for _, r := range batch {
				if r.err == nil && r.post != nil {
					r.err = fmt.Errorf("boltstore: claim journal: %v: %w", err, store.ErrUnavailable)
				}
			}
		}
	}
	for _, r := range batch {
		r.done <- r.err
	}
}

// commit runs batch in one transaction; when that fails, each request is
// run alone, so that one request's error is its own.
func (c *committer) commit(batch []*request) {
	c.commits.Add(1)
	c.writes.Add(int64(len(batch)))
	err := c.db.Update(func(tx *bolt.Tx) error {
		for _, r := range batch {
			if err := r.fn(tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil || len(batch) == 1 {
		for _, r := range batch {
			r.err = err
		}
		return
	}
	for _, r := range batch {
		r.err = c.db.Update(r.fn)
	}
}
