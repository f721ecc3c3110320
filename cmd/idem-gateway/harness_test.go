package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// binary is the idem-gateway built once for the tests that run it as a
// real process.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-gateway-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "idem-gateway")
	build := exec.Command("go", "build", "-race", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building idem-gateway:", err)
		os.Exit(1)
	}
	code := 0
	func() {
		defer os.RemoveAll(dir)
		code = m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// proc is a running gateway process.
type proc struct {
	cmd   *exec.Cmd
	addr  string // the proxy listener
	admin string // the admin listener, when -admin was given
	logs  *logBuf
	done  chan error
	// opened is closed once the gateway logged that its store is open.
	opened chan struct{}
}

// logBuf keeps a process's stderr (its JSON log) for failure messages.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) add(s string) { l.mu.Lock(); l.b.WriteString(s + "\n"); l.mu.Unlock() }
func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startGateway runs the binary with args (listening on a free loopback
// port unless -listen is given) and returns once it logged that its store
// is open and it serves covered requests.
func startGateway(t *testing.T, args ...string) *proc {
	t.Helper()
	return startGatewayEnv(t, nil, args...)
}

// startGatewayEnv is startGateway with env added to the process's
// environment.
func startGatewayEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := startListeningEnv(t, env, args...)
	select {
	case <-p.opened:
	case err := <-p.done:
		p.done <- err
		t.Fatalf("idem-gateway exited before its store opened (%v):\n%s", err, p.logs)
	case <-time.After(60 * time.Second):
		t.Fatalf("idem-gateway's store did not open within 60s:\n%s", p.logs)
	}
	return p
}

// startListening is startGateway returning once the gateway listens, its
// store open or not; p.opened is closed once the store is open.
func startListening(t *testing.T, args ...string) *proc {
	t.Helper()
	return startListeningEnv(t, nil, args...)
}

func startListeningEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	if !hasFlag(args, "-listen") {
		args = append([]string{"-listen", "127.0.0.1:0"}, args...)
	}
	p := &proc{cmd: exec.Command(binary, args...), logs: &logBuf{}, done: make(chan error, 1), opened: make(chan struct{})}
	p.cmd.Env = append(append(os.Environ(), "IDEM_STATE_DIR="+t.TempDir()), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		signalled, opened := false, false
		for sc.Scan() {
			line := sc.Text()
			p.logs.add(line)
			var rec struct{ Msg, Addr, Admin string }
			if json.Unmarshal([]byte(line), &rec) != nil {
				continue
			}
			switch {
			case !signalled && rec.Msg == "idem-gateway listening":
				p.addr, p.admin, signalled = rec.Addr, rec.Admin, true
				close(ready)
			case !opened && rec.Msg == "store open; serving covered requests":
				opened = true
				close(p.opened)
			}
		}
		p.done <- p.cmd.Wait()
	}()
	t.Cleanup(func() { p.kill() })
	select {
	case <-ready:
	case err := <-p.done:
		p.done <- err
		t.Fatalf("idem-gateway exited before listening (%v):\n%s", err, p.logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("idem-gateway did not start within 30s:\n%s", p.logs)
	}
	return p
}

func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	p.wait()
}

// wait returns the process's exit error once it has exited.
func (p *proc) wait() error {
	err := <-p.done
	p.done <- err
	return err
}

func (p *proc) url(path string) string { return "http://" + p.addr + path }

// upstream is a service that counts executions per idempotency key and can
// hold requests until released.
type upstream struct {
	srv   *httptest.Server
	runs  sync.Map // key -> *atomic.Int64
	total atomic.Int64
	hold  atomic.Pointer[chan struct{}]
	// arrived receives the key of every request that reached the handler.
	arrived chan string
	// onRun, when set, is called as each request arrives, with its key and
	// its run number for that key, before the request is held or answered.
	onRun  atomic.Pointer[func(r *http.Request, key string, run int64)]
	mu     sync.Mutex
	times  map[string][]time.Time
	bodies map[string][]string // key -> every 201 body written for it
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{arrived: make(chan string, 1024), times: map[string][]time.Time{}, bodies: map[string][]string{}}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, _ := io.ReadAll(r.Body)
	c, _ := u.runs.LoadOrStore(key, new(atomic.Int64))
	n := c.(*atomic.Int64).Add(1)
	u.total.Add(1)
	u.mu.Lock()
	u.times[key] = append(u.times[key], time.Now())
	u.mu.Unlock()
	select {
	case u.arrived <- key:
	default:
	}
	if f := u.onRun.Load(); f != nil {
		(*f)(r, key, n)
	}
	if h := u.hold.Load(); h != nil {
		select {
		case <-*h:
		case <-r.Context().Done():
			return
		}
	}
	switch r.URL.Path {
	case "/close": // read the request, then drop the connection unanswered
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	case "/fail":
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	// /busy/<status>: the first request of a key gets that status (such
	// as 429), later ones the 201 below.
	if code, ok := strings.CutPrefix(r.URL.Path, "/busy/"); ok && n == 1 {
		s, _ := strconv.Atoi(code)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(s)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+key)
	w.Header().Set("Set-Cookie", "session=s3cret")
	w.Header().Set("Www-Authenticate", `Bearer realm="x"`)
	w.Header().Set("Proxy-Authenticate", `Basic`)
	w.Header().Set("X-Upstream-Private", "internal")
	w.WriteHeader(http.StatusCreated)
	out := fmt.Sprintf(`{"key":%q,"run":%d,"principal":%q,"body":%q}`, key, n, r.Header.Get("Authorization"), body)
	u.mu.Lock()
	u.bodies[key] = append(u.bodies[key], out)
	u.mu.Unlock()
	io.WriteString(w, out)
}

// produced reports whether the upstream wrote body as a 201 for key.
func (u *upstream) produced(key, body string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Contains(u.bodies[key], body)
}

// count returns how often key was executed.
func (u *upstream) count(key string) int64 {
	c, ok := u.runs.Load(key)
	if !ok {
		return 0
	}
	return c.(*atomic.Int64).Load()
}

// holdAll makes requests wait until the returned func is called.
func (u *upstream) holdAll() (release func()) {
	ch := make(chan struct{})
	u.hold.Store(&ch)
	var once sync.Once
	return func() { once.Do(func() { u.hold.Store(nil); close(ch) }) }
}

type answer struct {
	status int
	header http.Header
	body   string
	err    error
}

var client = &http.Client{Timeout: 60 * time.Second}

// send makes one request; header holds name, value pairs.
func send(method, url, body string, header ...string) answer {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

// problemType returns the type of a problem+json answer, "" otherwise.
func (a answer) problemType() string {
	if a.header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p struct{ Type string }
	_ = json.Unmarshal([]byte(a.body), &p)
	return strings.TrimPrefix(p.Type, "urn:idem:problem:")
}
