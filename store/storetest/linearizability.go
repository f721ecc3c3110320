package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/seed-a1b882c0/idem/store"
)

// The linearizability check drives the raw store with LinClients
// concurrent clients over a few keys, records every call's invocation and
// response order, and asks porcupine whether some sequential order of the
// calls, consistent with real time, explains every answer under a model of
// one record (the state machine of DESIGN §2).

type linKind uint8

const (
	linClaim linKind = iota
	linComplete
	linFail
	linRelease
	linExtend
	linGet
)

var linKindNames = [...]string{"claim", "complete", "fail", "release", "extend", "get"}

type linInput struct {
	kind       linKind
	key        string
	now        int64
	owner, fp  string
	fence      uint64
	leaseUntil int64 // claim, extend
	expiresAt  int64 // claim, complete, fail
	result     string
}

// linRecord is the comparable part of a record the model tracks.
type linRecord struct {
	exists     bool
	status     store.Status
	fence      uint64
	owner, fp  string
	leaseUntil int64
	expiresAt  int64
	result     string
}

type linOutput struct {
	err      string // "", "notfound", "fenced", or "other: ..."
	acquired bool
	takeover bool
	rec      linRecord // claim and get
	// unknown marks a call that failed with another error: whether it
	// took effect is unknown (a timed-out write may have been applied).
	unknown bool
}

func errClass(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, store.ErrNotFound):
		return "notfound"
	case errors.Is(err, store.ErrFenced):
		return "fenced"
	}
	return "other: " + err.Error()
}

func toLin(r *store.Record) linRecord {
	if r == nil {
		return linRecord{}
	}
	res := string(r.Result)
	if r.Err != nil {
		res = "err:" + r.Err.Code
	}
	return linRecord{exists: true, status: r.Status, fence: r.Fence, owner: r.Owner, fp: r.Fingerprint,
		leaseUntil: r.LeaseUntil, expiresAt: r.ExpiresAt, result: res}
}

// linStep is the model: given the state before, the input and the store's
// answer, is the answer legal, and what is the state after?
func linStep(st linRecord, in linInput, out linOutput) (bool, linRecord) {
	if out.unknown {
		return true, linEffect(st, in)
	}
	live := st.exists && in.now < st.expiresAt
	held := func() string {
		if !live {
			return "notfound"
		}
		if st.fence != in.fence || st.owner != in.owner || st.status != store.StatusInProgress {
			return "fenced"
		}
		return ""
	}
	switch in.kind {
	case linClaim:
		if out.err != "" {
			return false, st
		}
		fresh := linRecord{exists: true, status: store.StatusInProgress, owner: in.owner, fp: in.fp,
			leaseUntil: in.leaseUntil, expiresAt: in.expiresAt}
		switch {
		case !live:
			// Absent: fence 1. Expired but present: fence+1; a backend
			// that already reclaimed it answers 1.
			if !out.acquired || out.takeover {
				return false, st
			}
			fresh.fence = out.rec.fence
			if fresh.fence != 1 && !(st.exists && fresh.fence == st.fence+1) {
				return false, st
			}
			return out.rec == fresh, fresh
		case st.status == store.StatusInProgress && in.now >= st.leaseUntil:
			fresh.fence = st.fence + 1
			return out.acquired && out.takeover && out.rec == fresh, fresh
		case st.status == store.StatusInProgress && st.owner == in.owner && st.fp == in.fp:
			return out.acquired && !out.takeover && out.rec == st, st
		default:
			return !out.acquired && out.rec == st, st
		}
	case linComplete, linFail:
		want := held()
		if out.err != want {
			return false, st
		}
		if want != "" {
			return true, st
		}
		next := st
		next.status, next.expiresAt, next.result = store.StatusCompleted, in.expiresAt, in.result
		if in.kind == linFail {
			next.status, next.result = store.StatusFailed, "err:"+in.result
		}
		return true, next
	case linRelease:
		want := held()
		if out.err != want {
			return false, st
		}
		if want != "" {
			return true, st
		}
		return true, linRecord{}
	case linExtend:
		want := held()
		if out.err != want {
			return false, st
		}
		if want != "" {
			return true, st
		}
		next := st
		next.leaseUntil = in.leaseUntil
		return true, next
	case linGet:
		if !st.exists {
			return out.err == "notfound", st
		}
		if !live && out.err == "notfound" {
			return true, st // reclaimed by the backend's TTL or sweeper
		}
		return out.err == "" && out.rec == st, st
	}
	return false, st
}

