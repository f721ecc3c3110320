package idem

import "testing"

func TestSplitFingerprint(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in      string
		version int
		digest  string
		ok      bool
	}{
		{"v1:3f2a", 1, "3f2a", true},
		{"v2:", 2, "", true},
		{"v12:ab", 12, "ab", true},
		{"", 0, "", false},
		{"3f2a", 0, "", false},      // no version: not written by the engine
		{"v:ab", 0, "", false},      // no number
		{"v0:ab", 0, "", false},     // versions start at 1
		{"v01:ab", 0, "", false},    // one spelling per version
		{"v1x:ab", 0, "", false},    // not a number
		{"v-1:ab", 0, "", false},    // not a version
		{"v12345:ab", 0, "", false}, // too long to be one
		{"V1:ab", 0, "", false},     // lower case only
		{"v1", 0, "", false},        // no ':'
		{"fp", 0, "", false},        // a test's fingerprint
	} {
		v, d, ok := splitFingerprint(c.in)
		if v != c.version || d != c.digest || ok != c.ok {
			t.Errorf("splitFingerprint(%q) = %d %q %v, want %d %q %v", c.in, v, d, ok, c.version, c.digest, c.ok)
		}
	}
}

func TestStoredFingerprint(t *testing.T) {
	t.Parallel()
	if got := storedFingerprint("3f2a"); got != "v1:3f2a" {
		t.Errorf("storedFingerprint = %q, want v1:3f2a (the rules' version, ':' and the digest)", got)
	}
	if got := storedFingerprint(""); got != "" {
		t.Errorf("no payload: storedFingerprint = %q, want empty", got)
	}
	if v, d, ok := splitFingerprint(storedFingerprint("3f2a")); v != fingerprintRules || d != "3f2a" || !ok {
		t.Errorf("the stored form does not name this release's rules: %d %q %v", v, d, ok)
	}
}

// TestSameFingerprint: the one rule that compares a call's fingerprint with
// a stored one, with a release that knows older rules (remake) and one
// that does not.
func TestSameFingerprint(t *testing.T) {
	t.Parallel()
	cannot := func(int) (string, bool) { return "", false }
	// A release whose rules are 1 and that still knows rules 7: it remakes
	// the call's fingerprint by them as "v7:old".
	knows7 := func(v int) (string, bool) {
		if v == 7 {
			return "v7:old", true
		}
		return "", false
	}
	for _, c := range []struct {
		name        string
		stored, got string
		remake      func(int) (string, bool)
		same        bool
	}{
		{"same rules, same digest", "v1:aa", "v1:aa", cannot, true},
		{"same rules, other digest", "v1:aa", "v1:bb", cannot, false},
		{"no payload either time", "", "", cannot, true},
		{"stored without a payload, call with one", "", "v1:aa", cannot, false},
		{"stored with a payload, call without", "v1:aa", "", cannot, false},
		{"other rules, call has no payload", "v2:aa", "", cannot, false},
		{"other rules this call cannot apply: the key decides", "v2:aa", "v1:bb", cannot, true},
		{"rules unknown to this release (a newer one wrote it)", "v9:aa", "v1:bb", knows7, true},
		{"older rules remade: same", "v7:old", "v1:bb", knows7, true},
		{"older rules remade: other payload", "v7:other", "v1:bb", knows7, false},
		{"no version: compared as it is", "aa", "v1:aa", knows7, false},
	} {
		if got := sameFingerprint(c.stored, c.got, c.remake); got != c.same {
			t.Errorf("%s: sameFingerprint(%q, %q) = %v, want %v", c.name, c.stored, c.got, got, c.same)
		}
	}
}
