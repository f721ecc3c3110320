package redisstore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// closedAddr is a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// With Redis down, one Ping — and so one Check, the open attempt of
// storeurl and the gateway — fails as unavailable within the client's
// dial timeout, although go-redis retries the refused dial and then the
// command (1.7s for a 300ms dial timeout before the bound). go-redis's
// own log lines go to the logger SetLogger names, as JSON there.
func TestPingOfARedisThatIsDownTakesNoLongerThanTheDialTimeout(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	redisstore.SetLogger(slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil)))
	t.Cleanup(func() { redisstore.SetLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))) })
	addr := closedAddr(t)
	for _, dial := range []time.Duration{300 * time.Millisecond, time.Second} {
		s, err := redisstore.Open("redis://"+addr+"/0?dial_timeout="+dial.String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for name, call := range map[string]func(context.Context) error{"Ping": s.Ping, "Check": s.Check} {
			start := time.Now()
			err := call(context.Background())
			took := time.Since(start)
			if !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("%s with Redis down: %v, want store.ErrUnavailable", name, err)
			}
			// The bound, and a little for the scheduler of a loaded machine.
			if took > dial+250*time.Millisecond {
				t.Errorf("%s with Redis down and dial_timeout=%v took %v", name, dial, took)
			}
		}
		s.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if buf.Len() == 0 {
		t.Fatal("go-redis logged nothing through the logger")
	}
	for _, line := range lines {
		var rec struct{ Level, Msg, Detail string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Msg != "go-redis" || rec.Level != "WARN" || !strings.Contains(rec.Detail, "dial") {
			t.Errorf("go-redis's line %q: %+v %v", line, rec, err)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
