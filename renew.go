// Lease renewal: one timer for the leases of every running holder, each
// renewed every interval while its operation runs.

package idem

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// renewals renews the leases of the engine's running calls: one queue
// ordered by when each renewal is due, and one timer (the clock's
// AfterFunc) for the earliest, instead of a timer per call. A renewal
// runs on a goroutine of its own, so a slow store delays no other.
//
// A holder is in the queue while its renewal is wanted and not in flight;
// stop waits for a renewal in flight, so none lands after the outcome
// write (or a hand-off) that follows it.
type renewals struct {
	e     *Engine
	mu    sync.Mutex
	ended sync.Cond   // signalled when a renewal in flight ends
	queue renewQueue  // a min-heap by next
	timer store.Timer // fires at armed, for queue[0]
	armed int64       // when timer fires (UnixNano); 0 when none
	fire  func()      // r.due, made once
}

func (r *renewals) init(e *Engine) {
	r.e = e
	r.ended.L = &r.mu
	r.fire = r.due
}

// interval is how often h's lease is renewed: a third of the lease, at
// most Config.RenewInterval.
func (h *holder) interval() time.Duration {
	return min(h.e.cfg.RenewInterval, max(h.lease/3, time.Millisecond))
}

// start renews h's lease an interval after now, and every interval after.
func (r *renewals) start(h *holder, now time.Time) {
	r.mu.Lock()
	r.scheduleLocked(h, now)
	r.mu.Unlock()
}

// scheduleLocked queues h's next renewal an interval after now, or, for a
// claim made with a lease longer than a renewed one (a far deadline), once
// that lease has no more than a renewed lease less an interval left: as
// the lease of a claim without a deadline always has. Under r.mu.
func (r *renewals) scheduleLocked(h *holder, now time.Time) {
	h.renewOn = true
	next := now.Add(h.interval())
	if first := store.FromMillis(h.claimedUntil).Add(h.interval() - h.lease); first.After(next) {
		next = first
	}
	h.next = next.UnixNano()
	r.push(h)
	r.arm()
}

// stopRenewal ends h's renewal, waiting for a renewal in flight. It is
// safe on a holder whose lease is not renewed.
func (h *holder) stopRenewal() {
	if h.cancel == nil {
		return
	}
	r := &h.e.renewals
	r.mu.Lock()
	h.renewOn = false
	if h.qi > 0 {
		r.remove(h)
	}
	for h.renewing {
		r.ended.Wait()
	}
	r.mu.Unlock()
}

// resumeRenewal restarts renewal after stopRenewal (a Detach whose write
// failed), unless the claim was lost or settled meanwhile.
func (h *holder) resumeRenewal() {
	if h.cancel == nil {
		return
	}
	r := &h.e.renewals
	r.mu.Lock()
	defer r.mu.Unlock()
	if h.ended || h.renewOn {
		return
	}
	r.scheduleLocked(h, h.e.cfg.Clock.Now())
}

// due runs when the timer fires: every renewal due starts. Over a store
// that renews in batches ([store.BatchExtender]) the renewals due
// together — the claims of a batch waiting for their turn, concurrent
// calls — go in one round trip; else each goes on its own goroutine.
func (r *renewals) due() {
	r.mu.Lock()
	r.armed, r.timer = 0, nil
	now := r.e.cfg.Clock.Now().UnixNano()
	var run []*holder
	for len(r.queue) > 0 && r.queue[0].next <= now {
		h := r.queue[0]
		r.remove(h)
		h.renewing = true
		run = append(run, h)
	}
	r.arm()
	r.mu.Unlock()
	if be, ok := r.e.store.(store.BatchExtender); ok && len(run) > 1 {
		for len(run) > 0 {
			n := min(len(run), maxRenewBatch)
			chunk := run[:n]
			if run = run[n:]; len(run) == 0 {
				r.renewAll(be, chunk) // the timer's own goroutine takes the last
			} else {
				go r.renewAll(be, chunk)
			}
		}
		return
	}
	for i, h := range run {
		if i == len(run)-1 {
			h.renewOnce() // the timer's own goroutine takes the last
		} else {
			go h.renewOnce()
		}
	}
}

// maxRenewBatch is the most renewals one ExtendBatch carries.
const maxRenewBatch = 512

