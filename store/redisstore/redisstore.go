// Package redisstore is the idem store on Redis (go-redis v9).
//
// # One script per operation
//
// Every operation is one atomic server-side Lua script, sent with EVALSHA
// and loaded on a miss (NOSCRIPT): Claim decides absent / expired / lease
// passed / conflict, increments the fence and, on conflict, returns the
// live record in the same round trip; Complete, Fail, Release and Extend
// check the fence and the status the write expects. Expiry is checked inside the scripts from the caller's
// Now; the key also carries a native expiry (PEXPIREAT expires_at), which
// only reclaims memory.
//
// A record is one hash under one key (Config.Prefix + the idem key): no
// script touches two keys, so the store is safe on Redis Cluster.
//
// # Durability: what Redis does and does not promise
//
// Redis acknowledges a write when the primary has applied it in memory.
// With persistence off (or appendfsync everysec) a crash loses the last
// writes; with replicas, replication is asynchronous, so a failover can
// promote a replica that never received an acknowledged claim or
// completion — a duplicate may then run a second time. WAIT n timeout
// (see [Store.WaitReplicas]) blocks until n replicas have the write, which
// narrows that window, but it does not make Redis strongly consistent: a
// write WAIT timed out on is still applied on the primary, and a failover
// can still pick a replica that lags. Where losing a claim is not
// acceptable, use PostgreSQL or DynamoDB.
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

//go:embed claim.lua
var claimSrc string

//go:embed fenced.lua
var fencedSrc string

var (
	claimScript  = redis.NewScript(claimSrc)
	fencedScript = redis.NewScript(fencedSrc)
)

// Config configures a [Store]. A nil *Config means all defaults.
type Config struct {
	// Prefix is put before every idem key, to share a Redis with other
	// data or isolate tenants/tests. Default "idem:".
	Prefix string
	// MaxResultBytes bounds a stored result or error. Default 16 MiB.
	MaxResultBytes int
	// WaitReplicas, when > 0, makes every write wait (Redis WAIT) until that
	// many replicas acknowledged it, at most WaitTimeout (default 1s); a
	// write not acknowledged in time fails with idem.ErrUnavailable (it
	// may still have been applied on the primary). See the package doc.
	WaitReplicas int
	// WaitTimeout bounds WaitReplicas.
	WaitTimeout int // ms
}

// Store is an [idem.Store] on Redis. It also implements [idem.Lister],
// [idem.Deleter] and [Store.ClaimBatch].
type Store struct {
	c     redis.UniversalClient
	cfg   Config
	owned bool // Close closes c
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.Lister  = (*Store)(nil)
	_ store.Deleter = (*Store)(nil)
)

// New returns a store using the caller's client (a *redis.Client,
// *redis.ClusterClient, *redis.Ring or failover client, TLS configured as
// the caller wishes). Close does not close it.
func New(c redis.UniversalClient, cfg *Config) (*Store, error) {
	if c == nil {
		return nil, fmt.Errorf("redisstore: nil client: %w", idem.ErrInvalidConfig)
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
		return nil, fmt.Errorf("redisstore: negative MaxResultBytes, WaitReplicas or WaitTimeout: %w", idem.ErrInvalidConfig)
	}
	if conf.WaitTimeout == 0 {
		conf.WaitTimeout = 1000
	}
	return &Store{c: c, cfg: conf}, nil
}

// Open connects to a Redis URL (redis://[user:pass@]host:port/db, or
// rediss:// for TLS) and returns a store that owns the client.
func Open(url string, cfg *Config) (*Store, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w: %w", idem.ErrInvalidConfig, err)
	}
	s, err := New(redis.NewClient(opt), cfg)
	if err != nil {
		return nil, err
	}
	s.owned = true
	return s, nil
}

// Close closes the client if the store opened it ([Open]).
func (s *Store) Close() error {
	if s.owned {
		return s.c.Close()
	}
	return nil
}

// Ping checks that Redis answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.c.Ping(ctx).Err(); err != nil {
		return s.translate("ping", "", err)
	}
	return nil
}

func (s *Store) rkey(key string) string { return s.cfg.Prefix + key }

func (s *Store) claimArgs(p store.ClaimParams) []any {
	return []any{p.Now, p.LeaseUntil, p.ExpiresAt, p.Owner, p.Fingerprint, store.RecordVersion}
}

// Claim implements [idem.Store] with one script call.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	v, err := claimScript.Run(ctx, s.c, []string{s.rkey(p.Key)}, s.claimArgs(p)...).Slice()
	if err != nil {
		return store.ClaimResult{}, s.translate("claim", p.Key, err)
	}
	res, err := s.claimResult(p, v)
	if err == nil && res.Acquired {
		err = s.wait(ctx, "claim", p.Key)
	}
	return res, err
}

