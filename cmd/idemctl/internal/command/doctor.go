package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/pgstore"
	"github.com/seed-a1b882c0/idem/store/redisstore"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

var doctorCommand = command{
	name: "doctor", args: "[URL]",
	summary: "Check a live store against the settings that keep idem's promise (docs/production.md): that it opens, " +
		"its own configuration check, a round trip, and per store its durability and room; print what is wrong and how to fix it. " +
		"Read-only; exit 0 when all is well, 1 when a problem was found (an unreachable store is one).",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		probes := fs.Int("probes", 5, "round trips to time (reads of an absent key)")
		return func(ctx context.Context, args []string) error {
			switch len(args) {
			case 0:
			case 1:
				c.store = args[0]
			default:
				return usagef("doctor takes one store URL, got %d arguments", len(args))
			}
			if *probes < 1 {
				return usagef("-probes must be at least 1")
			}
			d := &doctor{c: c}
			d.run(ctx, *probes)
			if d.problems > 0 {
				return fmt.Errorf("%d problem(s) found; fixes above", d.problems)
			}
			fmt.Fprintln(c.env.Stdout, "no problems found")
			return nil
		}
	},
}

// doctor is one run of idemctl doctor: it prints one line per check.
type doctor struct {
	c        *ctl
	problems int
}

func (d *doctor) ok(check, format string, args ...any) {
	fmt.Fprintf(d.c.env.Stdout, "ok       %-18s %s\n", check, fmt.Sprintf(format, args...))
}

// problem reports what is wrong and, when fix is not empty, how to fix it.
func (d *doctor) problem(check, what, fix string) {
	d.problems++
	fmt.Fprintf(d.c.env.Stdout, "PROBLEM  %-18s %s\n", check, what)
	if fix != "" {
		fmt.Fprintf(d.c.env.Stdout, "         %-18s fix: %s\n", "", fix)
	}
}

func (d *doctor) run(ctx context.Context, probes int) {
	raw := d.c.storeURL()
	if raw == "" {
		d.problem("store", "no store URL", "give it as the argument, with -store, or in $"+EnvStore)
		return
	}
	fmt.Fprintf(d.c.env.Stdout, "store    %s\n", storeurl.Redact(raw))
	start := time.Now()
	s, closeStore, err := d.c.openReadOnly(ctx)
	if err != nil {
		d.problem("open", err.Error(), openFix(err))
		return
	}
	defer closeStore()
	system := "a store"
	if n, ok := s.(store.SystemNamer); ok && n.SystemName() != "" {
		system = n.SystemName()
	}
	d.ok("open", "%s, opened and answered in %v", system, time.Since(start).Round(time.Millisecond))

	if c, ok := s.(interface{ Check(context.Context) error }); ok {
		if err := c.Check(ctx); err != nil {
			d.problem("configuration", err.Error(), openFix(err))
			return // the rest would fail for the same reason
		}
		d.ok("configuration", "the store's own check passed")
	}
	d.roundTrip(ctx, s, probes)
	if t, ok := s.(store.ServerTimer); ok {
		d.clock(ctx, t)
	}
	if b, ok := s.(diskFreer); ok {
		d.disk(b.DiskFree())
	}
	if p, ok := s.(durabler); ok {
		d.durability(ctx, p)
	}
	if r, ok := s.(replicator); ok {
		d.replication(ctx, r)
	}
}

// maxClockOffset is the engine's default Config.MaxClockOffset: beyond it
// an engine takes over no claim (docs/state-machine.md, "One clock").
const maxClockOffset = time.Minute

// clock compares this machine's clock (idemctl's) with the store's: an
// engine corrects its timestamps by the offset, but takes over no claim
// whose lease has passed while the offset is beyond MaxClockOffset.
func (d *doctor) clock(ctx context.Context, t store.ServerTimer) {
	before := d.c.now()
	at, err := t.ServerTime(ctx)
	if err != nil {
		d.problem("clock", "cannot read the store's clock: "+err.Error(), openFix(err))
		return
	}
	after := d.c.now()
	offset := at.Sub(before.Add(after.Sub(before) / 2)).Round(time.Millisecond)
	if offset > maxClockOffset || offset < -maxClockOffset {
		d.problem("clock", fmt.Sprintf("this machine's clock is %v from the store's, beyond the %v within which an engine here takes over claims whose lease has passed (it still runs nothing twice)", offset, maxClockOffset),
			"synchronise this machine's clock (NTP), or raise Config.MaxClockOffset")
		return
	}
	d.ok("clock", "%v from the store's (engines correct their timestamps by it)", offset)
}

// replicator is a store that says how its masters replicate
// (*redisstore.Store).
type replicator interface {
	Replication(ctx context.Context) (redisstore.Replication, error)
}

