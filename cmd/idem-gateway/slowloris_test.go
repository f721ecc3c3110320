package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/store"
)

// guard bounds every wait on the gateway in these tests: a failure guard,
// far above the configured limits (300ms) and below their defaults (10s
// for headers, 30s for bodies, 1m idle), never a timing assertion.
const guard = 8 * time.Second

// rawConn opens a TCP connection to the gateway and writes head; the rest
// is up to the test.
func rawConn(t *testing.T, gw *proc, head string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", gw.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.SetReadDeadline(time.Now().Add(guard)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	return c
}

// coveredHead is the head of a covered request with key and a declared body
// length, followed by the first bytes of its body.
func coveredHead(key string, length int, first string) string {
	return fmt.Sprintf("POST /orders HTTP/1.1\r\nHost: gw\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, length, first)
}

// timeoutAnswer reads one response from c and checks that it is the 408
// body-timeout problem and that the gateway then closed c.
func timeoutAnswer(c net.Conn) error {
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return fmt.Errorf("no answer to a stalled body: %w", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	var p idemhttp.Problem
	_ = json.Unmarshal(body, &p)
	if resp.StatusCode != http.StatusRequestTimeout || resp.Header.Get("Content-Type") != "application/problem+json" ||
		p.Type != idemhttp.ProblemTypeBase+idemhttp.ProblemBodyTimeout || !strings.Contains(p.Detail, "300ms") {
		return fmt.Errorf("answer %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	return closed(br)
}

// closed reads from r until the gateway closes the connection; it fails if
// the gateway sends anything more or keeps the connection open past guard.
func closed(r io.Reader) error {
	n, err := io.Copy(io.Discard, r)
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("connection still open after %v", guard)
	case err != nil && !errors.Is(err, syscall.ECONNRESET):
		return fmt.Errorf("reading until close: %w", err)
	case n > 0:
		return fmt.Errorf("%d unexpected bytes before close", n)
	}
	return nil
}

// TestSlowBodiesAre408AndClaimNothing: a covered request whose body stalls
// after 3 bytes, or trickles in a byte at a time, gets 408 problem+json
// once -body-timeout has passed, its connection is closed, the upstream
// never sees it, and the store holds no record for its key.
func TestSlowBodiesAre408AndClaimNothing(t *testing.T) {
	up := newUpstream(t)
	db := t.TempDir() + "/gw.db"
	gw := startGateway(t, "-upstream", up.srv.URL, "-store", "bolt://"+db, "-body-timeout", "300ms")

	t.Run("stalled after 3 bytes", func(t *testing.T) {
		c := rawConn(t, gw, coveredHead("stalled", 100, `{"a`))
		if err := timeoutAnswer(c); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("trickling", func(t *testing.T) {
		// One byte every 50ms keeps arriving: the deadline is for the
		// whole body, not for the gap between two reads.
		c := rawConn(t, gw, coveredHead("trickled", 1000, `{`))
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if _, err := io.WriteString(c, " "); err != nil {
						return
					}
				}
			}
		})
		if err := timeoutAnswer(c); err != nil {
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
	})
	t.Run("chunked, stalled", func(t *testing.T) {
		c := rawConn(t, gw, "POST /orders HTTP/1.1\r\nHost: gw\r\nIdempotency-Key: chunked\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a")
		if err := timeoutAnswer(c); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("the deadline does not cut a slow upstream", func(t *testing.T) {
		release := up.holdAll()
		defer release()
		answers := make(chan answer, 1)
		go func() { answers <- send("POST", gw.url("/orders"), `{"a":1}`, "Idempotency-Key", "slow-upstream") }()
		<-up.arrived
		// Real time, twice the gateway's body deadline: the body is in, so
		// the deadline was lifted and the request keeps going.
		<-time.After(600 * time.Millisecond)
		release()
		if a := <-answers; a.err != nil || a.status != 201 {
			t.Fatalf("%+v", a)
		}
	})

	for _, key := range []string{"stalled", "trickled", "chunked"} {
		if n := up.count(key); n != 0 {
			t.Errorf("%s reached the upstream %d times", key, n)
		}
	}
	// The store, read after the gateway stopped: one record, the control
	// key's; nothing under the others.
	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := gw.wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, gw.logs)
	}
	st, closeStore, err := openStore(context.Background(), "bolt://"+db)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	page, err := st.(store.Lister).List(context.Background(), store.ListParams{Now: time.Now().UnixMilli()})
	if err != nil {
		t.Fatal(err)
	}
	var resp idemhttp.Response
	if len(page.Records) != 1 || page.Records[0].Status != store.StatusCompleted ||
		json.Unmarshal(page.Records[0].Result, &resp) != nil || !strings.Contains(string(resp.Body), `"key":"slow-upstream"`) {
		for _, r := range page.Records {
			t.Errorf("the store holds %s %s %s", r.Key, r.Status, r.Result)
		}
		t.Fatalf("want only the control key's completed record")
	}
}

// TestStalledConnectionsAreClosed opens many connections that each stall
// in a different place (in the headers, in a covered body, in a passed-
// through body, idle after a request) and checks that the gateway closes
// every one of them.
func TestStalledConnectionsAreClosed(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, "-upstream", up.srv.URL, "-store", "memory:",
		"-read-header-timeout", "300ms", "-body-timeout", "300ms", "-read-timeout", "600ms", "-idle-timeout", "300ms")
	const perKind = 50
	kinds := map[string]func(i int) string{
		"headers":             func(i int) string { return "POST /orders HTTP/1.1\r\nHost: gw\r\nIdempot" },
		"covered body":        func(i int) string { return coveredHead(fmt.Sprintf("many-%d", i), 100, `{"a`) },
		"passed-through body": func(i int) string { return "PUT /orders HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n{\"a" },
		"idle":                func(i int) string { return "GET /orders HTTP/1.1\r\nHost: gw\r\n\r\n" },
	}
	type conn struct {
		kind string
		c    net.Conn
	}
	var conns []conn
	for kind, head := range kinds {
		for i := range perKind {
			conns = append(conns, conn{kind, rawConn(t, gw, head(i))})
		}
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			if err := stalledConn(c.kind, c.c); err != nil {
				t.Errorf("%s: %v", c.kind, err)
			}
		})
	}
	wg.Wait()
	for i := range perKind {
		if n := up.count(fmt.Sprintf("many-%d", i)); n != 0 {
			t.Errorf("covered request many-%d reached the upstream %d times", i, n)
		}
	}
}

// stalledConn waits for the end of a connection of the given kind.
func stalledConn(kind string, c net.Conn) error {
	br := bufio.NewReader(c)
	switch kind {
	case "covered body":
		return timeoutAnswer(c)
	case "idle": // answered, then left idle
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	case "headers", "passed-through body":
		// Whatever the answer (net/http's own 408 for headers), the
		// connection must end.
		if resp, err := http.ReadResponse(br, nil); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	return closed(br)
}
