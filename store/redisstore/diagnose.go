package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/store"
)

var _ store.Diagnoser = (*Store)(nil)

// Diagnose implements [store.Diagnoser], reading only (INFO, CONFIG GET,
// and Check's probes of the ACL):
//
//   - "configuration": [Store.Check]'s probes of the ACL (an [*ACLError]);
//   - "eviction", per server: a server that may evict keys is a problem
//     ([*EvictionError]), or with Config.AllowEviction a warning: the
//     risk accepted;
//   - "persistence", per master (INFO persistence, CONFIG GET save and
//     appendfsync): no AOF, no RDB save point and no replica is a problem
//     (a restart forgets every record); RDB snapshots alone, AOF without
//     appendfsync always, or no persistence behind replicas is a warning
//     (a restart or a crash loses the last writes);
//   - "replicas", per master: a store that reaches a replica (writes
//     fail), fewer replicas online than Config.WaitReplicas (new claims
//     fail), replicas with WaitReplicas 0 (a failover can lose
//     acknowledged outcomes) are problems.
//
// A server is each master of a cluster, each shard of a ring, the primary
// behind Sentinel, or the one server.
func (s *Store) Diagnose(ctx context.Context) []store.Finding {
	var out []store.Finding
	if err := s.checkACL(ctx); err != nil {
		out = append(out, store.FindingOf("configuration", err))
	} else {
		out = append(out, store.Finding{Check: "configuration", What: fmt.Sprintf(
			"the server answers, and its ACL lets the store's user run its scripts and read keys under prefix %q", s.cfg.Prefix)})
	}
	var (
		mu      sync.Mutex
		servers []serverFindings
	)
	err := s.eachServer(ctx, func(ctx context.Context, c redis.UniversalClient, addr string) {
		if addr == "" {
			addr = serverAddr(ctx, c)
		}
		f := s.diagnoseServer(ctx, c, addr)
		mu.Lock()
		servers = append(servers, f)
		mu.Unlock()
	})
	if err != nil {
		err = s.translate("diagnose", "", err)
		for _, check := range []string{"eviction", "persistence", "replicas"} {
			out = append(out, store.FindingOf(check, err))
		}
		return out
	}
	slices.SortFunc(servers, func(a, b serverFindings) int { return strings.Compare(a.addr, b.addr) })
	for _, pick := range []func(serverFindings) store.Finding{
		func(f serverFindings) store.Finding { return f.eviction },
		func(f serverFindings) store.Finding { return f.persistence },
		func(f serverFindings) store.Finding { return f.replicas },
	} {
		for _, f := range servers {
			out = append(out, pick(f))
		}
	}
	return out
}

// serverFindings are Diagnose's findings on one server.
type serverFindings struct {
	addr                            string
	eviction, persistence, replicas store.Finding
}

// eachServer calls fn for every server the store writes to, concurrently
// on a cluster or ring: each master of a cluster, each shard of a ring,
// else the one server c reaches, whose addr is "" when the client does not
// say (a Sentinel's primary).
func (s *Store) eachServer(ctx context.Context, fn func(ctx context.Context, c redis.UniversalClient, addr string)) error {
	if s.cluster != nil {
		return s.cluster.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			fn(ctx, n, n.Options().Addr)
			return nil
		})
	}
	if r, ok := s.c.(*redis.Ring); ok {
		return r.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			fn(ctx, n, n.Options().Addr)
			return nil
		})
	}
	fn(ctx, s.c, clientAddr(s.c))
	return nil
}

// diagnoseServer reads one server's memory, persistence and replication.
func (s *Store) diagnoseServer(ctx context.Context, c redis.UniversalClient, addr string) serverFindings {
	f := serverFindings{addr: addr}
	f.eviction = s.diagnoseEviction(ctx, c, addr)
	repl, err := readReplication(ctx, c, addr)
	if err != nil {
		err = s.translate("INFO replication on "+addr, "", err)
		f.replicas = store.FindingOf("replicas", err)
		f.persistence = store.FindingOf("persistence", err)
		return f
	}
	f.replicas = s.diagnoseReplicas(repl)
	f.persistence = s.diagnosePersistence(ctx, c, addr, repl.Online)
	return f
}

func (s *Store) diagnoseEviction(ctx context.Context, c redis.UniversalClient, addr string) store.Finding {
	err := readEviction(ctx, c, addr)
	var ee *EvictionError
	switch {
	case errors.As(err, &ee) && s.cfg.AllowEviction:
		return store.Finding{Check: "eviction", Severity: store.SeverityWarning,
			What: ee.found() + "; alloweviction=true (Config.AllowEviction) accepts that risk",
			Fix:  "set maxmemory-policy noeviction (or give idem a Redis of its own with noeviction), then drop alloweviction=true"}
	case ee != nil:
		return store.Finding{Check: "eviction", Severity: store.SeverityProblem, What: ee.found(), Fix: ee.fix()}
	case err != nil:
		return store.FindingOf("eviction", s.translate("INFO memory on "+addr, "", err))
	}
	return store.Finding{Check: "eviction", What: addr + ": evicts no key (noeviction, or no maxmemory)"}
}

