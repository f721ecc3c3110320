package idemrpc_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
)

// FuzzParseKey: ParseKey accepts exactly one value of 1 to MaxKeyLen
// printable ASCII bytes without leading or trailing space, returned as
// sent; anything else is ErrMissingKey or an *idem.KeyError whose message stays
// short, never a panic.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"order-42", "", " a", "a ", "clé", "a\x00b", strings.Repeat("k", idemrpc.MaxKeyLen+1), "\"quoted\""} {
		f.Add(s, "", uint8(1))
		f.Add(s, "other", uint8(2))
	}
	f.Add("", "", uint8(0))
	f.Fuzz(func(t *testing.T, a, b string, n uint8) {
		values := []string{a, b}[:n%3] // none, one or two values
		k, err := idemrpc.ParseKey(values)
		if err != nil {
			var ke *idem.KeyError
			switch {
			case len(values) == 0 && !errors.Is(err, idemrpc.ErrMissingKey):
				t.Fatalf("no value: %v, want ErrMissingKey", err)
			case len(values) > 0 && (!errors.As(err, &ke) || !errors.Is(err, idem.ErrInvalidKey)):
				t.Fatalf("%q: %v, want an *idem.KeyError", values, err)
			}
			if ke != nil && len(err.Error()) > 320+len(ke.Reason) { // the value cut to 64 bytes, quoted
				t.Fatalf("error message of %d bytes: %.80q", len(err.Error()), err.Error())
			}
			return
		}
		if len(values) != 1 || k != values[0] {
			t.Fatalf("%q accepted as %q", values, k)
		}
		if len(k) == 0 || len(k) > idemrpc.MaxKeyLen || k[0] == ' ' || k[len(k)-1] == ' ' {
			t.Fatalf("accepted %q", k)
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("accepted byte 0x%02x in %q", k[i], k)
			}
		}
	})
}
