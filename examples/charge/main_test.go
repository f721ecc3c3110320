package main

import (
	"path/filepath"
	"testing"
)

// The example program is a test: it fails if the bank is charged more than
// once, on a fresh file and again when the same file is reopened.
func TestChargeRunsOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	if err := run(16, path); err != nil {
		t.Fatal(err)
	}
	if err := run(16, path); err != nil {
		t.Fatalf("second run on the same file: %v", err)
	}
}
