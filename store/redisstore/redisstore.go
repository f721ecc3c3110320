// Package redisstore is the idem store on Redis (go-redis v9).
//
// # Round trips and scripts
//
// A record is one string under one key (Config.Prefix + the idem key),
// laid out (see layout.go) so that:
//
//   - a claim of an absent key is one plain SET NX GET, no script: its
//     reply is nil when the claim was written, or the live record, which
//     answers a conflict or the caller's own retried claim in the same
//     round trip. Only a record that may have to be taken over (expired,
//     or its lease passed) costs a second round trip, the claim script,
//     which decides absent / expired / lease passed / conflict atomically
//     and increments the fence;
//   - Complete, Fail, Release and Extend are one small Lua script each
//     (EVALSHA, loaded on a NOSCRIPT miss) that checks the claim by
//     comparing the record's prefix with the writer's fence and owner,
//     checks status and expiry, and writes the new value with SET;
//   - a batch of Completes ([Store.CompleteBatch]) or of Extends
//     ([Store.ExtendBatch]) is one invocation of a batch script per
//     master and per 128 writes, all in one pipeline, which decides each
//     write by the same code as the single script (fence.lua), each with
//     its own answer.
//   - a step ([Store.RecordStep]) is one invocation of the fenced script,
//     which checks the claim and the number of steps the record holds and
//     appends the step to the record: on a record of 512 bytes or more in
//     place (GETRANGE of its head, SETRANGE of the steps' header, APPEND
//     of the step), so that the steps held do not pass through the
//     script, else by rewriting it (SET); a takeover by a claim with the
//     record's fingerprint copies the steps into the new claim in the claim
//     script, and its answer carries them.
//
// The scripts declare themselves with a shebang (#!lua, Redis 7.0 or
// later), so that a replica refuses them outright (READONLY, unavailable)
// instead of running their reads: a client still pointed at a demoted
// primary must not take a replica's copy for the record (a fenced write
// that found the key absent there would be answered "not found").
//
// Expiry is checked from the caller's Now; the key also carries a native
// expiry (PXAT expires_at), which only reclaims memory. No operation
// touches two keys but a batch (below).
//
// # Redis Cluster
//
// Give [New] a *redis.ClusterClient, or [Open] a redis+cluster:// URL. Every
// operation but listing names one key, so the cluster routes it to the
// key's master. Listing scans every master in turn (see [Store.List]).
// WaitReplicas sends its WAIT on the connection of the master that took
// the write (see [Config]). A MOVED or ASK reply is followed, and after any
// error that may mean the client's map of the slots is stale (a dead
// master's "connection refused", MOVED, CLUSTERDOWN) the store asks the
// client to reload the map: go-redis does so by itself only on a MOVED it
// sees and every ClusterStateReloadInterval (60 s by default), which left
// a dead master's keys failing for up to a minute after its replica took
// over. The whole contract, the fault suite and a failover under load run
// on a real 3+3 cluster in the tests (scripts/redis-cluster).
//
// # Many calls in flight
//
// [New] takes any go-redis UniversalClient, go-redis's AutoPipeliner
// (client.AutoPipeline()) among them: concurrent calls' commands then
// share pipelines, which saves most of the per-command system calls on
// both sides (docs/benchmarks.md has the figures). A command queued there
// no longer follows its context's deadline; the client's timeouts bound
// it. An AutoPipeliner hides the client it pipelines for: on Redis Cluster
// name the cluster client in Config.Cluster too, so that listing, WAIT and
// the map refresh reach the nodes.
//
// # Durability: what Redis does and does not promise
//
// Redis acknowledges a write when the primary has applied it in memory.
// With persistence off (or appendfsync everysec) a crash loses the last
// writes; with replicas, replication is asynchronous, so a failover can
// promote a replica that never received an acknowledged claim or
// completion — a duplicate may then run a second time. The failover tests
// measured it (docs/failover.md): with WaitReplicas 0 a failover under load
// lost some acknowledged outcomes; with WaitReplicas 1 (every master with
// one replica) it lost none. WAIT n timeout (see Config.WaitReplicas)
// blocks until n replicas have the write; it is not consensus: a write
// WAIT timed out on is still applied on the primary (the call reports it
// unavailable and the engine retries or fails closed), and with more
// replicas than WaitReplicas a failover can still promote one that lags.
// WaitReplicas equal to the replicas each master has closes that gap, at
// the price of refusing writes to a shard while it has fewer replicas.
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/seed-a1b882c0/idem/store"
)

//go:embed claim.lua
var claimSrc string

//go:embed fence.lua
var fenceSrc string

//go:embed fenced.lua
var fencedMain string

//go:embed complete.lua
var completeMain string

//go:embed extend.lua
var extendMain string

