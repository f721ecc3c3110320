package redisstore

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/seed-a1b882c0/idem/store"
)

// FuzzDecodeValue: whatever a key holds, reading it as a record never
// panics, and a value that is not a record is a *store.CorruptError (the
// store answers ErrCorrupt, and nothing is written over it).
func FuzzDecodeValue(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "golden", "*.redis"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	claim := encodeClaim(store.ClaimParams{Key: "k", Fingerprint: "v1:ab", Owner: "o/1", Now: 1000, LeaseUntil: 2000, ExpiresAt: 9000})
	f.Add(string(claim))
	f.Add(string(claim) + stepsPayload(store.Step{Name: "charge", At: 1500, Result: []byte(`"ch_1"`)}))
	f.Fuzz(func(t *testing.T, v string) {
		r, err := decodeValue("k", v)
		if err != nil {
			var ce *store.CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("decodeValue(%q): %v, want a *store.CorruptError", v, err)
			}
			return
		}
		if r == nil {
			t.Fatalf("decodeValue(%q): no record and no error", v)
		}
	})
}

// FuzzDecodeSteps: an IN_PROGRESS record's steps read back exactly as
// written, and any other payload is a *store.CorruptError, never a panic.
func FuzzDecodeSteps(f *testing.F) {
	f.Add("charge", int64(1500), []byte(`"ch_1"`), "", "", []byte(nil), "email", int64(1600))
	f.Add("charge", int64(0), []byte(nil), "mail_refused", "mailbox full", []byte("{}"), "x", int64(-1))
	f.Fuzz(func(t *testing.T, name string, at int64, result []byte, code, msg string, body []byte, name2 string, at2 int64) {
		first := store.Step{Name: name, At: at, Result: result}
		if code != "" {
			first = store.Step{Name: name, At: at, Err: &store.ErrorRecord{Code: code, Message: msg, Body: body}}
		}
		steps := []store.Step{first, {Name: name2, At: at2}}
		v := stepsPayload(steps...)
		got, err := decodeSteps("k", v)
		if err != nil {
			t.Fatalf("steps %+v written as %q read back as %v", steps, v, err)
		}
		if len(got) != 2 || got[0].Name != name || got[0].At != at || got[1].Name != name2 || got[1].At != at2 ||
			(first.Err == nil && !reflect.DeepEqual(nonNil(got[0].Result), nonNil(result))) ||
			(first.Err != nil && (got[0].Err == nil || got[0].Err.Code != code || got[0].Err.Message != msg)) {
			t.Fatalf("steps %+v read back as %+v", steps, got)
		}
		// Any cut of a valid payload but the whole is malformed, and says so.
		for _, cut := range []int{len(v) - 1, len(v) / 2, 1} {
			if cut <= 0 || cut >= len(v) {
				continue
			}
			if _, err := decodeSteps("k", v[:cut]); err != nil {
				var ce *store.CorruptError
				if !errors.As(err, &ce) {
					t.Fatalf("a cut payload %q: %v, want a *store.CorruptError", v[:cut], err)
				}
			}
		}
	})
}

// stepsPayload is an IN_PROGRESS record's payload holding steps: their
// count, their size, then each step.
func stepsPayload(steps ...store.Step) string {
	size := 0
	var b []byte
	for _, st := range steps {
		size += st.Size()
		b = appendStep(b, st)
	}
	return strconv.Itoa(len(steps)) + ";" + strconv.Itoa(size) + ";" + string(b)
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
