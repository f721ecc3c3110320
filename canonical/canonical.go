// Package canonical turns a JSON document into one canonical byte form, so
// that two payloads meaning the same thing fingerprint alike and two
// payloads meaning different things never do. idem fingerprints request
// payloads with it.
package canonical

import (
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of arrays and objects that [JSON]
// accepts.
const MaxDepth = 128

// SyntaxError says why a document has no canonical form, and where.
type SyntaxError struct {
	// Offset is the byte offset where the problem was found.
	Offset int
	Reason string
}

func (e *SyntaxError) Error() string {
	return "canonical: invalid JSON at byte " + strconv.Itoa(e.Offset) + ": " + e.Reason
}

// JSON returns the canonical form of a JSON document, in the style of
// RFC 8785 (JSON Canonicalization Scheme): no insignificant white space,
// object members sorted by the UTF-16 code units of their names, strings
// with the minimal escaping of RFC 8785, numbers in the ECMAScript shortest
// notation.
//
// It differs from RFC 8785 where RFC 8785 would make two different payloads
// look alike: numbers are canonicalised as exact decimals, never through a
// float64, so 9007199254740993 and 9007199254740992 stay different, as do
// 0.1 and 0.10000000000000001; numerically equal spellings (1, 1.0, 10e-1)
// still share one form.
//
// Strictness: invalid UTF-8, lone surrogate escapes, duplicate member names
// (after unescaping), trailing data, and nesting deeper than [MaxDepth] are
// errors ([*SyntaxError]), never silently repaired.
func JSON(src []byte) ([]byte, error) {
	p := canonParser{src: src, out: make([]byte, 0, len(src))}
	p.skipSpace()
	if p.pos >= len(p.src) {
		return nil, p.fail("empty document")
	}
	if err := p.value(0); err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.src) {
		return nil, p.fail("trailing data after the JSON value")
	}
	return p.out, nil
}

type canonParser struct {
	src []byte
	pos int
	out []byte
}

func (p *canonParser) fail(reason string) error {
	return &SyntaxError{Offset: p.pos, Reason: reason}
}

func (p *canonParser) skipSpace() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *canonParser) value(depth int) error {
	if p.pos >= len(p.src) {
		return p.fail("unexpected end of input")
	}
	switch c := p.src[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.str()
		if err != nil {
			return err
		}
		p.out = appendCanonString(p.out, s)
		return nil
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	default:
		return p.fail("unexpected character " + strconv.QuoteRune(rune(c)))
	}
}

func (p *canonParser) literal(lit string) error {
	if len(p.src)-p.pos < len(lit) || string(p.src[p.pos:p.pos+len(lit)]) != lit {
		return p.fail("invalid literal, want " + lit)
	}
	p.pos += len(lit)
	p.out = append(p.out, lit...)
	return nil
}

func (p *canonParser) array(depth int) error {
	if depth > MaxDepth {
		return p.fail("nesting deeper than " + strconv.Itoa(MaxDepth))
	}
	p.pos++ // [
	p.out = append(p.out, '[')
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == ']' {
		p.pos++
		p.out = append(p.out, ']')
		return nil
	}
	for {
		p.skipSpace()
		if err := p.value(depth); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.src) {
			return p.fail("unterminated array")
		}
		switch p.src[p.pos] {
		case ',':
			p.pos++
			p.out = append(p.out, ',')
		case ']':
			p.pos++
			p.out = append(p.out, ']')
			return nil
		default:
			return p.fail("expected ',' or ']' in array")
		}
	}
}

type member struct {
	name       string
	at         int // offset of the name in the source, for errors
	start, end int // canonical "name":value bytes in out
}

