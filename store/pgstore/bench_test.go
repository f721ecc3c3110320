package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/pgstore"
)

// Reproduce: cd store/pgstore && go test -run '^$' -bench . -benchmem -benchtime 2s -count 3
// PostgreSQL 15 on loopback, the machine's service (fsync on, synchronous_commit on).

func benchStore(b *testing.B) store.Store {
	s, _ := newStore(b, pgstore.Config{})
	return s
}

func BenchmarkNewCall(b *testing.B) { benchkit.NewCallBenchmarks(b, benchStore, 1, 16) }

func BenchmarkDuplicateCall(b *testing.B) {
	benchkit.DuplicateCallBenchmarks(b, benchStore, 500, 1, 16)
}

// rawKey is the key a raw call uses for call i: the engine's store key
// for the same request, so rows and index entries have the same size.
func rawKey(i int) string {
	k, _ := idem.NewStoreKey("charge", "", []byte(strconv.Itoa(i)))
	return k.String()
}

var rawResult = []byte(`{"id":"r-1","amount":1000}`)

// rawCalls are the statements of a hand-written check on table: a new
// call is INSERT … ON CONFLICT DO NOTHING plus an UPDATE storing the
// result; a duplicate is the INSERT doing nothing and a SELECT of the row
// (what a hand-written check needs to answer it).
type rawCalls struct{ insert, update, read string }

func newRawCalls(table string) rawCalls {
	return rawCalls{
		insert: "INSERT INTO " + table + " (key, status, fence, owner, lease_until, expires_at, fingerprint, created_at, version) " +
			"VALUES ($1, 1, 1, 'o', 1, 9000000000000, '', 1, 1) ON CONFLICT (key) DO NOTHING",
		update: "UPDATE " + table + " SET status = 2, result = $2, completed_at = 2 WHERE key = $1 AND fence = 1",
		read:   "SELECT status FROM " + table + " WHERE key = $1",
	}
}

func (r rawCalls) new(ctx context.Context, db pgstore.DB, k string) error {
	if _, err := db.Exec(ctx, r.insert, k); err != nil {
		return err
	}
	_, err := db.Exec(ctx, r.update, k, rawResult)
	return err
}

func (r rawCalls) duplicate(ctx context.Context, db pgstore.DB, k string) error {
	if _, err := db.Exec(ctx, r.insert, k); err != nil {
		return err
	}
	var st int
	return db.QueryRow(ctx, r.read, k).Scan(&st)
}

// BenchmarkRaw is the same pool with no library, on the same table (see
// rawCalls).
func BenchmarkRaw(b *testing.B) {
	ctx := context.Background()
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("new/c=%d", conc), func(b *testing.B) {
			s, pool := newStore(b, pgstore.Config{})
			raw := newRawCalls(s.Config().Table)
			benchkit.Run(b, conc, func(i int) error { return raw.new(ctx, pool, rawKey(i)) })
		})
	}
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("dup/c=%d", conc), func(b *testing.B) {
			s, pool := newStore(b, pgstore.Config{})
			raw := newRawCalls(s.Config().Table)
			for i := range 500 {
				if _, err := pool.Exec(ctx, raw.insert, rawKey(i)); err != nil {
					b.Fatal(err)
				}
			}
			benchkit.Run(b, conc, func(i int) error { return raw.duplicate(ctx, pool, rawKey(i%500)) })
		})
	}
}

