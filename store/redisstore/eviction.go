package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/store"
)

var _ store.SettingsChecker = (*Store)(nil)

// EvictionError reports a Redis server that may evict keys: it has a
// memory limit (maxmemory > 0) and a maxmemory-policy other than
// noeviction. Every idem record carries an expiry, so under every such
// policy (volatile-* and allkeys-* alike) any record may be dropped when
// memory runs short, IN_PROGRESS claims and COMPLETED outcomes included,
// and an operation whose record was dropped runs again at its next call.
// It matches store.ErrMisconfigured and store.ErrInvalidConfig
// (errors.Is); the message says what to set.
type EvictionError struct {
	// Addr is the server (host:port; on Redis Cluster, the master).
	Addr string
	// Policy is its maxmemory-policy ("" when INFO memory did not say).
	Policy string
	// MaxMemory is its maxmemory in bytes (-1 when INFO memory did not
	// say).
	MaxMemory int64
}

func (e *EvictionError) Error() string {
	return "redisstore: " + e.found() + ". " + e.fix()
}

// found says what e found: the server, its limit and policy, and what
// they cost.
func (e *EvictionError) found() string {
	policy, limit := e.Policy, strconv.FormatInt(e.MaxMemory, 10)
	if policy == "" {
		policy = "not reported by INFO memory"
	}
	if e.MaxMemory < 0 {
		limit = "not reported by INFO memory"
	}
	return fmt.Sprintf("Redis at %s may evict keys when memory runs short (maxmemory %s, maxmemory-policy %s): "+
		"it may drop idem records before their expiry, IN_PROGRESS ones included, and an operation whose record was dropped runs again",
		e.Addr, limit, policy)
}

// fix says what to set.
func (e *EvictionError) fix() string {
	return "Set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, and in redis.conf); on a managed service, " +
		"the ElastiCache parameter group's maxmemory-policy, the Memorystore instance's maxmemory-policy configuration, " +
		"Azure Cache for Redis's maxmemory-policy setting; or give idem a Redis of its own with noeviction. " +
		"To accept that records may be forgotten and operations may run again, set Config.AllowEviction (alloweviction=true in a store URL)"
}

// Is makes errors.Is(err, store.ErrMisconfigured) and
// errors.Is(err, store.ErrInvalidConfig) true.
func (e *EvictionError) Is(target error) bool {
	return target == store.ErrMisconfigured || target == store.ErrInvalidConfig
}

// CheckSettings implements [store.SettingsChecker]: one check, "eviction",
// which reads INFO memory on the server (every master of a cluster, every
// shard of a ring, the primary behind Sentinel) and answers an
// [*EvictionError] for a server that may evict keys (several joined, one
// per server), or store.ErrUnavailable when it cannot tell: the server
// did not answer, or the ACL refuses INFO (the error says so, with the
// ACL SETUSER that allows it). With Config.AllowEviction it checks
// nothing.
func (s *Store) CheckSettings(ctx context.Context) []store.SettingCheck {
	if s.cfg.AllowEviction {
		return nil
	}
	err := s.checkEviction(ctx)
	var ae *ACLError
	if errors.As(err, &ae) {
		// Not a setting found wrong: a setting that could not be read.
		err = fmt.Errorf("redisstore: eviction not checked: %w: %v", store.ErrUnavailable, ae)
	}
	return []store.SettingCheck{{Name: "eviction", Err: err}}
}

// checkEviction reads maxmemory and maxmemory_policy (INFO memory, which
// managed services that disable CONFIG still answer) on every server the
// store writes to, and answers an *EvictionError for each that may evict.
func (s *Store) checkEviction(ctx context.Context) error {
	var (
		mu   sync.Mutex
		errs []error
	)
	one := func(ctx context.Context, c redis.UniversalClient, addr string) error {
		err := readEviction(ctx, c, addr)
		if ee, ok := err.(*EvictionError); ok && ee.Addr == "" {
			ee.Addr = serverAddr(ctx, c)
		}
		if err != nil {
			var re redis.Error
			if errors.As(err, &re) && strings.HasPrefix(re.Error(), "NOPERM") {
				user, _ := c.Do(ctx, "acl", "whoami").Text() // best effort, for the message
				err = &ACLError{User: user, Command: "INFO", Prefix: s.cfg.Prefix, Err: err}
			} else if !errors.Is(err, store.ErrMisconfigured) {
				err = s.translate(strings.TrimSpace("check eviction on "+addr), "", err)
			}
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		return nil
	}
	var err error
	switch {
	case s.cluster != nil:
		err = s.cluster.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			return one(ctx, n, n.Options().Addr)
		})
	default:
		if r, ok := s.c.(*redis.Ring); ok {
			err = r.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
				return one(ctx, n, n.Options().Addr)
			})
			break
		}
		_ = one(ctx, s.c, clientAddr(s.c))
	}
	if err != nil {
		errs = append(errs, s.translate("check eviction", "", err))
	}
	// Sorted, so that the message is the same at every check.
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// clientAddr is the address of the server a client talks to, "" when
// its options do not say (a Sentinel's primary, an AutoPipeliner).
func clientAddr(c redis.UniversalClient) string {
	if o, ok := c.(interface{ Options() *redis.Options }); ok && o.Options().Addr != "FailoverClient" {
		return o.Options().Addr
	}
	return ""
}

// serverAddr asks the server c talks to for its address, as it sees the
// connection (CLIENT INFO's laddr), for a message.
func serverAddr(ctx context.Context, c redis.UniversalClient) string {
	if info, err := c.Do(ctx, "client", "info").Text(); err == nil {
		for f := range strings.FieldsSeq(info) {
			if v, ok := strings.CutPrefix(f, "laddr="); ok {
				return v
			}
		}
	}
	return "the server"
}

// readEviction reads INFO memory from c (the server at addr) and returns
// an *EvictionError when it may evict keys.
func readEviction(ctx context.Context, c redis.Cmdable, addr string) error {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return err
	}
	var (
		maxMemory int64
		policy    string
		haveMax   bool
	)
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "maxmemory":
			maxMemory, err = strconv.ParseInt(v, 10, 64)
			haveMax = err == nil
		case "maxmemory_policy":
			policy = v
		}
	}
	if !haveMax {
		return &EvictionError{Addr: addr, Policy: policy, MaxMemory: -1}
	}
	if maxMemory == 0 || policy == "noeviction" { // maxmemory 0: no limit, nothing is evicted
		return nil
	}
	return &EvictionError{Addr: addr, Policy: policy, MaxMemory: maxMemory}
}
