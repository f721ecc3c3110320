package redisstore

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Replication is what the store's masters say of their replicas, and how
// many replicas each write waits for: with WaitReplicas above a master's
// replicas online every write to it fails, and with WaitReplicas 0 and
// replicas a failover can lose acknowledged outcomes (docs/failover.md).
// See [Store.Replication].
type Replication struct {
	// WaitReplicas is Config.WaitReplicas.
	WaitReplicas int
	// Masters are the servers the store writes to: one, or each master of
	// a cluster.
	Masters []MasterReplication
}

// MasterReplication is one master's INFO replication.
type MasterReplication struct {
	// Addr is the server's address, when the client says.
	Addr string
	// Role is the server's role: "master", or "slave" for a store that
	// reaches a replica (its writes fail).
	Role string
	// Online counts the replicas linked and in sync (state=online).
	Online int
}

// Replication reads INFO replication on every server the store writes to
// (read-only), for [Store.Diagnose].
func (s *Store) Replication(ctx context.Context) (Replication, error) {
	r := Replication{WaitReplicas: s.cfg.WaitReplicas}
	read := readReplication
	if s.cluster != nil {
		var mu sync.Mutex
		err := s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			m, err := read(ctx, c, c.Options().Addr)
			mu.Lock()
			r.Masters = append(r.Masters, m)
			mu.Unlock()
			return err
		})
		if err != nil {
			return Replication{}, s.translate("replication", "", err)
		}
		slices.SortFunc(r.Masters, func(a, b MasterReplication) int { return strings.Compare(a.Addr, b.Addr) })
		return r, nil
	}
	addr := ""
	if c, ok := s.c.(*redis.Client); ok {
		addr = c.Options().Addr
	}
	m, err := read(ctx, s.c, addr)
	if err != nil {
		return Replication{}, s.translate("replication", "", err)
	}
	r.Masters = append(r.Masters, m)
	return r, nil
}

// readReplication reads INFO replication from c, the server at addr.
func readReplication(ctx context.Context, c redis.Cmdable, addr string) (MasterReplication, error) {
	m := MasterReplication{Addr: addr}
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return m, err
	}
	for line := range strings.SplitSeq(info, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "role:"); ok {
			m.Role = v
		}
		if strings.HasPrefix(line, "slave") && strings.Contains(line, "state=online") {
			m.Online++
		}
	}
	return m, nil
}