var (
	claimScript = redis.NewScript(claimSrc)

	// fencedSrc, completeSrc and extendSrc decide each write by the same
	// code (fence.lua): one write, and a batch of Completes or of Extends
	// in one invocation.
	fencedSrc      = withFence(fencedMain)
	completeSrc    = withFence(completeMain)
	extendSrc      = withFence(extendMain)
	fencedScript   = redis.NewScript(fencedSrc)
	completeScript = redis.NewScript(completeSrc)
	extendScript   = redis.NewScript(extendSrc)

	// scriptSources are the sources [Store.evalsha] and [Store.script]
	// send on NOSCRIPT.
	scriptSources = map[*redis.Script]string{claimScript: claimSrc, fencedScript: fencedSrc, completeScript: completeSrc, extendScript: extendSrc}
)

// withFence is the script src with fence.lua in place of its line
// "--fence.lua--".
func withFence(src string) string {
	return strings.Replace(src, "--fence.lua--\n", fenceSrc, 1)
}

// Config configures a [Store]. A nil *Config means all defaults.
type Config struct {
	// Prefix is put before every idem key, to share a Redis with other
	// data or isolate tenants/tests. Default "idem:".
	Prefix string
	// MaxResultBytes bounds a stored result or error. Default 16 MiB.
	MaxResultBytes int
	// WaitReplicas, when > 0, makes every write wait (Redis WAIT, sent in
	// one pipeline with the write, on the connection of the node that took
	// it) until that many replicas acknowledged it, at most WaitTimeout
	// (default 1s); a write not acknowledged in time fails with
	// store.ErrUnavailable (it may still have been applied on the
	// primary). A claim may write nothing (a replay, a conflict): it is
	// sent alone, and its WAIT follows on the same connection only if it
	// wrote, so a replay never waits for replicas (with one down it would
	// wait all of WaitTimeout). See the package doc and docs/failover.md.
	WaitReplicas int
	// WaitTimeout bounds WaitReplicas.
	WaitTimeout int // ms
	// Cluster is the Redis Cluster client behind the client given to
	// [New], when that client is not the *redis.ClusterClient itself (an
	// AutoPipeliner of one). Nil otherwise.
	Cluster *redis.ClusterClient
	// AllowEviction accepts a Redis that may evict keys when its memory
	// runs short (maxmemory set and a maxmemory-policy other than
	// noeviction): records may then be forgotten before their expiry,
	// IN_PROGRESS claims and stored outcomes alike, and operations may run
	// again. Without it [Store.Check] refuses such a server with an
	// [*EvictionError]; with it, Check logs a warning to Logger instead,
	// and [Store.CheckSettings] (the monitor's check) reports nothing.
	// Default false: records stay until their expiry. See docs/redis.md.
	AllowEviction bool
	// Logger receives the warning of AllowEviction. Default
	// slog.Default().
	Logger *slog.Logger
}

// Store is an [store.Store] on Redis. It also implements [store.Lister],
// [store.Deleter], [store.Stepper] and [Store.ClaimBatch].
type Store struct {
	c       redis.UniversalClient
	cluster *redis.ClusterClient // c, when it is a cluster client; else nil
	cfg     Config
	owned   bool // Close closes c

	lent sync.Map // *redis.Client → *lender: see lend
}

// SystemName implements store.SystemNamer: the backend's db.system.name in
// the OpenTelemetry database semantic conventions, "redis".
func (s *Store) SystemName() string { return "redis" }

var (
	_ store.Store        = (*Store)(nil)
	_ store.Lister       = (*Store)(nil)
	_ store.Deleter      = (*Store)(nil)
	_ store.BatchClaimer = (*Store)(nil)
	_ store.Stepper      = (*Store)(nil)
)

// New returns a store using the caller's client (a *redis.Client,
// *redis.ClusterClient, *redis.Ring or failover client, TLS configured as
// the caller wishes). Close does not close it.
func New(c redis.UniversalClient, cfg *Config) (*Store, error) {
	if c == nil {
		return nil, fmt.Errorf("redisstore: nil client: %w", store.ErrInvalidConfig)
	}
	var conf Config
	if cfg != nil {
		conf = *cfg
	}
	if conf.Prefix == "" {
		conf.Prefix = "idem:"
	}
	if conf.MaxResultBytes == 0 {
		conf.MaxResultBytes = 16 << 20
	}
	if conf.MaxResultBytes < 0 || conf.WaitReplicas < 0 || conf.WaitTimeout < 0 {
		return nil, fmt.Errorf("redisstore: negative MaxResultBytes, WaitReplicas or WaitTimeout: %w", store.ErrInvalidConfig)
	}
	if conf.WaitTimeout == 0 {
		conf.WaitTimeout = 1000
	}
	if conf.Logger == nil {
		conf.Logger = slog.Default()
	}
	cluster, _ := c.(*redis.ClusterClient)
	if conf.Cluster != nil {
		cluster = conf.Cluster
	}
	return &Store{c: c, cluster: cluster, cfg: conf}, nil
}

