package store

import (
	"fmt"
	"time"
)

// RecordVersion is the version of the record and key format written by this
// release. Stores persist it with every record so the format can evolve.
const RecordVersion = 1

// Status is the state of an idempotency record.
type Status uint8

// The states of a record. The zero value is not a valid status.
const (
	// StatusInProgress: a caller holds the claim and the operation is running.
	StatusInProgress Status = iota + 1
	// StatusCompleted: the operation succeeded and its result is stored.
	StatusCompleted
	// StatusFailed: the operation failed with a terminal error, which is stored.
	StatusFailed
)

// String returns the status as it is stored: IN_PROGRESS, COMPLETED or FAILED.
func (s Status) String() string {
	switch s {
	case StatusInProgress:
		return "IN_PROGRESS"
	case StatusCompleted:
		return "COMPLETED"
	case StatusFailed:
		return "FAILED"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Valid reports whether s is one of the three defined states.
func (s Status) Valid() bool { return s >= StatusInProgress && s <= StatusFailed }

// ParseStatus parses the stored form of a status (as returned by String).
func ParseStatus(s string) (Status, error) {
	switch s {
	case "IN_PROGRESS":
		return StatusInProgress, nil
	case "COMPLETED":
		return StatusCompleted, nil
	case "FAILED":
		return StatusFailed, nil
	}
	return 0, fmt.Errorf("idem: unknown status %q (want IN_PROGRESS, COMPLETED or FAILED)", s)
}

// Record is the stored state of one idempotency key. All times are
// milliseconds since the Unix epoch, the one unit used everywhere in idem.
type Record struct {
	// Key is the store key, "<operation>[/<tenant>]#<digest>" (see idem.StoreKey).
	Key string
	// Status is the state of the key.
	Status Status
	// Fence grows by one on every claim of the key: the first claim, a
	// takeover after the lease, a re-claim after expiry. Writes by a holder
	// whose fence is no longer the record's fence are refused.
	Fence uint64
	// Owner names who holds or held the claim, for people reading logs. The
	// engine makes it unique per call, so a store can recognise a retried
	// claim as the caller's own.
	Owner string
	// LeaseUntil is when an IN_PROGRESS record may be taken over (unless
	// Hold is set) and counts as stuck.
	LeaseUntil int64
	// ExpiresAt is when the record starts to count as absent, whatever the
	// backend's own TTL has done yet.
	ExpiresAt int64
	// Fingerprint is the hex SHA-256 of the canonical request payload, or
	// empty when the caller supplied no payload.
	Fingerprint string
	// Result is the encoded result of a COMPLETED record.
	Result []byte
	// Err is the stored terminal error of a FAILED record.
	Err *ErrorRecord
	// Ref is an optional external execution reference (such as a workflow
	// execution ID).
	Ref string
	// CreatedAt is when the current claim was made.
	CreatedAt int64
	// CompletedAt is when the record became COMPLETED or FAILED.
	CompletedAt int64
	// Version is the record format version ([RecordVersion] when written).
	Version int
	// Hold is set when the claim was made under the Hold takeover policy
	// (ClaimParams.Hold): past its lease the record is not taken over but
	// stays IN_PROGRESS, stuck, until a person settles it or it expires.
	// It is the claim's, kept by Complete and Fail, and shows operators
	// why a stuck record waits for them.
	Hold bool
	// Steps are the finished steps of the operation running under the
	// claim, in the order they ran ([Stepper]): kept while the record is
	// IN_PROGRESS, carried into the claim that takes it over, and dropped
	// when the record is settled (COMPLETED or FAILED) or deleted.
	Steps []Step
}

// Step is one finished step of an operation, recorded under its claim by
// [Stepper.RecordStep]: its encoded result, or the terminal error it ended
// with (never both).
type Step struct {
	// Name is the step's name, as the operation called it.
	Name string
	// Result is the step's encoded result, when it succeeded.
	Result []byte
	// Err is the terminal error the step ended with, when it failed.
	Err *ErrorRecord
	// At is when the step was recorded (ms).
	At int64
}

// Size is the number of payload bytes a step carries (its name, result and
// error), the figure a record's size counts for it.
func (s Step) Size() int {
	n := len(s.Name) + len(s.Result)
	if s.Err != nil {
		n += s.Err.Size()
	}
	return n
}

// Clone returns a deep copy of s.
func (s Step) Clone() Step {
	if s.Result != nil {
		s.Result = append([]byte(nil), s.Result...)
	}
	if s.Err != nil {
		e := *s.Err
		if e.Body != nil {
			e.Body = append([]byte(nil), e.Body...)
		}
		s.Err = &e
	}
	return s
}

// cloneSteps returns a deep copy of steps (nil when there are none).
func cloneSteps(steps []Step) []Step {
	if len(steps) == 0 {
		return nil
	}
	c := make([]Step, len(steps))
	for i, st := range steps {
		c[i] = st.Clone()
	}
	return c
}

// ErrorRecord is a terminal error as stored in a FAILED record.
type ErrorRecord struct {
	// Code is a short machine-readable code, such as "card_declined".
	Code string
	// Message is the human-readable message.
	Message string
	// Body is optional encoded detail (for example an HTTP error body).
	Body []byte
}

// Expired reports whether the record counts as absent at now (ms). The rule
// every store shares: a record is expired when now >= ExpiresAt.
func (r *Record) Expired(now int64) bool { return now >= r.ExpiresAt }

// LeaseExpired reports whether an IN_PROGRESS record's lease has run out at
// now (ms): now >= LeaseUntil. It is then stuck, and a claim may take it
// over unless it is held ([Record.Held]).
func (r *Record) LeaseExpired(now int64) bool {
	return r.Status == StatusInProgress && now >= r.LeaseUntil
}

// Held reports whether r is IN_PROGRESS past its lease under the Hold
// policy at now (ms): stuck, waiting for a person, not taken over.
func (r *Record) Held(now int64) bool { return r.Hold && r.LeaseExpired(now) }

// Claimable reports whether a Claim at now may replace r: r is expired, or it
// is IN_PROGRESS past its lease and not held.
func (r *Record) Claimable(now int64) bool {
	return r.Expired(now) || (r.LeaseExpired(now) && !r.Hold)
}

// Clone returns a deep copy of r, so that a store never shares memory with
// its callers.
func (r *Record) Clone() *Record {
	if r == nil {
		return nil
	}
	c := *r
	if r.Result != nil {
		c.Result = append([]byte(nil), r.Result...)
	}
	if r.Err != nil {
		e := *r.Err
		if e.Body != nil {
			e.Body = append([]byte(nil), e.Body...)
		}
		c.Err = &e
	}
	c.Steps = cloneSteps(r.Steps)
	return &c
}

// Size is the number of payload bytes a record carries (result, error body
// and message, and its steps' [Step.Size]), the figure stores compare with
// their size limit.
func (r *Record) Size() int {
	n := len(r.Result)
	if r.Err != nil {
		n += r.Err.Size()
	}
	for _, st := range r.Steps {
		n += st.Size()
	}
	return n
}

// Millis converts t to milliseconds since the Unix epoch.
func Millis(t time.Time) int64 { return t.UnixMilli() }

// FromMillis converts milliseconds since the Unix epoch to a time.Time.
func FromMillis(ms int64) time.Time { return time.UnixMilli(ms) }
