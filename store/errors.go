package store

import (
	"errors"
	"fmt"
)

// Errors returned by stores.
var (
	// ErrNotFound: the key is absent or expired.
	ErrNotFound = errors.New("idem: record not found")
	// ErrFenced: a write by a holder whose fence is no longer the record's,
	// or to a record no longer IN_PROGRESS. Nothing changed. The error is a
	// [*FencedError].
	ErrFenced = errors.New("idem: write refused, fence is stale")
	// ErrTooLarge: the record is over the store's size limit. The error is a
	// [*TooLargeError].
	ErrTooLarge = errors.New("idem: record too large for the store")
	// ErrUnavailable: the backend could not be reached or did not answer in
	// time. Wrapped by stores with the backend's error.
	ErrUnavailable = errors.New("idem: store unavailable")
	// ErrThrottled: the backend refused the call for the rate of requests
	// (DynamoDB's ProvisionedThroughputExceededException,
	// ThrottlingException, RequestLimitExceeded), after the client's own
	// retries. A transient fault: stores wrap it together with
	// ErrUnavailable, so that it is handled as one (retried, failed
	// closed), and reported apart (observe.StoreThrottled), so that
	// operators see a table short of capacity rather than an outage.
	ErrThrottled = errors.New("idem: store throttled")
	// ErrCorrupt: stored bytes could not be decoded. The engine fails
	// closed: it never replays what it cannot read.
	ErrCorrupt = errors.New("idem: corrupt record")
	// ErrMisconfigured: the backend refused a request for a reason no
	// retry mends — credentials refused, a bucket, table or privilege
	// missing, a command forbidden — until someone fixes the store's
	// configuration. The engine does not retry an outcome write that
	// fails with it (see idem.Config.WriteTimeout). Stores wrap it with an
	// error that says what to fix; found when a store is opened, the same
	// errors also match ErrInvalidConfig.
	ErrMisconfigured = errors.New("idem: store misconfigured")
	// ErrInvalidConfig: a store's configuration (a Config field, a URL) is
	// out of range or unusable. It is idem.ErrInvalidConfig, the same
	// error value, so that a store needs nothing but this package.
	ErrInvalidConfig = errors.New("idem: invalid config")
	// ErrInvalidParams: a call's parameters are unusable (an Extend whose
	// From is not IN_PROGRESS, a required argument left empty). The
	// caller's mistake: nothing was read or written, and a retry fails
	// alike.
	ErrInvalidParams = errors.New("idem: invalid store call parameters")
	// ErrInvalidCursor: a listing's cursor was not made by the store's
	// List, or is damaged.
	ErrInvalidCursor = errors.New("idem: invalid list cursor")
)

// TakenOver reports whether a fenced write's error says the claim is no
// longer the writer's: the store refused it (ErrFenced) or the record is
// gone (ErrNotFound). The one test of every holder, engine and adapter.
func TakenOver(err error) bool {
	return err != nil && (errors.Is(err, ErrFenced) || errors.Is(err, ErrNotFound))
}

// FencedError is returned by a store when a write's claim (fence and owner)
// is not the record's claim, or the record is no longer IN_PROGRESS.
type FencedError struct {
	Key string
	// Fence and Owner name the writer's claim; Current and CurrentOwner
	// the record's.
	Fence, Current      uint64
	Owner, CurrentOwner string
	// Status is the record's status.
	Status Status
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("idem: write to %s by claim %d (%s) refused: record holds claim %d (%s), status %s",
		e.Key, e.Fence, e.Owner, e.Current, e.CurrentOwner, e.Status)
}

// Own reports whether the record still holds the writer's own claim (in
// another status than IN_PROGRESS): for example a Complete retried after its
// first reply was lost finds its own COMPLETED record.
func (e *FencedError) Own() bool { return e.Current == e.Fence && e.CurrentOwner == e.Owner }

// Is makes errors.Is(err, ErrFenced) true.
func (e *FencedError) Is(target error) bool { return target == ErrFenced }

// TooLargeError is returned by a store when a record is over its limit.
type TooLargeError struct {
	Key         string
	Size, Limit int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("idem: record %s carries %d bytes, over the store's limit of %d", e.Key, e.Size, e.Limit)
}

// Is makes errors.Is(err, ErrTooLarge) true.
func (e *TooLargeError) Is(target error) bool { return target == ErrTooLarge }

// CorruptError describes stored bytes that could not be decoded.
type CorruptError struct {
	Key    string
	Reason string
}

func (e *CorruptError) Error() string {
	if e.Key == "" {
		return "idem: corrupt record: " + e.Reason
	}
	return fmt.Sprintf("idem: corrupt record %s: %s", e.Key, e.Reason)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }
