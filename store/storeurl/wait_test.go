package storeurl_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/seed-a1b882c0/idem/idemtest/faultproxy"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/pgstore"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// TestOpenWaitForAServerThatComesBack opens Redis and PostgreSQL through a
// proxy that is down when OpenWait starts and comes up 3s later:
// OpenWait retries, reports its attempts, and opens the store (PostgreSQL:
// migrated). With the proxy down for good, it gives up with a WaitError
// once the wait is over.
func TestOpenWaitForAServerThatComesBack(t *testing.T) {
	stamp := time.Now().UnixNano()
	for _, kind := range []string{"redis", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			var addr string
			var via func(hp string) string
			switch kind {
			case "redis":
				addr = testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
				via = func(hp string) string { return fmt.Sprintf("redis://%s/0?prefix=storeurl-wait-%d:", hp, stamp) }
			case "postgres":
				addr = testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
				table := fmt.Sprintf("storeurl_wait_%d", stamp)
				via = func(hp string) string { return fmt.Sprintf("postgres://%s@%s/test?table=%s", PGUser(), hp, table) }
				t.Cleanup(func() { dropTable(t, fmt.Sprintf("postgres://%s@%s/test", PGUser(), addr), table) })
			}
			px, err := faultproxy.New(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer px.Close()
			px.Down()
			up := time.AfterFunc(3*time.Second, func() {
				if err := px.Up(); err != nil {
					t.Error(err)
				}
			})
			defer up.Stop()
			var retries []storeurl.Retry
			start := time.Now()
			s, err := storeurl.OpenWait(context.Background(), via(px.Addr()), nil, storeurl.WaitOptions{Wait: 30 * time.Second,
				Backoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, OnRetry: func(r storeurl.Retry) { retries = append(retries, r) }})
			if err != nil {
				t.Fatalf("after %v: %v", time.Since(start), err)
			}
			defer s.Close()
			if time.Since(start) < 3*time.Second {
				t.Fatalf("opened after %v and %d retries, while the server was down for 3s", time.Since(start), len(retries))
			}
			for _, r := range retries {
				if !errors.Is(r.Err, store.ErrUnavailable) {
					t.Errorf("attempt %d failed with %v, want store.ErrUnavailable", r.Attempt, r.Err)
				}
			}
			roundTrip(t, s)

			px.Down()
			_, err = storeurl.OpenWait(context.Background(), via(px.Addr()), nil, storeurl.WaitOptions{Wait: 1500 * time.Millisecond, Backoff: 100 * time.Millisecond})
			var we *storeurl.WaitError
			if !errors.As(err, &we) || we.Attempts < 1 || !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("server down for good: %v, want a WaitError", err)
			}
			t.Logf("gave up with: %v", err)
		})
	}
}

func dropTable(t *testing.T, conn, table string) {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, conn)
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// A PostgreSQL that refuses the store for good — a database or a role that
// does not exist — fails OpenWait at its first attempt with pgstore's
// *ConnectError, instead of retrying for the whole wait.
func TestOpenWaitFailsAtOnceOnARefusedConnection(t *testing.T) {
	addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
	stamp := time.Now().UnixNano()
	for name, raw := range map[string]string{
		"missing database": fmt.Sprintf("postgres://%s@%s/idem_nodb_%d", PGUser(), addr, stamp),
		"missing role":     fmt.Sprintf("postgres://idem_norole_%d@%s/test", stamp, addr),
	} {
		attempts := 0
		start := time.Now()
		_, err := storeurl.OpenWait(context.Background(), raw, nil, storeurl.WaitOptions{Wait: time.Minute,
			OnRetry: func(storeurl.Retry) { attempts++ }})
		var ce *pgstore.ConnectError
		if !errors.As(err, &ce) || !errors.Is(err, store.ErrMisconfigured) || attempts != 0 {
			t.Errorf("%s: %v after %d retries, want a *pgstore.ConnectError at once", name, err, attempts)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s: OpenWait took %v", name, d)
		}
	}
}
