// Package childproc runs one test of the test binary as a process of its
// own, for tests that kill (SIGKILL) or stop (SIGSTOP) it mid-operation:
// the child reads its part from the environment, writes what it did on
// its standard output, line by line, and may wait for a line on its
// standard input.
package childproc

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"testing"
)

// Child is a running test binary.
type Child struct {
	// Cmd is the process: signal it through Cmd.Process.
	Cmd *exec.Cmd
	// In is its standard input.
	In io.Writer

	out *bufio.Scanner
}

// Start runs the test named test (the exact name: a -test.run of
// ^test$) of this test binary, with env added to this process's
// environment; its standard error is this process's. It is killed and
// waited for at cleanup.
func Start(t testing.TB, test string, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &Child{Cmd: cmd, In: in, out: bufio.NewScanner(out)}
}

// WaitLine reads the child's output until a line that is want, and fails
// t if the output ends first.
func (c *Child) WaitLine(t testing.TB, want string) {
	t.Helper()
	for c.out.Scan() {
		if c.out.Text() == want {
			return
		}
	}
	t.Fatalf("the child ended before %q", want)
}

// Scan reads the child's output line by line, calling each with every
// line until it returns true, and fails t if the output ends first.
func (c *Child) Scan(t testing.TB, each func(line string) bool) {
	t.Helper()
	for c.out.Scan() {
		if each(c.out.Text()) {
			return
		}
	}
	t.Fatal("the child ended before the line awaited")
}
