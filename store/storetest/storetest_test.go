package storetest_test

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

// broken stores: each breaks one rule of the contract, and the suite must
// catch it in the named case. This is the suite's own test: a conformance
// suite that passes a broken store proves nothing.
var broken = map[string]struct {
	wrap  func(*memstore.Store) store.Store
	fails string // a case that must fail
}{
	"ignores-fence":              {func(m *memstore.Store) store.Store { return &noFence{Store: m} }, "Fencing"},
	"conflict-drops-fingerprint": {func(m *memstore.Store) store.Store { return &dropFingerprint{Store: m} }, "EngineMismatchEveryPath"},
	"trusts-ttl-only":            {func(m *memstore.Store) store.Store { return &noExpiry{Store: m} }, "ExpiryBoundary"},
	"early-takeover":             {func(m *memstore.Store) store.Store { return &earlyTakeover{Store: m} }, "TakeoverOnlyAfterLease"},
	"racy-claim":                 {func(m *memstore.Store) store.Store { return &racyClaim{Store: m} }, "Storm"},
	"truncates-results":          {func(m *memstore.Store) store.Store { return &truncating{Store: m} }, "ResultSizeLimit"},
	"fence-without-owner":        {func(m *memstore.Store) store.Store { return &noOwner{Store: m} }, "ReclaimAfterDeletion"},
	"gives-up-under-contention":  {func(m *memstore.Store) store.Store { return &givesUp{Store: m} }, "Linearizability"},
	"resettles-any-status":       {func(m *memstore.Store) store.Store { return &anyStatus{Store: m} }, "Resettle"},
	"attach-resets-lease":        {func(m *memstore.Store) store.Store { return &attachResets{Store: m} }, "Attach"},
	"extend-ignores-from":        {func(m *memstore.Store) store.Store { return &extendIgnoresFrom{Store: m} }, "ExtendFrom"},
	"lists-one-shard":            {func(m *memstore.Store) store.Store { return &oneShard{Store: m} }, "Admin"},
	"batch-complete-unfenced":    {func(m *memstore.Store) store.Store { return &batchUnfenced{Store: m} }, "CompleteBatch"},
	"batch-extend-unfenced":      {func(m *memstore.Store) store.Store { return &extendUnfenced{Store: m} }, "ExtendBatch"},
	"batch-extend-first-lease":   {func(m *memstore.Store) store.Store { return &extendFirstLease{Store: m} }, "ExtendBatch"},
	"batch-shares-first-params":  {func(m *memstore.Store) store.Store { return &batchFirstParams{Store: m} }, "BatchOwnParams"},
	"racy-batch-claim":           {func(m *memstore.Store) store.Store { return &racyBatch{Store: m} }, "BatchStorm"},
	"takes-over-anyway":          {func(m *memstore.Store) store.Store { return &takesOverAnyway{Store: m} }, "NoTakeover"},
	"forgets-hold":               {func(m *memstore.Store) store.Store { return &forgetsHold{Store: m} }, "Hold"},
	"takes-over-held":            {func(m *memstore.Store) store.Store { return &takesOverHeld{Store: m} }, "Hold"},
	"hex-only-fingerprint":       {func(m *memstore.Store) store.Store { return &hexOnlyFingerprint{Store: m} }, "GoldenRecords"},
	"step-unfenced":              {func(m *memstore.Store) store.Store { return &stepUnfenced{Store: m} }, "StepFencing"},
	"takeover-drops-steps":       {func(m *memstore.Store) store.Store { return &takeoverDropsSteps{Store: m} }, "Steps"},
	"step-retry-appends":         {func(m *memstore.Store) store.Store { return &stepRetryAppends{Store: m} }, "Steps"},
	"complete-keeps-steps":       {func(m *memstore.Store) store.Store { return &completeKeepsSteps{Store: m} }, "Steps"},
	"fresh-claim-keeps-steps":    {func(m *memstore.Store) store.Store { return &freshClaimKeepsSteps{Store: m} }, "StepsGoWithRecord"},
	"step-truncated-to-fit":      {func(m *memstore.Store) store.Store { return &stepTruncates{Store: m} }, "StepSizeLimit"},
	"lists-hide-steps":           {func(m *memstore.Store) store.Store { return &listsHideSteps{Store: m} }, "StepsListing"},
	"text-made-valid":            {func(m *memstore.Store) store.Store { return &textMadeValid{Store: m} }, "TextIsUTF8"},
}

