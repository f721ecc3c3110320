package repocheck_test

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// TestGoWorkSumIsComplete: go.work.sum holds every checksum the
// workspace's module graph needs, so that `go doc`, `go list -m all` and
// an editor's tools in a fresh clone do not rewrite it. The file is put
// back as it was whatever the command did.
func TestGoWorkSumIsComplete(t *testing.T) {
	before, err := os.ReadFile("go.work.sum")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "list", "-m", "all").CombinedOutput()
	after, rerr := os.ReadFile("go.work.sum")
	if rerr != nil {
		t.Fatal(rerr)
	}
	if !bytes.Equal(before, after) {
		if werr := os.WriteFile("go.work.sum", before, 0o644); werr != nil {
			t.Fatal(werr)
		}
		t.Fatal("go list -m all rewrote go.work.sum (put back as it was): run it at the repository's root and commit the result")
	}
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
}
