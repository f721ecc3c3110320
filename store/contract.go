package store

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"
)

// Store is the contract every backend implements: a handful of atomic,
// single-key operations, each one round trip where the backend allows.
//
// Time is never read from the store's own clock inside an operation: every
// call carries Now (ms) from the engine's clock, and every operation decides
// expiry and leases by comparing those timestamps with the record's
// ([Record.Expired], [Record.LeaseExpired]). A backend's native TTL only
// reclaims space. A store with a clock of its own tells it through
// [ServerTimer], and the engine corrects its clock to it, so that the Now
// of every caller is the store's time.
//
// Errors: stores translate backend errors at their boundary. A backend that
// cannot be reached or answered in time yields an error wrapping
// [ErrUnavailable]; bytes that cannot be decoded yield [ErrCorrupt]; a record
// over the store's size limit yields a [*TooLargeError]; a refusal no retry
// mends (credentials refused, a privilege or bucket missing) yields an
// error wrapping [ErrMisconfigured] that says what to fix. The conformance
// suite in package storetest is the contract in executable form.
type Store interface {
	// Claim atomically claims p.Key.
	//
	//   - absent, or expired at p.Now: a new IN_PROGRESS record is written
	//     with Fence = 1 (absent) or the old fence + 1 (expired record still
	//     present); the result has Acquired = true and the new record.
	//   - IN_PROGRESS with its lease passed at p.Now, not held (Hold
	//     unset): taken over, Fence + 1, Acquired = true, Takeover = true;
	//     the new record keeps the old one's steps when the fingerprints
	//     are equal ([Stepper]).
	//   - IN_PROGRESS with its lease passed, held (Hold set by the claim
	//     that wrote it), not expired: a conflict like any live record.
	//   - IN_PROGRESS held by the same p.Owner with the same fingerprint (a
	//     retried claim whose first reply was lost): returned as acquired,
	//     unchanged.
	//   - IN_PROGRESS held by another claim, when p.NoTakeover is set:
	//     whatever its lease and expiry, nothing is written; a conflict
	//     (Acquired = false, Record the existing record).
	//   - any other live record (conflict): nothing is written; Acquired =
	//     false and Record is the existing record, returned by the same round
	//     trip. The caller compares fingerprints; the store never does.
	//
	// Contention is not a fault: a claim racing any number of calls on the
	// key still answers with one of the outcomes above. [ErrUnavailable]
	// means the backend could not be reached or did not answer in time,
	// never that the claim lost races.
	Claim(ctx context.Context, p ClaimParams) (ClaimResult, error)

	// Complete stores a result and marks the record COMPLETED, setting
	// ExpiresAt and CompletedAt from p (and clearing a stored error and
	// the record's steps, [Stepper]). It
	// succeeds only when the record holds the writer's claim (Fence ==
	// p.Fence and Owner == p.Owner), is in status p.From (IN_PROGRESS when
	// p.From is zero) and is not expired at p.Now.
	//   - absent or expired: [ErrNotFound]; nothing changes.
	//   - another claim (other fence or other owner), or another status: a
	//     [*FencedError] describing the record's claim; nothing changes.
	//   - result over the store's limit: a [*TooLargeError]; nothing changes.
	//
	// Checking the owner as well as the fence is what makes a write safe
	// after the record vanished: a record deleted by a TTL, a sweeper or a
	// release and claimed afresh starts again at fence 1, but under another
	// owner, so the first holder's late write can never land in it.
	Complete(ctx context.Context, p CompleteParams) error

	// Fail stores a terminal error and marks the record FAILED (clearing a
	// stored result and the record's steps), under the same conditions and with the same errors
	// as Complete. An error whose Code or Message is not valid UTF-8 is
	// refused first, with an error wrapping [ErrInvalidParams], and nothing
	// changes ([FailParams.Check]): text columns and attributes refuse it,
	// and every store refuses alike.
	Fail(ctx context.Context, p FailParams) error

	// Release deletes the record (its steps with it) so that a retry can run, only when it
	// holds the writer's claim (Fence and Owner) and is in status p.From
	// (IN_PROGRESS when zero).
	//   - absent or expired: [ErrNotFound].
	//   - another claim, or another status: a [*FencedError]; nothing
	//     changes.
	Release(ctx context.Context, p ReleaseParams) error

	// Extend changes an IN_PROGRESS record that holds the writer's claim
	// (Fence and Owner): it renews the lease (LeaseUntil = p.LeaseUntil)
	// when p.LeaseUntil is not zero, for long-running work, and attaches
	// the execution reference (Ref = p.Ref) when p.Ref is not empty, for
	// work handed to something else. Both in one atomic step; with
	// neither, it only checks that the claim is still held.
	//   - absent or expired: [ErrNotFound].
	//   - another claim, or not IN_PROGRESS: a [*FencedError]; nothing changes.
	//   - p.From other than zero or IN_PROGRESS: an error wrapping
	//     [ErrInvalidParams] ([ExtendParams.Check]); nothing is read or written.
	Extend(ctx context.Context, p ExtendParams) error

	// Get returns the record under key, read with strong consistency.
	//   - absent: [ErrNotFound].
	//   - expired: the record as stored, if the backend has not yet
	//     reclaimed it; callers check [Record.Expired].
	// The returned record is the caller's to keep and modify.
	Get(ctx context.Context, key string) (*Record, error)
}