// Open connects to Redis by URL and returns a store that owns the client:
//
//	redis://[user:pass@]host:port/db            one server (rediss:// for TLS)
//	redis+cluster://[user:pass@]host:port?addr=host:port&addr=…
//	                                            Redis Cluster from seed nodes (rediss+cluster:// for TLS)
//	redis+sentinel://[user:pass@]host:port/db?master_name=NAME&addr=host:port&…
//	                                            the primary named NAME, found by asking the
//	                                            Sentinels (rediss+sentinel:// for TLS)
//
// The URL's user and password are the Redis servers' in the first two
// forms and the Sentinels' in the third (password= and username= in the
// query are the servers'). The query takes go-redis's client options by
// their snake-case names (dial_timeout, read_timeout, pool_size, …): see
// go-redis's ParseURL, ParseClusterURL and ParseFailoverURL. A cluster
// client's map of the slots is refreshed every
// cluster_state_reload_interval (a duration; default here 5s, go-redis's
// own 60s) and by the store after any error that may mean the map is
// stale: see docs/failover.md.
func Open(url string, cfg *Config) (*Store, error) {
	c, err := NewClient(url)
	if err != nil {
		return nil, err
	}
	s, err := New(c, cfg)
	if err != nil {
		c.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// NewClient returns the go-redis client for a URL in one of the forms
// [Open] takes, without connecting.
func NewClient(raw string) (redis.UniversalClient, error) {
	bad := func(err error) error { return fmt.Errorf("redisstore: %w: %w", store.ErrInvalidConfig, err) }
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, bad(fmt.Errorf("URL %q has no scheme: write redis://, rediss://, redis+cluster:// or redis+sentinel://", raw))
	}
	base, kind, _ := strings.Cut(strings.ToLower(scheme), "+")
	if base != "redis" && base != "rediss" {
		return nil, bad(fmt.Errorf("URL scheme %q: write redis://, rediss://, redis+cluster:// or redis+sentinel://", scheme))
	}
	u := base + "://" + rest
	switch kind {
	case "":
		opt, err := redis.ParseURL(u)
		if err != nil {
			return nil, bad(err)
		}
		opt.MaintNotificationsConfig = noMaintNotifications()
		return redis.NewClient(opt), nil
	case "cluster":
		reload, u, err := takeParam(u, "cluster_state_reload_interval")
		if err != nil {
			return nil, bad(err)
		}
		opt, err := redis.ParseClusterURL(u)
		if err != nil {
			return nil, bad(err)
		}
		opt.ClusterStateReloadInterval = 5 * time.Second
		if reload != "" {
			if opt.ClusterStateReloadInterval, err = time.ParseDuration(reload); err != nil || opt.ClusterStateReloadInterval <= 0 {
				return nil, bad(fmt.Errorf("cluster_state_reload_interval=%q: a positive duration such as 5s", reload))
			}
		}
		opt.MaintNotificationsConfig = noMaintNotifications()
		return redis.NewClusterClient(opt), nil
	case "sentinel":
		opt, err := redis.ParseFailoverURL(u)
		if err != nil {
			return nil, bad(err)
		}
		if opt.MasterName == "" {
			return nil, bad(fmt.Errorf("URL %q names no primary: add master_name=NAME, as the Sentinels know it", raw))
		}
		return redis.NewFailoverClient(opt), nil
	}
	return nil, bad(fmt.Errorf("URL scheme %q: write redis://, rediss://, redis+cluster:// or redis+sentinel://", scheme))
}

// noMaintNotifications turns go-redis's maintenance notifications off
// (a handoff protocol of Redis Enterprise and Redis Cloud, which Redis
// Open Source does not speak). In its default mode, auto, a client tries
// it on each new connection and, refused, turns it off by writing its
// options; a connection lent for the caller's use alone (Conn: the WAIT
// after a write, Config.WaitReplicas) shares those options but not their
// lock, and the race detector sees the two race (go-redis v9.23). Off
// from the start, nothing is written.
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// takeParam removes the query parameter name from the URL raw and returns
// its value.
func takeParam(raw, name string) (string, string, error) {
	u, err := neturl.Parse(raw)
	if err != nil {
		return "", "", err
	}
	q := u.Query()
	v := q.Get(name)
	q.Del(name)
	u.RawQuery = q.Encode()
	return v, u.String(), nil
}

// Close closes the client if the store opened it ([Open]).
func (s *Store) Close() error {
	if s.owned {
		return s.c.Close()
	}
	return nil
}

// Ping checks that Redis answers, within the client's DialTimeout: go-redis
// retries a refused dial (DialerRetries) and then the command
// (MaxRetries), which without a bound makes a Redis that is down take
// several dial timeouts to report — and every attempt of a caller that
// waits for its store (storeurl.OpenWait, the gateway) as long. A live
// Redis answers a ping in far less than a dial timeout.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.dialTimeout())
	defer cancel()
	if err := s.c.Ping(ctx).Err(); err != nil {
		return s.translate("ping", "", err)
	}
	return nil
}

