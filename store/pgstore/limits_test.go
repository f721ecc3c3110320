package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/pgstore"
)

// refusedAtOnce opens url and wants a *ConnectError with SQLSTATE code
// that matches ErrInvalidConfig and ErrMisconfigured (so storeurl.OpenWait
// does not retry it) and not ErrUnavailable, within a few seconds, and the
// message to carry each of want.
func refusedAtOnce(t *testing.T, url, code string, want ...string) {
	t.Helper()
	start := time.Now()
	s, err := pgstore.Open(context.Background(), url, &pgstore.Config{ReapInterval: -1})
	if err == nil {
		s.Close()
		t.Fatalf("Open(%s) succeeded, want SQLSTATE %s", url, code)
	}
	var ce *pgstore.ConnectError
	if !errors.As(err, &ce) || ce.Code != code || !errors.Is(err, idem.ErrInvalidConfig) || !errors.Is(err, store.ErrMisconfigured) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Open: %v (%T), want a *ConnectError with SQLSTATE %s", err, err, code)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q lacks %q", err, w)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Open took %v to refuse", d)
	}
	t.Logf("%v", err)
}

// A database that does not exist (3D000) and a role that does not exist
// (28000) fail Open at once with a *ConnectError that says what to fix:
// no wait mends them.
func TestOpenRefusedForAMissingDatabaseOrRole(t *testing.T) {
	addr := hostPort(t)
	db := fmt.Sprintf("idem_nodb_%x", rand.Uint32())
	refusedAtOnce(t, fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&connect_timeout=5", pgUser(), addr, db),
		"3D000", "database "+db+" does not exist", "CREATE DATABASE")
	role := fmt.Sprintf("idem_norole_%x", rand.Uint32())
	refusedAtOnce(t, fmt.Sprintf("postgres://%s@%s/test?sslmode=disable&connect_timeout=5", role, addr),
		"28000", "role "+role, "CREATE ROLE")
}

func pgUser() string {
	if u := os.Getenv("IDEM_PG_USER"); u != "" {
		return u
	}
	return "postgres"
}

// A wrong password (28P01) fails Open at once. The shared server trusts
// every connection, so this runs on a PostgreSQL of its own that asks for
// passwords (scram-sha-256), made with initdb.
func TestOpenRefusedForAWrongPassword(t *testing.T) {
	addr := ownPostgres(t, "secret")
	refusedAtOnce(t, "postgres://postgres:wrong@"+addr+"/postgres?sslmode=disable&connect_timeout=5",
		"28P01", "password", "role postgres")
	s, err := pgstore.Open(context.Background(), "postgres://postgres:secret@"+addr+"/postgres?sslmode=disable&connect_timeout=5", &pgstore.Config{ReapInterval: -1})
	if err != nil {
		t.Fatalf("with the right password: %v", err)
	}
	s.Close()
}