// TestBrokenStoreHelper runs the suite against the store named by
// IDEM_BROKEN_STORE; it is only run as a child of TestSuiteCatchesBrokenStores.
func TestBrokenStoreHelper(t *testing.T) {
	name := os.Getenv("IDEM_BROKEN_STORE")
	if name == "" {
		t.Skip("helper for TestSuiteCatchesBrokenStores")
	}
	b := broken[name]
	storetest.Run(t, storetest.Features{MaxResultBytes: 1 << 16, StormGoroutines: 64, LinOps: 2000}, func(t *testing.T) store.Store {
		m := memstore.New(&memstore.Config{MaxResultBytes: 1 << 16, SweepInterval: -1})
		t.Cleanup(func() { _ = m.Close() })
		return b.wrap(m)
	})
}

func TestSuiteCatchesBrokenStores(t *testing.T) {
	t.Parallel()
	for name, b := range broken {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenStoreHelper$", "-test.v")
			cmd.Env = append(os.Environ(), "IDEM_BROKEN_STORE="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a store that %s", name)
			}
			if !strings.Contains(string(out), "--- FAIL: TestBrokenStoreHelper/"+b.fails) {
				t.Fatalf("store that %s: case %s did not fail; output:\n%s", name, b.fails, tail(string(out)))
			}
		})
	}
}

func TestSuitePassesMemstore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Features{MaxResultBytes: 1 << 16}, func(t *testing.T) store.Store {
		m := memstore.New(&memstore.Config{MaxResultBytes: 1 << 16})
		t.Cleanup(func() { _ = m.Close() })
		return m
	})
}

func tail(s string) string {
	if len(s) > 3000 {
		return s[len(s)-3000:]
	}
	return s
}

type noFence struct{ *memstore.Store }

func (s *noFence) Complete(ctx context.Context, p store.CompleteParams) error {
	if r, err := s.Store.Get(ctx, p.Key); err == nil {
		p.Fence = r.Fence
		if r.Status != store.StatusInProgress {
			return nil
		}
	}
	return s.Store.Complete(ctx, p)
}

type dropFingerprint struct{ *memstore.Store }

func (s *dropFingerprint) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, p)
	if err == nil && !res.Acquired {
		res.Record.Fingerprint = p.Fingerprint // echoes the caller's instead of the stored one
	}
	return res, err
}

// hexOnlyFingerprint keeps only the digest of a fingerprint, as a store
// that took fingerprints for 64 hex digits would: the version of the rules
// that made it is lost.
type hexOnlyFingerprint struct{ *memstore.Store }

func (s *hexOnlyFingerprint) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	if i := strings.LastIndexByte(p.Fingerprint, ':'); i >= 0 {
		p.Fingerprint = p.Fingerprint[i+1:]
	}
	return s.Store.Claim(ctx, p)
}

type noExpiry struct{ *memstore.Store }

func (s *noExpiry) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	if r, err := s.Store.Get(ctx, p.Key); err == nil && r.Status != store.StatusInProgress && r.Expired(p.Now) {
		p.Now = r.ExpiresAt - 1 // pretends the record is still live
	}
	return s.Store.Claim(ctx, p)
}

// takesOverAnyway ignores ClaimParams.NoTakeover: an engine whose clock
// runs ahead takes live work over.
type takesOverAnyway struct{ *memstore.Store }

func (s *takesOverAnyway) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	p.NoTakeover = false
	return s.Store.Claim(ctx, p)
}

// forgetsHold does not store ClaimParams.Hold: a crashed holder's key is
// run again under the Hold policy.
type forgetsHold struct{ *memstore.Store }

func (s *forgetsHold) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	p.Hold = false
	return s.Store.Claim(ctx, p)
}

