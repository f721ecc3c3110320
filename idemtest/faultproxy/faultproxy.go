// Package faultproxy is the project's TCP fault proxy for store tests: it
// sits between a client and a real server on loopback and, on command,
// delays replies, loses them, resets connections or plays the server
// being down. Test-only; the standard library only.
package faultproxy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards every connection accepted on Addr to a target.
type Proxy struct {
	target string
	addr   string

	latency   atomic.Int64 // ns added before each reply chunk
	dropReply atomic.Int64 // replies still to lose
	resetReq  atomic.Int64 // requests still to reset before they reach the server

	// Dropped counts replies lost; Reset counts requests cut before the
	// server saw them.
	Dropped, Reset atomic.Int64

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// New starts a proxy to target on a free loopback port.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	p.serve(ln)
	return p, nil
}

// Addr is the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.addr }

// SetLatency delays every reply chunk by d from now on (0 removes it).
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// DropReplies makes the next n requests reach the server and their replies
// never reach the client: the connection is reset instead. The write
// happened; the caller cannot know.
func (p *Proxy) DropReplies(n int) { p.dropReply.Store(int64(n)) }

// ResetRequests makes the next n requests fail before the server sees
// them: the connection is reset on the first bytes of each.
func (p *Proxy) ResetRequests(n int) { p.resetReq.Store(int64(n)) }

// Down stops accepting connections and cuts every open one: the server is
// unreachable until Up.
func (p *Proxy) Down() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		reset(c)
	}
	p.mu.Unlock()
}

// Up listens again on the same address after Down.
func (p *Proxy) Up() error {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.serve(ln)
	return nil
}

// Close stops the proxy, cuts its connections and waits for its goroutines.
func (p *Proxy) Close() {
	p.Down()
	p.wg.Wait()
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !p.track(c, true) {
				reset(c)
				continue
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.handle(c)
			}()
		}
	}()
}

// track adds (or removes) c; it refuses to add while the proxy is down.
func (p *Proxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !add {
		delete(p.conns, c)
		return true
	}
	if p.ln == nil {
		return false
	}
	p.conns[c] = true
	return true
}

func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close sends RST
	}
	c.Close()
}

func (p *Proxy) handle(cc net.Conn) {
	defer p.track(cc, false)
	defer cc.Close()
	sc, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		reset(cc)
		return
	}
	if !p.track(sc, true) {
		reset(sc)
		reset(cc)
		return
	}
	defer p.track(sc, false)
	defer sc.Close()
	// pending is set while a request's reply is to be dropped.
	var pending atomic.Bool
	p.wg.Add(1)
	go func() { // client → server
		defer p.wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := cc.Read(buf)
			if n > 0 {
				if p.resetReq.Add(-1) >= 0 {
					p.Reset.Add(1)
					reset(cc)
					reset(sc)
					return
				}
				p.resetReq.Store(0)
				if p.dropReply.Add(-1) >= 0 {
					pending.Store(true)
				} else {
					p.dropReply.Store(0)
				}
				if _, werr := sc.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				if tc, ok := sc.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for { // server → client
		n, err := sc.Read(buf)
		if n > 0 {
			if pending.Load() {
				p.Dropped.Add(1)
				reset(cc)
				return
			}
			if d := time.Duration(p.latency.Load()); d > 0 {
				time.Sleep(d) // the fault itself: a slow network, not a test wait
			}
			if _, werr := cc.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				reset(cc)
			}
			return
		}
	}
}