// ownPostgres starts a PostgreSQL of the test's own (the machine's
// binaries, as scripts/pg-standby finds them, run as the postgres user
// when the test runs as root, which initdb refuses) on a free port, whose
// superuser postgres has password pw and every TCP login needs a password
// (scram-sha-256). It is stopped when the test ends.
func ownPostgres(t *testing.T, pw string) string {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		testenv.Missing(t, "no PostgreSQL binaries (initdb) under /usr/lib/postgresql")
	}
	bin := filepath.Dir(bins[len(bins)-1])
	as := func(name string, args ...string) *exec.Cmd {
		if os.Getuid() == 0 {
			return exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(bin, name)}, args...)...)
		}
		return exec.Command(filepath.Join(bin, name), args...)
	}
	dir, err := os.MkdirTemp("", "idem-pg-auth-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Getuid() == 0 {
		if out, err := exec.Command("chown", "postgres", dir).CombinedOutput(); err != nil {
			t.Fatalf("chown: %v: %s", err, out)
		}
	}
	pwfile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwfile, []byte(pw+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if out, err := as("initdb", "-D", data, "-U", "postgres", "--auth=scram-sha-256", "--pwfile="+pwfile).CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v: %s", err, out)
	}
	port := freePort(t)
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c max_connections=20 -c shared_buffers=16MB -c fsync=off", port, dir)
	if out, err := as("pg_ctl", "-D", data, "-l", filepath.Join(dir, "log"), "-o", opts, "-w", "start").CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl start: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := as("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop").CombinedOutput(); err != nil {
			t.Errorf("pg_ctl stop: %v: %s", err, out)
		}
	})
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// freePort is a TCP port free on loopback a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// A server out of connections for the store's role (SQLSTATE 53300, here a
// role's CONNECTION LIMIT on the shared server, the same refusal as
// max_connections) makes calls fail as unavailable, never as a damaged or
// changed record: the engine runs nothing, the record another store holds
// stays as it was, and calls succeed again once a connection is free.
func TestConnectionsExhaustedIsUnavailable(t *testing.T) {
	addr := hostPort(t)
	ctx := context.Background()
	admin := newPoolTimeout(t, addr, 2, 10*time.Second)
	table := newSchema(t, admin)
	schema, _, _ := strings.Cut(table, ".")
	role := fmt.Sprintf("idem_limited_%x", rand.Uint32())
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN CONNECTION LIMIT 2",
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
		"GRANT SELECT ON " + schema + ".idem_schema_migrations TO " + role,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + table + " TO " + role,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, q := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := admin.Exec(context.Background(), q); err != nil {
				t.Errorf("cleanup: %s: %v", q, err)
			}
		}
	})
	conn := fmt.Sprintf("postgres://%s@%s/test?sslmode=disable&connect_timeout=5", role, addr)
	url := conn + "&pool_max_conns=1"

	// Store a, one connection, claims a key and keeps its connection.
	a, err := pgstore.Open(ctx, url, &pgstore.Config{Table: table, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	now := time.Now().UnixMilli()
	first, err := a.Claim(ctx, store.ClaimParams{Key: "k", Owner: "a", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 600_000})
	if err != nil || !first.Acquired {
		t.Fatalf("claim by a: %+v %v", first, err)
	}
	// Another client takes the role's last connection.
	held, err := pgx.Connect(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pgstore.New(newRolePool(t, url), &pgstore.Config{Table: table, ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	e, err := idem.New(b, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, key := range []string{"k", "new"} {
		_, err := idem.Do(ctx, e, idem.Request{Operation: "op", Key: key}, func(context.Context) (int, error) { ran++; return 1, nil })
		if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("call for %s out of connections: %v, want unavailable", key, err)
		}
		if !strings.Contains(err.Error(), "53300") || !strings.Contains(err.Error(), "out of connections") {
			t.Errorf("call for %s: %v, want the server's too_many_connections (53300)", key, err)
		}
	}
	if _, err := b.Get(ctx, "k"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("get out of connections: %v", err)
	}
	if ran != 0 {
		t.Fatalf("the operation ran %d times without a claim", ran)
	}
	rec, err := a.Get(ctx, "k")
	if err != nil || rec.Status != store.StatusInProgress || rec.Fence != 1 || rec.Owner != "a" {
		t.Fatalf("a's record after the refusals: %+v %v", rec, err)
	}
	if _, err := a.Get(ctx, "new"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused claim left a record: %v", err)
	}

	// A connection freed: b works again, and finds a's claim as it was.
	if err := held.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The server ends the backend after the client left: wait for it.
	for n := 2; n >= 2; {
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", role).Scan(&n); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // another process's exit
	}
	res, err := b.Claim(ctx, store.ClaimParams{Key: "k", Owner: "b", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 600_000})
	if err != nil || res.Acquired || res.Record.Fence != 1 || res.Record.Owner != "a" {
		t.Fatalf("claim by b once a connection is free: %+v %v, want a's live claim", res, err)
	}
	if err := a.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k", Fence: 1, Owner: "a", Now: now}, ExpiresAt: now + 600_000, Result: []byte("r")}); err != nil {
		t.Fatalf("a completes: %v", err)
	}
}

// newRolePool is a pool for url that connects on first use (as the pool a
// service starts with before the server is out of connections).
func newRolePool(t *testing.T, url string) pgstore.DB {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// Durability reads the server's settings as the store's sessions have
// them: synchronous_commit as a connection sets it, no standby here, a
// primary.
func TestDurability(t *testing.T) {
	addr := hostPort(t)
	ctx := context.Background()
	for _, want := range []string{"on", "off"} {
		url := fmt.Sprintf("postgres://%s@%s/test?sslmode=disable&connect_timeout=5&synchronous_commit=%s", pgUser(), addr, want)
		pool := newRolePool(t, url)
		s, err := pgstore.New(pool, &pgstore.Config{Table: newSchema(t, pool.(*pgxpool.Pool)), ReapInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		d, err := s.Durability(ctx)
		s.Close()
		if err != nil || d.SynchronousCommit != want || d.InRecovery {
			t.Fatalf("synchronous_commit=%s: %+v %v", want, d, err)
		}
	}
}