// ClaimParams are the arguments of [Store.Claim].
type ClaimParams struct {
	Key         string
	Fingerprint string
	// Owner identifies this claim attempt; unique per call. Together with
	// the fence it names the claim in every later fenced write.
	Owner string
	// Now is the caller's current time (ms).
	Now int64
	// LeaseUntil is the lease end of the new claim (ms).
	LeaseUntil int64
	// ExpiresAt is the expiry of the new claim (ms).
	ExpiresAt int64
	// NoTakeover forbids replacing an IN_PROGRESS record, even one whose
	// lease or expiry has passed at Now: it is answered as a conflict (or
	// as acquired, when it is the caller's own claim). The engine sets it
	// while it cannot trust its clock (its offset to the store's clock is
	// unknown, stale or beyond its bound), so that a caller whose clock
	// runs ahead never takes over live work. Settled and absent records
	// are claimed as usual.
	NoTakeover bool
	// Hold writes the new claim with [Record.Hold] set: the takeover
	// policy Hold. Past its lease such a record is not taken over by any
	// claim; it stays IN_PROGRESS (stuck, listed) until a fenced write
	// settles it or it expires, when it is claimable as any expired
	// record. Stores persist it with the claim and keep it through
	// Complete, Fail and Extend.
	Hold bool
	// Local says the claim's holder is the calling process itself (an
	// operation run by Do), not a token handed to work elsewhere (Begin).
	// A store whose unsynced writes survive a crash of the process but not
	// of its machine (an embedded file store writing without fsync) may
	// then leave the new claim unsynced: whatever loses it ends its holder
	// too, and a claim lost that way is a claim released. Every later
	// fenced write (an Extend that hands the claim off included) must
	// still be durable when it returns. Other stores ignore it.
	Local bool
}

// BatchClaimer is an optional power of a store: claiming many keys in one
// round trip (one script, a pipeline, one statement), for consumers that receive
// messages in batches. Find it by type assertion.
type BatchClaimer interface {
	// ClaimBatch claims each of ps exactly as Claim would, in order, and
	// answers res[i] and errs[i] for ps[i] (len(ps) of each). A key named
	// twice is claimed twice: the second claim sees the first (a conflict,
	// or the same owner's retry). One key's failure does not stop the
	// others; a failure of the whole round trip is every key's error.
	ClaimBatch(ctx context.Context, ps []ClaimParams) (res []ClaimResult, errs []error)
}

// BatchCompleter is an optional power of a store: making many Completes in
// one round trip (one script, a pipeline, one statement). The engine finds it by type
// assertion and sends the Completes of calls that finish together through
// it, so that a consumer's concurrent messages share their outcome writes.
// A wrapper that embeds such a store and changes its Complete (faults,
// instrumentation) must wrap CompleteBatch too, or the engine bypasses it.
type BatchCompleter interface {
	// CompleteBatch makes each of ps exactly as Complete would, in order,
	// and answers errs[i] for ps[i] (len(ps) of them): each keeps its own
	// fence and owner condition and its own refusal (ErrFenced,
	// ErrNotFound, a TooLargeError), and one refusal neither stops nor
	// settles another. A key named twice is completed twice: the second
	// sees the first. A failure of the whole round trip is every
	// Complete's error.
	CompleteBatch(ctx context.Context, ps []CompleteParams) (errs []error)
}

