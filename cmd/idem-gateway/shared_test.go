package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/seed-a1b882c0/idem/internal/testenv"
)

// TestThreeGatewaysShareOneStore runs three gateway processes over one
// Redis or PostgreSQL store and sends every key to all of them at once:
// each key reaches the upstream exactly once.
func TestThreeGatewaysShareOneStore(t *testing.T) {
	stamp := time.Now().UnixNano()
	stores := map[string]func(t *testing.T) string{
		"redis": func(t *testing.T) string {
			addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
			return fmt.Sprintf("redis://%s/0?prefix=gw3-%d:", addr, stamp)
		},
		"postgres": func(t *testing.T) string {
			addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
			table := fmt.Sprintf("gw3_%d", stamp)
			url := fmt.Sprintf("postgres://%s@%s/test", pgUser(), addr)
			t.Cleanup(func() {
				c, err := pgx.Connect(context.Background(), url)
				if err == nil {
					_, _ = c.Exec(context.Background(), "DROP TABLE IF EXISTS "+table)
					_ = c.Close(context.Background())
				}
			})
			return url + "?table=" + table
		},
	}
	for name, storeURL := range stores {
		t.Run(name, func(t *testing.T) {
			url := storeURL(t)
			up := newUpstream(t)
			var gws []*proc
			for range 3 {
				gws = append(gws, startGateway(t, "-upstream", up.srv.URL, "-store", url, "-wait", "30s"))
			}
			const keys, perGateway = 20, 3
			var wg sync.WaitGroup
			answers := make(chan answer, keys*len(gws)*perGateway)
			for k := range keys {
				for _, gw := range gws {
					for range perGateway {
						wg.Go(func() {
							answers <- send("POST", gw.url("/orders"), `{"n":1}`, "Idempotency-Key", fmt.Sprintf("k%d", k))
						})
					}
				}
			}
			wg.Wait()
			close(answers)
			replays := 0
			for a := range answers {
				if a.err != nil || a.status != 201 {
					t.Fatalf("answer %+v", a)
				}
				if a.replayed() {
					replays++
				}
			}
			for k := range keys {
				if n := up.count(fmt.Sprintf("k%d", k)); n != 1 {
					t.Errorf("key k%d reached the upstream %d times", k, n)
				}
			}
			if want := keys*len(gws)*perGateway - keys; replays != want {
				t.Errorf("%d replays, want %d", replays, want)
			}
		})
	}
}

func pgUser() string {
	if u := os.Getenv("IDEM_PG_USER"); u != "" {
		return u
	}
	return "postgres"
}
