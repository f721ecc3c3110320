// Package ops holds an operator's manual writes on an idem store: release,
// delete, resolve as COMPLETED with a result, or as FAILED with an error;
// and the listing rules operators read records by. idemctl's commands and
// the operator console (package console) both settle and list records
// through it, so the rules are written once:
//
//   - A write is guarded by everything the operator was shown ([Guard]: a
//     digest of every field of the record, the settled result or error
//     and the expiry included): it is refused with a [*ChangedError] if
//     the record is not, at the time of the write, exactly the record
//     the operator read, and nothing is written. Two operators settling
//     the same record from the same page get one write and one refusal.
//   - The write itself is fenced by the record's claim and status, so the
//     store refuses it if the holder settles the claim meanwhile.
//   - An IN_PROGRESS record still within its expected completion may have
//     a holder at work; it is settled only with Write.Force. "Within" is
//     decided on the store's clock, as the engine decides leases
//     ([Operator.Clock], [store.ServerClock]): an operator whose clock
//     runs ahead of the store's is not offered live work as stuck.
//   - A COMPLETED record is not released (that would discard its result
//     and run the operation again); Delete says so explicitly.
//   - Operator writes go to the store directly, never through an engine:
//     an engine disabled by IDEM_DISABLED (Config.Disabled) does not
//     turn them into no-ops.
//   - A listing ([Query], [List]) reads at most Query.MaxScan
//     records per request, whatever the filters.
//
// # What the guard covers
//
// The store's own condition on a write is the claim (fence and owner) and
// the status, which an operator's settlement of an already settled record
// does not change. The guard adds the rest: the write is made only while
// the record's digest is the one shown, checked and written under a
// per-key lock that every operator write of the process takes, so two
// operators of one console (or two idemctl writes in one process) are
// serialised exactly. Across processes (idemctl and a console at once) the
// check and the write are two round trips: a second settlement landing
// between them is caught by reading the record back after a write to a
// settled record, which reports a [*ChangedError] when the outcome that
// stands is not the operator's.
//
// The files beside this package (grafana/, prometheus/) are the
// dashboards and alert rules operators run next to it.
package ops

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// Action is a kind of manual write.
type Action string

// The manual writes.
const (
	// Release deletes a stuck IN_PROGRESS or a FAILED record: the next call
	// with the key runs the operation again.
	Release Action = "release"
	// Delete deletes a record whatever its status, COMPLETED included.
	Delete Action = "delete"
	// Complete resolves a record as COMPLETED with Write.Result: later
	// calls with the key replay it.
	Complete Action = "complete"
	// Fail resolves a record as FAILED with Write.Error: later calls with
	// the key get that error.
	Fail Action = "fail"
)

// Actions lists every action.
var Actions = []Action{Release, Delete, Complete, Fail}

// ParseAction reads an action's name.
func ParseAction(s string) (Action, error) {
	for _, a := range Actions {
		if string(a) == s {
			return a, nil
		}
	}
	return "", fmt.Errorf("unknown action %q: want release, delete, complete or fail", s)
}

// Write is one manual write.
type Write struct {
	Action Action
	// Result is Complete's result, stored as it is (the application's
	// codec's bytes: JSON for the default codec).
	Result []byte
	// Error is Fail's terminal error: a code and a message.
	Error *idem.TerminalError
	// Expiry is how long a record resolved by Complete or Fail is
	// replayed; 0 means as long as the application kept this record
	// (its expiry less its claim or settling time).
	Expiry time.Duration
	// Force also settles an IN_PROGRESS record still within its expected
	// completion, whose holder may be at work.
	Force bool
}

// Validate reports what is wrong with w itself, before any record is read.
func (w Write) Validate() error {
	if _, err := ParseAction(string(w.Action)); err != nil {
		return err
	}
	switch {
	case w.Expiry < 0:
		return fmt.Errorf("expiry %v: want a positive duration", w.Expiry)
	case w.Action == Complete && len(w.Result) == 0:
		return errors.New("complete needs a result")
	case w.Action == Fail && (w.Error == nil || w.Error.Code == "" || w.Error.Message == ""):
		return errors.New("fail needs an error code and a message")
	case w.Action != Complete && len(w.Result) > 0:
		return fmt.Errorf("%s takes no result", w.Action)
	case w.Action != Fail && w.Error != nil:
		return fmt.Errorf("%s takes no error", w.Action)
	}
	return nil
}

// FreshError refuses a write to an IN_PROGRESS record still within its
// expected completion without Write.Force: its holder may still be working.
type FreshError struct {
	Key        string
	LeaseUntil time.Time
	// Left is the time left until the expected completion.
	Left   time.Duration
	Holder string
}