// BatchExtender is an optional power of a store: renewing the leases of
// many claims in one round trip (one script, a pipeline, one statement).
// The engine finds it by type assertion and renews together the claims
// whose renewals fall due together: the claims of a batch that wait for
// their turn, and concurrent calls' leases. A store without it is renewed
// one Extend at a time. A wrapper that embeds such a store and changes
// its Extend (faults, instrumentation) must wrap ExtendBatch too, or the
// engine bypasses it.
type BatchExtender interface {
	// ExtendBatch makes each of ps exactly as Extend would, in order, and
	// answers errs[i] for ps[i] (len(ps) of them): each keeps its own
	// fence and owner condition and its own refusal (ErrFenced,
	// ErrNotFound, ErrInvalidParams), and one refusal neither stops nor
	// changes another. A failure of the whole round trip is every
	// Extend's error.
	ExtendBatch(ctx context.Context, ps []ExtendParams) (errs []error)
}

// Stepper is an optional power of a store: recording the finished steps of
// an operation under its claim, so that a holder that takes the key over
// after a crash resumes after the last finished step instead of running
// the operation from the start (idem.Step). Find it by type assertion.
//
// The steps live in the record ([Record.Steps]) and share its life:
//   - a takeover (Claim of an IN_PROGRESS record whose lease has passed)
//     carries the old record's steps into the new claim, when the claim's
//     fingerprint is the old record's, and the claim's answer returns
//     them: resuming costs no round trip beyond the claim. A takeover
//     with another fingerprint, and every fresh claim (absent, expired),
//     starts with none;
//   - Complete and Fail drop them: a settled record carries its outcome
//     only, so its size and its replay are the outcome's alone;
//   - Release (and Delete, and expiry) removes them with the record;
//   - listing ([Lister]) and its rules are unaffected by them: a record
//     is listed, or not, whatever steps it holds.
//
// A store whose backend allows it records a step in one round trip (a
// script appending to the record, one UPDATE, an UpdateItem appending to
// a list attribute under a condition), fenced exactly as Complete is.
type Stepper interface {
	// RecordStep appends p.Step to the steps of the record that holds the
	// writer's claim (Fence and Owner), is IN_PROGRESS and is not expired
	// at p.Now. p.Index is the step's position (0 for the first): the
	// record must hold p.Index steps before it.
	//   - absent or expired: [ErrNotFound]; nothing changes.
	//   - another claim (other fence or other owner), or not IN_PROGRESS:
	//     a [*FencedError] describing the record's claim; nothing changes.
	//   - the record holds p.Index steps: p.Step is appended; nil.
	//   - step p.Index is recorded already under p.Step.Name (a retry whose
	//     first reply was lost): nil; nothing changes.
	//   - fewer than p.Index steps, or another name at p.Index: an error
	//     wrapping [ErrInvalidParams]; nothing changes.
	//   - the record with p.Step over the store's size limit
	//     ([Record.Size] counts every step): a [*TooLargeError]; nothing
	//     changes.
	//   - p invalid ([StepParams.Check]: From other than zero or
	//     IN_PROGRESS, an empty name, a negative index, a result and an
	//     error both): an error wrapping [ErrInvalidParams]; nothing is
	//     read or written.
	RecordStep(ctx context.Context, p StepParams) error
}

// StepParams are the arguments of [Stepper.RecordStep]. Its From must be
// zero or IN_PROGRESS ([StepParams.Check]).
type StepParams struct {
	ClaimRef
	// Index is the step's position among the operation's steps, from 0:
	// the number of steps the record holds before it.
	Index int
	// Step is the step to record. Its At is the time it is recorded (ms).
	Step Step
}

