package idemhttp

import (
	"errors"
	"fmt"
	"strings"

	"github.com/seed-a1b882c0/idem/clientkey"
)

// HeaderName is the request header that carries the idempotency key.
const HeaderName = "Idempotency-Key"

// ReplayedHeader is set to "true" on every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// MaxHeaderLen is the longest idempotency key accepted, in characters.
const MaxHeaderLen = clientkey.MaxHeaderLen

var (
	// ErrMissingKey: the method is covered, a key is required and the
	// request has no Idempotency-Key header. Answered 400.
	ErrMissingKey = errors.New("idemhttp: Idempotency-Key header is required")
	// ErrInvalidKey: the Idempotency-Key header is malformed or repeated.
	// The error is a [*KeyHeaderError]. Answered 400.
	ErrInvalidKey = errors.New("idemhttp: invalid Idempotency-Key header")
)

// KeyHeaderError says what is wrong with an Idempotency-Key header.
type KeyHeaderError struct {
	// Value is the header value as received (all of them, joined, when
	// the header was repeated).
	Value  string
	Reason string
}

func (e *KeyHeaderError) Error() string {
	v := e.Value
	if len(v) > 64 {
		v = v[:64] + "..."
	}
	return fmt.Sprintf("idemhttp: invalid Idempotency-Key %q: %s", v, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidKey) true.
func (e *KeyHeaderError) Is(target error) bool { return target == ErrInvalidKey }

// ParseHeader parses the values of the Idempotency-Key header fields of one
// request (http.Header.Values). The value is an RFC 8941 sf-string
// ("quoted", with \" and \\ escapes); a bare token of RFC 9110 tchar, ':'
// and '/' is accepted too, for clients that send a UUID unquoted. The key
// is 1 to 255 printable ASCII characters. More than one header field, or a
// list in one field, is an error. It returns [ErrMissingKey] when there is
// no field, else a [*KeyHeaderError] naming the problem. One field's value
// is read by [clientkey.ParseHeader], as idemctl find and the console read
// the value an operator was given.
func ParseHeader(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrMissingKey
	case 1:
	default:
		return "", &KeyHeaderError{Value: strings.Join(values, ", "), Reason: fmt.Sprintf("sent %d times; send exactly one", len(values))}
	}
	key, err := clientkey.ParseHeader(values[0])
	if err != nil {
		if he, ok := err.(*clientkey.HeaderError); ok {
			return "", &KeyHeaderError{Value: he.Value, Reason: he.Reason}
		}
		return "", err
	}
	return key, nil
}