// replication reports each Redis master's replicas against WaitReplicas.
func (d *doctor) replication(ctx context.Context, p replicator) {
	r, err := p.Replication(ctx)
	if err != nil {
		d.problem("replicas", "cannot read INFO replication: "+err.Error(), openFix(err))
		return
	}
	for _, m := range r.Masters {
		name := m.Addr
		if name == "" {
			name = "the server"
		}
		switch {
		case m.Role != "master":
			d.problem("replicas", fmt.Sprintf("%s is a %s: every write fails", name, m.Role), "point the store's URL at the primary (or use redis+sentinel:// or redis+cluster://)")
		case m.Online < r.WaitReplicas:
			d.problem("replicas", fmt.Sprintf("%s has %d replica(s) online, WaitReplicas is %d: every new claim and outcome there fails as unavailable (replays still answer)", name, m.Online, r.WaitReplicas),
				"bring its replicas back, or lower waitreplicas to the replicas each master keeps (docs/failover.md)")
		case m.Online > 0 && r.WaitReplicas == 0:
			d.problem("replicas", fmt.Sprintf("%s has %d replica(s) online and WaitReplicas is 0: replication is asynchronous, so a failover can lose acknowledged outcomes", name, m.Online),
				fmt.Sprintf("set waitreplicas=%d in the URL (Config.WaitReplicas), the replicas each master keeps (docs/failover.md)", m.Online))
		default:
			d.ok("replicas", "%s: %d online, WaitReplicas %d", name, m.Online, r.WaitReplicas)
		}
	}
}

// diskFreer is a store that says how much room its file has
// (*boltstore.Store).
type diskFreer interface {
	DiskFree() (free, min int64, ok bool, err error)
}

// openFix says what to do about an error opening or checking the store.
func openFix(err error) string {
	switch {
	case errors.Is(err, store.ErrMisconfigured), errors.Is(err, store.ErrInvalidConfig):
		return "the message above says what to change; no retry mends it"
	case errors.Is(err, store.ErrUnavailable):
		return "unless the message above names something to create, check that the server runs and that this machine reaches it (address, port, firewall, TLS), then run doctor again"
	}
	return ""
}

// roundTrip times probes reads of a key no call uses.
func (d *doctor) roundTrip(ctx context.Context, s store.Store, probes int) {
	times := make([]time.Duration, 0, probes)
	for range probes {
		start := time.Now()
		_, err := s.Get(ctx, "idemctl-doctor#probe")
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			d.problem("round trip", "a read failed: "+err.Error(), openFix(err))
			return
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	d.ok("round trip", "%d reads: median %v, max %v", probes, times[len(times)/2].Round(10*time.Microsecond), times[len(times)-1].Round(10*time.Microsecond))
}

// disk reports a bolt file's free space.
func (d *doctor) disk(free, min int64, ok bool, err error) {
	switch {
	case err != nil:
		d.problem("disk", "cannot read the free space: "+err.Error(), "")
	case !ok:
		d.ok("disk", "free space not checked on this platform or with MinFreeBytes < 0")
	case free < min:
		d.problem("disk", fmt.Sprintf("%s free, under the %s new claims need (MinFreeBytes): new calls fail as unavailable", bytesOf(free), bytesOf(min)),
			"free space on the file system of the store's file, or move it to a larger one")
	default:
		d.ok("disk", "%s free (new claims need %s)", bytesOf(free), bytesOf(min))
	}
}

// durabler is a store that says how long its server keeps a commit
// (*pgstore.Store).
type durabler interface {
	Durability(ctx context.Context) (pgstore.Durability, error)
}

// durability reports a PostgreSQL server's commit settings.
func (d *doctor) durability(ctx context.Context, p durabler) {
	v, err := p.Durability(ctx)
	if err != nil {
		d.problem("durability", "cannot read the server's settings: "+err.Error(), openFix(err))
		return
	}
	if v.InRecovery {
		d.problem("primary", "the server is a standby (in recovery): every write fails", "point the store's URL at the primary")
	}
	switch v.SynchronousCommit {
	case "off":
		d.problem("synchronous_commit", "off: a crash of the server can lose outcomes it acknowledged",
			"ALTER ROLE <the store's role> SET synchronous_commit = on (or remove synchronous_commit=off from the URL)")
	case "local":
		if v.Standbys > 0 {
			d.problem("synchronous_commit", "local: commits wait for no standby, so a failover can lose acknowledged outcomes",
				"ALTER ROLE <the store's role> SET synchronous_commit = on (docs/failover.md)")
		} else {
			d.ok("synchronous_commit", "local (no standby streams from this server)")
		}
	default:
		d.ok("synchronous_commit", "%s", v.SynchronousCommit)
	}
	switch {
	case v.Standbys > 0 && strings.TrimSpace(v.SynchronousStandbyNames) == "":
		d.problem("standbys", fmt.Sprintf("%d standby(s) stream asynchronously: a failover can lose the last acknowledged outcomes", v.Standbys),
			"set synchronous_standby_names on the primary (e.g. 'ANY 1 (*)') so that each commit waits for a standby (docs/failover.md)")
	case v.Standbys > 0:
		d.ok("standbys", "%d streaming, synchronous_standby_names = %q", v.Standbys, v.SynchronousStandbyNames)
	default:
		d.ok("standbys", "none streams from this server (a failover has nothing to promote; nothing to lose to one)")
	}
}

func bytesOf(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