// Check returns an error wrapping [ErrInvalidParams] when p cannot be
// recorded: From names a status other than IN_PROGRESS, the step has no
// name or one that is not valid UTF-8, Index is negative, the step
// carries both a result and an error, or its error's code or message is
// not valid UTF-8. Stores call it before anything else, so that every
// store refuses alike.
func (p StepParams) Check() error {
	switch {
	case p.From.OrInProgress() != StatusInProgress:
		return fmt.Errorf("%w: RecordStep of %q with From %s: steps are recorded under an IN_PROGRESS claim only; leave From zero", ErrInvalidParams, p.Key, p.From)
	case p.Step.Name == "":
		return fmt.Errorf("%w: RecordStep of %q: the step has no name", ErrInvalidParams, p.Key)
	case !utf8.ValidString(p.Step.Name):
		return fmt.Errorf("%w: RecordStep of %q: the step's name %q is not valid UTF-8", ErrInvalidParams, p.Key, p.Step.Name)
	case p.Index < 0:
		return fmt.Errorf("%w: RecordStep of %q: negative step index %d", ErrInvalidParams, p.Key, p.Index)
	case p.Step.Result != nil && p.Step.Err != nil:
		return fmt.Errorf("%w: RecordStep of %q: step %q carries a result and an error; a step has one or the other", ErrInvalidParams, p.Key, p.Step.Name)
	case p.Step.Err != nil:
		return p.Step.Err.check(p.Key, "RecordStep")
	}
	return nil
}

// ApplyStep records p.Step in r as [Stepper.RecordStep] says, for stores
// that read and write a key atomically. Call it after [CheckFence] (and
// [StepParams.Check]). limit is the store's size limit (0 or less: none).
// changed is false, with a nil error, when the step was recorded already
// (a retry): there is nothing to write. r is changed only when changed.
func ApplyStep(r *Record, p StepParams, limit int) (changed bool, err error) {
	switch n := len(r.Steps); {
	case p.Index < n && r.Steps[p.Index].Name == p.Step.Name:
		return false, nil
	case p.Index != n:
		at := "no step"
		if p.Index < n {
			at = fmt.Sprintf("step %q", r.Steps[p.Index].Name)
		}
		return false, fmt.Errorf("%w: RecordStep of %q: step %q at index %d, but the record holds %d steps and %s there", ErrInvalidParams, p.Key, p.Step.Name, p.Index, n, at)
	}
	if size := r.Size() + p.Step.Size(); limit > 0 && size > limit {
		return false, &TooLargeError{Key: p.Key, Size: size, Limit: limit}
	}
	r.Steps = append(r.Steps, p.Step.Clone())
	return true, nil
}

// ClaimResult is the answer of [Store.Claim].
type ClaimResult struct {
	// Acquired is true when the caller now holds the claim.
	Acquired bool
	// Takeover is true when the claim replaced an IN_PROGRESS record whose
	// lease had passed.
	Takeover bool
	// Record is the new claim when Acquired, else the existing live record.
	Record *Record
}

// ClaimRef names the claim a fenced write (Complete, Fail, Release,
// Extend, RecordStep) acts for, the status it expects the record in, and the time it
// acts at. Each of their parameter structs embeds one; [CheckFence] decides
// a write by it.
type ClaimRef struct {
	Key string
	// Fence is the claim's fence, as Claim returned it.
	Fence uint64
	// Owner is the claim's owner, as given to Claim: a write must hold
	// both the fence and the owner of the record's claim.
	Owner string
	// From is the status the record must be in: zero means IN_PROGRESS,
	// the holder settling its own claim. A settled status lets whoever
	// holds the claim that settled the record correct it, with the same
	// fencing: a workflow redriven to success after it was marked FAILED,
	// an operator resolving a key by hand. Extend changes IN_PROGRESS
	// records only: any other From is refused with [ErrInvalidParams].
	From Status
	// Now is the caller's current time (ms).
	Now int64
}

// CompleteParams are the arguments of [Store.Complete].
type CompleteParams struct {
	ClaimRef
	// ExpiresAt is the expiry of the completed record (ms).
	ExpiresAt int64
	Result    []byte
}

// FailParams are the arguments of [Store.Fail].
type FailParams struct {
	ClaimRef
	// ExpiresAt is the expiry of the failed record (ms).
	ExpiresAt int64
	Err       ErrorRecord
}

// Check returns an error wrapping [ErrInvalidParams] when p's error
// cannot be stored as text: a Code or Message that is not valid UTF-8.
// Stores call it before anything else.
func (p FailParams) Check() error {
	return p.Err.check(p.Key, "Fail")
}