// dialTimeout is the client's DialTimeout (go-redis's default, 5s, when
// the client is of a kind this store does not know).
func (s *Store) dialTimeout() time.Duration {
	var d time.Duration
	switch c := s.c.(type) {
	case *redis.Client:
		d = c.Options().DialTimeout
	case *redis.ClusterClient:
		d = c.Options().DialTimeout
	case *redis.Ring:
		d = c.Options().DialTimeout
	}
	if d <= 0 {
		d = 5 * time.Second
	}
	return d
}

// SetLogger sends go-redis's own log lines (a dial that failed, a pool
// that ran dry: the lines it writes to stderr by default) to l, at level
// WARN with the message "go-redis" and the line as "detail", so that a
// process logging JSON keeps every line JSON. go-redis's logger is
// global: this sets it for every client of the process.
func SetLogger(l *slog.Logger) { redis.SetLogger(redisLogger{l}) }

type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, "go-redis", "detail", fmt.Sprintf(format, v...))
}

func (s *Store) rkey(key string) string { return s.cfg.Prefix + key }

// Claim implements [store.Store]. A key that is absent takes one SET NX GET
// (no script): the reply is nil when the claim was written, or the live
// record otherwise, which answers a conflict or the caller's own retried
// claim in the same round trip. Only a record that may have to be taken
// over (expired, or its lease passed) costs a second round trip: the claim script, which decides atomically.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	k := s.rkey(p.Key)
	r, w, err := s.do(ctx, k, claimWrote, "set", k, encodeClaim(p), "nx", "get", "pxat", p.ExpiresAt)
	switch {
	case err != nil:
		return store.ClaimResult{}, s.translate("claim", p.Key, err)
	case r.kind == '_': // written
		res, _ := store.ApplyClaim(nil, p)
		return res, s.waited("claim", p.Key, w)
	case r.kind != '$':
		return store.ClaimResult{}, s.errorReply("claim", p.Key, r)
	}
	rec, err := decodeValue(p.Key, r.str)
	if err != nil {
		return store.ClaimResult{}, err
	}
	res, write := store.ApplyClaim(rec, p)
	if write != nil { // expired, or its lease passed: the script decides
		return s.claimScripted(ctx, p)
	}
	return res, nil // a conflict, or the caller's own claim
}

// claimScripted claims p.Key with the claim script.
func (s *Store) claimScripted(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	cmd, w := s.script(ctx, claimScript, s.rkey(p.Key), claimScriptWrote, s.claimArgs(p)...)
	return s.claimAnswer(p, cmd, w)
}

// claimAnswer reads the claim script's reply to p, and the WAIT that
// followed it when it wrote.
func (s *Store) claimAnswer(p store.ClaimParams, cmd *redis.Cmd, w *redis.IntCmd) (store.ClaimResult, error) {
	v, err := cmd.Slice()
	if err != nil {
		return store.ClaimResult{}, s.translate("claim", p.Key, err)
	}
	res, err := s.claimResult(p, v)
	if err == nil && res.Acquired {
		err = s.waited("claim", p.Key, w)
	}
	return res, err
}

// claimWrote tells from the reply of a claim's SET NX GET whether it
// wrote: a nil reply. Otherwise it found a record and wrote nothing (a
// replay, a conflict), and waits for no replica (see [Store.send]).
func claimWrote(r reply) bool { return r.kind == '_' }

// claimSetWrote is claimWrote for a SET NX GET sent as a *redis.Cmd (in
// a batch).
func claimSetWrote(c redis.Cmder) bool { return c.Err() == redis.Nil }

// claimScriptWrote tells from the claim script's reply whether it wrote:
// {1, fence, takeover}.
func claimScriptWrote(c redis.Cmder) bool {
	v, err := c.(*redis.Cmd).Slice()
	return err == nil && len(v) > 0 && v[0] == int64(1)
}

func (s *Store) claimArgs(p store.ClaimParams) []any {
	hold := "0"
	if p.NoTakeover {
		hold = "1"
	}
	return []any{p.Now, appendClaimRest(nil, p), p.ExpiresAt, hold, p.Fingerprint}
}

