package ordertest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// StartChild runs the test named test of the running test binary again, as
// a child process (a server of its own: another process on the same
// store), with env added to its environment. It returns what the child
// printed with [Ready]. The child is killed when t ends.
func StartChild(t testing.TB, test string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				ready <- v
				break
			}
		}
		for sc.Scan() { // keep the pipe drained until the child ends
		}
		close(ready)
	}()
	select {
	case v, ok := <-ready:
		if !ok {
			t.Fatalf("child %s ended before it was ready", test)
		}
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("child %s not ready after 30s", test)
	}
	return ""
}

// Ready tells the parent that started this child with [StartChild] that it
// is ready, and v.
func Ready(v string) { fmt.Printf("READY %s\n", v) }

// Runs counts executions across processes: each one appends a line to a
// file.
type Runs struct {
	Path string
	mu   sync.Mutex
}

// Add appends line.
func (r *Runs) Add(line string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, err := os.OpenFile(r.Path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Lines returns the lines added, by every process.
func (r *Runs) Lines() []string {
	b, err := os.ReadFile(r.Path)
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}