// claimResult decodes the claim script's reply.
func (s *Store) claimResult(p store.ClaimParams, v []any) (store.ClaimResult, error) {
	code, _ := v[0].(int64)
	switch code {
	case 1: // written: {1, fence, takeover}
		fence, _ := v[1].(int64)
		takeover, _ := v[2].(int64)
		var old *store.Record
		if fence > 1 {
			// The old record only matters for its fence and whether it had
			// expired; rebuild that much so ApplyClaim agrees with the
			// script.
			old = &store.Record{Fence: uint64(fence - 1), Status: store.StatusInProgress, ExpiresAt: p.Now, LeaseUntil: p.Now}
			if takeover == 1 {
				old.ExpiresAt = p.Now + 1
			}
		}
		res, write := store.ApplyClaim(old, p)
		if write == nil || res.Record.Fence != uint64(fence) {
			return store.ClaimResult{}, &store.CorruptError{Key: p.Key, Reason: "claim script and client disagree"}
		}
		return res, nil
	case 0: // conflict: {0, HGETALL}
		fields, _ := v[1].([]any)
		rec, err := decode(p.Key, fields)
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

// ClaimBatch claims many keys in one pipelined round trip (plus one more
// if the script must be loaded first). Results and errors are per key, in
// the order of ps; a failed claim has a nil-Record result and an error.
func (s *Store) ClaimBatch(ctx context.Context, ps []store.ClaimParams) ([]store.ClaimResult, []error) {
	res := make([]store.ClaimResult, len(ps))
	errs := make([]error, len(ps))
	run := func(idx []int) []int {
		pipe := s.c.Pipeline()
		cmds := make([]*redis.Cmd, len(idx))
		for j, i := range idx {
			cmds[j] = claimScript.EvalSha(ctx, pipe, []string{s.rkey(ps[i].Key)}, s.claimArgs(ps[i])...)
		}
		_, _ = pipe.Exec(ctx) // errors are per command
		var noscript []int
		for j, i := range idx {
			v, err := cmds[j].Slice()
			switch {
			case err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT"):
				noscript = append(noscript, i)
			case err != nil:
				errs[i] = s.translate("claim", ps[i].Key, err)
			default:
				res[i], errs[i] = s.claimResult(ps[i], v)
			}
		}
		return noscript
	}
	all := make([]int, len(ps))
	for i := range all {
		all[i] = i
	}
	if again := run(all); len(again) > 0 {
		// Not executed: load the script and send those once more.
		if err := claimScript.Load(ctx, s.c).Err(); err != nil {
			for _, i := range again {
				errs[i] = s.translate("claim", ps[i].Key, err)
			}
		} else {
			run(again)
		}
	}
	if s.cfg.WaitReplicas > 0 {
		if err := s.wait(ctx, "claim", ""); err != nil {
			for i := range errs {
				if errs[i] == nil && res[i].Acquired {
					errs[i] = err
				}
			}
		}
	}
	return res, errs
}

// fenced runs the fenced script for op, on a record that must be in
// status from (IN_PROGRESS when zero).
func (s *Store) fenced(ctx context.Context, op, key string, fence uint64, owner string, from store.Status, now int64, extra ...any) error {
	args := append([]any{op, fence, owner, now, int(from.OrInProgress())}, extra...)
	v, err := fencedScript.Run(ctx, s.c, []string{s.rkey(key)}, args...).Slice()
	if err != nil {
		return s.translate(op, key, err)
	}
	code, _ := v[0].(int64)
	switch code {
	case 0:
		return s.wait(ctx, op, key)
	case 1:
		return store.ErrNotFound
	case 2:
		cur, _ := v[1].(int64)
		st, _ := v[2].(int64)
		o, _ := v[3].(string)
		return &store.FencedError{Key: key, Fence: fence, Owner: owner, Current: uint64(cur), CurrentOwner: o, Status: store.Status(st)}
	}
	return scriptCorrupt(key, v)
}

// Complete implements [idem.Store].
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	if len(p.Result) > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: len(p.Result), Limit: s.cfg.MaxResultBytes}
	}
	return s.fenced(ctx, "complete", p.Key, p.Fence, p.Owner, p.From, p.Now, p.ExpiresAt, p.Result)
}

// Fail implements [idem.Store].
func (s *Store) Fail(ctx context.Context, p store.FailParams) error {
	if n := p.Err.Size(); n > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: n, Limit: s.cfg.MaxResultBytes}
	}
	return s.fenced(ctx, "fail", p.Key, p.Fence, p.Owner, p.From, p.Now, p.ExpiresAt, p.Err.Code, p.Err.Message, p.Err.Body)
}