// claimResult decodes the claim script's reply.
func (s *Store) claimResult(p store.ClaimParams, v []any) (store.ClaimResult, error) {
	code, _ := v[0].(int64)
	switch code {
	case 1: // written: {1, fence, takeover, steps}
		if len(v) < 4 {
			return store.ClaimResult{}, scriptCorrupt(p.Key, v)
		}
		fence, err := strconv.ParseUint(fmt.Sprint(v[1]), 10, 64)
		if err != nil {
			return store.ClaimResult{}, scriptCorrupt(p.Key, v)
		}
		takeover, _ := v[2].(int64)
		var steps []store.Step
		if enc, _ := v[3].(string); enc != "" {
			if steps, err = decodeSteps(p.Key, enc); err != nil {
				return store.ClaimResult{}, err
			}
		}
		var old *store.Record
		if fence > 1 {
			// The old record only matters for its fence and whether it had
			// expired; rebuild that much so ApplyClaim agrees with the
			// script.
			old = &store.Record{Fence: fence - 1, Status: store.StatusInProgress, ExpiresAt: p.Now, LeaseUntil: p.Now}
			if takeover == 1 {
				old.ExpiresAt = p.Now + 1
			}
			if steps != nil { // carried: the fingerprints are equal
				old.Fingerprint, old.Steps = p.Fingerprint, steps
			}
			if p.NoTakeover { // the script replaced a settled record only
				old.Status = store.StatusCompleted
			}
		}
		res, write := store.ApplyClaim(old, p)
		if write == nil || res.Record.Fence != fence || len(res.Record.Steps) != len(steps) {
			return store.ClaimResult{}, &store.CorruptError{Key: p.Key, Reason: "claim script and client disagree"}
		}
		return res, nil
	case 0: // conflict: {0, value}
		cur, ok := v[1].(string)
		if !ok {
			return store.ClaimResult{}, scriptCorrupt(p.Key, v)
		}
		rec, err := decodeValue(p.Key, cur)
		if err != nil {
			return store.ClaimResult{}, err
		}
		res, write := store.ApplyClaim(rec, p)
		if write != nil {
			return store.ClaimResult{}, &store.CorruptError{Key: p.Key, Reason: "claim script refused a claimable record"}
		}
		return res, nil
	}
	return store.ClaimResult{}, scriptCorrupt(p.Key, v)
}

func scriptCorrupt(key string, v []any) error {
	reason := "unexpected script reply"
	if len(v) > 1 {
		if r, ok := v[1].(string); ok {
			reason = r
		}
	}
	return &store.CorruptError{Key: key, Reason: reason}
}

// ClaimBatch implements [store.BatchClaimer] as Claim does, for every
// claim in one pipeline: one SET NX GET per claim (no script), so that a
// batch of new keys and duplicates costs Redis what hand-written SET NX
// commands would, in one round trip. The claims whose record may have to
// be taken over (expired, or its lease passed), and every later claim of
// the same key, which must see what the first decides, go in a second
// pipeline through the claim script, in order, as Claim sends one. A key
// named twice sees its first claim. Results and errors are per key, in the
// order of ps; a failed claim has a nil-Record result and an error.
func (s *Store) ClaimBatch(ctx context.Context, ps []store.ClaimParams) ([]store.ClaimResult, []error) {
	res := make([]store.ClaimResult, len(ps))
	errs := make([]error, len(ps))
	keys := make([]string, len(ps))
	for i, p := range ps {
		keys[i] = p.Key
	}
	var again []int              // the claims the claim script decides
	var scripted map[string]bool // their keys
	s.pipelined(ctx, "claim", keys, errs, func(i int, _ bool) *redis.Cmd {
		p := ps[i]
		return redis.NewCmd(ctx, "set", s.rkey(p.Key), encodeClaim(p), "nx", "get", "pxat", p.ExpiresAt)
	}, claimSetWrote, func(i int, cmd *redis.Cmd, w *redis.IntCmd) {
		p := ps[i]
		v, err := cmd.Text()
		switch {
		case err == redis.Nil: // written
			res[i], _ = store.ApplyClaim(nil, p)
			errs[i] = s.waited("claim", p.Key, w)
			return
		case err != nil:
			errs[i] = s.translate("claim", p.Key, err)
			return
		case scripted[p.Key]:
			again = append(again, i)
			return
		}
		rec, err := decodeValue(p.Key, v)
		if err != nil {
			errs[i] = err
			return
		}
		r, write := store.ApplyClaim(rec, p)
		if write != nil { // expired, or its lease passed: the script decides
			if scripted == nil {
				scripted = map[string]bool{}
			}
			scripted[p.Key] = true
			again = append(again, i)
			return
		}
		res[i] = r // a conflict, or the caller's own claim
	})
	if len(again) == 0 {
		return res, errs
	}
	slices.Sort(again) // the groups of a cluster answer one after the other
	sub, subErrs := make([]string, len(again)), make([]error, len(again))
	for j, i := range again {
		sub[j] = keys[i]
	}
	s.pipelined(ctx, "claim", sub, subErrs, func(j int, source bool) *redis.Cmd {
		return scriptCmd(ctx, claimScript, s.rkey(sub[j]), s.claimArgs(ps[again[j]]), source)
	}, claimScriptWrote, func(j int, cmd *redis.Cmd, w *redis.IntCmd) {
		i := again[j]
		res[i], errs[i] = s.claimAnswer(ps[i], cmd, w)
	})
	for j, i := range again {
		if subErrs[j] != nil {
			errs[i] = subErrs[j]
		}
	}
	return res, errs
}