func (e *FreshError) Error() string {
	return fmt.Sprintf("%s is IN_PROGRESS and within its expected completion (%s, in %v): its holder %s may still be working; wait, or force the write",
		e.Key, e.LeaseUntil.UTC().Format(time.RFC3339), e.Left.Round(time.Second), e.Holder)
}

// ErrReleaseCompleted refuses to release a COMPLETED record.
var ErrReleaseCompleted = errors.New("releasing a COMPLETED record would discard its stored result and run the operation again; use delete if that is what you want")

// ChangedError refuses a write because the record is no longer the one
// read: nothing was written.
type ChangedError struct {
	Key string
	// Now is the record as it is now; nil when it was deleted or expired.
	Now *Seen
	// Settled is true when the holder settled the same claim while the
	// operator's write was on its way (the write found it settled).
	Settled bool
	// Overwritten is true when the operator's write landed and another
	// write replaced it at once (another process settling the same
	// record): the outcome that stands is not the operator's.
	Overwritten bool
}

// Seen is what a refused write found.
type Seen struct {
	Status idem.Status
	Fence  uint64
	Owner  string
}

func (e *ChangedError) Error() string {
	switch {
	case e.Now == nil && e.Overwritten:
		return fmt.Sprintf("%s changed underneath: it was deleted right after the operator's write; the operator's outcome does not stand", e.Key)
	case e.Now == nil:
		return fmt.Sprintf("%s changed underneath: it was deleted or expired since it was read; nothing was written", e.Key)
	case e.Overwritten:
		return fmt.Sprintf("%s changed underneath: another write settled it as %s right after the operator's; the operator's outcome does not stand. Read it again and decide again", e.Key, e.Now.Status)
	case e.Settled:
		return fmt.Sprintf("%s changed underneath: its holder settled it as %s while the operator's write was on its way; the operator's outcome was not stored. Read it again and decide again", e.Key, e.Now.Status)
	}
	return fmt.Sprintf("%s changed underneath: it is now %s (fence %d, owner %s), not the record that was read; nothing was written. Read it again and decide again",
		e.Key, e.Now.Status, e.Now.Fence, e.Now.Owner)
}

// Allowed reports whether w may be applied to st, read at now: a
// [*FreshError] or [ErrReleaseCompleted] when not.
func (w Write) Allowed(st *idem.State, now time.Time) error {
	if st.Status == idem.StatusInProgress && !st.Overdue(now) && !w.Force {
		return &FreshError{Key: st.Key, LeaseUntil: st.LeaseUntil, Left: st.LeaseUntil.Sub(now), Holder: st.Owner}
	}
	if w.Action == Release && st.Status == idem.StatusCompleted {
		return fmt.Errorf("%s is COMPLETED: %w", st.Key, ErrReleaseCompleted)
	}
	return nil
}

// After is the status the record has after w: 0 (absent) for Release and
// Delete.
func (w Write) After() idem.Status {
	switch w.Action {
	case Complete:
		return idem.StatusCompleted
	case Fail:
		return idem.StatusFailed
	}
	return 0
}

// ExpiryFor is how long the record stays after w is applied to st.
func (w Write) ExpiryFor(st *idem.State) time.Duration {
	if w.Expiry > 0 {
		return w.Expiry
	}
	return Window(st)
}

// Describe says exactly what applying w to st changes, for a confirmation.
func (w Write) Describe(st *idem.State) string {
	before := fmt.Sprintf("%s (fence %d, owner %s)", st.Status, st.Fence, orDash(st.Owner))
	switch w.Action {
	case Release, Delete:
		return fmt.Sprintf("The record %s is deleted: the next call with this key runs the operation again.", before)
	case Complete:
		return fmt.Sprintf("The record %s becomes COMPLETED with the %d-byte result below: calls with this key replay it for %v.", before, len(w.Result), w.ExpiryFor(st))
	case Fail:
		return fmt.Sprintf("The record %s becomes FAILED with error %s: %s; calls with this key get that error for %v.", before, w.Error.Code, w.Error.Message, w.ExpiryFor(st))
	}
	return ""
}

// Window is how long a record settled by hand stays: as long as the
// application kept st (its expiry less its claim or settling time).
func Window(st *idem.State) time.Duration {
	from := st.CreatedAt
	if !st.CompletedAt.IsZero() {
		from = st.CompletedAt
	}
	return st.ExpiresAt.Sub(from)
}

