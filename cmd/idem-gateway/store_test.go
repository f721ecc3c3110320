package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
)

func TestStoreURLErrors(t *testing.T) {
	for raw, want := range map[string]string{
		"nothing":                   "no scheme",
		"ftp://x":                   `unknown scheme "ftp"`,
		"bolt://host/path.db":       `host "host" given`,
		"dynamodb://":               "no table",
		"dynamodb://t?create=maybe": "create:",
	} {
		_, _, err := openStore(context.Background(), raw)
		var ue *StoreURLError
		if !errors.As(err, &ue) || !strings.Contains(ue.Reason, want) {
			t.Errorf("%s: %v, want a StoreURLError saying %q", raw, err, want)
		}
	}
}

// roundTrip claims and completes one key through s, then reads it back.
func roundTrip(t *testing.T, s store.Store) {
	t.Helper()
	ctx := context.Background()
	key := fmt.Sprintf("gateway#%064x", time.Now().UnixNano())
	now := store.Millis(time.Now())
	res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "test", Fingerprint: "fp", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000})
	if err != nil || !res.Acquired {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: res.Record.Fence, Owner: "test", Now: now}, ExpiresAt: now + 3_600_000, Result: []byte(`"ok"`)}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, key)
	if err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != `"ok"` {
		t.Fatalf("get: %+v %v", rec, err)
	}
	if err := checkStore(ctx, s); err != nil {
		t.Fatalf("health check: %v", err)
	}
}

func TestStoreURLsOpenWorkingStores(t *testing.T) {
	ctx := context.Background()
	open := func(t *testing.T, raw string) {
		s, closeStore, err := openStore(ctx, raw)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := closeStore(); err != nil {
				t.Error(err)
			}
		}()
		roundTrip(t, s)
	}
	t.Run("memory", func(t *testing.T) { open(t, "memory:") })
	t.Run("bolt", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "a", "gw.db")
		open(t, "bolt://"+path)
		if _, err := os.Stat(path); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("bolt default path", func(t *testing.T) {
		dir := t.TempDir()
		t.Setenv("IDEM_STATE_DIR", dir)
		open(t, "bolt://")
		if _, err := os.Stat(filepath.Join(dir, "gateway.db")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("redis", func(t *testing.T) {
		addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
		open(t, "redis://"+addr+"/0?prefix=gwurl:")
	})
	t.Run("postgres", func(t *testing.T) {
		addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
		open(t, fmt.Sprintf("postgres://%s@%s/test?table=gw_url_test", pgUser(), addr))
	})
	t.Run("dynamodb", func(t *testing.T) {
		ep := testenv.DynamoDB(t)
		t.Setenv("AWS_ACCESS_KEY_ID", "local")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "local")
		open(t, fmt.Sprintf("dynamodb://gw_url_%d?region=us-east-1&create=true&endpoint=%s", time.Now().UnixNano(), ep))
	})
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1048576": 1 << 20, "512KiB": 512 << 10, "1MiB": 1 << 20, "10MB": 10e6, "2 GiB": 2 << 30, "7B": 7} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1MiB", "1.5MiB", "lots", "9999999999GiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}

func TestFlagErrors(t *testing.T) {
	for args, want := range map[string]string{
		"":                                    "-upstream is required",
		"-upstream http://x -max-body big":    "-max-body",
		"-upstream http://x -log-level loud":  "-log-level",
		"-upstream http://x extra":            `unexpected argument "extra"`,
		"-upstream http://x -status-path /s/": "-status-path needs -admin",
	} {
		_, err := parseFlags(strings.Fields(args), io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
	}
	o, err := parseFlags([]string{"-upstream", "http://x", "-methods", "post, put"}, io.Discard)
	if err != nil || strings.Join(o.methods, ",") != "POST,PUT" || !strings.HasPrefix(o.store, "bolt://") {
		t.Fatalf("%+v %v", o, err)
	}
	if _, err := newGateway(&options{upstream: "127.0.0.1:9000"}, nil, nil); err == nil || !strings.Contains(err.Error(), "want http://host:port") {
		t.Fatalf("upstream without scheme: %v", err)
	}
}