// group is the writes of a batch that one pipeline sends.
type group struct {
	idx  []int
	pipe func() redis.Pipeliner
	conn func() (*redis.Conn, error) // the node's connection, or nil (see connFor)
}

// groups splits a batch of writes to keys into the pipelines that send
// it: one, through the client; but on Redis Cluster with byMaster (a
// batch script, which must run on the node of its keys) or with
// Config.WaitReplicas, one per master, on that master's own client, so
// that each master's WAIT follows the writes on the connection that sent
// them (see send). A key whose master cannot be found has its error (for op) set in
// errs and is in no group.
func (s *Store) groups(ctx context.Context, op string, keys []string, errs []error, byMaster bool) []group {
	if s.cluster == nil || !byMaster && s.cfg.WaitReplicas <= 0 {
		all := make([]int, len(keys))
		for i := range all {
			all[i] = i
		}
		g := group{idx: all, pipe: s.c.Pipeline}
		if c, ok := s.c.(*redis.Client); ok && s.cfg.WaitReplicas > 0 {
			g.conn = func() (*redis.Conn, error) { return s.lend(ctx, c) }
		}
		return []group{g}
	}
	var out []group
	at := map[*redis.Client]int{}
	for i, k := range keys {
		node, err := s.cluster.MasterForKey(ctx, s.rkey(k))
		if err != nil {
			errs[i] = s.translate(op, k, err)
			continue
		}
		j, ok := at[node]
		if !ok {
			j = len(out)
			at[node] = j
			out = append(out, group{pipe: node.Pipeline, conn: func() (*redis.Conn, error) { return s.lend(ctx, node) }})
		}
		out[j].idx = append(out[j].idx, i)
	}
	return out
}

// CompleteBatch implements [store.BatchCompleter]: the Completes in one
// invocation of complete.lua (on Redis Cluster one per master, and one per
// 128 writes), which decides each by the code that decides Complete's
// (fence.lua), so each keeps its own condition and answer.
func (s *Store) CompleteBatch(ctx context.Context, ps []store.CompleteParams) []error {
	errs := make([]error, len(ps))
	keys := make([]string, 0, len(ps))
	idx := make([]int, 0, len(ps)) // the params sent: not refused as too large
	for i, p := range ps {
		if len(p.Result) > s.cfg.MaxResultBytes {
			errs[i] = &store.TooLargeError{Key: p.Key, Size: len(p.Result), Limit: s.cfg.MaxResultBytes}
			continue
		}
		keys, idx = append(keys, p.Key), append(idx, i)
	}
	if len(keys) == 0 {
		return errs
	}
	sent := make([]error, len(keys))
	s.scripted(ctx, "complete", fencedScript, completeScript, keys, sent, func(j int) []any {
		p := ps[idx[j]]
		return append(s.fencedArgs("settle", p.ClaimRef), "2", p.ExpiresAt, completeTail(p.Now, p.Result))
	}, func(j int) []any {
		p := ps[idx[j]]
		a := s.fencedArgs("", p.ClaimRef)[1:] // tag, now, from
		return append(a, p.ExpiresAt, completeTail(p.Now, p.Result))
	}, func(j int, v any, err error, w *redis.IntCmd) {
		sent[j] = s.fencedAnswer("complete", ps[idx[j]].ClaimRef, v, err, w)
	})
	for j, i := range idx {
		errs[i] = sent[j]
	}
	return errs
}

