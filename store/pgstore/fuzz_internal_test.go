package pgstore

import (
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/seed-a1b882c0/idem/store"
)

// FuzzDecodeSteps: whatever the steps column holds, reading it never
// panics; what is not a list of well-formed steps is a
// *store.CorruptError; a step written by encodeStep reads back as written.
func FuzzDecodeSteps(f *testing.F) {
	f.Add([]byte(`[{"name":"charge","at":1500,"size":6,"result":"ImNoXzEi"}]`), "charge", int64(1500), []byte(`"ch_1"`))
	f.Add([]byte(`[{"name":"x","at":1,"size":99,"result":null}]`), "email", int64(0), []byte(nil))
	f.Add([]byte(`null`), "", int64(-5), []byte{})
	f.Fuzz(func(t *testing.T, col []byte, name string, at int64, result []byte) {
		if _, err := decodeSteps("k", col); err != nil {
			var ce *store.CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("decodeSteps(%q): %v, want a *store.CorruptError", col, err)
			}
		}
		if name == "" || !utf8.ValidString(name) {
			return // RecordStep refuses such a name first (store.StepParams.Check)
		}
		st := store.Step{Name: name, At: at, Result: result}
		b, err := encodeStep(st)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeSteps("k", append(append([]byte("["), b...), ']'))
		if err != nil || len(got) != 1 || got[0].Name != name || got[0].At != at || string(got[0].Result) != string(result) || (result == nil) != (got[0].Result == nil) {
			t.Fatalf("step %+v written as %s read back as %+v, %v", st, b, got, err)
		}
	})
}
