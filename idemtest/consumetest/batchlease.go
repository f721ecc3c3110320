package consumetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store"
)

// Member is one member of a consumer group as an adapter runs it through
// its batch path (idemnats' ConsumeBatch, idemamqp's RunBatch): a
// consumer of its own on the real broker, reading a stream subject or
// queue that only it reads, so that a test decides which member gets
// which message.
type Member interface {
	// Publish sends a message keyed key with payload to this member alone,
	// and returns once the broker holds it.
	Publish(t *testing.T, key string, payload []byte)
	// Start starts consuming through the batch path, until t ends.
	Start(t *testing.T)
}

// MemberConfig is what a [Member] runs with.
type MemberConfig struct {
	// Engine is the member's own engine; Operation the operation name it
	// must use.
	Engine    *idem.Engine
	Operation string
	// Size is the most messages in one batch. The member's first batch
	// must hold all Size messages published before Start: let it wait
	// long enough for them (a batch that fills waits no longer).
	Size int
	// Concurrency is how many handlers of one batch run at once (the
	// adapter's option for it): 1, in order.
	Concurrency int
	// Handle is the handler: the adapter calls it with the message's key.
	Handle func(ctx context.Context, key string) error
	// Settled is called every time the member settles a delivery, with its
	// key and whether it was acknowledged (false: nakked, requeued,
	// delayed or left for redelivery).
	Settled func(key string, acked bool)
}

// NewMember makes a member of a consumer group with c, not yet started.
type NewMember func(t *testing.T, c MemberConfig) Member

// The timing of [BatchHoldsItsClaims] and [BatchSkipsLapsedClaims]: the lease of both members, when
// the copies are published to Y (past the lease, after the batch's
// claim), and the shortest run of the batch's slow head.
const (
	batchLease     = 2 * time.Second
	copiesAfter    = 2500 * time.Millisecond
	slowHeadLasts  = 3500 * time.Millisecond
	scenarioBounds = 20 * time.Second // every wait of the scenario, should the adapter hang
)

// BatchHoldsItsClaims is the hole of a batch whose items run fewer at
// once than it holds, on a real broker: no item of a batch runs after its
// claim lapsed while it waited for its turn. Two members of one group,
// each with its own engine (Lease 2s) over st, shared. Member X's batch is
// [a message whose handler takes 3.5s, M1, M2], run one at a time
// (Concurrency 1), so M1 and M2 wait behind the slow head. Once X has
// claimed them (checked in the store when the head starts) and their
// first lease has passed (2.5s), copies of M1 and M2 (same keys, same
// payloads) are published to member Y. Y must find them held by X — their
// claims renewed while they wait — and X then runs them: every key runs
// exactly once, by X, and every delivery ends acknowledged once (Y's
// copies after they came back as replays), with no redelivery loop.
// Before the batch held its waiting claims, Y took M1 and M2 over at 2.5s
// and ran them, and X ran them again at 3.5s.
//
// It takes four to seven seconds of real time: a lease must pass.
func BatchHoldsItsClaims(t *testing.T, st store.Store, newMember NewMember) {
	batchTail(t, st, newMember, false)
}

// BatchSkipsLapsedClaims is [BatchHoldsItsClaims] with X's renewals of M1
// and M2 failing (the store unreachable for them, a partition) until Y
// has taken them over and run them: when their turn comes in X's batch,
// X does not run them (their answer wraps idem.ErrLeaseLost, the verdict
// Leave), and the deliveries X left come back to X and are acknowledged
// as replays of Y's outcomes. Every key runs exactly once (M1 and M2 by
// Y) and every delivery ends acknowledged once.
func BatchSkipsLapsedClaims(t *testing.T, st store.Store, newMember NewMember) {
	batchTail(t, st, newMember, true)
}

