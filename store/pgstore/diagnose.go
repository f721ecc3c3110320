package pgstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/seed-a1b882c0/idem/store"
)

var _ store.Diagnoser = (*Store)(nil)

// Diagnose implements [store.Diagnoser], with read-only queries:
//
//   - "configuration": [Store.Check] (the table exists, a
//     [*NoTableError] with the idemctl migrate to run; the role's
//     privileges on it, a [*PrivilegeError]);
//   - "primary": a server in recovery (a standby) fails every write;
//   - "synchronous_commit": off lets a crash of the server lose outcomes
//     it acknowledged; local does so in a failover while standbys stream;
//   - "standbys": standbys streaming asynchronously (no
//     synchronous_standby_names) let a failover lose the last
//     acknowledged outcomes.
//
// The last three come from [Store.Durability].
func (s *Store) Diagnose(ctx context.Context) []store.Finding {
	var out []store.Finding
	if err := s.Check(ctx); err != nil {
		out = append(out, store.FindingOf("configuration", err))
	} else {
		out = append(out, store.Finding{Check: "configuration", What: fmt.Sprintf("table %s exists, and the store's role may read and write it", s.cfg.Table)})
	}
	v, err := s.Durability(ctx)
	if err != nil {
		f := store.FindingOf("durability", err)
		f.What = "cannot read the server's settings: " + f.What
		return append(out, f)
	}
	problem := func(check, what, fix string) store.Finding {
		return store.Finding{Check: check, Severity: store.SeverityProblem, What: what, Fix: fix}
	}
	ok := func(check, what string) store.Finding { return store.Finding{Check: check, What: what} }
	if v.InRecovery {
		out = append(out, problem("primary", "the server is a standby (in recovery): every write fails", "point the store's URL at the primary"))
	} else {
		out = append(out, ok("primary", "the server is a primary"))
	}
	switch v.SynchronousCommit {
	case "off":
		out = append(out, problem("synchronous_commit", "off: a crash of the server can lose outcomes it acknowledged",
			"ALTER ROLE <the store's role> SET synchronous_commit = on (or remove synchronous_commit=off from the URL)"))
	case "local":
		if v.Standbys > 0 {
			out = append(out, problem("synchronous_commit", "local: commits wait for no standby, so a failover can lose acknowledged outcomes",
				"ALTER ROLE <the store's role> SET synchronous_commit = on (docs/failover.md)"))
		} else {
			out = append(out, ok("synchronous_commit", "local (no standby streams from this server)"))
		}
	default:
		out = append(out, ok("synchronous_commit", v.SynchronousCommit))
	}
	switch {
	case v.Standbys > 0 && strings.TrimSpace(v.SynchronousStandbyNames) == "":
		out = append(out, problem("standbys", fmt.Sprintf("%d standby(s) stream asynchronously: a failover can lose the last acknowledged outcomes", v.Standbys),
			"set synchronous_standby_names on the primary (e.g. 'ANY 1 (*)') so that each commit waits for a standby (docs/failover.md)"))
	case v.Standbys > 0:
		out = append(out, ok("standbys", fmt.Sprintf("%d streaming, synchronous_standby_names = %q", v.Standbys, v.SynchronousStandbyNames)))
	default:
		out = append(out, ok("standbys", "none streams from this server (a failover has nothing to promote; nothing to lose to one)"))
	}
	return out
}
