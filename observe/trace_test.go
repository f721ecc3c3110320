package observe_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem/observe"
)

// FuzzParseTraceParent: a traceparent either fails with ErrTraceParent or
// reads as a valid trace context that String writes back as the same
// value (in lower case), and that reads back to itself.
func FuzzParseTraceParent(f *testing.F) {
	for _, s := range []string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-00",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tc, err := observe.ParseTraceParent(s)
		if err != nil {
			if !errors.Is(err, observe.ErrTraceParent) || tc != (observe.TraceContext{}) {
				t.Fatalf("%q: %+v, %v; want the zero context and ErrTraceParent", s, tc, err)
			}
			return
		}
		if !tc.IsValid() {
			t.Fatalf("%q read as an invalid context %+v", s, tc)
		}
		out := tc.String()
		if out != strings.ToLower(s) {
			t.Fatalf("%q written back as %q", s, out)
		}
		if again, err := observe.ParseTraceParent(out); err != nil || again != tc {
			t.Fatalf("%q read back as %+v, %v", out, again, err)
		}
	})
}