// ExtendBatch implements [store.BatchExtender]: the Extends in one
// invocation of extend.lua (on Redis Cluster one per master, and one per
// 128 writes), which decides each by the code that decides Extend's
// (fence.lua), so each keeps its own condition, lease and answer. An
// Extend that [store.ExtendParams.Check] refuses is not sent.
func (s *Store) ExtendBatch(ctx context.Context, ps []store.ExtendParams) []error {
	errs := make([]error, len(ps))
	keys := make([]string, 0, len(ps))
	idx := make([]int, 0, len(ps)) // the params sent: not refused by Check
	for i, p := range ps {
		if err := p.Check(); err != nil {
			errs[i] = err
			continue
		}
		keys, idx = append(keys, p.Key), append(idx, i)
	}
	if len(keys) == 0 {
		return errs
	}
	sent := make([]error, len(keys))
	s.scripted(ctx, "extend", fencedScript, extendScript, keys, sent, func(j int) []any {
		p := ps[idx[j]]
		return append(s.fencedArgs("extend", p.ClaimRef), p.LeaseUntil, p.Ref)
	}, func(j int) []any {
		p := ps[idx[j]]
		a := s.fencedArgs("", p.ClaimRef)[1:] // tag, now, from
		return append(a, p.LeaseUntil, p.Ref)
	}, func(j int, v any, err error, w *redis.IntCmd) {
		sent[j] = s.fencedAnswer("extend", ps[idx[j]].ClaimRef, v, err, w)
	})
	for j, i := range idx {
		errs[i] = sent[j]
	}
	return errs
}

// fenced runs the fenced script for op ("settle", "release", "extend") for
// the claim c; name is the operation's name in errors.
func (s *Store) fenced(ctx context.Context, op, name string, c store.ClaimRef, extra ...any) error {
	r, w, err := s.evalsha(ctx, fencedScript, s.rkey(c.Key), append(s.fencedArgs(op, c), extra...)...)
	if err != nil {
		return s.translate(name, c.Key, err)
	}
	switch {
	case r.kind == ':' && r.n == 0:
		return s.waited(name, c.Key, w)
	case r.kind == ':' && r.n == 1:
		return store.ErrNotFound
	case r.kind == '$':
		return s.refusal(c, r.str)
	}
	return s.errorReply(name, c.Key, r)
}

// fencedArgs are the fenced script's first arguments for op on claim c.
func (s *Store) fencedArgs(op string, c store.ClaimRef) []any {
	tag := appendTag(make([]byte, 0, 32+len(c.Owner)), c.Fence, c.Owner)
	return []any{op, tag, c.Now, int(c.From.OrInProgress())}
}

// fencedAnswer reads the fenced script's reply to one write of a batch
// (v, or the error of its command or invocation), as fenced reads its
// own; {-2, message} is the error the script met for this write alone
// (complete.lua).
func (s *Store) fencedAnswer(name string, c store.ClaimRef, v any, err error, w *redis.IntCmd) error {
	if err != nil {
		return s.translate(name, c.Key, err)
	}
	switch v := v.(type) {
	case int64:
		switch v {
		case 0:
			return s.waited(name, c.Key, w)
		case 1:
			return store.ErrNotFound
		}
	case string:
		return s.refusal(c, v)
	case []any:
		if msg, ok := raised(v); ok {
			return s.errorReply(name, c.Key, reply{kind: '-', str: msg})
		}
	}
	return fmt.Errorf("redisstore: %s %s: %w: unexpected reply %v", name, c.Key, store.ErrUnavailable, v)
}

// refusal is the error of a write the fenced script refused, from the
// record it answered with (rec).
func (s *Store) refusal(c store.ClaimRef, rec string) error {
	r, err := decodeValue(c.Key, rec)
	if err != nil {
		return err
	}
	if err := store.CheckFence(r, c); err != nil {
		return err
	}
	return &store.CorruptError{Key: c.Key, Reason: "fenced script refused a write the record allows"}
}

// Complete implements [store.Store].
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	if len(p.Result) > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: len(p.Result), Limit: s.cfg.MaxResultBytes}
	}
	return s.fenced(ctx, "settle", "complete", p.ClaimRef,
		"2", p.ExpiresAt, completeTail(p.Now, p.Result))
}

// Fail implements [store.Store].
func (s *Store) Fail(ctx context.Context, p store.FailParams) error {
	if err := p.Check(); err != nil {
		return err
	}
	if n := p.Err.Size(); n > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: n, Limit: s.cfg.MaxResultBytes}
	}
	return s.fenced(ctx, "settle", "fail", p.ClaimRef,
		"3", p.ExpiresAt, failTail(p.Now, p.Err))
}

// Release implements [store.Store].
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	return s.fenced(ctx, "release", "release", p.ClaimRef)
}

// Extend implements [store.Store].
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	if err := p.Check(); err != nil {
		return err
	}
	return s.fenced(ctx, "extend", "extend", p.ClaimRef, p.LeaseUntil, p.Ref)
}

