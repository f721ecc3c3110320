package clientkey

import (
	"fmt"
	"strings"

	"github.com/seed-a1b882c0/idem"
)

// MaxHeaderLen is the longest key an Idempotency-Key header may carry, in
// characters.
const MaxHeaderLen = 255

// HeaderField is the [idem.KeyError] Field of an Idempotency-Key header
// value that carries no key.
const HeaderField = "Idempotency-Key header"

// ParseHeader reads the key of one Idempotency-Key header value as
// idemhttp does: an RFC 8941 sf-string ("quoted", with \" and \\
// escapes), or a bare token of RFC 9110 tchar, ':' and '/', for clients
// that send a UUID unquoted; 1 to 255 printable ASCII characters. So the
// header values "order-42" (quoted) and order-42 name one key. A value
// that holds none fails with an *[idem.KeyError] whose Field is
// [HeaderField]; it matches [idem.ErrInvalidKey].
func ParseHeader(raw string) (string, error) {
	v := strings.Trim(raw, " \t")
	if v == "" {
		return "", badHeader(raw, "empty")
	}
	var key string
	if v[0] == '"' {
		k, rest, reason := parseString(v)
		if reason != "" {
			return "", badHeader(raw, reason)
		}
		if rest = strings.TrimLeft(rest, " \t"); rest != "" {
			return "", badHeader(raw, "unexpected text after the quoted key (a list or parameters?); send one quoted string")
		}
		key = k
	} else {
		for i := 0; i < len(v); i++ {
			if !isTokenChar(v[i]) {
				return "", badHeader(raw, fmt.Sprintf("character %q at offset %d is not allowed in an unquoted key; quote it as an RFC 8941 string", v[i], i))
			}
		}
		key = v
	}
	switch {
	case key == "":
		return "", badHeader(raw, "empty")
	case len(key) > MaxHeaderLen:
		return "", badHeader(raw, fmt.Sprintf("%d characters, over the limit of %d", len(key), MaxHeaderLen))
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

func badHeader(raw, reason string) error {
	return &idem.KeyError{Field: HeaderField, Value: raw, Reason: reason}
}
