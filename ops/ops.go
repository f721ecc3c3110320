// Package ops holds an operator's manual writes on an idem store: release,
// delete, resolve as COMPLETED with a result, or as FAILED with an error.
// idemctl's commands and the operator console (package console) both
// settle records through it, so the rules are written once:
//
//   - A write goes through the token of exactly the record the operator
//     read ([idem.State.Token]): the store refuses it if the record
//     changed in between (another claim, another status, deleted), and
//     nothing is written.
//   - An IN_PROGRESS record still within its expected completion may have
//     a holder at work; it is settled only with Write.Force.
//   - A COMPLETED record is not released (that would discard its result
//     and run the operation again); Delete says so explicitly.
//   - A resolved outcome that the holder beat by settling the same claim
//     first is reported as a change underneath, not as success.
//
// The files beside this package (grafana/, prometheus/) are the
// dashboards and alert rules operators run next to it.
package ops

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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
}

// Seen is what a refused write found.
type Seen struct {
	Status idem.Status
	Fence  uint64
	Owner  string
}

func (e *ChangedError) Error() string {
	switch {
	case e.Now == nil:
		return fmt.Sprintf("%s changed underneath: it was deleted or expired since it was read; nothing was written", e.Key)
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
	// Clock is the time writes are made at. Default store.SystemClock.
	Clock store.Clock
	// Owner is the owner written on records resolved by hand. Default
	// "idem-operator".
	Owner string
	// Logger receives the engine's own warnings. Default slog.Default().
	Logger *slog.Logger
}

func (o *Operator) clock() store.Clock {
	if o.Clock == nil {
		return store.SystemClock{}
	}
	return o.Clock
}

// Now is the operator's time.
func (o *Operator) Now() time.Time { return o.clock().Now() }

// engine returns an engine whose settled records live for expiry (at
// least a second) and that stores results as they are given.
func (o *Operator) engine(expiry time.Duration) (*idem.Engine, error) {
	expiry = max(expiry, time.Second)
	owner, log := o.Owner, o.Logger
	if owner == "" {
		owner = "idem-operator"
	}
	if log == nil {
		log = slog.Default()
	}
	return idem.New(o.Store, &idem.Config{
		Clock: o.clock(), Codec: RawCodec{}, Owner: owner, Logger: log,
		Expiry: expiry, Lease: min(30*time.Second, expiry), RenewInterval: -1,
	})
}

// Read reads key's record with strong consistency; a key with no live
// record gives an error matching [store.ErrNotFound].
func (o *Operator) Read(ctx context.Context, key idem.StoreKey) (*idem.State, error) {
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
// on: it checks [Write.Allowed], then writes through st's token, so the
// store refuses the write with a [*ChangedError] if the record changed
// since it was read.
func (o *Operator) Apply(ctx context.Context, st *idem.State, w Write) error {
	if err := w.Validate(); err != nil {
		return err
	}
	if err := w.Allowed(st, o.Now()); err != nil {
		return err
	}
	e, err := o.engine(w.ExpiryFor(st))
	if err != nil {
		return err
	}
	t := st.Token()
	switch w.Action {
	case Release, Delete:
		err = e.Release(ctx, t)
	case Complete:
		err = e.Complete(ctx, t, w.Result)
	case Fail:
		err = e.Fail(ctx, t, w.Error)
	}
	if err != nil {
		return explain(st.Key, err)
	}
	if w.Action != Complete && w.Action != Fail {
		return nil
	}
	// The engine counts a write that finds the record already settled
	// under the same claim as its own (an earlier attempt whose reply was
	// lost); for an operator's write that means the holder settled it in
	// between.
	after, err := o.Read(ctx, t.Key)
	if err != nil {
		return fmt.Errorf("%s: the write was accepted but the record cannot be read back: %w", st.Key, err)
	}
	if !landed(w, after) {
		return &ChangedError{Key: st.Key, Now: &Seen{Status: after.Status, Fence: after.Fence, Owner: after.Owner}, Settled: true}
	}
	return nil
}

func landed(w Write, st *idem.State) bool {
	if w.Action == Complete {
		return st.Status == idem.StatusCompleted && bytes.Equal(st.Result, w.Result)
	}
	return st.Status == idem.StatusFailed && st.Err != nil && st.Err.Code == w.Error.Code && st.Err.Message == w.Error.Message
}

// explain turns a refused write into a [*ChangedError].
func explain(key string, err error) error {
	var stale *idem.StaleTokenError
	if !errors.As(err, &stale) {
		return err
	}
	if stale.Status == 0 {
		return &ChangedError{Key: key}
	}
	return &ChangedError{Key: key, Now: &Seen{Status: stale.Status, Fence: stale.Fence, Owner: stale.Owner}}
}

// ParseError reads a terminal error given as CODE:MESSAGE.
func ParseError(s string) (*idem.TerminalError, error) {
	code, msg, ok := strings.Cut(s, ":")
	if !ok || code == "" || msg == "" {
		return nil, fmt.Errorf("%q: want CODE:MESSAGE, such as declined:card declined", s)
	}
	return &idem.TerminalError{Code: code, Message: msg}, nil
}

// RawCodec stores the bytes it is given as they are: a result an operator
// supplies is already in whatever encoding the application uses.
type RawCodec struct{}

// Marshal returns v, which must be a []byte.
func (RawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.([]byte)
	if !ok {
		return nil, fmt.Errorf("ops: raw codec given %T", v)
	}
	return b, nil
}

// Unmarshal copies data into v, which must be a *[]byte.
func (RawCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("ops: raw codec given %T", v)
	}
	*p = append([]byte(nil), data...)
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