func (p *canonParser) object(depth int) error {
	if depth > MaxDepth {
		return p.fail("nesting deeper than " + strconv.Itoa(MaxDepth))
	}
	p.pos++ // {
	base := len(p.out)
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == '}' {
		p.pos++
		p.out = append(p.out, '{', '}')
		return nil
	}
	var members []member
	for {
		p.skipSpace()
		if p.pos >= len(p.src) || p.src[p.pos] != '"' {
			return p.fail("expected a member name")
		}
		namePos := p.pos
		name, err := p.str()
		if err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.src) || p.src[p.pos] != ':' {
			return p.fail("expected ':' after member name")
		}
		p.pos++
		p.skipSpace()
		start := len(p.out)
		p.out = appendCanonString(p.out, name)
		p.out = append(p.out, ':')
		if err := p.value(depth); err != nil {
			return err
		}
		members = append(members, member{name: name, at: namePos, start: start, end: len(p.out)})
		p.skipSpace()
		if p.pos >= len(p.src) {
			return p.fail("unterminated object")
		}
		if p.src[p.pos] == ',' {
			p.pos++
			continue
		}
		if p.src[p.pos] == '}' {
			p.pos++
			break
		}
		return p.fail("expected ',' or '}' in object")
	}
	slices.SortStableFunc(members, func(a, b member) int { return compareUTF16(a.name, b.name) })
	for i := 1; i < len(members); i++ {
		if members[i].name == members[i-1].name {
			return &SyntaxError{Offset: max(members[i].at, members[i-1].at), Reason: "duplicate member name " + strconv.Quote(members[i].name)}
		}
	}
	body := slices.Clone(p.out[base:])
	p.out = append(p.out[:base], '{')
	for i, m := range members {
		if i > 0 {
			p.out = append(p.out, ',')
		}
		p.out = append(p.out, body[m.start-base:m.end-base]...)
	}
	p.out = append(p.out, '}')
	return nil
}

// compareUTF16 orders strings by their UTF-16 code units, as RFC 8785
// requires for member names.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			ua, ub := utf16Units(ra), utf16Units(rb)
			if ua[0] != ub[0] {
				return int(ua[0]) - int(ub[0])
			}
			return int(ua[1]) - int(ub[1])
		}
		a, b = a[na:], b[nb:]
	}
	return len(a) - len(b)
}

func utf16Units(r rune) [2]uint16 {
	if r < 0x10000 {
		return [2]uint16{uint16(r), 0}
	}
	hi, lo := utf16.EncodeRune(r)
	return [2]uint16{uint16(hi), uint16(lo)}
}

// str parses a JSON string at p.pos and returns its decoded value.
func (p *canonParser) str() (string, error) {
	p.pos++ // opening quote
	start := p.pos
	// Fast path: no escapes, all ASCII.
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		if c == '"' {
			s := string(p.src[start:p.pos])
			p.pos++
			return s, nil
		}
		if c == '\\' || c < 0x20 || c >= 0x80 {
			break
		}
		p.pos++
	}
	buf := append([]byte(nil), p.src[start:p.pos]...)
	for {
		if p.pos >= len(p.src) {
			return "", p.fail("unterminated string")
		}
		c := p.src[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(buf), nil
		case c < 0x20:
			return "", p.fail("control character in string")
		case c == '\\':
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			buf = utf8.AppendRune(buf, r)
		case c < 0x80:
			buf = append(buf, c)
			p.pos++
		default:
			r, n := utf8.DecodeRune(p.src[p.pos:])
			if r == utf8.RuneError && n <= 1 {
				return "", p.fail("invalid UTF-8")
			}
			buf = append(buf, p.src[p.pos:p.pos+n]...)
			p.pos += n
		}
	}
}

func (p *canonParser) escape() (rune, error) {
	if p.pos+1 >= len(p.src) {
		return 0, p.fail("unterminated escape")
	}
	c := p.src[p.pos+1]
	p.pos += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
		r, err := p.hex4()
		if err != nil {
			return 0, err
		}
		if utf16.IsSurrogate(r) {
			if r >= 0xDC00 {
				return 0, p.fail("lone low surrogate escape")
			}
			if p.pos+1 >= len(p.src) || p.src[p.pos] != '\\' || p.src[p.pos+1] != 'u' {
				return 0, p.fail("lone high surrogate escape")
			}
			p.pos += 2
			lo, err := p.hex4()
			if err != nil {
				return 0, err
			}
			if lo < 0xDC00 || lo > 0xDFFF {
				return 0, p.fail("high surrogate not followed by a low surrogate")
			}
			return utf16.DecodeRune(r, lo), nil
		}
		return r, nil
	}
	return 0, p.fail("invalid escape")
}

func (p *canonParser) hex4() (rune, error) {
	if p.pos+4 > len(p.src) {
		return 0, p.fail("short \\u escape")
	}
	var r rune
	for _, c := range p.src[p.pos : p.pos+4] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, p.fail("invalid hex digit in \\u escape")
		}
		r = r<<4 | rune(d)
	}
	p.pos += 4
	return r, nil
}

