package idemhttp_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemhttp"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	ok := []struct{ in, want string }{
		{`"abc"`, "abc"},
		{`  "a b c"  `, "a b c"},
		{`"a\"b\\c"`, `a"b\c`},
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{`order:42/retry`, "order:42/retry"},
		{`"` + strings.Repeat("k", 255) + `"`, strings.Repeat("k", 255)},
		{strings.Repeat("k", 255), strings.Repeat("k", 255)},
	}
	for _, c := range ok {
		got, err := idemhttp.ParseHeader([]string{c.in})
		if err != nil || got != c.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	bad := []struct{ in, reason string }{
		{``, "empty"},
		{`""`, "empty"},
		{`"abc`, "missing closing quote"},
		{`"a\nb"`, "invalid escape"},
		{`"abc" "def"`, "unexpected text"},
		{`"abc", "def"`, "unexpected text"},
		{`"abc";p=1`, "unexpected text"},
		{`a b`, "not allowed in an unquoted key"},
		{`"é"`, "not printable ASCII"},
		{"\"a\x7fb\"", "not printable ASCII"},
		{`abc,def`, "not allowed"},
		{`"` + strings.Repeat("k", 256) + `"`, "256 characters, over the limit of 255"},
		{`"ab\`, "unterminated escape"},
	}
	for _, c := range bad {
		_, err := idemhttp.ParseHeader([]string{c.in})
		var ke *idem.KeyError
		if !errors.As(err, &ke) || !errors.Is(err, idem.ErrInvalidKey) || ke.Field != clientkey.HeaderField || !strings.Contains(ke.Reason, c.reason) {
			t.Errorf("ParseHeader(%q) = %v; want an idem.KeyError saying %q", c.in, err, c.reason)
		}
	}
	if _, err := idemhttp.ParseHeader(nil); !errors.Is(err, idemhttp.ErrMissingKey) {
		t.Errorf("no header: %v", err)
	}
	_, err := idemhttp.ParseHeader([]string{`"a"`, `"a"`})
	if !errors.Is(err, idem.ErrInvalidKey) || !strings.Contains(err.Error(), "sent 2 times") {
		t.Errorf("two headers: %v", err)
	}
}

// quote renders key as an RFC 8941 sf-string.
func quote(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

func FuzzParseHeader(f *testing.F) {
	for _, s := range []string{`"abc"`, `abc`, `"a\"b"`, `""`, `"a" "b"`, `a b`, `"\`, "\"\x00\"", `8e03978e-40d5`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := idemhttp.ParseHeader([]string{v})
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("error %v is not ErrInvalidKey", err)
			}
			return
		}
		if key == "" || len(key) > idemhttp.MaxHeaderLen {
			t.Fatalf("accepted key of length %d", len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("accepted non-printable byte 0x%02x", key[i])
			}
		}
		again, err := idemhttp.ParseHeader([]string{quote(key)})
		if err != nil || again != key {
			t.Fatalf("quoted form of %q parses to %q, %v", key, again, err)
		}
	})
}