// takesOverHeld stores Hold but takes a held record over past its lease,
// as if it had expired.
type takesOverHeld struct{ *memstore.Store }

func (s *takesOverHeld) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	if r, err := s.Store.Get(ctx, p.Key); err == nil && r.Held(p.Now) && !r.Expired(p.Now) {
		p.Now = r.ExpiresAt
	}
	return s.Store.Claim(ctx, p)
}

type earlyTakeover struct{ *memstore.Store }

func (s *earlyTakeover) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	p.Now++
	return s.Store.Claim(ctx, p)
}

type racyClaim struct{ *memstore.Store }

// Claim checks and writes in two steps, like a read-then-put without a
// condition.
func (s *racyClaim) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	r, err := s.Store.Get(ctx, p.Key)
	if err == nil && !r.Claimable(p.Now) {
		return store.ClaimResult{Record: r}, nil
	}
	runtime.Gosched()
	_ = s.Store.Delete(ctx, p.Key) // a blind put: overwrites whoever got here first
	return s.Store.Claim(ctx, p)
}

type truncating struct{ *memstore.Store }

func (s *truncating) Complete(ctx context.Context, p store.CompleteParams) error {
	if len(p.Result) > 1024 {
		p.Result = p.Result[:1024]
	}
	return s.Store.Complete(ctx, p)
}

// noOwner checks the fence of every write but not the owner: a record
// deleted and claimed afresh (fence 1 again) takes the first holder's
// writes.
type noOwner struct{ *memstore.Store }

func (s *noOwner) owner(ctx context.Context, key string, fence uint64) string {
	if r, err := s.Store.Get(ctx, key); err == nil && r.Fence == fence {
		return r.Owner
	}
	return ""
}

func (s *noOwner) Complete(ctx context.Context, p store.CompleteParams) error {
	p.Owner = s.owner(ctx, p.Key, p.Fence)
	return s.Store.Complete(ctx, p)
}

func (s *noOwner) Fail(ctx context.Context, p store.FailParams) error {
	p.Owner = s.owner(ctx, p.Key, p.Fence)
	return s.Store.Fail(ctx, p)
}

func (s *noOwner) Release(ctx context.Context, p store.ReleaseParams) error {
	p.Owner = s.owner(ctx, p.Key, p.Fence)
	return s.Store.Release(ctx, p)
}

func (s *noOwner) Extend(ctx context.Context, p store.ExtendParams) error {
	p.Owner = s.owner(ctx, p.Key, p.Fence)
	return s.Store.Extend(ctx, p)
}

type givesUp struct{ *memstore.Store }

// Claim retries while the record changes between two reads, and gives up
// after two rounds with ErrUnavailable: contention reported as a fault.
func (s *givesUp) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	for range 2 {
		before, _ := s.Store.Get(ctx, p.Key)
		runtime.Gosched()
		if after, _ := s.Store.Get(ctx, p.Key); reflect.DeepEqual(before, after) {
			return s.Store.Claim(ctx, p)
		}
	}
	return store.ClaimResult{}, fmt.Errorf("claim %s: the record changed under 2 attempts: %w", p.Key, store.ErrUnavailable)
}

type anyStatus struct{ *memstore.Store }

// Complete corrects a settled record whatever status the write names.
func (s *anyStatus) Complete(ctx context.Context, p store.CompleteParams) error {
	if r, err := s.Store.Get(ctx, p.Key); err == nil && r.Status != store.StatusInProgress {
		p.From = r.Status
	}
	return s.Store.Complete(ctx, p)
}

type attachResets struct{ *memstore.Store }

// Extend writes LeaseUntil even when the write only attaches a reference.
func (s *attachResets) Extend(ctx context.Context, p store.ExtendParams) error {
	if p.LeaseUntil == 0 {
		p.LeaseUntil = p.Now
	}
	return s.Store.Extend(ctx, p)
}

type extendIgnoresFrom struct{ *memstore.Store }

// Extend ignores From instead of refusing a status other than IN_PROGRESS.
func (s *extendIgnoresFrom) Extend(ctx context.Context, p store.ExtendParams) error {
	p.From = 0
	return s.Store.Extend(ctx, p)
}