// Operator settles records of one store by hand.
type Operator struct {
	Store store.Store
	// Clock is the time records are judged and written at, corrected to
	// the store's clock ([store.ServerClock]) when the store tells its
	// time and Clock is real time: whether an IN_PROGRESS record is
	// still within its expected completion ([Write.Allowed]) is decided
	// as the engine decides leases, so an operator whose clock runs ahead
	// is not told that live work may be settled. Default
	// store.SystemClock.
	Clock store.Clock
	// Owner names the engine records are read through. A record settled
	// by hand keeps its claim's fence and owner. Default "idem-operator".
	Owner string
	// Logger is not used: reads and writes log nothing (the console and
	// idemctl report every action themselves), and the warning of an
	// engine disabled by IDEM_DISABLED does not concern operator writes.
	Logger *slog.Logger

	once sync.Once
	sc   *store.ServerClock
}

// clock is Clock corrected to the store's.
func (o *Operator) clock() *store.ServerClock {
	o.once.Do(func() { o.sc = store.NewServerClock(o.Store, o.Clock) })
	return o.sc
}

// Now is the operator's time: the store's, as the last [Operator.Sync]
// (or Read, or write) measured it.
func (o *Operator) Now() time.Time { return o.clock().Now() }

// Sync measures the store's clock when due (see [store.ServerClock]), so
// that Now is the store's time; Read and every write do it themselves. A
// listing calls it first, and judges records at Now.
func (o *Operator) Sync(ctx context.Context) error { return o.clock().Sync(ctx) }

// engine returns the engine records are read through. Writes never go
// through it (see [Operator.ApplyGuarded]).
func (o *Operator) engine(expiry time.Duration) (*idem.Engine, error) {
	owner := o.Owner
	if owner == "" {
		owner = "idem-operator"
	}
	return idem.New(o.Store, &idem.Config{
		Clock: o.clock(), Owner: owner, Logger: slog.New(slog.DiscardHandler),
		Expiry: expiry, Lease: min(30*time.Second, expiry), RenewInterval: -1,
	})
}

// Read reads key's record with strong consistency, after measuring the
// store's clock when due; a key with no live record (absent, or expired
// on the store's clock) gives an error matching [store.ErrNotFound].
func (o *Operator) Read(ctx context.Context, key idem.StoreKey) (*idem.State, error) {
	if err := o.Sync(ctx); err != nil {
		return nil, err
	}
	e, err := o.engine(time.Hour)
	if err != nil {
		return nil, err
	}
	st, err := e.Status(ctx, key)
	if errors.Is(err, idem.ErrNotFound) {
		return nil, fmt.Errorf("%s: no such record (absent or expired): %w", key, store.ErrNotFound)
	}
	return st, err
}

// Apply applies w to the record st, which the operator read and decided
// on: see [Operator.ApplyGuarded], with st's [Guard].
func (o *Operator) Apply(ctx context.Context, st *idem.State, w Write) error {
	k, err := idem.ParseStoreKey(st.Key)
	if err != nil {
		return fmt.Errorf("%s: %w", st.Key, err)
	}
	return o.ApplyGuarded(ctx, k, Guard(st), w)
}

// ApplyGuarded applies w to key's record if it is still the record the
// operator was shown, whose [Guard] is guard. Under the key's lock it
// reads the record again and refuses with a [*ChangedError] when its
// guard differs (or it is gone), checks [Write.Allowed], then writes
// through the store, fenced by the record's claim and status. A write to
// an already settled record is read back: an outcome that does not stand
// (another process settled it right after) is a [*ChangedError] too.
func (o *Operator) ApplyGuarded(ctx context.Context, key idem.StoreKey, guard string, w Write) error {
	if err := w.Validate(); err != nil {
		return err
	}
	k := key.String()
	defer lockKey(k)()
	st, err := o.Read(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return &ChangedError{Key: k}
	}
	if err != nil {
		return err
	}
	if Guard(st) != guard {
		return &ChangedError{Key: k, Now: seen(st)}
	}
	now := o.Now()
	if err := w.Allowed(st, now); err != nil {
		return err
	}
	ref := store.ClaimRef{Key: k, Fence: st.Fence, Owner: st.Owner, From: st.Status, Now: store.Millis(now)}
	expires := ref.Now + max(w.ExpiryFor(st), time.Second).Milliseconds()
	switch w.Action {
	case Release, Delete:
		err = o.Store.Release(ctx, store.ReleaseParams{ClaimRef: ref})
	case Complete:
		err = o.Store.Complete(ctx, store.CompleteParams{ClaimRef: ref, ExpiresAt: expires, Result: w.Result})
	case Fail:
		err = o.Store.Fail(ctx, store.FailParams{ClaimRef: ref, ExpiresAt: expires,
			Err: store.ErrorRecord{Code: w.Error.Code, Message: w.Error.Message, Body: w.Error.Body}})
	}
	if err != nil {
		return explain(k, st, err)
	}
	if st.Status == idem.StatusInProgress || w.After() == 0 {
		return nil // the store's status condition guarded it whole
	}
	after, err := o.Read(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return &ChangedError{Key: k, Overwritten: true}
	}
	if err != nil {
		return fmt.Errorf("%s: the write was accepted but the record cannot be read back: %w", k, err)
	}
	if !landed(w, after, ref.Now, expires) {
		return &ChangedError{Key: k, Now: seen(after), Overwritten: true}
	}
	return nil
}