// renewAll renews the leases of hs in one ExtendBatch, each under its own
// claim and with its own answer, as renewOnce would one by one.
func (r *renewals) renewAll(be store.BatchExtender, hs []*holder) {
	e := r.e
	now := store.Millis(e.cfg.Clock.Now())
	ps := make([]store.ExtendParams, len(hs))
	timeout := e.cfg.WriteTimeout
	for i, h := range hs {
		ps[i] = store.ExtendParams{ClaimRef: h.ref(now), LeaseUntil: h.renewalEnd(now)}
		timeout = min(timeout, h.attemptTimeout())
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	var errs []error
	_ = e.timed(observe.StoreExtend, func() error { // counted; each holder's own answer is handled below
		errs = be.ExtendBatch(ctx, ps)
		return batchAnswers(&errs, len(ps), ps[0].Key, "extend")
	})
	cancel()
	for i, h := range hs {
		h.renewed(ps[i].LeaseUntil, errs[i])
	}
}

// arm sets the timer for the earliest renewal, unless it is set for an
// earlier time already (it then re-arms when it fires). Under r.mu.
func (r *renewals) arm() {
	if len(r.queue) == 0 {
		if r.timer != nil {
			r.timer.Stop()
			r.timer, r.armed = nil, 0
		}
		return
	}
	next := r.queue[0].next
	if r.timer != nil && r.armed <= next {
		return
	}
	if r.timer != nil {
		r.timer.Stop()
	}
	d := time.Duration(next - r.e.cfg.Clock.Now().UnixNano())
	r.timer, r.armed = r.e.cfg.Clock.AfterFunc(max(d, 0), r.fire), next
}

// renewalEnd is the lease end a renewal made at now (ms) asks for: a
// renewed lease from now, never before the lease the claim was made with,
// never past the claim's expiry.
func (h *holder) renewalEnd(now int64) int64 {
	return min(max(now+max(h.lease.Milliseconds(), 1), h.claimedUntil), h.expiresAt)
}

// attemptTimeout is how long one renewal may take: at most half an
// interval, and a failed one is tried again after a quarter, so that a
// reply that never comes, or a short outage, does not let the lease lapse
// while the work runs (with the default interval of a third of the lease,
// three attempts fit in it).
func (h *holder) attemptTimeout() time.Duration {
	return min(h.e.cfg.WriteTimeout, max(h.interval()/2, time.Millisecond))
}

// renewOnce makes one renewal of h's lease and queues the next.
func (h *holder) renewOnce() {
	e := h.e
	now := store.Millis(e.cfg.Clock.Now())
	until := h.renewalEnd(now)
	ctx, cancel := context.WithTimeout(context.Background(), h.attemptTimeout())
	ctx, ss := h.storeSpan(ctx, observe.StoreExtend)
	err := e.timed(observe.StoreExtend, func() error {
		return e.store.Extend(ctx, store.ExtendParams{ClaimRef: h.ref(now), LeaseUntil: until})
	})
	endStore(ss, err)
	cancel()
	h.renewed(until, err)
}

// renewed handles the answer (err) of a renewal of h's lease to until, and
// queues the next: at once after a refusal that says the claim is gone
// (taken over: the operation is cancelled, or an item of a batch still
// waiting its turn will not run), a quarter interval after a failure, an
// interval after a renewal that landed.
func (h *holder) renewed(until int64, err error) {
	e := h.e
	r := &e.renewals
	next := h.interval()
	lost := false
	switch fe, fenced := asFenced(err); {
	case err == nil:
		h.flight.leaseUntil.Store(until)
		h.event(observe.Event{Kind: observe.EventRenew, LeaseUntil: store.FromMillis(until)})
	case fenced && fe.Own():
		// The outcome write landed before its reply came back: nothing
		// is left to renew.
		next = -1
	case store.TakenOver(err):
		e.cfg.Observer.Observe(h.name, observe.OutcomeFenced)
		h.event(observe.Event{Kind: observe.EventLeaseLost, Fence: h.fence, Err: err})
		e.cfg.Logger.Error("idem: lease renewal refused; the key was taken over, cancelling the operation",
			"key", h.key, "fence", h.fence, "err", err)
		next, lost = -1, true
	default:
		e.cfg.Observer.Observe(h.name, observe.OutcomeStoreError)
		h.event(observe.Event{Kind: observe.EventRenew, LeaseUntil: store.FromMillis(until), Err: err})
		e.cfg.Logger.Warn("idem: lease renewal failed; will retry", "key", h.key, "err", err)
		next = max(h.interval()/4, time.Millisecond)
	}
	r.mu.Lock()
	h.renewing = false
	switch {
	case next < 0:
		h.renewOn, h.ended = false, true
		h.lost = h.lost || lost
	case h.renewOn && until < h.expiresAt: // the claim cannot outlive its expiry
		h.next = e.cfg.Clock.Now().Add(next).UnixNano()
		r.push(h)
		r.arm()
	}
	r.ended.Broadcast()
	r.mu.Unlock()
	if lost {
		// The cause is ErrLeaseLost and the store's refusal (a
		// *store.FencedError or store.ErrNotFound), so that an operation
		// that stops on it can say why.
		h.cancel(&leaseLostError{err})
	}
}

// push adds h to the queue. Under r.mu.
func (r *renewals) push(h *holder) { heap.Push(&r.queue, h) }

// remove takes h out of the queue. Under r.mu.
func (r *renewals) remove(h *holder) { heap.Remove(&r.queue, h.qi-1) }

// renewQueue is the holders waiting for their next renewal, a
// container/heap by next; each holder's qi is its index + 1 (0: not
// queued).
type renewQueue []*holder

func (q renewQueue) Len() int           { return len(q) }
func (q renewQueue) Less(i, j int) bool { return q[i].next < q[j].next }
func (q renewQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].qi, q[j].qi = i+1, j+1
}

// Push implements heap.Interface.
func (q *renewQueue) Push(x any) {
	h := x.(*holder)
	*q = append(*q, h)
	h.qi = len(*q)
}

// Pop implements heap.Interface.
func (q *renewQueue) Pop() any {
	old := *q
	h := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	h.qi = 0
	return h
}
