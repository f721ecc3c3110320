package command

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/console"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/monitor"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// BenchmarkConsoleFirstPage measures the console's first page of records
// (50 a page) over a store holding $IDEM_CONSOLE_BENCH_RECORDS records
// (default 2,000; docs/benchmarks.md has the figures at 100,000): 89%
// COMPLETED, 10% stuck IN_PROGRESS, 1% FAILED. Each request reads one
// page through the store's cursor, never the whole store.
//
//	IDEM_CONSOLE_BENCH_RECORDS=100000 scripts/dynamodb-local run \
//	  sh -c 'cd cmd/idemctl && go test -run "^$" -bench ConsoleFirstPage -benchtime 20x ./internal/command/'
func BenchmarkConsoleFirstPage(b *testing.B) {
	n := 2000
	if v := os.Getenv("IDEM_CONSOLE_BENCH_RECORDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 100 {
			b.Fatalf("IDEM_CONSOLE_BENCH_RECORDS=%q: want a number of at least 100", v)
		}
	}
	stamp := time.Now().UnixNano()
	b.Run("redis", func(b *testing.B) {
		addr := testenv.Reach(b, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
		benchFirstPage(b, fmt.Sprintf("redis://%s/0?prefix=consolebench%d:", addr, stamp), n)
	})
	b.Run("postgres", func(b *testing.B) {
		addr := testenv.Reach(b, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
		user := os.Getenv("IDEM_PG_USER")
		if user == "" {
			user = "postgres"
		}
		benchFirstPage(b, fmt.Sprintf("postgres://%s@%s/test?table=consolebench_%d", user, addr, stamp), n)
	})
	b.Run("dynamodb", func(b *testing.B) {
		ep := testenv.DynamoDB(b)
		b.Setenv("AWS_ACCESS_KEY_ID", "local")
		b.Setenv("AWS_SECRET_ACCESS_KEY", "local")
		benchFirstPage(b, fmt.Sprintf("dynamodb://consolebench_%d?region=us-east-1&endpoint=%s&openindex=open", stamp, ep), n)
	})
}

// seeded remembers which stores a run of the benchmark filled already
// (the go command runs a benchmark function more than once).
var seeded sync.Map

func benchFirstPage(b *testing.B, u string, n int) {
	ctx := context.Background()
	clock := clocktest.New(time.Now().Add(-time.Hour))
	if _, done := seeded.Load(u); !done {
		k, err := storeurl.Parse(u)
		if err != nil {
			b.Fatal(err)
		}
		var out, errb syncBuffer
		env := System()
		env.Stdout, env.Stderr = &out, &errb
		env.Getenv = func(string) string { return u }
		switch k.Kind {
		case storeurl.Postgres:
			if Run(ctx, []string{"migrate"}, env) != ExitOK {
				b.Fatal(errb.String())
			}
		case storeurl.DynamoDB:
			if Run(ctx, []string{"create-table"}, env) != ExitOK {
				b.Fatal(errb.String())
			}
		}
		start := time.Now()
		seedMany(b, u, clock, n)
		b.Logf("seeded %d records in %v", n, time.Since(start).Round(time.Millisecond))
		seeded.Store(u, true)
	}
	s, err := storeurl.Open(ctx, u, &storeurl.Options{Passive: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	m, err := monitor.New(s.Lister(), nil) // sweeps only when asked: none here
	if err != nil {
		b.Fatal(err)
	}
	c, err := console.New(s.Store, &console.Config{Monitor: m, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	srv := httptest.NewServer(c)
	defer srv.Close()
	for _, page := range []struct{ name, path string }{
		{"all", "records"}, {"stuck", "records?stuck=1"}, {"failed", "records?status=failed"}, {"operation", "records?scope=bench-7"},
	} {
		b.Run(page.name, func(b *testing.B) {
			for b.Loop() {
				resp, err := http.Get(srv.URL + "/" + page.path)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("GET /%s: %d", page.path, resp.StatusCode)
				}
			}
		})
	}
}

// seedMany writes n records on u, an hour back on clock so that the
// IN_PROGRESS ones are stuck: 89% COMPLETED, 10% IN_PROGRESS, 1% FAILED,
// over ten operations.
func seedMany(b *testing.B, u string, clock store.Clock, n int) {
	ctx := context.Background()
	s, err := storeurl.Open(ctx, u, &storeurl.Options{Clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	e, err := idem.New(s.Store, &idem.Config{Clock: clock, Owner: "bench", Expiry: 24 * time.Hour, Lease: time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				req := idem.Request{Operation: fmt.Sprintf("bench-%d", i%10), Key: strconv.Itoa(i)}
				var err error
				switch {
				case i%100 < 89:
					_, err = idem.Do(ctx, e, req, func(context.Context) (int, error) { return i, nil })
				case i%100 < 99:
					_, err = e.Begin(ctx, req, nil)
				default:
					var bg idem.Begun
					if bg, err = e.Begin(ctx, req, nil); err == nil {
						err = e.Fail(ctx, bg.Token, &idem.TerminalError{Code: "bench", Message: "failed"})
					}
				}
				if err != nil {
					errs <- fmt.Errorf("record %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}