func (s *Store) diagnoseReplicas(m MasterReplication) store.Finding {
	name, wait := m.Addr, s.cfg.WaitReplicas
	bad := func(what, fix string) store.Finding {
		return store.Finding{Check: "replicas", Severity: store.SeverityProblem, What: what, Fix: fix}
	}
	switch {
	case m.Role != "master":
		return bad(fmt.Sprintf("%s is a %s: every write fails", name, m.Role), "point the store's URL at the primary (or use redis+sentinel:// or redis+cluster://)")
	case m.Online < wait:
		return bad(fmt.Sprintf("%s has %d replica(s) online, WaitReplicas is %d: every new claim and outcome there fails as unavailable (replays still answer)", name, m.Online, wait),
			"bring its replicas back, or lower waitreplicas to the replicas each master keeps (docs/failover.md)")
	case m.Online > 0 && wait == 0:
		return bad(fmt.Sprintf("%s has %d replica(s) online and WaitReplicas is 0: replication is asynchronous, so a failover can lose acknowledged outcomes", name, m.Online),
			fmt.Sprintf("set waitreplicas=%d in the URL (Config.WaitReplicas), the replicas each master keeps (docs/failover.md)", m.Online))
	}
	return store.Finding{Check: "replicas", What: fmt.Sprintf("%s: %d online, WaitReplicas %d", name, m.Online, wait)}
}

// diagnosePersistence grades what a restart or a crash of the server at
// addr, with replicas online, would lose.
func (s *Store) diagnosePersistence(ctx context.Context, c redis.UniversalClient, addr string, replicas int) store.Finding {
	info, err := c.Info(ctx, "persistence").Result()
	if err != nil {
		return store.FindingOf("persistence", s.translate("INFO persistence on "+addr, "", err))
	}
	aof := strings.Contains(info, "aof_enabled:1")
	// CONFIG GET may be refused (ACL, or a managed service that renames
	// it): then the save points and the fsync policy are unknown.
	save, saveErr := configGet(ctx, c, "save")
	fsync, _ := configGet(ctx, c, "appendfsync")
	const fix = "turn on AOF with appendfsync always (CONFIG SET appendonly yes, CONFIG SET appendfsync always, and in redis.conf), " +
		"or keep replicas and set waitreplicas to their number (docs/production.md, docs/failover.md)"
	warn := func(what, fix string) store.Finding {
		return store.Finding{Check: "persistence", Severity: store.SeverityWarning, What: addr + ": " + what, Fix: fix}
	}
	ok := func(what string) store.Finding { return store.Finding{Check: "persistence", What: addr + ": " + what} }
	rdb := fmt.Sprintf("RDB snapshots (save %q)", save)
	switch {
	case aof && fsync == "always":
		return ok("AOF on, appendfsync always")
	case replicas > 0 && !aof && saveErr == nil && save == "":
		return warn(fmt.Sprintf("no persistence (AOF off, no RDB save point), %d replica(s): if this server restarts before a replica is promoted, it comes back empty and its replicas copy the empty data set, forgetting every record", replicas),
			"turn on AOF (appendonly yes), or never restart a master automatically: let Sentinel or the cluster promote a replica first (docs/failover.md)")
	case replicas > 0:
		return ok(fmt.Sprintf("%d replica(s) hold the writes (AOF %s, save %q)", replicas, onOff(aof), save))
	case aof:
		return warn(fmt.Sprintf("AOF on with appendfsync %s and no replica: a crash of the machine can lose the last second of acknowledged outcomes, whose operations then run again", orUnknown(fsync)), fix)
	case saveErr != nil:
		return warn("AOF off and no replica; the RDB save points could not be read ("+saveErr.Error()+"): without them a restart forgets every record", fix)
	case save != "":
		return warn(rdb+" without AOF and no replica: a restart loses every write since the last snapshot, and those operations run again", fix)
	}
	return store.Finding{Check: "persistence", Severity: store.SeverityProblem,
		What: addr + ": no persistence (AOF off, no RDB save point) and no replica: a restart forgets every record, and every operation runs again at its next call",
		Fix:  fix}
}

// configGet reads one CONFIG GET parameter.
func configGet(ctx context.Context, c redis.UniversalClient, name string) (string, error) {
	m, err := c.ConfigGet(ctx, name).Result()
	if err != nil {
		return "", err
	}
	v, ok := m[name]
	if !ok {
		return "", fmt.Errorf("CONFIG GET %s: not reported", name)
	}
	return v, nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}