// landed reports whether st is what w wrote at now (ms), expiring at
// expires (ms).
func landed(w Write, st *idem.State, now, expires int64) bool {
	if st.Status != w.After() || store.Millis(st.CompletedAt) != now || store.Millis(st.ExpiresAt) != expires {
		return false
	}
	if w.Action == Complete {
		return bytes.Equal(st.Result, w.Result)
	}
	return st.Err != nil && st.Err.Code == w.Error.Code && st.Err.Message == w.Error.Message && bytes.Equal(st.Err.Body, w.Error.Body)
}

func seen(st *idem.State) *Seen {
	return &Seen{Status: st.Status, Fence: st.Fence, Owner: st.Owner}
}

// explain turns a write the store refused into a [*ChangedError].
func explain(key string, st *idem.State, err error) error {
	var fenced *store.FencedError
	switch {
	case errors.Is(err, store.ErrNotFound):
		return &ChangedError{Key: key}
	case errors.As(err, &fenced):
		return &ChangedError{Key: key, Now: &Seen{Status: fenced.Status, Fence: fenced.Current, Owner: fenced.CurrentOwner},
			Settled: fenced.Own() && st.Status == idem.StatusInProgress}
	}
	return fmt.Errorf("%s: %w", key, err)
}

// Guard is the digest of everything an operator is shown of st: key,
// status, claim (fence and owner), execution reference, fingerprint, every
// time (created, expected completion, settled, expiry), the stored result
// or terminal error (code, message, body), and the finished steps an
// IN_PROGRESS record holds (each one's name, time, result or error), so
// that a step its holder records after the page was shown refuses the
// write. Any write to the record
// that an operator could see changes it. It is not a secret: it names a
// version of a record, and is compared, never trusted.
func Guard(st *idem.State) string {
	h := sha256.New()
	field := func(b []byte) {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
		h.Write(b)
	}
	num := func(v int64) { field(binary.AppendVarint(nil, v)) }
	field([]byte(st.Key))
	num(int64(st.Status))
	num(int64(st.Fence))
	field([]byte(st.Owner))
	field([]byte(st.Ref))
	field([]byte(st.Fingerprint))
	for _, t := range []time.Time{st.CreatedAt, st.LeaseUntil, st.CompletedAt, st.ExpiresAt} {
		if t.IsZero() {
			num(0)
		} else {
			num(store.Millis(t))
		}
	}
	errRec := func(set bool, code, msg string, body []byte) {
		if !set {
			num(0)
			return
		}
		num(1)
		field([]byte(code))
		field([]byte(msg))
		field(body)
	}
	field(st.Result)
	if e := st.Err; e != nil {
		errRec(true, e.Code, e.Message, e.Body)
	} else {
		errRec(false, "", "", nil)
	}
	// Steps, when there are any: a record without them keeps the digest
	// it had before steps were covered.
	for _, s := range st.Steps {
		field([]byte(s.Name))
		num(s.At)
		field(s.Result)
		if e := s.Err; e != nil {
			errRec(true, e.Code, e.Message, e.Body)
		} else {
			errRec(false, "", "", nil)
		}
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// keyLocks serialises the operator writes of this process per key, so
// that a guard's check and its write are one step for every operator of
// a console.
var keyLocks = struct {
	sync.Mutex
	m map[string]*keyLock
}{m: make(map[string]*keyLock)}

type keyLock struct {
	sync.Mutex
	users int
}

// lockKey locks key and returns its unlock.
func lockKey(key string) (unlock func()) {
	keyLocks.Lock()
	l := keyLocks.m[key]
	if l == nil {
		l = &keyLock{}
		keyLocks.m[key] = l
	}
	l.users++
	keyLocks.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		keyLocks.Lock()
		if l.users--; l.users == 0 {
			delete(keyLocks.m, key)
		}
		keyLocks.Unlock()
	}
}

// ParseError reads a terminal error given as CODE:MESSAGE.
func ParseError(s string) (*idem.TerminalError, error) {
	code, msg, ok := strings.Cut(s, ":")
	if !ok || code == "" || msg == "" {
		return nil, fmt.Errorf("%q: want CODE:MESSAGE, such as declined:card declined", s)
	}
	return &idem.TerminalError{Code: code, Message: msg}, nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
