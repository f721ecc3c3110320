// Package memstore is an in-memory idem store, for tests and for a single
// process that can afford to forget every record when it exits.
//
// It is bounded: when MaxRecords live records are held, a claim of a new
// key fails closed with an error wrapping store.ErrUnavailable; live records
// are never evicted to make room. Expired records are swept by a goroutine
// that stops on Close.
package memstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/seed-a1b882c0/idem/store"
)

// ErrFull is returned (wrapping store.ErrUnavailable) when a claim of a new
// key finds the store at MaxRecords live records.
var ErrFull = fmt.Errorf("memstore: full: %w", store.ErrUnavailable)

// Config configures a [Store]. A nil *Config means all defaults.
type Config struct {
	// MaxRecords bounds the number of records. Default 1,000,000.
	MaxRecords int
	// MaxResultBytes bounds a record's payload (result or error, or its
	// steps taken together). Default 16 MiB.
	MaxResultBytes int
	// SweepInterval is how often expired records are deleted. Default 1m;
	// negative disables the sweeper.
	SweepInterval time.Duration
	// Clock drives the sweeper. Default store.SystemClock.
	Clock store.Clock
}

// Store is an in-memory [store.Store]. It also implements [store.Lister],
// [store.Deleter] and [store.Stepper].
type Store struct {
	cfg Config

	mu sync.Mutex
	m  map[string]*store.Record

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// SystemName implements store.SystemNamer: the backend's db.system.name in
// the OpenTelemetry database semantic conventions, the store keeps its records in memory: "memory".
func (s *Store) SystemName() string { return "memory" }

var (
	_ store.Store        = (*Store)(nil)
	_ store.Lister       = (*Store)(nil)
	_ store.Deleter      = (*Store)(nil)
	_ store.BatchClaimer = (*Store)(nil)
	_ store.Stepper      = (*Store)(nil)
)

// New returns an empty store and starts its sweeper.
func New(cfg *Config) *Store {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MaxRecords <= 0 {
		c.MaxRecords = 1_000_000
	}
	if c.MaxResultBytes <= 0 {
		c.MaxResultBytes = 16 << 20
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Minute
	}
	if c.Clock == nil {
		c.Clock = store.SystemClock{}
	}
	s := &Store{cfg: c, m: make(map[string]*store.Record), stop: make(chan struct{}), done: make(chan struct{})}
	if c.SweepInterval > 0 {
		go store.Every(s.stop, s.done, s.cfg.Clock.After, s.cfg.SweepInterval, func() {
			s.Sweep(store.Millis(s.cfg.Clock.Now()))
		})
	} else {
		close(s.done)
	}
	return s
}

// Close stops the sweeper and waits for it. The store stays usable.
func (s *Store) Close() error {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

// Sweep deletes every record expired at now (ms) and returns how many.
func (s *Store) Sweep(now int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sweepLocked(now)
}

func (s *Store) sweepLocked(now int64) int {
	n := 0
	for k, r := range s.m {
		if r.Expired(now) {
			delete(s.m, k)
			n++
		}
	}
	return n
}

// Len returns the number of records held, expired or not.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// Claim implements [store.Store].
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return store.ClaimResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claimLocked(p)
}

func (s *Store) claimLocked(p store.ClaimParams) (store.ClaimResult, error) {
	old := s.m[p.Key]
	if old == nil && len(s.m) >= s.cfg.MaxRecords && s.sweepLocked(p.Now) == 0 {
		return store.ClaimResult{}, ErrFull
	}
	res, write := store.ApplyClaim(old, p)
	if write != nil {
		s.m[p.Key] = write
	}
	return res, nil
}

// ClaimBatch implements [store.BatchClaimer]: the claims are made in
// order under one lock.
func (s *Store) ClaimBatch(ctx context.Context, ps []store.ClaimParams) ([]store.ClaimResult, []error) {
	res, errs := make([]store.ClaimResult, len(ps)), make([]error, len(ps))
	if err := ctx.Err(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return res, errs
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range ps {
		res[i], errs[i] = s.claimLocked(p)
	}
	return res, errs
}

// held returns the record that a fenced write may change, or the error the
// contract names.
func (s *Store) held(c store.ClaimRef) (*store.Record, error) {
	r := s.m[c.Key]
	if err := store.CheckFence(r, c); err != nil {
		return nil, err
	}
	return r, nil
}

// CompleteBatch implements [store.BatchCompleter]: each Complete in turn.
// An in-process store has no round trip to save; it takes the engine's
// batched path so that the engine's tests run it, and storetest holds it
// to the contract as it does every store.
func (s *Store) CompleteBatch(ctx context.Context, ps []store.CompleteParams) []error {
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = s.Complete(ctx, p)
	}
	return errs
}

// ExtendBatch implements [store.BatchExtender]: each Extend in turn, as
// CompleteBatch does, so that the engine's batched renewals run here too.
func (s *Store) ExtendBatch(ctx context.Context, ps []store.ExtendParams) []error {
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = s.Extend(ctx, p)
	}
	return errs
}

