//go:build unix

package repocheck_test

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// make demo runs scripts/demo, which starts the orders service and
// idem-gateway. Killing the script alone — SIGTERM, SIGINT or SIGHUP to its
// PID, not to its process group — stops both and frees the gateway's bolt
// file: before, the gateway went on listening with the file locked.
func TestDemoStopsItsChildren(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) { demoStops(t, sig) })
	}
}

func demoStops(t *testing.T, sig syscall.Signal) {
	args := []string{"scripts/demo"}
	if signal.Ignored(sig) {
		// A process started in the background of a shell without job
		// control ignores SIGINT, and so do its children: a script cannot
		// trap a signal ignored when it started. A terminal's Ctrl-C is
		// not ignored; give the script the default, as a terminal does.
		if exec.Command("env", "--default-signal="+signalName(sig), "true").Run() != nil {
			t.Skipf("%v is ignored by this test process and env cannot reset it", sig)
		}
		args = append([]string{"env", "--default-signal=" + signalName(sig)}, args...)
	}
	gateway, orders, admin := freeAddr(t), freeAddr(t), freeAddr(t)
	state := t.TempDir()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "GATEWAY_ADDR="+gateway, "ORDERS_ADDR="+orders, "ADMIN_ADDR="+admin, "IDEM_STATE_DIR="+state)
	var out syncBuf
	cmd.Stdout, cmd.Stderr = &out, &out
	// A process group of its own, so that cleanup can end whatever the
	// script leaves behind; the test signals the script alone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	// Ready: the gateway has opened its store (the first build of the
	// binaries may take minutes).
	deadline := time.Now().Add(5 * time.Minute)
	for !ready("http://" + admin + "/readyz") {
		select {
		case err := <-done:
			t.Fatalf("the demo ended before it was ready: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the demo not ready after 5 minutes:\n%s", out.String())
		}
		time.Sleep(100 * time.Millisecond) // another process is starting
	}

	if err := syscall.Kill(cmd.Process.Pid, sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+int(sig) {
			t.Errorf("the demo ended with %v, want exit status %d (128+%d)", err, 128+int(sig), sig)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the demo still runs a minute after %v:\n%s", sig, out.String())
	}
	// The script returned once its children were gone: nothing of its
	// process group is left, nothing listens, the bolt file is free.
	if err := syscall.Kill(-pgid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("processes of the demo still run after its script ended (kill -0 -%d: %v):\n%s", pgid, err, out.String())
	}
	for name, addr := range map[string]string{"gateway": gateway, "orders": orders, "admin": admin} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("the %s listener %s still accepts connections", name, addr)
		}
	}
	f, err := os.OpenFile(filepath.Join(state, "gateway.db"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Errorf("the gateway's bolt file is still locked: %v", err)
	}
}

func signalName(sig syscall.Signal) string {
	return map[syscall.Signal]string{syscall.SIGTERM: "TERM", syscall.SIGINT: "INT", syscall.SIGHUP: "HUP"}[sig]
}

// freeAddr is a loopback address with a port nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func ready(url string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
