package store_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem/store"
)

// fixable is an error that knows its fix, and is unavailable by class.
type fixable struct{}

func (fixable) Error() string        { return "table t does not exist" }
func (fixable) Fix() string          { return "run idemctl migrate" }
func (fixable) Is(target error) bool { return target == store.ErrUnavailable }

// FindingOf: a problem whose fix is the error's own when it has one,
// else the one its class calls for.
func TestFindingOf(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err     error
		fix     string
		notHave string
	}{
		{fmt.Errorf("open: %w", fixable{}), "run idemctl migrate", "check that the server runs"},
		{fmt.Errorf("dial: %w", store.ErrUnavailable), "check that the server runs", ""},
		{fmt.Errorf("ACL: %w", store.ErrMisconfigured), "no retry mends it", ""},
		{errors.New("odd"), "", ""},
	} {
		f := store.FindingOf("open", c.err)
		if f.Check != "open" || f.Severity != store.SeverityProblem || f.What != c.err.Error() {
			t.Errorf("%v: %+v", c.err, f)
		}
		if c.fix == "" && f.Fix != "" || !strings.Contains(f.Fix, c.fix) || c.notHave != "" && strings.Contains(f.Fix, c.notHave) {
			t.Errorf("%v: fix %q, want %q", c.err, f.Fix, c.fix)
		}
	}
	if got := []string{store.SeverityOK.String(), store.SeverityWarning.String(), store.SeverityProblem.String()}; strings.Join(got, ",") != "ok,warning,problem" {
		t.Errorf("severities %v", got)
	}
}