// batchUnfenced completes each write of a batch under whatever claim holds
// the record, as a batch that dropped each write's own condition would.
type batchUnfenced struct{ *memstore.Store }

func (s *batchUnfenced) CompleteBatch(ctx context.Context, ps []store.CompleteParams) []error {
	errs := make([]error, len(ps))
	for i, p := range ps {
		if r, err := s.Get(ctx, p.Key); err == nil && r.Status == store.StatusInProgress {
			p.Fence, p.Owner = r.Fence, r.Owner
		}
		errs[i] = s.Store.Complete(ctx, p)
	}
	return errs
}

// extendUnfenced renews each lease of a batch under whatever claim holds
// the record, as a batch that dropped each renewal's own condition would.
type extendUnfenced struct{ *memstore.Store }

func (s *extendUnfenced) ExtendBatch(ctx context.Context, ps []store.ExtendParams) []error {
	errs := make([]error, len(ps))
	for i, p := range ps {
		if r, err := s.Get(ctx, p.Key); err == nil && r.Status == store.StatusInProgress {
			p.Fence, p.Owner = r.Fence, r.Owner
		}
		errs[i] = s.Store.Extend(ctx, p)
	}
	return errs
}

// extendFirstLease renews every lease of a batch to the first one's end,
// as a batch statement that bound it once would.
type extendFirstLease struct{ *memstore.Store }

func (s *extendFirstLease) ExtendBatch(ctx context.Context, ps []store.ExtendParams) []error {
	ps = append([]store.ExtendParams(nil), ps...)
	for i := range ps {
		ps[i].LeaseUntil = ps[0].LeaseUntil
	}
	return s.Store.ExtendBatch(ctx, ps)
}

// batchFirstParams claims every key of a batch with the first claim's
// lease and expiry, as a batch statement that bound them once would.
type batchFirstParams struct{ *memstore.Store }

func (s *batchFirstParams) ClaimBatch(ctx context.Context, ps []store.ClaimParams) ([]store.ClaimResult, []error) {
	ps = append([]store.ClaimParams(nil), ps...)
	for i := range ps {
		ps[i].LeaseUntil, ps[i].ExpiresAt = ps[0].LeaseUntil, ps[0].ExpiresAt
	}
	return s.Store.ClaimBatch(ctx, ps)
}

// racyBatch claims the keys of a batch by reading each and then writing
// it blindly, as a batch that checked before it locked would.
type racyBatch struct{ *memstore.Store }

func (s *racyBatch) ClaimBatch(ctx context.Context, ps []store.ClaimParams) ([]store.ClaimResult, []error) {
	res, errs := make([]store.ClaimResult, len(ps)), make([]error, len(ps))
	for i, p := range ps {
		r, err := s.Store.Get(ctx, p.Key)
		if err == nil && !r.Claimable(p.Now) {
			res[i], _ = store.ApplyClaim(r, p)
			continue
		}
		runtime.Gosched()
		_ = s.Store.Delete(ctx, p.Key)
		res[i], errs[i] = s.Store.Claim(ctx, p)
	}
	return res, errs
}

// oneShard lists only the records of one shard in three, by the key's hash,
// as a store on a cluster that scans one node would.
type oneShard struct{ *memstore.Store }

func (s *oneShard) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	res, err := s.Store.List(ctx, p)
	kept := res.Records[:0]
	for _, r := range res.Records {
		if crc32.ChecksumIEEE([]byte(r.Key))%3 == 0 {
			kept = append(kept, r)
		}
	}
	res.Records = kept
	return res, err
}

// stepUnfenced records a step under whatever claim holds the record, as a
// step script that dropped the fence condition would: a zombie's step
// lands in the next holder's claim.
type stepUnfenced struct{ *memstore.Store }

func (s *stepUnfenced) RecordStep(ctx context.Context, p store.StepParams) error {
	if r, err := s.Store.Get(ctx, p.Key); err == nil && r.Status == store.StatusInProgress {
		p.Fence, p.Owner = r.Fence, r.Owner
	}
	return s.Store.RecordStep(ctx, p)
}

