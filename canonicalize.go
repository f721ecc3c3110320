// Canonical JSON: the form a payload is fingerprinted in.

package idem

import (
	"errors"

	"github.com/seed-a1b882c0/idem/canonical"
)

// canonicalize returns the canonical form of a JSON document, the form
// payloads are fingerprinted in: see [canonical.JSON] for the rules. A
// document without one fails with a [*PayloadError] naming where and why.
func canonicalize(src []byte) ([]byte, error) {
	b, err := canonical.JSON(src)
	var se *canonical.SyntaxError
	if errors.As(err, &se) {
		return nil, &PayloadError{Offset: se.Offset, Reason: se.Reason}
	}
	return b, err
}
