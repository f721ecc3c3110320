package idemhttp

import (
	"bufio"
	"net"
	"net/http"
)

// capture passes a handler's response through to the client and keeps a
// copy of its status, the headers its replay policy keeps, and body (up to
// a limit) for the store.
type capture struct {
	w        http.ResponseWriter
	replay   *replayPolicy
	limit    int
	status   int
	header   http.Header
	body     []byte
	size     int
	over     bool
	hijacked bool
}

var _ interface {
	http.ResponseWriter
	http.Flusher
	http.Hijacker
} = (*capture)(nil)

func (c *capture) Header() http.Header { return c.w.Header() }

func (c *capture) WriteHeader(code int) {
	if c.status == 0 && !c.hijacked {
		if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
			// Informational (103 Early Hints): passed on, not final.
			c.w.WriteHeader(code)
			return
		}
		c.status = code
		c.snapshot()
	}
	c.w.WriteHeader(code)
}

func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	n, err := c.w.Write(p)
	c.keep(p[:n])
	return n, err
}

func (c *capture) keep(p []byte) {
	c.size += len(p)
	if c.over {
		return
	}
	if c.size > c.limit {
		c.over, c.body = true, nil
		return
	}
	c.body = append(c.body, p...)
}

// Flush sends what was written so far; it works whether or not the
// underlying writer flushes.
func (c *capture) Flush() {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(c.w).Flush()
}

// Hijack hands the connection to the handler. A hijacked response is not
// captured: the key is released when the handler returns.
func (c *capture) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(c.w).Hijack()
	if err == nil {
		c.hijacked = true
	}
	return conn, rw, err
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (c *capture) Unwrap() http.ResponseWriter { return c.w }

// finish fixes the status of a handler that wrote nothing.
func (c *capture) finish() {
	if c.status == 0 {
		c.status = http.StatusOK
		c.snapshot()
	}
}

func (c *capture) snapshot() { c.header = c.replay.filter(c.w.Header()) }