// linEffect is the state after a call whose answer is unknown, placed
// where it took effect: the state after the answer the model accepts for
// a success there (a claim acquiring the next fence, a fenced write done),
// or st when no success is legal there (a conflict, a refusal, a read).
// The history records such a call as returning after every other call, so
// the checker may equally place it last, where no one sees its effect:
// "not applied".
func linEffect(st linRecord, in linInput) linRecord {
	var wins []linOutput
	switch in.kind {
	case linClaim:
		fresh := linRecord{exists: true, status: store.StatusInProgress, owner: in.owner, fp: in.fp,
			leaseUntil: in.leaseUntil, expiresAt: in.expiresAt, fence: st.fence + 1}
		wins = []linOutput{{acquired: true, rec: fresh}, {acquired: true, takeover: true, rec: fresh}}
	case linGet:
	default:
		wins = []linOutput{{}}
	}
	for _, out := range wins {
		if ok, next := linStep(st, in, out); ok {
			return next
		}
	}
	return st
}

var linModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range history {
			k := op.Input.(linInput).key
			if _, ok := byKey[k]; !ok {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return linRecord{} },
	Step: func(state, input, output any) (bool, any) {
		return linStep(state.(linRecord), input.(linInput), output.(linOutput))
	},
	Equal: func(a, b any) bool { return a.(linRecord) == b.(linRecord) },
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		if out.unknown {
			return fmt.Sprintf("%s(now=%d fence=%d owner=%s) -> unknown outcome, %s",
				linKindNames[in.kind], in.now, in.fence, in.owner, out.err)
		}
		return fmt.Sprintf("%s(now=%d fence=%d owner=%s) -> err=%q acq=%v takeover=%v rec=%+v",
			linKindNames[in.kind], in.now, in.fence, in.owner, out.err, out.acquired, out.takeover, out.rec)
	},
	DescribeState: func(state any) string { return fmt.Sprintf("%+v", state.(linRecord)) },
}

