// Package ctltest runs idemctl, built from this repository's workspace,
// in the tests of modules that cannot import its command package (it is
// internal to cmd/idemctl): an operator's command against the store an
// adapter wrote to. Test-only.
package ctltest

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
)

// Path is idemctl's import path.
const Path = "github.com/seed-a1b882c0/idem/cmd/idemctl"

// Build builds idemctl into t's temporary directory and returns the
// binary's path. It needs the go tool and the repository's workspace
// (go.work): without them the test is skipped outside CI and fails in CI
// (testenv.Missing).
func Build(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Missing(t, "go tool not on PATH: idemctl cannot be built")
	}
	if out, err := exec.Command("go", "env", "GOWORK").Output(); err != nil || len(bytes.TrimSpace(out)) == 0 || string(bytes.TrimSpace(out)) == "off" {
		testenv.Missing(t, "not in the repository's workspace (go.work): idemctl cannot be built from this tree")
	}
	bin := filepath.Join(t.TempDir(), "idemctl")
	if out, err := exec.Command("go", "build", "-o", bin, Path).CombinedOutput(); err != nil {
		t.Fatalf("building idemctl: %v\n%s", err, out)
	}
	return bin
}

// Run runs the idemctl binary bin with args and returns its exit code,
// standard output and standard error.
func Run(t testing.TB, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running idemctl: %v", err)
	}
	return code, out.String(), errb.String()
}

// FindArgs are the arguments of `idemctl find` for m.
func FindArgs(m clientkey.Material) []string {
	kind := map[clientkey.Kind]string{clientkey.KindHTTP: "-http", clientkey.KindGateway: "-gateway", clientkey.KindRPC: "-grpc",
		clientkey.KindKey: "-message", clientkey.KindJSON: "-json", clientkey.KindPayload: "-payload"}[m.Kind]
	args := []string{"find", kind}
	for _, f := range []struct{ name, v string }{{"-operation", m.Operation}, {"-method", m.Method}, {"-route", m.Route},
		{"-principal", m.Principal}, {"-tenant", m.Tenant}, {"-topic", m.Topic}, {"-key", m.Key}} {
		if f.v != "" {
			args = append(args, f.name, f.v)
		}
	}
	return args
}

// Find runs `idemctl -store storeURL find …` with what a client sent (m),
// as an operator does, and fails the test unless it shows a live record
// under want, the store key the adapter wrote.
func Find(t testing.TB, bin, storeURL string, m clientkey.Material, want string) {
	t.Helper()
	args := append([]string{"-store", storeURL}, FindArgs(m)...)
	code, out, errOut := Run(t, bin, args...)
	if code != 0 || !strings.Contains(out, "key:") || !strings.Contains(out, want) || !strings.Contains(out, "status:") {
		t.Fatalf("idemctl %s: exit %d, want the record of %s\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out, errOut)
	}
}
