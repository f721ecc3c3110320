package idem_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/canonical"
)

func TestCanonicalize(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" [ 1 , 2 ,\n3 ] ", `[1,2,3]`},
		{`{"a":{"d":[true,false,null],"c":"x"}}`, `{"a":{"c":"x","d":[true,false,null]}}`},
		{`1.0`, `1`},
		{`10e-1`, `1`},
		{`-0`, `0`},
		{`-0.0e5`, `0`},
		{`1e21`, `1e+21`},
		{`123456789012345678901`, `123456789012345678901`},
		{`0.000001`, `0.000001`},
		{`1e-7`, `1e-7`},
		{`1.5E3`, `1500`},
		{`9007199254740993`, `9007199254740993`},
		{`"\u00e9\n\u0001\/"`, "\"\u00e9\\n\\u0001/\""},
		{`"\ud83d\ude00"`, "\"\U0001F600\""},
		// Member names sort by UTF-16 code units: U+1F600 (D83D..) before U+FB01.
		{"{\"\uFB01\":1,\"\U0001F600\":2}", "{\"\U0001F600\":2,\"\uFB01\":1}"},
		{`{}`, `{}`},
		{`[]`, `[]`},
	}
	for _, c := range cases {
		got, err := idem.Canonicalize([]byte(c.in))
		if err != nil || string(got) != c.want {
			t.Errorf("Canonicalize(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
}

// Payloads that float64-based canonicalisers (and careless parsers) make
// look alike. Each pair must keep distinct fingerprints.
var collisionTraps = [][2]string{
	{`9007199254740993`, `9007199254740992`},
	{`{"id":12345678901234567890}`, `{"id":12345678901234567891}`},
	{`0.1`, `0.10000000000000001`},
	{`1e400`, `1e401`},
	{`"a\u0000"`, `"a"`},
	{`{"a":1,"b":2}`, `{"a":1,"b":"2"}`},
	{`["1",2]`, `[1,"2"]`},
	{`{"a":null}`, `{}`},
	{`[[]]`, `[]`},
	{`"\u00e9"`, `"e\u0301"`},
	{`true`, `"true"`},
	{`1`, `-1`},
	{`{"ab":1}`, `{"a":1,"b":1}`},
}

func TestCanonicalizeNeverCollapsesDifferentPayloads(t *testing.T) {
	t.Parallel()
	for _, p := range collisionTraps {
		a, errA := idem.Canonicalize([]byte(p[0]))
		b, errB := idem.Canonicalize([]byte(p[1]))
		if errA != nil || errB != nil {
			t.Fatalf("%s / %s: %v %v", p[0], p[1], errA, errB)
		}
		if string(a) == string(b) {
			t.Errorf("%s and %s collapse to %s", p[0], p[1], a)
		}
	}
}

func TestCanonicalizeRejects(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", canonical.MaxDepth+1) + strings.Repeat("]", canonical.MaxDepth+1)
	ok := strings.Repeat("[", canonical.MaxDepth) + strings.Repeat("]", canonical.MaxDepth)
	if _, err := idem.Canonicalize([]byte(ok)); err != nil {
		t.Fatalf("nesting at the limit: %v", err)
	}
	bad := map[string]string{
		"duplicate key":          `{"a":1,"a":2}`,
		"duplicate after escape": `{"a":1,"\u0061":2}`,
		"invalid UTF-8":          "\"\xff\"",
		"lone high surrogate":    `"\ud83d"`,
		"lone low surrogate":     `"\ude00"`,
		"trailing data":          `{} {}`,
		"trailing comma":         `[1,]`,
		"too deep":               deep,
		"leading zero":           `01`,
		"bare fraction":          `1.`,
		"NaN":                    `NaN`,
		"empty":                  ``,
		"control char":           "\"a\tb\"",
		"huge exponent":          `1e99999999999`,
		"single quotes":          `{'a':1}`,
		"unterminated":           `{"a":`,
	}
	for name, in := range bad {
		_, err := idem.Canonicalize([]byte(in))
		var pe *idem.PayloadError
		if !errors.Is(err, idem.ErrInvalidPayload) || !errors.As(err, &pe) {
			t.Errorf("%s (%q): %v, want a *PayloadError", name, in, err)
		}
	}
}

func FuzzCanonicalize(f *testing.F) {
	for _, p := range collisionTraps {
		f.Add([]byte(p[0]))
		f.Add([]byte(p[1]))
	}
	for _, s := range []string{`{"b":[1,2,{"c":"\u00e9"}],"a":-0.5e-3}`, `"\ud83d\ude00"`, `[1e21,1e-7,100]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := idem.Canonicalize(in)
		if err != nil {
			var pe *idem.PayloadError
			if !errors.As(err, &pe) || pe.Offset < 0 || pe.Offset > len(in) {
				t.Fatalf("error %v is not a *PayloadError with an offset inside the input", err)
			}
			return
		}
		// The canonical form is valid JSON, valid UTF-8, and a fixed point.
		if !json.Valid(c) || !utf8.Valid(c) {
			t.Fatalf("canonical form %q of %q is not valid JSON", c, in)
		}
		again, err := idem.Canonicalize(c)
		if err != nil || string(again) != string(c) {
			t.Fatalf("not a fixed point: %q -> %q (%v)", c, again, err)
		}
		// Anything we accept, encoding/json accepts too.
		if !json.Valid(in) {
			t.Fatalf("accepted %q, which encoding/json rejects", in)
		}
	})
}