// TestLinearizability runs LinClients clients making LinOps calls in all
// over four keys, with leases and expiry short enough (in the suite's
// logical milliseconds) that takeovers, expiries and stale fences are
// common, and checks the history with porcupine.
func TestLinearizability(t *testing.T, f Features, newStore NewStore) {
	f = f.withDefaults()
	s := newStore(t)
	keys := []string{newKey(t), newKey(t), newKey(t), newKey(t)}
	fps := []string{fp("x"), fp("y")}
	const (
		tick     = 1 // logical ms per call
		linLease = 12
		linExp   = 60
	)
	t0 := base()
	var clock, seq atomic.Int64
	perClient := f.LinOps / f.LinClients
	ops := make([][]porcupine.Operation, f.LinClients)
	var wg sync.WaitGroup
	for c := range f.LinClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 42))
			fences := map[string]uint64{}
			owners := map[string]string{}
			ctx := context.Background()
			for i := range perClient {
				key := keys[rng.IntN(len(keys))]
				now := t0 + clock.Add(tick)
				fence, owner := fences[key], owners[key]
				switch rng.IntN(16) { // sometimes stale or wrong on purpose
				case 0, 1:
					fence = uint64(rng.IntN(4))
				case 2:
					owner = fmt.Sprintf("c%d-%d", rng.IntN(f.LinClients), rng.IntN(max(i, 1)))
				}
				in := linInput{key: key, now: now, fence: fence, owner: owner}
				switch r := rng.IntN(100); {
				case r < 35:
					in.kind = linClaim
					in.owner = fmt.Sprintf("c%d-%d", c, i)
					in.fp = fps[rng.IntN(len(fps))]
					in.leaseUntil, in.expiresAt = now+linLease, now+linExp
				case r < 55:
					in.kind, in.result, in.expiresAt = linComplete, fmt.Sprintf("r%d-%d", c, i), now+linExp
				case r < 63:
					in.kind, in.result, in.expiresAt = linFail, fmt.Sprintf("e%d-%d", c, i), now+linExp
				case r < 73:
					in.kind = linRelease
				case r < 83:
					in.kind, in.leaseUntil = linExtend, now+linLease
				default:
					in.kind = linGet
				}
				call := seq.Add(1)
				out := linApply(ctx, s, in)
				ret := seq.Add(1)
				if out.err != "" && out.err != "notfound" && out.err != "fenced" {
					t.Errorf("%s: unexpected store error %s", linKindNames[in.kind], out.err)
					out.unknown = true
				}
				if in.kind == linClaim && out.acquired {
					fences[key], owners[key] = out.rec.fence, out.rec.owner
				}
				ops[c] = append(ops[c], porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
			}
		}()
	}
	wg.Wait()
	var history []porcupine.Operation
	kinds := map[string]int{}
	end := seq.Load()
	for _, o := range ops {
		for i, op := range o {
			if op.Output.(linOutput).unknown {
				// Unanswered: it may take effect any time after its call.
				end++
				o[i].Return = end
			}
		}
		history = append(history, o...)
		for _, op := range o {
			out := op.Output.(linOutput)
			name := linKindNames[op.Input.(linInput).kind]
			if out.err != "" {
				name += "/" + out.err
			} else if op.Input.(linInput).kind == linClaim {
				name += fmt.Sprintf("/acquired=%v,takeover=%v", out.acquired, out.takeover)
			}
			kinds[name]++
		}
	}
	res, info := porcupine.CheckOperationsVerbose(linModel, history, f.LinTimeout)
	switch res {
	case porcupine.Ok:
		t.Logf("linearizable: %d operations by %d clients over %d keys; %v", len(history), f.LinClients, len(keys), kinds)
	case porcupine.Illegal:
		// The test's artifact directory: kept under -artifacts DIR, else
		// removed with the test, so passing runs (the suite's self-test
		// fails broken stores on purpose) leave nothing behind.
		path := filepath.Join(t.ArtifactDir(), "linearizability.html")
		if err := porcupine.VisualizePath(linModel, info, path); err != nil {
			path = "(visualization failed: " + err.Error() + ")"
		}
		t.Fatalf("history of %d operations is NOT linearizable against the record model; outcome mix %v; visualization in %s (run with -artifacts DIR to keep it)", len(history), kinds, path)
	default:
		t.Fatalf("linearizability check inconclusive after %v (%d operations)", f.LinTimeout, len(history))
	}
}

func linApply(ctx context.Context, s store.Store, in linInput) linOutput {
	var out linOutput
	switch in.kind {
	case linClaim:
		res, err := s.Claim(ctx, store.ClaimParams{Key: in.key, Fingerprint: in.fp, Owner: in.owner, Now: in.now, LeaseUntil: in.leaseUntil, ExpiresAt: in.expiresAt})
		out.err, out.acquired, out.takeover, out.rec = errClass(err), res.Acquired, res.Takeover, toLin(res.Record)
	case linComplete:
		out.err = errClass(s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: in.key, Fence: in.fence, Owner: in.owner, Now: in.now}, ExpiresAt: in.expiresAt, Result: []byte(in.result)}))
	case linFail:
		out.err = errClass(s.Fail(ctx, store.FailParams{ClaimRef: store.ClaimRef{Key: in.key, Fence: in.fence, Owner: in.owner, Now: in.now}, ExpiresAt: in.expiresAt, Err: store.ErrorRecord{Code: in.result}}))
	case linRelease:
		out.err = errClass(s.Release(ctx, store.ReleaseParams{ClaimRef: store.ClaimRef{Key: in.key, Fence: in.fence, Owner: in.owner, Now: in.now}}))
	case linExtend:
		out.err = errClass(s.Extend(ctx, store.ExtendParams{ClaimRef: store.ClaimRef{Key: in.key, Fence: in.fence, Owner: in.owner, Now: in.now}, LeaseUntil: in.leaseUntil}))
	case linGet:
		r, err := s.Get(ctx, in.key)
		out.err, out.rec = errClass(err), toLin(r)
	}
	return out
}
