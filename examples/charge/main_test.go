package main

import "testing"

// The example program is a test: it fails if the bank is charged more than
// once.
func TestChargeRunsOnce(t *testing.T) {
	if err := run(16); err != nil {
		t.Fatal(err)
	}
}