// Complete implements [store.Store].
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(p.Result) > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: len(p.Result), Limit: s.cfg.MaxResultBytes}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.held(p.ClaimRef)
	if err != nil {
		return err
	}
	store.ApplyComplete(r, p)
	return nil
}

// Fail implements [store.Store].
func (s *Store) Fail(ctx context.Context, p store.FailParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := p.Check(); err != nil {
		return err
	}
	if n := p.Err.Size(); n > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: n, Limit: s.cfg.MaxResultBytes}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.held(p.ClaimRef)
	if err != nil {
		return err
	}
	store.ApplyFail(r, p)
	return nil
}

// Release implements [store.Store].
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.held(p.ClaimRef); err != nil {
		return err
	}
	delete(s.m, p.Key)
	return nil
}

// Extend implements [store.Store].
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	return s.change(ctx, p.Check(), p.ClaimRef, func(r *store.Record) error {
		store.ApplyExtend(r, p)
		return nil
	})
}

// RecordStep implements [store.Stepper]: the step is appended to the
// record under the store's lock, fenced as Complete is. MaxResultBytes
// bounds the record's steps taken together.
func (s *Store) RecordStep(ctx context.Context, p store.StepParams) error {
	return s.change(ctx, p.Check(), p.ClaimRef, func(r *store.Record) error {
		_, err := store.ApplyStep(r, p, s.cfg.MaxResultBytes)
		return err
	})
}

// change applies apply, under the store's lock, to the IN_PROGRESS record
// that holds ref, unless the write's parameters were refused (bad, from
// their Check) or ctx is done.
func (s *Store) change(ctx context.Context, bad error, ref store.ClaimRef, apply func(*store.Record) error) error {
	if bad != nil {
		return bad
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.held(ref)
	if err != nil {
		return err
	}
	return apply(r)
}

// Get implements [store.Store].
func (s *Store) Get(ctx context.Context, key string) (*store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.m[key]
	if !ok {
		return nil, store.ErrNotFound
	}
	return r.Clone(), nil
}

// List implements [store.Lister]: records in key order, the cursor being the
// last key of the previous page.
func (s *Store) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	if err := ctx.Err(); err != nil {
		return store.ListResult{}, err
	}
	s.mu.Lock()
	var recs []*store.Record
	for k, r := range s.m {
		if k > p.Cursor && p.Matches(r) {
			recs = append(recs, r.Clone())
		}
	}
	s.mu.Unlock()
	slices.SortFunc(recs, func(a, b *store.Record) int { return cmp.Compare(a.Key, b.Key) })
	var out store.ListResult
	if n := p.PageSize(); len(recs) > n {
		recs = recs[:n]
		out.Next = recs[n-1].Key
	}
	out.Records = recs
	return out, nil
}

// Delete implements [store.Deleter].
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[key]; !ok {
		return store.ErrNotFound
	}
	delete(s.m, key)
	return nil
}

var _ store.Diagnoser = (*Store)(nil)

// Diagnose implements store.Diagnoser with one finding, "persistence", a
// warning: the records live in this process's memory and are forgotten
// when it exits, and their operations then run again.
func (s *Store) Diagnose(context.Context) []store.Finding {
	return []store.Finding{{Check: "persistence", Severity: store.SeverityWarning,
		What: "records live in this process's memory: they are forgotten when it exits, and their operations then run again",
		Fix:  "for records that must outlive the process, use a bolt file, Redis with persistence, PostgreSQL or DynamoDB (docs/stores.md)"}}
}
