package idemhttp

import (
	"errors"
	"fmt"
	"strings"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
)

// HeaderName is the request header that carries the idempotency key.
const HeaderName = "Idempotency-Key"

// ReplayedHeader is set to "true" on every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// MaxHeaderLen is the longest idempotency key accepted, in characters.
const MaxHeaderLen = clientkey.MaxHeaderLen

// ErrMissingKey: the method is covered, a key is required and the request
// has no Idempotency-Key header. Answered 400.
var ErrMissingKey = errors.New("idemhttp: Idempotency-Key header is required")

// ParseHeader parses the values of the Idempotency-Key header fields of one
// request (http.Header.Values). The value is an RFC 8941 sf-string
// ("quoted", with \" and \\ escapes); a bare token of RFC 9110 tchar, ':'
// and '/' is accepted too, for clients that send a UUID unquoted. The key
// is 1 to 255 printable ASCII characters. More than one header field, or a
// list in one field, is an error. It returns [ErrMissingKey] when there is
// no field, else an [*idem.KeyError] naming the problem (Field
// [clientkey.HeaderField]). One field's value
// is read by [clientkey.ParseHeader], as idemctl find and the console read
// the value an operator was given.
func ParseHeader(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrMissingKey
	case 1:
	default:
		return "", &idem.KeyError{Field: clientkey.HeaderField, Value: strings.Join(values, ", "), Reason: fmt.Sprintf("sent %d times; send exactly one", len(values))}
	}
	return clientkey.ParseHeader(values[0])
}
