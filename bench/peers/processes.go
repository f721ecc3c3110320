package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// installNode copies the Node.js side (bench/peers/node: package.json,
// package-lock.json, peers.mjs) into .cache/peers/node and runs npm ci
// there when the lock file differs from the one last installed. It returns
// that directory.
func installNode(ctx context.Context, root string) (string, error) {
	src := filepath.Join(root, "bench", "peers", "node")
	dst := filepath.Join(root, ".cache", "peers", "node")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", err
	}
	lock, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	if err != nil {
		return "", err
	}
	installed, _ := os.ReadFile(filepath.Join(dst, "installed-lock.json"))
	for _, f := range []string{"package.json", "package-lock.json", "peers.mjs"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o644); err != nil {
			return "", err
		}
	}
	if _, err := os.Stat(filepath.Join(dst, "node_modules")); err == nil && bytes.Equal(lock, installed) {
		return dst, nil
	}
	fmt.Println("peers: npm ci in", dst)
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dst, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("npm ci in %s: %w", dst, err)
	}
	return dst, os.WriteFile(filepath.Join(dst, "installed-lock.json"), lock, 0o644)
}

// nodeSide is the running node peers.mjs process.
type nodeSide struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

type nodeRequest struct {
	Lib   string `json:"lib"`
	Store string `json:"store"`
	Kind  string `json:"kind"`
	Conc  int    `json:"conc"`
	Calls int    `json:"calls"`
	Keys  int    `json:"keys"`
	Tag   string `json:"tag"`
	Setup bool   `json:"setup"` // complete the keys a dup or cache run replays; measure nothing
}

type nodeReply struct {
	Error    string  `json:"error"`
	Calls    int     `json:"calls"`
	Seconds  float64 `json:"seconds"`
	P50us    float64 `json:"p50_us"`
	P99us    float64 `json:"p99_us"`
	CPUus    float64 `json:"cpu_us"`
	Requests int64   `json:"requests"`
}

func startNode(ctx context.Context, dir string, e *env) (*nodeSide, error) {
	cmd := exec.CommandContext(ctx, "node", "peers.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"PEERS_DYNAMODB_ENDPOINT="+e.endpoint,
		"PEERS_REDIS_URL=redis://"+e.redisAddr,
		"PEERS_TABLE_POWERTOOLS="+e.powertoolsTable,
		"PEERS_TABLE_RAW="+e.nodeRawTable,
		// Powertools reads these in Lambda; outside it, they keep its
		// logs quiet and its region fixed.
		"AWS_REGION=us-east-1",
		"POWERTOOLS_LOG_LEVEL=ERROR",
	)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	return &nodeSide{cmd: cmd, in: in, out: sc}, nil
}

func (n *nodeSide) run(req nodeRequest) (measured, error) {
	b, _ := json.Marshal(req)
	if _, err := n.in.Write(append(b, '\n')); err != nil {
		return measured{}, fmt.Errorf("node: %w", err)
	}
	if !n.out.Scan() {
		return measured{}, fmt.Errorf("node exited: %v", n.out.Err())
	}
	var r nodeReply
	if err := json.Unmarshal(n.out.Bytes(), &r); err != nil {
		return measured{}, fmt.Errorf("node said %q: %w", n.out.Bytes(), err)
	}
	if r.Error != "" {
		return measured{}, errors.New("node: " + r.Error)
	}
	return measured{calls: r.Calls, seconds: r.Seconds, p50: r.P50us, p99: r.P99us, cpu: r.CPUus, requests: r.Requests}, nil
}

// close ends node's input, which makes it close its clients and exit.
func (n *nodeSide) close() error {
	n.in.Close()
	done := make(chan error, 1)
	go func() { done <- n.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		_ = n.cmd.Process.Kill()
		return errors.New("node did not exit within 10s of its input closing; killed")
	}
}

// redisServer is the redis-server this harness starts for itself.
type redisServer struct {
	cmd  *exec.Cmd
	addr string
}

// startRedis starts redis-server on a free loopback port from 6390 up, with
// no persistence, and waits until it answers.
func startRedis(ctx context.Context, dir string) (*redisServer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port := 0
	for p := 6390; p < 6490; p++ {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			l.Close()
			port = p
			break
		}
	}
	if port == 0 {
		return nil, errors.New("no free port for redis-server in 6390-6489")
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	// Its own process group: a Ctrl-C at the terminal reaches this
	// harness, which stops it, rather than killing it mid-run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("redis-server: %w", err)
	}
	r := &redisServer{cmd: cmd, addr: addr}
	for range 100 {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			fmt.Printf("peers: redis-server pid %d on %s\n", cmd.Process.Pid, addr)
			return r, nil
		}
		if ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = r.stop()
	return nil, fmt.Errorf("redis-server on %s did not answer (log: %s)", addr, filepath.Join(dir, "redis.log"))
}

// stop ends the server by its PID: SIGTERM, then SIGKILL after 5s.
func (r *redisServer) stop() error {
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(5 * time.Second):
		return r.cmd.Process.Kill()
	}
}
