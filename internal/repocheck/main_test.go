package repocheck_test

import (
	"fmt"
	"os"
	"testing"
)

// TestMain runs the checks from the repository's root, which every path in
// them is relative to.
func TestMain(m *testing.M) {
	if err := os.Chdir("../.."); err != nil {
		fmt.Fprintln(os.Stderr, "repocheck:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