// check refuses an error record whose text is not valid UTF-8.
func (e *ErrorRecord) check(key, op string) error {
	switch {
	case !utf8.ValidString(e.Code):
		return fmt.Errorf("%w: %s of %q: the error's code %q is not valid UTF-8", ErrInvalidParams, op, key, e.Code)
	case !utf8.ValidString(e.Message):
		return fmt.Errorf("%w: %s of %q: the error's message %q is not valid UTF-8", ErrInvalidParams, op, key, e.Message)
	}
	return nil
}

// ReleaseParams are the arguments of [Store.Release].
type ReleaseParams struct {
	ClaimRef
}

// ExtendParams are the arguments of [Store.Extend]. Its From must be zero
// or IN_PROGRESS ([ExtendParams.Check]).
type ExtendParams struct {
	ClaimRef
	// LeaseUntil, when not zero, is the new lease end (ms): for a claim
	// handed to other work, the time by which it should be done.
	LeaseUntil int64
	// Ref, when not empty, is the execution reference to attach (a
	// workflow execution's ID, a job's URL).
	Ref string
}

// Check returns an error wrapping [ErrInvalidParams] when p.From names a
// status other than IN_PROGRESS: only a claim in progress can be extended.
// Stores call it before anything else, so that every store refuses alike.
func (p ExtendParams) Check() error {
	if p.From.OrInProgress() != StatusInProgress {
		return fmt.Errorf("%w: Extend of %q with From %s: only an IN_PROGRESS claim is extended; leave From zero", ErrInvalidParams, p.Key, p.From)
	}
	return nil
}

// Lister is an optional power of a store: listing records for operators.
// Find it by type assertion.
type Lister interface {
	// List returns records matching p, at most p.Limit of them, and a cursor
	// for the next page ("" when there is none). Expired records are never
	// listed.
	List(ctx context.Context, p ListParams) (ListResult, error)
}

// ListParams select records for [Lister.List].
type ListParams struct {
	// Status, when valid, keeps only records with that status.
	Status Status
	// Stuck keeps only IN_PROGRESS records whose lease has passed at Now.
	Stuck bool
	// Now is the caller's current time (ms), for expiry and Stuck.
	Now int64
	// Limit caps the page size; 0 means 100.
	Limit int
	// Cursor continues a previous listing.
	Cursor string
}

// ListResult is one page of [Lister.List].
type ListResult struct {
	Records []*Record
	Next    string
}

// Deleter is an optional power of a store: deleting one record whatever its
// state, for operators resolving a stuck or failed key. Deleting an absent
// key returns [ErrNotFound].
type Deleter interface {
	Delete(ctx context.Context, key string) error
}

// Matches reports whether a ListParams selects r at p.Now. Stores may use
// it to filter; it is the one definition of the listing rules.
func (p ListParams) Matches(r *Record) bool {
	if r.Expired(p.Now) {
		return false
	}
	if p.Status.Valid() && r.Status != p.Status {
		return false
	}
	if p.Stuck && !r.LeaseExpired(p.Now) {
		return false
	}
	return true
}

// PageSize returns p.Limit, or 100 when it is not positive.
func (p ListParams) PageSize() int {
	if p.Limit <= 0 {
		return 100
	}
	return p.Limit
}

// ApplyClaim decides a claim against the current record old (nil when the
// key is absent), for stores that read and write a key atomically (under a
// lock or in a transaction). It returns the answer, and the record to write
// when the claim acquired a new fence (nil when nothing is to be written).
// The returned records are fresh copies.
func ApplyClaim(old *Record, p ClaimParams) (res ClaimResult, write *Record) {
	var fence uint64 = 1
	takeover := false
	if old != nil {
		switch {
		case p.NoTakeover && old.Status == StatusInProgress:
			own := old.Owner == p.Owner && old.Fingerprint == p.Fingerprint
			return ClaimResult{Acquired: own, Record: old.Clone()}, nil
		case old.Expired(p.Now):
			fence = old.Fence + 1
		case old.LeaseExpired(p.Now) && !old.Hold:
			fence, takeover = old.Fence+1, true
		case old.Status == StatusInProgress && old.Owner == p.Owner && old.Fingerprint == p.Fingerprint:
			return ClaimResult{Acquired: true, Record: old.Clone()}, nil
		default:
			return ClaimResult{Record: old.Clone()}, nil
		}
	}
	w := &Record{
		Key: p.Key, Status: StatusInProgress, Fence: fence, Owner: p.Owner,
		LeaseUntil: p.LeaseUntil, ExpiresAt: p.ExpiresAt, Fingerprint: p.Fingerprint,
		CreatedAt: p.Now, Version: RecordVersion, Hold: p.Hold,
	}
	if takeover && old.Fingerprint == p.Fingerprint {
		// The new holder resumes after the old one's finished steps
		// ([Stepper]); a request with another payload starts afresh.
		w.Steps = cloneSteps(old.Steps)
	}
	return ClaimResult{Acquired: true, Takeover: takeover, Record: w.Clone()}, w
}