func batchTail(t *testing.T, st store.Store, newMember NewMember, lapse bool) {
	op := fmt.Sprintf("consumetest-batchlease-%d", seq.Add(1))
	n := seq.Add(1)
	slow, m1, m2 := fmt.Sprintf("slow-%d", n), fmt.Sprintf("m1-%d", n), fmt.Sprintf("m2-%d", n)
	tail := []string{m1, m2}
	ctx := context.Background()

	var mu sync.Mutex
	ran := map[string][]string{} // key → the members that ran it, in order
	acks := map[string]int{}     // member/key → acknowledgements
	others := map[string]int{}   // member/key → other settlements
	started, release := make(chan struct{}), make(chan struct{})
	var headRan sync.Once
	engine := func(owner string, s store.Store) *idem.Engine {
		e, err := idem.New(s, &idem.Config{Owner: owner, Lease: batchLease})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	member := func(name string, e *idem.Engine) Member {
		return newMember(t, MemberConfig{Engine: e, Operation: op, Size: 3, Concurrency: 1,
			Handle: func(ctx context.Context, key string) error {
				mu.Lock()
				ran[key] = append(ran[key], name)
				mu.Unlock()
				if key != slow {
					return nil
				}
				headRan.Do(func() { close(started) })
				select {
				case <-release:
					return nil
				case <-time.After(scenarioBounds):
					return errors.New("consumetest: the slow head was never released")
				}
			},
			Settled: func(key string, acked bool) {
				mu.Lock()
				defer mu.Unlock()
				if acked {
					acks[name+"/"+key]++
				} else {
					others[name+"/"+key]++
				}
			}})
	}
	// X's store: st itself, or, when its claims are to lapse, st behind a
	// switch that fails the tail's renewals.
	xs := &cutRenewals{Store: faultstore.New(st), keys: map[string]bool{}}
	for _, k := range tail {
		xs.keys[storeKey(t, op, k).String()] = true
	}
	xe := engine("member-x", st)
	if lapse {
		xs.cut.Store(true)
		xe = engine("member-x", xs)
	}
	x, y := member("X", xe), member("Y", engine("member-y", st))
	payload := func(key string) []byte { return []byte(`{"order":"` + key + `"}`) }
	for _, k := range []string{slow, m1, m2} {
		x.Publish(t, k, payload(k))
	}
	x.Start(t)
	y.Start(t)
	// Run before the members' own cleanups, which wait for their batches.
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release) // the test failed before: let the head end
		}
	})

	select {
	case <-started:
	case <-time.After(scenarioBounds):
		t.Fatal("X's slow head never ran")
	}
	head := time.Now()
	// The tail was claimed with the head: X's batch is [slow, M1, M2].
	for _, k := range tail {
		s, err := xe.Status(ctx, storeKey(t, op, k))
		if err != nil || s.Status != idem.StatusInProgress || !strings.HasPrefix(s.Owner, "member-x") {
			t.Fatalf("%s when X's slow head starts: %+v %v; want IN_PROGRESS, claimed by X with the head (X's batch must be [slow, M1, M2])", k, s, err)
		}
	}
	// Past the tail's first lease, the copies go to Y.
	time.Sleep(time.Until(head.Add(copiesAfter)))
	for _, k := range tail {
		y.Publish(t, k, payload(k))
	}
	// Y answers both copies (held by X: delayed; their claims lapsed: run
	// and acknowledged) while X's head still runs; then the head ends, no
	// sooner than 3.5s, X's renewals working again.
	eventually(t, "Y settled its copies of M1 and M2 while X's head ran", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range tail {
			if acks["Y/"+k]+others["Y/"+k] == 0 || lapse && acks["Y/"+k] == 0 {
				return false
			}
		}
		return true
	})
	xs.cut.Store(false)
	time.Sleep(time.Until(head.Add(slowHeadLasts)))
	close(release)

	want := []string{"X/" + slow, "X/" + m1, "X/" + m2, "Y/" + m1, "Y/" + m2}
	eventually(t, "every delivery acknowledged", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range want {
			if acks[d] == 0 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	ranBy := map[string]string{slow: "X", m1: "X", m2: "X"}
	if lapse {
		ranBy[m1], ranBy[m2] = "Y", "Y"
	}
	for _, k := range []string{slow, m1, m2} {
		if len(ran[k]) != 1 || ran[k][0] != ranBy[k] {
			t.Errorf("%s ran %d times (by %v), want once, by %s: an item of X's batch ran after its claim lapsed, or was taken over while it waited", k, len(ran[k]), ran[k], ranBy[k])
		}
	}
	for _, d := range slices.Sorted(maps.Keys(acks)) {
		if acks[d] != 1 || !slices.Contains(want, d) {
			t.Errorf("%s acknowledged %d times, want once", d, acks[d])
		}
	}
	// Settled otherwise first: none of X's when it held its claims; X's
	// M1 and M2 (left, not run) when they lapsed.
	for _, d := range want[:3] {
		lost := lapse && d != "X/"+slow
		if got := others[d]; got != 0 && !lost || got == 0 && lost {
			t.Errorf("%s settled %d times besides its ack (claim lost while it waited: %v)", d, got, lost)
		}
	}
	for _, k := range []string{slow, m1, m2} {
		s, err := xe.Status(ctx, storeKey(t, op, k))
		if err != nil || s.Status != idem.StatusCompleted || !strings.HasPrefix(s.Owner, "member-"+strings.ToLower(ranBy[k])) {
			t.Errorf("%s at the end: %+v %v, want COMPLETED by %s", k, s, err, ranBy[k])
		}
	}
}

// cutRenewals fails the renewals of keys while cut is set, as if the
// store could not be reached for them, and passes everything else through.
type cutRenewals struct {
	*faultstore.Store
	keys map[string]bool
	cut  atomic.Bool
}

var errCut = fmt.Errorf("consumetest: partitioned from the store: %w", store.ErrUnavailable)

func (s *cutRenewals) Extend(ctx context.Context, p store.ExtendParams) error {
	if s.cut.Load() && s.keys[p.Key] {
		return errCut
	}
	return s.Store.Extend(ctx, p)
}

func (s *cutRenewals) ExtendBatch(ctx context.Context, ps []store.ExtendParams) []error {
	errs := make([]error, len(ps))
	pass, at := make([]store.ExtendParams, 0, len(ps)), make([]int, 0, len(ps))
	for i, p := range ps {
		if s.cut.Load() && s.keys[p.Key] {
			errs[i] = errCut
			continue
		}
		pass, at = append(pass, p), append(at, i)
	}
	if len(pass) > 0 {
		var res []error
		if b, ok := s.Inner.(store.BatchExtender); ok {
			res = b.ExtendBatch(ctx, pass) // the store's own batch, as without the switch
		} else {
			res = s.Store.ExtendBatch(ctx, pass)
		}
		for j, err := range res {
			errs[at[j]] = err
		}
	}
	return errs
}

// storeKey is the store key of key under op, as every adapter derives it.
func storeKey(t *testing.T, op, key string) idem.StoreKey {
	t.Helper()
	id, err := (&idem.Request{Operation: op, Key: key}).Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id.StoreKey
}

// eventually polls cond until it holds, failing t after scenarioBounds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(scenarioBounds)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", scenarioBounds, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