// Release implements [idem.Store].
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	return s.fenced(ctx, "release", p.Key, p.Fence, p.Owner, p.From, p.Now)
}

// Extend implements [idem.Store].
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	return s.fenced(ctx, "extend", p.Key, p.Fence, p.Owner, 0, p.Now, p.LeaseUntil, p.Ref)
}

// Get implements [idem.Store] with one HGETALL.
func (s *Store) Get(ctx context.Context, key string) (*store.Record, error) {
	m, err := s.c.HGetAll(ctx, s.rkey(key)).Result()
	if err != nil {
		return nil, s.translate("get", key, err)
	}
	if len(m) == 0 {
		return nil, store.ErrNotFound
	}
	return decodeMap(key, m)
}

// Delete implements [idem.Deleter].
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

// wait runs WAIT when Config.WaitReplicas is set.
func (s *Store) wait(ctx context.Context, op, key string) error {
	if s.cfg.WaitReplicas <= 0 {
		return nil
	}
	n, err := s.c.Do(ctx, "WAIT", s.cfg.WaitReplicas, s.cfg.WaitTimeout).Int64()
	if err != nil {
		return s.translate(op, key, err)
	}
	if int(n) < s.cfg.WaitReplicas {
		return fmt.Errorf("redisstore: %s %s: %d of %d replicas acknowledged in %dms (applied on the primary): %w",
			op, key, n, s.cfg.WaitReplicas, s.cfg.WaitTimeout, store.ErrUnavailable)
	}
	return nil
}

// translate maps go-redis errors at the store boundary: a script or type
// error on the key is a damaged record; everything else (network, timeout,
// pool exhausted, server loading, read-only replica) is unavailable.
func (s *Store) translate(op, key string, err error) error {
	var re redis.Error
	if errors.As(err, &re) && !isNetErr(err) {
		msg := re.Error()
		if strings.HasPrefix(msg, "WRONGTYPE") || strings.Contains(msg, "user_script") {
			return &store.CorruptError{Key: key, Reason: msg}
		}
	}
	return fmt.Errorf("redisstore: %s %s: %w: %w", op, key, store.ErrUnavailable, err)
}

func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// decode reads a record from HGETALL's flat reply.
func decode(key string, fields []any) (*store.Record, error) {
	m := make(map[string]string, len(fields)/2)
	for i := 0; i+1 < len(fields); i += 2 {
		k, _ := fields[i].(string)
		v, _ := fields[i+1].(string)
		m[k] = v
	}
	return decodeMap(key, m)
}

// decodeMap reads a record from its hash. A damaged record fails closed.
func decodeMap(key string, m map[string]string) (*store.Record, error) {
	bad := func(field string) error {
		return &store.CorruptError{Key: key, Reason: "hash field " + field + " missing or malformed"}
	}
	i64 := func(f string) (int64, error) {
		n, err := strconv.ParseInt(m[f], 10, 64)
		if err != nil {
			return 0, bad(f)
		}
		return n, nil
	}
	r := &store.Record{Key: key, Owner: m["o"], Fingerprint: m["fp"], Ref: m["ref"]}
	var err error
	var st, f, v int64
	if st, err = i64("st"); err != nil || !store.Status(st).Valid() {
		return nil, bad("st")
	}
	r.Status = store.Status(st)
	if f, err = i64("f"); err != nil || f < 1 {
		return nil, bad("f")
	}
	r.Fence = uint64(f)
	if v, err = i64("v"); err != nil || v != store.RecordVersion {
		return nil, bad("v")
	}
	r.Version = int(v)
	for _, x := range []struct {
		f   string
		dst *int64
	}{{"l", &r.LeaseUntil}, {"e", &r.ExpiresAt}, {"c", &r.CreatedAt}} {
		if *x.dst, err = i64(x.f); err != nil {
			return nil, err
		}
	}
	if d, ok := m["d"]; ok {
		if r.CompletedAt, err = strconv.ParseInt(d, 10, 64); err != nil {
			return nil, bad("d")
		}
	}
	switch r.Status {
	case store.StatusCompleted:
		res, ok := m["r"]
		if !ok {
			return nil, bad("r")
		}
		r.Result = []byte(res)
	case store.StatusFailed:
		r.Err = &store.ErrorRecord{Code: m["ec"], Message: m["em"]}
		if b := m["eb"]; b != "" {
			r.Err.Body = []byte(b)
		}
	}
	return r, nil
}

// Prefix is the key prefix in use.
func (s *Store) Prefix() string { return s.cfg.Prefix }