// appendCanonString appends s quoted with RFC 8785's escaping.
func appendCanonString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			dst = append(dst, '\\', '"')
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			if c < 0x20 {
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			} else {
				dst = append(dst, c)
			}
		}
	}
	return append(dst, '"')
}

// maxExponent bounds the decimal exponent of a number; larger ones are
// rejected rather than approximated.
const maxExponent = 1_000_000_000

// number parses a JSON number and appends its canonical exact-decimal form.
func (p *canonParser) number() error {
	start := p.pos
	neg := false
	if p.src[p.pos] == '-' {
		neg = true
		p.pos++
	}
	intStart := p.pos
	if p.pos >= len(p.src) || !isDigit(p.src[p.pos]) {
		return p.fail("invalid number")
	}
	if p.src[p.pos] == '0' {
		p.pos++
		if p.pos < len(p.src) && isDigit(p.src[p.pos]) {
			return &SyntaxError{Offset: start, Reason: "number with a leading zero"}
		}
	} else {
		for p.pos < len(p.src) && isDigit(p.src[p.pos]) {
			p.pos++
		}
	}
	intPart := p.src[intStart:p.pos]
	var frac []byte
	if p.pos < len(p.src) && p.src[p.pos] == '.' {
		p.pos++
		fs := p.pos
		for p.pos < len(p.src) && isDigit(p.src[p.pos]) {
			p.pos++
		}
		if p.pos == fs {
			return p.fail("number with no digits after '.'")
		}
		frac = p.src[fs:p.pos]
	}
	var exp int64
	if p.pos < len(p.src) && (p.src[p.pos] == 'e' || p.src[p.pos] == 'E') {
		p.pos++
		eneg := false
		if p.pos < len(p.src) && (p.src[p.pos] == '+' || p.src[p.pos] == '-') {
			eneg = p.src[p.pos] == '-'
			p.pos++
		}
		es := p.pos
		for p.pos < len(p.src) && isDigit(p.src[p.pos]) {
			if exp < maxExponent {
				exp = exp*10 + int64(p.src[p.pos]-'0')
			}
			p.pos++
		}
		if p.pos == es {
			return p.fail("number with no digits in its exponent")
		}
		if exp >= maxExponent {
			return &SyntaxError{Offset: start, Reason: "number exponent out of range"}
		}
		if eneg {
			exp = -exp
		}
	}
	// value = digits × 10^exp, digits without leading or trailing zeros.
	digits := make([]byte, 0, len(intPart)+len(frac))
	digits = append(digits, intPart...)
	digits = append(digits, frac...)
	exp -= int64(len(frac))
	i := 0
	for i < len(digits) && digits[i] == '0' {
		i++
	}
	digits = digits[i:]
	for len(digits) > 0 && digits[len(digits)-1] == '0' {
		digits = digits[:len(digits)-1]
		exp++
	}
	if len(digits) == 0 {
		p.out = append(p.out, '0') // -0 and 0.000 are 0
		return nil
	}
	if neg {
		p.out = append(p.out, '-')
	}
	p.out = appendDecimal(p.out, digits, exp)
	return nil
}

// appendDecimal formats digits × 10^exp the way ECMAScript's
// Number.prototype.toString places the decimal point.
func appendDecimal(dst, digits []byte, exp int64) []byte {
	k := int64(len(digits))
	n := k + exp // position of the decimal point
	switch {
	case k <= n && n <= 21:
		dst = append(dst, digits...)
		for j := int64(0); j < n-k; j++ {
			dst = append(dst, '0')
		}
	case 0 < n && n <= 21:
		dst = append(dst, digits[:n]...)
		dst = append(dst, '.')
		dst = append(dst, digits[n:]...)
	case -6 < n && n <= 0:
		dst = append(dst, '0', '.')
		for j := int64(0); j < -n; j++ {
			dst = append(dst, '0')
		}
		dst = append(dst, digits...)
	default:
		dst = append(dst, digits[0])
		if k > 1 {
			dst = append(dst, '.')
			dst = append(dst, digits[1:]...)
		}
		dst = append(dst, 'e')
		if n-1 >= 0 {
			dst = append(dst, '+')
		}
		dst = strconv.AppendInt(dst, n-1, 10)
	}
	return dst
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
