package idem_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The core's production packages import the standard library only; test
// kits (storetest, with porcupine) stay out of them.
func TestProductionImportsAreStandardLibraryOnly(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("go tool not on PATH in CI")
		}
		t.Skip("go tool not on PATH")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}",
		".", "./memstore").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		// Every internal package is a test kit.
		if !strings.HasPrefix(p, "github.com/seed-a1b882c0/idem") || strings.Contains(p, "storetest") ||
			strings.Contains(p, "internal/") {
			t.Errorf("production package imports %s", p)
		}
	}
}
