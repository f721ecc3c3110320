package idemhttp

import (
	"errors"
	"fmt"
	"strings"
)

// HeaderName is the request header that carries the idempotency key.
const HeaderName = "Idempotency-Key"

// ReplayedHeader is set to "true" on every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// MaxHeaderLen is the longest idempotency key accepted, in characters.
const MaxHeaderLen = 255

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
// no field, else a [*KeyHeaderError] naming the problem.
func ParseHeader(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrMissingKey
	case 1:
	default:
		return "", &KeyHeaderError{Value: strings.Join(values, ", "), Reason: fmt.Sprintf("sent %d times; send exactly one", len(values))}
	}
	raw := values[0]
	v := strings.Trim(raw, " \t")
	if v == "" {
		return "", &KeyHeaderError{Value: raw, Reason: "empty"}
	}
	var key string
	if v[0] == '"' {
		k, rest, reason := parseString(v)
		if reason != "" {
			return "", &KeyHeaderError{Value: raw, Reason: reason}
		}
		if rest = strings.TrimLeft(rest, " \t"); rest != "" {
			return "", &KeyHeaderError{Value: raw, Reason: "unexpected text after the quoted key (a list or parameters?); send one quoted string"}
		}
		key = k
	} else {
		for i := 0; i < len(v); i++ {
			if !isTokenChar(v[i]) {
				return "", &KeyHeaderError{Value: raw, Reason: fmt.Sprintf("character %q at offset %d is not allowed in an unquoted key; quote it as an RFC 8941 string", v[i], i)}
			}
		}
		key = v
	}
	switch {
	case key == "":
		return "", &KeyHeaderError{Value: raw, Reason: "empty"}
	case len(key) > MaxHeaderLen:
		return "", &KeyHeaderError{Value: raw, Reason: fmt.Sprintf("%d characters, over the limit of %d", len(key), MaxHeaderLen)}
	}
	return key, nil
}

// parseString parses an RFC 8941 sf-string at the start of s (s[0] is the
// opening quote). It returns the unescaped string, the rest of s, and a
// reason when s does not hold a valid string.
func parseString(s string) (str, rest, reason string) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i == len(s) {
				return "", "", "unterminated escape at the end of the quoted key"
			}
			if s[i] != '"' && s[i] != '\\' {
				return "", "", fmt.Sprintf("invalid escape \\%c at offset %d; only \\\" and \\\\ are allowed", s[i], i-1)
			}
			b.WriteByte(s[i])
		case c == '"':
			return b.String(), s[i+1:], ""
		case c < 0x20 || c > 0x7e:
			return "", "", fmt.Sprintf("byte 0x%02x at offset %d is not printable ASCII", c, i)
		default:
			b.WriteByte(c)
		}
	}
	return "", "", "missing closing quote"
}

// isTokenChar reports whether c may appear in an unquoted key: RFC 9110
// tchar, plus ':' and '/' as in RFC 8941 tokens.
func isTokenChar(c byte) bool {
	if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