// RecordStep implements [store.Stepper] with one script (fenced.lua's
// step), which checks the claim as Complete's does, checks that the
// record holds p.Index steps (or step p.Index under p.Step.Name: a
// retry), checks the steps' size against MaxResultBytes, and appends
// the step to the record's payload (in place on a long record:
// fenced.lua's appended).
func (s *Store) RecordStep(ctx context.Context, p store.StepParams) error {
	if err := p.Check(); err != nil {
		return err
	}
	if n := p.Step.Size(); n > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: n, Limit: s.cfg.MaxResultBytes}
	}
	r, w, err := s.evalsha(ctx, fencedScript, s.rkey(p.Key), append(s.fencedArgs("step", p.ClaimRef),
		p.Index, p.Step.Name, p.Step.Size(), encodeStep(p.Step), s.cfg.MaxResultBytes)...)
	if err != nil {
		return s.translate("record step", p.Key, err)
	}
	switch {
	case r.kind == ':' && r.n == 0:
		return s.waited("record step", p.Key, w)
	case r.kind == ':' && r.n == 1:
		return store.ErrNotFound
	case r.kind == '$':
		return s.refusal(p.ClaimRef, r.str)
	case r.kind == '+':
		what, n, _ := strings.Cut(r.str, " ")
		switch what {
		case "order":
			at := "another step there"
			if held, err := strconv.Atoi(n); err == nil && p.Index > held {
				at = "no step there"
			}
			return fmt.Errorf("%w: RecordStep of %q: step %q at index %d, but the record holds %s steps and %s", store.ErrInvalidParams, p.Key, p.Step.Name, p.Index, n, at)
		case "size":
			if size, err := strconv.Atoi(n); err == nil {
				return &store.TooLargeError{Key: p.Key, Size: size, Limit: s.cfg.MaxResultBytes}
			}
		}
	}
	return s.errorReply("record step", p.Key, r)
}

// Get implements [store.Store] with one GET.
func (s *Store) Get(ctx context.Context, key string) (*store.Record, error) {
	v, err := s.c.Get(ctx, s.rkey(key)).Result()
	switch {
	case err == redis.Nil:
		return nil, store.ErrNotFound
	case err != nil:
		return nil, s.translate("get", key, err)
	}
	return decodeValue(key, v)
}

// Delete implements [store.Deleter].
func (s *Store) Delete(ctx context.Context, key string) error {
	n, err := s.c.Del(ctx, s.rkey(key)).Result()
	if err != nil {
		return s.translate("delete", key, err)
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// waited checks the WAIT that followed a write (nil without
// Config.WaitReplicas).
func (s *Store) waited(op, key string, w *redis.IntCmd) error {
	if w == nil {
		return nil
	}
	n, err := w.Result()
	if err != nil {
		return s.translate(op, key, err)
	}
	if int(n) < s.cfg.WaitReplicas {
		return fmt.Errorf("redisstore: %s %s: %d of %d replicas acknowledged in %dms (applied on the primary): %w",
			op, key, n, s.cfg.WaitReplicas, s.cfg.WaitTimeout, store.ErrUnavailable)
	}
	return nil
}

// translate maps go-redis errors at the store boundary: a type error on
// the key or a script's own error is a damaged record (see damaged);
// everything else (network, timeout, pool exhausted, server loading, a
// primary demoted to a read-only replica, within a script too) is
// unavailable.
//
// On Redis Cluster a network error asks the client to refresh its map of
// the slots: the node may have died and its slots moved to a replica.
func (s *Store) translate(op, key string, err error) error {
	var re redis.Error
	if errors.As(err, &re) && !isNetErr(err) {
		msg := re.Error()
		if damaged(msg) {
			return &store.CorruptError{Key: key, Reason: msg}
		}
		if strings.HasPrefix(msg, "NOPERM") {
			return &ACLError{Command: op, Prefix: s.cfg.Prefix, Err: err}
		}
		s.redirected(msg)
	} else if !errors.Is(err, context.Canceled) { // a caller that gave up says nothing of the nodes
		s.refresh()
	}
	return fmt.Errorf("redisstore: %s %s: %w: %w", op, key, store.ErrUnavailable, err)
}

// damaged reports whether an error reply says the stored record is
// damaged: a type error on the key, an error the scripts raise themselves
// ("idem: ..."), or a script that failed at run time ("ERR ... user_script").
// An error a script met from the server — "READONLY ... script: ...", after
// a failover demoted the primary; LOADING, OOM, MASTERDOWN — is the
// server's state, not the record's: unavailable, so that writes are retried.
func damaged(msg string) bool {
	return strings.HasPrefix(msg, "WRONGTYPE") || strings.HasPrefix(msg, "idem: ") ||
		strings.HasPrefix(msg, "ERR") && strings.Contains(msg, "user_script")
}

func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

func isWrongType(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE")
}

// Prefix is the key prefix in use.
func (s *Store) Prefix() string { return s.cfg.Prefix }
