package storeurl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/store/redisstore"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// With Options.Logger, go-redis's own lines about a Redis that is down
// (its failed dials) go to that logger as JSON, not to stderr in
// go-redis's format: a command logging JSON (the gateway) passes its
// logger and needs nothing of redisstore's. Not parallel: go-redis's
// logger is global.
func TestOpenSendsGoRedisLinesToTheLogger(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	wrote := make(chan struct{})
	var once sync.Once
	log := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		defer once.Do(func() { close(wrote) })
		return buf.Write(p)
	}), nil))
	t.Cleanup(func() { redisstore.SetLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	if s, err := storeurl.Open(context.Background(), "redis://"+addr+"/0?dial_timeout=200ms", &storeurl.Options{Logger: log}); err == nil {
		_ = s.Close()
		t.Fatal("opened a Redis that is down")
	}
	// go-redis logs once its pool gives up dialing, which may be after
	// Open's check gave up waiting.
	select {
	case <-wrote:
	case <-time.After(30 * time.Second):
		t.Fatal("go-redis logged nothing through Options.Logger")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec struct{ Msg, Detail string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Msg != "go-redis" || !strings.Contains(rec.Detail, "dial") {
			t.Errorf("go-redis's line %q: %+v %v", line, rec, err)
		}
	}
}

// DefaultBoltPath is the file bolt:// alone opens, under $IDEM_STATE_DIR
// when it is set.
func TestDefaultBoltPath(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("IDEM_STATE_DIR", dir)
	if got, want := storeurl.DefaultBoltPath(), filepath.Join(dir, "idem.db"); got != want {
		t.Fatalf("DefaultBoltPath() = %q, want %q", got, want)
	}
	s, err := storeurl.Open(context.Background(), "bolt://", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(filepath.Join(dir, "idem.db")); err != nil {
		t.Fatalf("bolt:// did not open DefaultBoltPath: %v", err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