// CheckFence returns nil when a fenced write (Complete, Fail, Release,
// Extend, RecordStep) for the claim c may change r (nil when absent): r holds c's
// fence and owner, is in status c.From (IN_PROGRESS when zero) and is not
// expired at c.Now. Else it returns [ErrNotFound] or a [*FencedError], as
// the contract says.
func CheckFence(r *Record, c ClaimRef) error {
	if r == nil || r.Expired(c.Now) {
		return ErrNotFound
	}
	if r.Fence != c.Fence || r.Owner != c.Owner || r.Status != c.From.OrInProgress() {
		return c.Fenced(r.Fence, r.Owner, r.Status)
	}
	return nil
}

// Fenced returns the [*FencedError] of a write for c refused by a record
// holding the claim (fence, owner) in status st.
func (c ClaimRef) Fenced(fence uint64, owner string, st Status) *FencedError {
	return &FencedError{Key: c.Key, Fence: c.Fence, Owner: c.Owner, Current: fence, CurrentOwner: owner, Status: st}
}

// OrInProgress returns s, or [StatusInProgress] when s is zero: the status
// a fenced write's From names.
func (s Status) OrInProgress() Status {
	if s == 0 {
		return StatusInProgress
	}
	return s
}

// ApplyComplete marks r COMPLETED as p says, dropping its steps
// ([Stepper]). Call it after [CheckFence].
func ApplyComplete(r *Record, p CompleteParams) {
	r.Status, r.Result, r.Err, r.ExpiresAt, r.CompletedAt = StatusCompleted, append([]byte{}, p.Result...), nil, p.ExpiresAt, p.Now
	r.Steps = nil
}

// ApplyFail marks r FAILED as p says, dropping its steps ([Stepper]).
// Call it after [CheckFence].
func ApplyFail(r *Record, p FailParams) {
	er := p.Err
	if er.Body != nil {
		er.Body = append([]byte{}, er.Body...)
	}
	r.Status, r.Err, r.Result, r.ExpiresAt, r.CompletedAt = StatusFailed, &er, nil, p.ExpiresAt, p.Now
	r.Steps = nil
}

// ApplyExtend renews r's lease and attaches its reference as p says. Call
// it after [CheckFence].
func ApplyExtend(r *Record, p ExtendParams) {
	if p.LeaseUntil != 0 {
		r.LeaseUntil = p.LeaseUntil
	}
	if p.Ref != "" {
		r.Ref = p.Ref
	}
}

// Size is the number of payload bytes a stored error carries (message and
// body), the figure stores compare with their size limit (as [Record.Size]
// does). The code is a short identifier and does not count, so the
// engine's bounded marker for an outcome too large to store
// ([github.com/seed-a1b882c0/idem.CodeResultTooLarge] with its message cut to the limit) fits any limit.
func (e ErrorRecord) Size() int { return len(e.Message) + len(e.Body) }

// Every calls fn every interval, timed by after (a clock's After), until
// stop is closed, and closes done when it returns. Stores run their expiry
// sweeps with it, on a goroutine of their own that Close stops.
func Every(stop <-chan struct{}, done chan<- struct{}, after func(time.Duration) <-chan time.Time, interval time.Duration, fn func()) {
	defer close(done)
	for {
		select {
		case <-stop:
			return
		case <-after(interval):
			fn()
		}
	}
}
