// Package faultstore wraps an store.Store to count its calls and inject
// failures, for tests: fail the Nth call of a method, every call while a
// switch is on, or the calls on some keys.
package faultstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/seed-a1b882c0/idem/store"
)

// Store wraps Inner. Set Fail to make calls fail; read Calls to count them.
type Store struct {
	Inner store.Store

	mu sync.Mutex
	// fail, keyed by method name, returns the error to inject for call n
	// (1-based) of that method, or nil to pass the call through.
	fail map[string]func(n int64) error
	// lost, keyed by method name, returns the error to answer call n with
	// after it was applied (a lost reply), or nil.
	lost map[string]func(n int64) error
	// keys, keyed by method name, returns the error to inject for a call
	// of that method on key, or nil to pass the call through.
	keys  map[string]func(key string) error
	calls map[string]*atomic.Int64
}

// New wraps inner.
func New(inner store.Store) *Store {
	s := &Store{Inner: inner, fail: map[string]func(int64) error{}, lost: map[string]func(int64) error{}, keys: map[string]func(string) error{}, calls: map[string]*atomic.Int64{}}
	for _, m := range []string{"claim", "claim_batch", "complete", "complete_batch", "fail", "release", "extend", "extend_batch", "get", "record_step"} {
		s.calls[m] = new(atomic.Int64)
	}
	return s
}

// FailWith makes method fail with the error f returns for call n (nil
// passes). A nil f removes the fault.
func (s *Store) FailWith(method string, f func(n int64) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == nil {
		delete(s.fail, method)
		return
	}
	s.fail[method] = f
}

// FailKeys makes the calls of method on a key fail with the error f
// returns for that key (nil passes): a fault of some keys, the others
// served. It applies to the methods that name one key ("claim",
// "complete", "fail", "release", "extend", "get"), and so to each
// Complete of a CompleteBatch and each Extend of an ExtendBatch, which
// are made through them; the call is counted either way. A nil f removes
// the fault.
func (s *Store) FailKeys(method string, f func(key string) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == nil {
		delete(s.keys, method)
		return
	}
	s.keys[method] = f
}

// LoseReplies makes method apply call n and then answer with the error f
// returns for it (nil answers as usual): the write happened, and the caller
// cannot know. A nil f removes the fault.
func (s *Store) LoseReplies(method string, f func(n int64) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == nil {
		delete(s.lost, method)
		return
	}
	s.lost[method] = f
}

// FailAlways makes every call of method fail with err.
func (s *Store) FailAlways(method string, err error) {
	s.FailWith(method, func(int64) error { return err })
}

// Calls returns how many times method was called.
func (s *Store) Calls(method string) int64 { return s.calls[method].Load() }

// Total returns the number of calls of every method.
func (s *Store) Total() int64 {
	var n int64
	for _, c := range s.calls {
		n += c.Load()
	}
	return n
}

func (s *Store) inject(method string) error {
	n := s.calls[method].Add(1)
	s.mu.Lock()
	f := s.fail[method]
	s.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(n)
}

// injectKey is inject for a call of method on key, with the key's fault
// after the call's.
func (s *Store) injectKey(method, key string) error {
	if err := s.inject(method); err != nil {
		return err
	}
	s.mu.Lock()
	f := s.keys[method]
	s.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(key)
}

// reply returns err, or the lost-reply fault for the last call of method
// when err is nil.
func (s *Store) reply(method string, err error) error {
	s.mu.Lock()
	f := s.lost[method]
	s.mu.Unlock()
	if err != nil || f == nil {
		return err
	}
	return f(s.calls[method].Load())
}

// Claim implements store.Store.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	if err := s.injectKey("claim", p.Key); err != nil {
		return store.ClaimResult{}, err
	}
	return s.Inner.Claim(ctx, p)
}

// ClaimBatch implements store.BatchClaimer, counted as one "claim_batch"
// call: a fault fails every claim of the batch. Over an inner store
// without batch claims the claims are made one by one.
func (s *Store) ClaimBatch(ctx context.Context, ps []store.ClaimParams) ([]store.ClaimResult, []error) {
	res, errs := make([]store.ClaimResult, len(ps)), make([]error, len(ps))
	if err := s.inject("claim_batch"); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return res, errs
	}
	if bc, ok := s.Inner.(store.BatchClaimer); ok {
		return bc.ClaimBatch(ctx, ps)
	}
	for i, p := range ps {
		res[i], errs[i] = s.Inner.Claim(ctx, p)
	}
	return res, errs
}

// RecordStep implements store.Stepper, counted as "record_step", with its
// faults and lost replies. Over an inner store without steps it fails
// with an error wrapping store.ErrMisconfigured.
func (s *Store) RecordStep(ctx context.Context, p store.StepParams) error {
	if err := s.inject("record_step"); err != nil {
		return err
	}
	st, ok := s.Inner.(store.Stepper)
	if !ok {
		return fmt.Errorf("faultstore: the inner store %T does not record steps: %w", s.Inner, store.ErrMisconfigured)
	}
	return s.reply("record_step", st.RecordStep(ctx, p))
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	if err := s.injectKey("complete", p.Key); err != nil {
		return err
	}
	return s.reply("complete", s.Inner.Complete(ctx, p))
}

// CompleteBatch implements store.BatchCompleter, counted as one
// "complete_batch" call (a fault there fails every Complete of the batch)
// and as one "complete" call per Complete, whose faults and lost replies
// apply to each as they would alone. The Completes are then made one by
// one on the inner store.
func (s *Store) CompleteBatch(ctx context.Context, ps []store.CompleteParams) []error {
	errs := make([]error, len(ps))
	if err := s.inject("complete_batch"); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for i, p := range ps {
		errs[i] = s.Complete(ctx, p)
	}
	return errs
}

// ExtendBatch implements store.BatchExtender, counted as one
// "extend_batch" call (a fault there fails every Extend of the batch) and
// as one "extend" call per Extend, whose faults and lost replies apply to
// each as they would alone.
func (s *Store) ExtendBatch(ctx context.Context, ps []store.ExtendParams) []error {
	errs := make([]error, len(ps))
	if err := s.inject("extend_batch"); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for i, p := range ps {
		errs[i] = s.Extend(ctx, p)
	}
	return errs
}

// Fail implements store.Store.
func (s *Store) Fail(ctx context.Context, p store.FailParams) error {
	if err := s.injectKey("fail", p.Key); err != nil {
		return err
	}
	return s.reply("fail", s.Inner.Fail(ctx, p))
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	if err := s.injectKey("release", p.Key); err != nil {
		return err
	}
	return s.reply("release", s.Inner.Release(ctx, p))
}

// Extend implements store.Store.
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	if err := s.injectKey("extend", p.Key); err != nil {
		return err
	}
	return s.reply("extend", s.Inner.Extend(ctx, p))
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (*store.Record, error) {
	if err := s.injectKey("get", key); err != nil {
		return nil, err
	}
	return s.Inner.Get(ctx, key)
}
