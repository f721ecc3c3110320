package store

import (
	"context"
	"errors"
)

// Diagnoser is an optional power of a store: checking a live backend
// against everything that keeps the contract's promise, for an operator
// (idemctl doctor prints one line per [Finding]). Find it by type
// assertion.
//
// Diagnose reads, changing nothing, and answers one Finding per check and
// per server it checks (each master of a Redis Cluster has its own), in
// the order the lines should be read. It runs every check, whatever an
// earlier one found, and includes what the store's own Check tests at open
// (privileges, ACL, a table's shape) as the "configuration" finding. A
// check that cannot be made is a finding too: a [SeverityProblem] when the
// backend did not answer, saying so. Stores that have it: redisstore
// (configuration, eviction, persistence, replicas), pgstore
// (configuration, primary, synchronous_commit, standbys), dynamostore
// (configuration), boltstore (disk) and memstore (persistence).
type Diagnoser interface {
	Diagnose(ctx context.Context) []Finding
}

// Finding is one answer of [Diagnoser.Diagnose].
type Finding struct {
	// Check names the check, short and stable: "configuration",
	// "eviction", "persistence", "replicas", "disk", …
	Check string
	// Severity says whether the finding keeps the promise
	// ([SeverityOK]), is a risk the configuration accepts or narrows
	// ([SeverityWarning]), or breaks it ([SeverityProblem]).
	Severity Severity
	// What says what was found, in a sentence; for a warning or a
	// problem, what it costs (which records may be lost, which calls
	// fail).
	What string
	// Fix says how to fix a warning or a problem: what to set, grant or
	// run. Empty for SeverityOK.
	Fix string
}

// Severity grades a [Finding].
type Severity int

const (
	// SeverityOK: the setting keeps the contract's promise.
	SeverityOK Severity = iota
	// SeverityWarning: the promise holds with a risk the operator
	// accepted (redisstore's AllowEviction) or narrowed (persistence that
	// can lose the last second of writes): records may be lost and their
	// operations run again in the case the finding names.
	SeverityWarning
	// SeverityProblem: the promise does not hold (records forgotten on a
	// restart, writes that fail), or the check could not be made.
	SeverityProblem
)

// String returns "ok", "warning" or "problem".
func (s Severity) String() string {
	switch s {
	case SeverityOK:
		return "ok"
	case SeverityWarning:
		return "warning"
	case SeverityProblem:
		return "problem"
	}
	return "severity(?)"
}

// Fixer is implemented by a store's errors that know what mends them
// beyond what their class says (pgstore's missing table: run idemctl
// migrate). Fix says it in a sentence, for an operator; idemctl doctor
// prints it under the error instead of a fix guessed from the error's
// class.
type Fixer interface {
	error
	Fix() string
}

// FindingOf is the [SeverityProblem] finding of a check that failed with
// err: What is the error's message; Fix is the error's own ([Fixer]),
// else what its class calls for ([ErrMisconfigured], [ErrInvalidConfig]:
// change what the message names; [ErrUnavailable]: reach the server).
func FindingOf(check string, err error) Finding {
	f := Finding{Check: check, Severity: SeverityProblem, What: err.Error()}
	var fx Fixer
	switch {
	case errors.As(err, &fx) && fx.Fix() != "":
		f.Fix = fx.Fix()
	case errors.Is(err, ErrMisconfigured), errors.Is(err, ErrInvalidConfig):
		f.Fix = "the message says what to change; no retry mends it"
	case errors.Is(err, ErrUnavailable):
		f.Fix = "check that the server runs and that this machine reaches it (address, port, firewall, TLS), then check again"
	}
	return f
}