// takeoverDropsSteps answers a takeover without the finished steps, as a
// claim script that returns the new record's fields but not its steps
// would: the new holder runs every step again.
type takeoverDropsSteps struct{ *memstore.Store }

func (s *takeoverDropsSteps) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, p)
	if err == nil && res.Takeover {
		res.Record.Steps = nil
	}
	return res, err
}

// stepRetryAppends appends every step at the end, whatever its index, as
// an append without the index condition would: a step retried after a
// lost reply is recorded twice, and the next holder's steps go out of
// order.
type stepRetryAppends struct{ *memstore.Store }

func (s *stepRetryAppends) RecordStep(ctx context.Context, p store.StepParams) error {
	if r, err := s.Store.Get(ctx, p.Key); err == nil {
		p.Index = len(r.Steps)
	}
	return s.Store.RecordStep(ctx, p)
}

// completeKeepsSteps leaves a record's steps in place when it is
// completed, as a Complete that sets the outcome's fields and no others
// would (kept beside the record here, and shown with it).
type completeKeepsSteps struct {
	*memstore.Store
	kept sync.Map // key → []store.Step
}

func (s *completeKeepsSteps) Complete(ctx context.Context, p store.CompleteParams) error {
	r, gerr := s.Store.Get(ctx, p.Key)
	err := s.Store.Complete(ctx, p)
	if err == nil && gerr == nil && len(r.Steps) > 0 {
		s.kept.Store(p.Key, r.Steps)
	}
	return err
}

func (s *completeKeepsSteps) show(r *store.Record) {
	if steps, ok := s.kept.Load(r.Key); ok && r.Status == store.StatusCompleted {
		r.Steps = steps.([]store.Step)
	}
}

func (s *completeKeepsSteps) Get(ctx context.Context, key string) (*store.Record, error) {
	r, err := s.Store.Get(ctx, key)
	if err == nil {
		s.show(r)
	}
	return r, err
}

func (s *completeKeepsSteps) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, p)
	if err == nil && res.Record != nil {
		s.show(res.Record)
	}
	return res, err
}

// freshClaimKeepsSteps carries an expired record's steps into the claim
// that replaces it, as a claim that keeps the steps on any overwrite
// would: a new request replays another's steps.
type freshClaimKeepsSteps struct{ *memstore.Store }

func (s *freshClaimKeepsSteps) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	old, _ := s.Store.Get(ctx, p.Key)
	res, err := s.Store.Claim(ctx, p)
	if err == nil && res.Acquired && !res.Takeover && old != nil && old.Expired(p.Now) {
		res.Record.Steps = old.Steps
	}
	return res, err
}

// stepTruncates cuts a step's result to what fits the record's limit,
// instead of refusing it.
type stepTruncates struct{ *memstore.Store }

func (s *stepTruncates) RecordStep(ctx context.Context, p store.StepParams) error {
	err := s.Store.RecordStep(ctx, p)
	var tl *store.TooLargeError
	if errors.As(err, &tl) {
		over := tl.Size - tl.Limit
		p.Step.Result = p.Step.Result[:max(len(p.Step.Result)-over, 0)]
		err = s.Store.RecordStep(ctx, p)
	}
	return err
}

// listsHideSteps leaves records with steps out of listings, as a store
// that keeps them under another key type and scans one would.
type listsHideSteps struct{ *memstore.Store }

func (s *listsHideSteps) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	res, err := s.Store.List(ctx, p)
	kept := res.Records[:0]
	for _, r := range res.Records {
		if len(r.Steps) == 0 {
			kept = append(kept, r)
		}
	}
	res.Records = kept
	return res, err
}

// textMadeValid stores an error's text with its invalid bytes replaced, as
// a store that encodes records as JSON would: what replays is not what
// was written.
type textMadeValid struct{ *memstore.Store }

func (s *textMadeValid) Fail(ctx context.Context, p store.FailParams) error {
	p.Err.Code, p.Err.Message = strings.ToValidUTF8(p.Err.Code, "\uFFFD"), strings.ToValidUTF8(p.Err.Message, "\uFFFD")
	return s.Store.Fail(ctx, p)
}
