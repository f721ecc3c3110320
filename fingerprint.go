// Fingerprints as stored: the version of the rules that made them, and the
// one comparison of a call's fingerprint with a stored one.

package idem

import (
	"strconv"
	"strings"

	"github.com/seed-a1b882c0/idem/observe"
)

// fingerprintRules is the version of the rules this release makes
// fingerprints by: canonical JSON as [canonical.JSON] writes it, hashed with
// SHA-256, and each adapter's choice of what it hashes (docs/http.md,
// docs/grpc.md, docs/consumers.md). A release that changes any of them
// raises it, so a record made by the old rules is still compared by them
// (see [call.mismatch]).
const fingerprintRules = 1

// fingerprintPrefix is how a stored fingerprint names the rules that made
// it: "v1:" and the hex digest.
var fingerprintPrefix = "v" + strconv.Itoa(fingerprintRules) + ":"

// storedFingerprint is the form in which a call's fingerprint fp, made by
// this release's rules, is stored and compared: the rules' version, ':'
// and fp. No payload, no fingerprint: "" stays "".
func storedFingerprint(fp string) string {
	if fp == "" {
		return ""
	}
	return fingerprintPrefix + fp
}

// splitFingerprint reads a stored fingerprint: the version of the rules
// that made it and the digest. ok is false when s names no version (a
// record written by something other than the engine, or none at all).
func splitFingerprint(s string) (version int, digest string, ok bool) {
	rest, found := strings.CutPrefix(s, "v")
	if !found {
		return 0, "", false
	}
	n, digest, found := strings.Cut(rest, ":")
	if !found || n == "" || len(n) > 4 || n[0] == '0' {
		return 0, "", false
	}
	v, err := strconv.Atoi(n)
	if err != nil || v < 1 {
		return 0, "", false
	}
	return v, digest, true
}

// fingerprintBy is the hook for records made by other rules: the call's
// fingerprint as version's rules make it (stored form), and whether this
// call can make it. A release that raises fingerprintRules keeps the rules
// it replaced and answers here for a call that still has what they hash
// (a [Request]'s payload). With one version of the rules there is nothing
// to remake.
func (c *call) fingerprintBy(version int) (string, bool) {
	return "", false
}

// mismatch checks the call's fingerprint against a stored one: the one
// check of every path (cache, store conflict, in-process flight). Both are
// in stored form; [sameFingerprint] is the rule.
func (c *call) mismatch(stored string) error {
	if sameFingerprint(stored, c.fingerprint, c.fingerprintBy) {
		return nil
	}
	c.observe(observe.OutcomeMismatch)
	return &MismatchError{Key: c.key, Stored: stored, Got: c.fingerprint}
}

// sameFingerprint reports whether a stored fingerprint matches a call's,
// got, made by this release's rules (both in stored form). A fingerprint
// made by other rules (a record written before an upgrade, or by a newer
// release during a rolling one) is compared by the rules that made it, as
// remake makes the call's fingerprint by them; when the call cannot make
// it, the key alone decides: a retry in flight across a change of the
// rules is answered by its record, never by a mismatch. A stored
// fingerprint that names no version is compared as it is.
func sameFingerprint(stored, got string, remake func(version int) (string, bool)) bool {
	if stored == got {
		return true
	}
	v, _, ok := splitFingerprint(stored)
	if !ok || v == fingerprintRules || got == "" {
		return false
	}
	fp, can := remake(v)
	return !can || fp == stored
}