// BenchmarkVersusRaw runs the library (idem.Do through the store) and the
// raw statements in turn, round after round (IDEM_BENCH_ROUNDS, default
// 3), so that both sides of a ratio share the machine's load; the last
// line it logs is the median ratio per workload. Besides benchkit's
// metrics each run reports its statements per call (rt/op, counted by a
// pgx tracer), the client process's CPU per call (client-µs/op, from
// getrusage) and the CPU per call of the PostgreSQL backends serving its
// pool (server-µs/op, from /proc/<pid>/schedstat; only when the server
// runs on this machine and /proc is readable).
//
// Reproduce: cd store/pgstore && go test -run '^$' -bench VersusRaw -benchmem -benchtime 4000x
func BenchmarkVersusRaw(b *testing.B) {
	rounds := 3
	if n, err := strconv.Atoi(os.Getenv("IDEM_BENCH_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	ctx := context.Background()
	const dupKeys = 500
	type sample struct{ lib, raw []float64 }
	results := map[string]*sample{}
	var order []string
	for round := range rounds {
		for _, work := range []string{"new", "dup"} {
			for _, conc := range []int{1, 16} {
				name := fmt.Sprintf("%s/c=%d", work, conc)
				if results[name] == nil {
					results[name] = &sample{}
					order = append(order, name)
				}
				for _, side := range []string{"library", "raw"} {
					var opsPerSec float64
					b.Run(fmt.Sprintf("%s/%s/round=%d", name, side, round+1), func(b *testing.B) {
						m := newMeteredStore(b, conc)
						var op func(i int) error
						switch side + "/" + work {
						case "library/new":
							e := benchkit.Engine(b, m.store)
							op = func(i int) error {
								_, err := idem.Do(ctx, e, idem.Request{Operation: "charge", Key: strconv.Itoa(i)}, charge)
								return err
							}
						case "library/dup":
							e := benchkit.Engine(b, m.store)
							for i := range dupKeys {
								if _, err := idem.Do(ctx, e, idem.Request{Operation: "charge", Key: strconv.Itoa(i)}, charge); err != nil {
									b.Fatal(err)
								}
							}
							op = func(i int) error {
								r, err := idem.Do(ctx, e, idem.Request{Operation: "charge", Key: strconv.Itoa(i % dupKeys)}, charge)
								if err == nil && !r.Replayed {
									err = fmt.Errorf("call %d was not a replay", i)
								}
								return err
							}
						case "raw/new":
							raw := newRawCalls(m.store.Config().Table)
							op = func(i int) error { return raw.new(ctx, m.pool, rawKey(i)) }
						case "raw/dup":
							raw := newRawCalls(m.store.Config().Table)
							for i := range dupKeys {
								if _, err := m.pool.Exec(ctx, raw.insert, rawKey(i)); err != nil {
									b.Fatal(err)
								}
							}
							op = func(i int) error { return raw.duplicate(ctx, m.pool, rawKey(i%dupKeys)) }
						}
						opsPerSec = m.run(b, conc, op)
					})
					s := results[name]
					if side == "library" {
						s.lib = append(s.lib, opsPerSec)
					} else {
						s.raw = append(s.raw, opsPerSec)
					}
				}
			}
		}
	}
	median := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		if len(v) == 0 {
			return 0
		}
		return v[len(v)/2]
	}
	var sum strings.Builder
	for _, name := range order {
		s := results[name]
		var ratios []float64
		for i := range min(len(s.lib), len(s.raw)) {
			ratios = append(ratios, s.lib[i]/s.raw[i])
		}
		fmt.Fprintf(&sum, "\n%-8s library %6.0f ops/s  raw %6.0f ops/s  (medians)  library ÷ raw per round %.2f, median %.2f",
			name, median(s.lib), median(s.raw), ratios, median(ratios))
	}
	b.Log(sum.String())
}

func charge(context.Context) (benchkit.Receipt, error) {
	return benchkit.Receipt{ID: "r-1", Amount: 1000}, nil
}

// meteredStore is a store on a fresh table whose pool counts the
// statements it sends and knows the backends serving it.
type meteredStore struct {
	store      *pgstore.Store
	pool       *pgxpool.Pool
	statements counter
	mu         sync.Mutex
	backends   []uint32
}

func newMeteredStore(b *testing.B, conc int) *meteredStore {
	m := &meteredStore{}
	cfg, err := pgxpool.ParseConfig(dsn(hostPort(b)))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 32
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	cfg.ConnConfig.Tracer = &m.statements
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		m.mu.Lock()
		m.backends = append(m.backends, c.PgConn().PID())
		m.mu.Unlock()
		return nil
	}
	m.pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(m.pool.Close)
	table := newSchema(b, m.pool)
	m.store, err = pgstore.New(m.pool, &pgstore.Config{Table: table, ReapInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.store.Close() })
	// Open the connections the run will use before it starts.
	conns := make([]*pgxpool.Conn, conc)
	for i := range conns {
		if conns[i], err = m.pool.Acquire(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	return m
}

// run is benchkit.Run with the meters around it; it returns ops/s.
func (m *meteredStore) run(b *testing.B, conc int, op func(i int) error) float64 {
	stmts, client, server := m.statements.n.Load(), clientCPU(), m.serverCPU()
	start := time.Now()
	benchkit.Run(b, conc, op)
	elapsed := time.Since(start)
	n := float64(b.N)
	b.ReportMetric(float64(m.statements.n.Load()-stmts)/n, "rt/op")
	b.ReportMetric(float64(clientCPU()-client)/n/1e3, "client-µs/op")
	if s := m.serverCPU(); s >= 0 && server >= 0 {
		b.ReportMetric(float64(s-server)/n/1e3, "server-µs/op")
	}
	return n / elapsed.Seconds()
}

// clientCPU is this process's user and system CPU time in ns.
func clientCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// serverCPU is the CPU time in ns of the backends serving the pool, or -1
// when it cannot be read.
func (m *meteredStore) serverCPU() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var total int64
	for _, pid := range m.backends {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			return -1
		}
		ns, err := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64)
		if err != nil {
			return -1
		}
		total += ns
	}
	return total
}
