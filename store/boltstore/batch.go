package boltstore

import (
	"context"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/seed-a1b882c0/idem/store"
)

// ExtendBatch implements [store.BatchExtender]: every renewal decided as
// Extend decides it, under the slots of all the batch's keys (taken in key
// order, so that two batches never wait for each other's), and written in
// one group commit: one bbolt transaction and its fdatasyncs for the whole
// batch. Each renewal keeps its own answer; a key named twice sees its
// earlier renewal. As with Extend, renewing a held Local claim writes it
// to the file.
func (s *Store) ExtendBatch(ctx context.Context, ps []store.ExtendParams) []error {
	errs := make([]error, len(ps))
	var keys []string
	for i, p := range ps {
		if errs[i] = p.Check(); errs[i] == nil {
			keys = append(keys, p.Key)
		}
	}
	if len(keys) == 0 {
		return errs
	}
	refuse := func(err error) []error {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	if s.readOnly {
		return refuse(ErrReadOnly)
	}
	if err := ctx.Err(); err != nil {
		return refuse(err)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	slots := make(map[string]*slot, len(keys))
	for _, k := range keys {
		slots[k] = s.lock(k)
	}
	defer func() {
		for _, k := range keys {
			s.unlock(k, slots[k])
		}
	}()

	// Each key's record as the batch's renewals see it: the held claim,
	// else the file's, all read in one transaction.
	recs := make(map[string]*store.Record, len(keys))
	bad := map[string]error{} // a record that cannot be read: its key's error
	err := s.db.View(func(tx *bolt.Tx) error {
		for _, k := range keys {
			if h := slots[k].held.Load(); h != nil {
				recs[k] = h.Clone()
				continue
			}
			r, err := s.read(tx, k)
			if err != nil {
				bad[k] = err
			}
			recs[k] = r
		}
		return nil
	})
	if err != nil {
		return refuse(translate(err))
	}
	var renewed []int // the renewals the records allowed
	for i, p := range ps {
		if errs[i] != nil {
			continue
		}
		if err := bad[p.Key]; err != nil {
			errs[i] = err
			continue
		}
		r := recs[p.Key]
		if errs[i] = store.CheckFence(r, p.ClaimRef); errs[i] == nil {
			store.ApplyExtend(r, p)
			renewed = append(renewed, i)
		}
	}
	if len(renewed) == 0 {
		return errs
	}
	// One write per key renewed, its last state; a held claim's write is
	// followed by its drop in the journal, as fenced does.
	at := map[string]int{} // key → its request
	var reqs []*request
	for _, i := range renewed {
		k := ps[i].Key
		if _, ok := at[k]; ok {
			continue
		}
		at[k] = len(reqs)
		v := store.MarshalRecord(recs[k])
		req := &request{fn: func(tx *bolt.Tx) error { return tx.Bucket(s.bucket).Put([]byte(k), v) }}
		if h := slots[k].held.Load(); h != nil {
			req.post, req.drop, req.dropping = dropEntry(k), slots[k], h
		}
		reqs = append(reqs, req)
	}
	if err := ctx.Err(); err != nil {
		for _, i := range renewed {
			errs[i] = err
		}
		return errs
	}
	written := s.commits.sendAll(reqs)
	for _, i := range renewed {
		errs[i] = translate(written[at[ps[i].Key]])
	}
	return errs
}

// sendAll queues rs together, so that the committer takes them into one
// transaction (each keeps its own outcome: see commit), and returns their
// outcomes.
func (c *committer) sendAll(rs []*request) []error {
	errs := make([]error, len(rs))
	for _, r := range rs {
		r.done = make(chan error, 1) // not pooled: see send
	}
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		for i := range errs {
			errs[i] = errClosed
		}
		return errs
	}
	c.queue = append(c.queue, rs...)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	for i, r := range rs {
		errs[i] = <-r.done
	}
	return errs
}
