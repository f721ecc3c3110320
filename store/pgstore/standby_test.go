package pgstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/failover"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/pgstore"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

// standbyPair is a PostgreSQL primary and its streaming hot standby
// (scripts/pg-standby), from IDEM_PG_PRIMARY_ADDR, IDEM_PG_STANDBY_ADDR,
// IDEM_PG_STANDBY_DIR and IDEM_PG_STANDBY_SCRIPT; outside CI the tests
// skip without them.
type standbyPair struct{ primary, standby, dir, script string }

func standby(t testing.TB) standbyPair {
	p := standbyPair{os.Getenv("IDEM_PG_PRIMARY_ADDR"), os.Getenv("IDEM_PG_STANDBY_ADDR"), os.Getenv("IDEM_PG_STANDBY_DIR"), os.Getenv("IDEM_PG_STANDBY_SCRIPT")}
	if p.primary == "" || p.standby == "" || p.dir == "" || p.script == "" {
		testenv.Missing(t, "no PostgreSQL primary and standby: scripts/pg-standby run go test ./...")
	}
	return p
}

// url is the multi-host URL a user gives pgstore: both servers, and
// target_session_attrs=read-write, so that the pool connects to whichever
// is the primary now.
func (p standbyPair) url() string {
	return "postgres://postgres@" + p.primary + "," + p.standby + "/postgres?sslmode=disable&connect_timeout=2&target_session_attrs=read-write"
}

// fresh makes a new pair (the script again: initdb, pg_basebackup) and
// sets synchronous replication on or off.
func (p standbyPair) fresh(t *testing.T, sync bool) {
	t.Helper()
	out, err := exec.Command(p.script, "start").CombinedOutput()
	if err != nil {
		t.Fatalf("%s start: %v: %s", p.script, err, out)
	}
	names := ""
	if sync {
		names = "*"
	}
	ctx := context.Background()
	c, err := pgx.Connect(ctx, "postgres://postgres@"+p.primary+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, q := range []string{"ALTER SYSTEM SET synchronous_standby_names = '" + names + "'", "SELECT pg_reload_conf()"} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// The setting is in force once a new session sees it.
	for range 100 {
		var v string
		c2, err := pgx.Connect(ctx, "postgres://postgres@"+p.primary+"/postgres?sslmode=disable")
		if err == nil {
			err = c2.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&v)
			c2.Close(ctx)
		}
		if err == nil && v == names {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("synchronous_standby_names did not take")
}

// The contract through the multi-host URL, with synchronous replication
// to the standby: the pool reaches the primary, whatever order the hosts
// are in.
func TestStandbyConformance(t *testing.T) {
	p := standby(t)
	p.fresh(t, true)
	for _, u := range []string{p.url(), strings.Replace(p.url(), p.primary+","+p.standby, p.standby+","+p.primary, 1)} {
		t.Run(strings.Split(strings.TrimPrefix(u, "postgres://postgres@"), "/")[0], func(t *testing.T) {
			storetest.Run(t, storetest.Features{MaxResultBytes: 1 << 20, StormGoroutines: 32, LinOps: 2000}, func(t *testing.T) store.Store {
				s, err := pgstore.Open(context.Background(), u, &pgstore.Config{Table: fmt.Sprintf("standby_%d_%x", schemaSeq.Add(1), rand.Uint32()), MaxResultBytes: 1 << 20, ReapInterval: -1})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			})
		})
	}
}

// TestStandbyFailoverUnderLoad is the failover measurement of
// docs/failover.md for PostgreSQL: 16 callers run Do on fresh keys through
// the multi-host URL while the primary is SIGKILLed (the postmaster and
// every backend at once) and the standby promoted (pg_promote); once the
// callers have run on the new primary for 3 s, every acknowledged outcome
// must replay. IDEM_FAILOVER_ROUNDS rounds (default 1) with synchronous
// replication off, as many with it on; the goal is none lost with it on.
func TestStandbyFailoverUnderLoad(t *testing.T) {
	p := standby(t)
	var all []failover.Round
	for i := range 2 * failover.Rounds(t) {
		sync := i%2 == 1
		all = append(all, standbyFailoverOnce(t, p, sync))
	}
	failover.Report(t, "pg-standby", all)
	for _, r := range all {
		if r.Setting == "synchronous" && r.Lost > 0 {
			t.Errorf("synchronous replication: %d acknowledged outcomes lost in a failover: %v", r.Lost, r.LostKeys)
		}
	}
	p.fresh(t, false) // leave a working pair behind
}

func standbyFailoverOnce(t *testing.T, p standbyPair, sync bool) failover.Round {
	p.fresh(t, sync)
	ctx := context.Background()
	s, err := pgstore.Open(ctx, p.url(), &pgstore.Config{Table: fmt.Sprintf("failover_%x", rand.Uint32()), ReapInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err := idem.New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := failover.Round{Setting: "asynchronous", Killed: p.primary}
	if sync {
		res.Setting = "synchronous"
	}
	l := failover.Start(e)
	time.Sleep(time.Second) // load before the fault
	killed := time.Now()
	killPostgres(t, filepath.Join(p.dir, "primary"))
	promote(t, p.standby)
	res.FailoverMs = time.Since(killed).Milliseconds()
	time.Sleep(3 * time.Second) // load on the new primary
	l.Finish(t, s, killed, &res)
	return res
}

// killPostgres SIGKILLs the server whose data folder is dir: its
// postmaster (PID in postmaster.pid) and every child, at once, as a crash
// of the machine would.
func killPostgres(t *testing.T, dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	pids := []int{pid}
	procs, _ := os.ReadDir("/proc")
	for _, d := range procs {
		stat, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			if c, err := strconv.Atoi(d.Name()); err == nil {
				pids = append(pids, c)
			}
		}
	}
	_ = syscall.Kill(pid, syscall.SIGSTOP) // no new children meanwhile
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	for range 200 {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("postmaster %d still runs", pid)
}

// promote promotes the standby at addr and waits until it takes writes.
func promote(t *testing.T, addr string) {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var ok bool
	if err := c.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_promote: %v %v", ok, err)
	}
}
