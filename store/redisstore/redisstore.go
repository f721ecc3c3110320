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
//     checks status and expiry, and writes the new value with SET.
//
// Expiry is checked from the caller's Now; the key also carries a native
// expiry (PXAT expires_at), which only reclaims memory. No operation
// touches two keys, so the store is safe on Redis Cluster.
//
// Records written by earlier builds (a hash of fields) are still read
// and written: a fenced write on one runs the earlier script, and a claim
// that takes one over writes the current layout. A process of an earlier
// build, though, cannot read the current layout and fails closed on it
// (ErrCorrupt; nothing runs twice): upgrade every process of a fleet
// before relying on it.
//
// # Many calls in flight
//
// [New] takes any go-redis UniversalClient, go-redis's AutoPipeliner
// (client.AutoPipeline()) among them: concurrent calls' commands then
// share pipelines, which saves most of the per-command system calls on
// both sides (docs/benchmarks.md has the figures). A command queued there
// no longer follows its context's deadline; the client's timeouts bound
// it.
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

//go:embed fenced_hash.lua
var fencedHashSrc string

var (
	claimScript      = redis.NewScript(claimSrc)
	fencedScript     = redis.NewScript(fencedSrc)
	fencedHashScript = redis.NewScript(fencedHashSrc)

	// scriptSources are the sources [Store.evalsha] and [Store.script]
	// send on NOSCRIPT.
	scriptSources = map[*redis.Script]string{claimScript: claimSrc, fencedScript: fencedSrc, fencedHashScript: fencedHashSrc}
)

// Config configures a [Store]. A nil *Config means all defaults.
type Config struct {
	// Prefix is put before every idem key, to share a Redis with other
	// data or isolate tenants/tests. Default "idem:".
	Prefix string
	// MaxResultBytes bounds a stored result or error. Default 16 MiB.
	MaxResultBytes int
	// WaitReplicas, when > 0, makes every write wait (Redis WAIT, sent in
	// one pipeline with the write) until that many replicas acknowledged it, at most WaitTimeout (default 1s); a
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
	_ store.Store        = (*Store)(nil)
	_ store.Lister       = (*Store)(nil)
	_ store.Deleter      = (*Store)(nil)
	_ store.BatchClaimer = (*Store)(nil)
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

// Claim implements [idem.Store]. A key that is absent takes one SET NX GET
// (no script): the reply is nil when the claim was written, or the live
// record otherwise, which answers a conflict or the caller's own retried
// claim in the same round trip. Only a record that may have to be taken
// over (expired, or its lease passed), or one in the previous layout,
// costs a second round trip: the claim script, which decides atomically.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	r, w, err := s.do(ctx, "set", s.rkey(p.Key), encodeClaim(p), "nx", "get", "pxat", p.ExpiresAt)
	switch {
	case err != nil:
		return store.ClaimResult{}, s.translate("claim", p.Key, err)
	case r.kind == '_': // written
		res, _ := store.ApplyClaim(nil, p)
		return res, s.waited("claim", p.Key, w)
	case r.kind == '-' && strings.HasPrefix(r.str, "WRONGTYPE"): // the previous layout: the script reads it
		return s.claimScripted(ctx, p)
	case r.kind != '$':
		return store.ClaimResult{}, errorReply("claim", p.Key, r)
	}
	rec, err := decodeValue(p.Key, r.str)
	if err != nil {
		return store.ClaimResult{}, err
	}
	if rec.Claimable(p.Now) {
		return s.claimScripted(ctx, p)
	}
	res, _ := store.ApplyClaim(rec, p) // a conflict, or the caller's own claim
	return res, nil
}

// claimScripted claims p.Key with the claim script.
func (s *Store) claimScripted(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	cmd, w := s.script(ctx, claimScript, s.rkey(p.Key), s.claimArgs(p)...)
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

func (s *Store) claimArgs(p store.ClaimParams) []any {
	return []any{p.Now, appendClaimRest(nil, p), p.ExpiresAt}
}

// claimResult decodes the claim script's reply.
func (s *Store) claimResult(p store.ClaimParams, v []any) (store.ClaimResult, error) {
	code, _ := v[0].(int64)
	switch code {
	case 1: // written: {1, fence, takeover}
		fence, err := strconv.ParseUint(fmt.Sprint(v[1]), 10, 64)
		if err != nil {
			return store.ClaimResult{}, scriptCorrupt(p.Key, v)
		}
		takeover, _ := v[2].(int64)
		var old *store.Record
		if fence > 1 {
			// The old record only matters for its fence and whether it had
			// expired; rebuild that much so ApplyClaim agrees with the
			// script.
			old = &store.Record{Fence: fence - 1, Status: store.StatusInProgress, ExpiresAt: p.Now, LeaseUntil: p.Now}
			if takeover == 1 {
				old.ExpiresAt = p.Now + 1
			}
		}
		res, write := store.ApplyClaim(old, p)
		if write == nil || res.Record.Fence != fence {
			return store.ClaimResult{}, &store.CorruptError{Key: p.Key, Reason: "claim script and client disagree"}
		}
		return res, nil
	case 0: // conflict: {0, value} or {0, HGETALL}
		var rec *store.Record
		var err error
		switch cur := v[1].(type) {
		case string:
			rec, err = decodeValue(p.Key, cur)
		case []any:
			rec, err = decodeFlat(p.Key, cur)
		default:
			err = scriptCorrupt(p.Key, v)
		}
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

// ClaimBatch implements [store.BatchClaimer]: every claim is the claim
// script, all of them in one pipeline, so the batch is one round trip
// (plus one more if the script must be loaded first). Redis runs a
// pipeline's commands in order, so a key named twice sees its first claim.
// Results and errors are per key, in the order of ps; a failed claim has a
// nil-Record result and an error.
func (s *Store) ClaimBatch(ctx context.Context, ps []store.ClaimParams) ([]store.ClaimResult, []error) {
	res := make([]store.ClaimResult, len(ps))
	errs := make([]error, len(ps))
	run := func(idx []int) []int {
		pipe := s.c.Pipeline()
		cmds := make([]*redis.Cmd, len(idx))
		for j, i := range idx {
			cmds[j] = claimScript.EvalSha(ctx, pipe, []string{s.rkey(ps[i].Key)}, s.claimArgs(ps[i])...)
		}
		var w *redis.IntCmd
		if s.cfg.WaitReplicas > 0 { // on the pipeline's connection: see send
			w = s.waitCmd(ctx)
			_ = pipe.Process(ctx, w)
		}
		_, _ = pipe.Exec(ctx) // errors are per command
		defer func() {
			for _, i := range idx {
				if errs[i] == nil && res[i].Acquired {
					errs[i] = s.waited("claim", ps[i].Key, w)
				}
			}
		}()
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
		// Not executed (Redis ran none of the script calls, so the order
		// of the keys still holds): load the script and send those again.
		if err := claimScript.Load(ctx, s.c).Err(); err != nil {
			for _, i := range again {
				errs[i] = s.translate("claim", ps[i].Key, err)
			}
		} else {
			run(again)
		}
	}
	return res, errs
}

// fenced runs the fenced script for op ("settle", "release", "extend") by
// the claim (fence, owner) on a record that must be in status from
// (IN_PROGRESS when zero). A record in the previous layout is written by
// the hash script instead, with hashArgs (see fenced_hash.lua).
func (s *Store) fenced(ctx context.Context, op, key string, fence uint64, owner string, from store.Status, now int64, extra []any, hashOp string, hashArgs []any) error {
	tag := appendTag(make([]byte, 0, 32+len(owner)), fence, owner)
	args := append([]any{op, tag, now, int(from.OrInProgress())}, extra...)
	r, w, err := s.evalsha(ctx, fencedScript, s.rkey(key), args...)
	if err != nil {
		return s.translate(hashOp, key, err)
	}
	switch {
	case r.kind == ':' && r.n == 0:
		return s.waited(hashOp, key, w)
	case r.kind == ':' && r.n == 1:
		return store.ErrNotFound
	case r.kind == ':' && r.n == 3:
		return s.fencedHash(ctx, hashOp, key, fence, owner, from, now, hashArgs...)
	case r.kind == '$':
		rec, err := decodeValue(key, r.str)
		if err != nil {
			return err
		}
		if err := store.CheckFence(rec, key, fence, owner, from, now); err != nil {
			return err
		}
		return &store.CorruptError{Key: key, Reason: "fenced script refused a write the record allows"}
	}
	return errorReply(hashOp, key, r)
}

// fencedHash runs the fenced script of the previous layout (a hash).
func (s *Store) fencedHash(ctx context.Context, op, key string, fence uint64, owner string, from store.Status, now int64, extra ...any) error {
	args := append([]any{op, fence, owner, now, int(from.OrInProgress())}, extra...)
	cmd, w := s.script(ctx, fencedHashScript, s.rkey(key), args...)
	v, err := cmd.Slice()
	if err != nil {
		return s.translate(op, key, err)
	}
	code, _ := v[0].(int64)
	switch code {
	case 0:
		return s.waited(op, key, w)
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
	return s.fenced(ctx, "settle", p.Key, p.Fence, p.Owner, p.From, p.Now,
		[]any{"2", p.ExpiresAt, completeTail(p.Now, p.Result)},
		"complete", []any{p.ExpiresAt, p.Result})
}

// Fail implements [idem.Store].
func (s *Store) Fail(ctx context.Context, p store.FailParams) error {
	if n := p.Err.Size(); n > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: n, Limit: s.cfg.MaxResultBytes}
	}
	return s.fenced(ctx, "settle", p.Key, p.Fence, p.Owner, p.From, p.Now,
		[]any{"3", p.ExpiresAt, failTail(p.Now, p.Err)},
		"fail", []any{p.ExpiresAt, p.Err.Code, p.Err.Message, p.Err.Body})
}

// Release implements [idem.Store].
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	return s.fenced(ctx, "release", p.Key, p.Fence, p.Owner, p.From, p.Now, nil, "release", nil)
}

// Extend implements [idem.Store].
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	return s.fenced(ctx, "extend", p.Key, p.Fence, p.Owner, 0, p.Now,
		[]any{p.LeaseUntil, p.Ref}, "extend", []any{p.LeaseUntil, p.Ref})
}

// Get implements [idem.Store] with one GET (and an HGETALL for a record in
// the previous layout).
func (s *Store) Get(ctx context.Context, key string) (*store.Record, error) {
	v, err := s.c.Get(ctx, s.rkey(key)).Result()
	switch {
	case err == redis.Nil:
		return nil, store.ErrNotFound
	case err != nil && isWrongType(err):
		m, err := s.c.HGetAll(ctx, s.rkey(key)).Result()
		if err != nil {
			return nil, s.translate("get", key, err)
		}
		if len(m) == 0 {
			return nil, store.ErrNotFound
		}
		return decodeHash(key, m)
	case err != nil:
		return nil, s.translate("get", key, err)
	}
	return decodeValue(key, v)
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

func isWrongType(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE")
}

// decodeFlat reads a record in the previous layout from HGETALL's flat
// reply.
func decodeFlat(key string, fields []any) (*store.Record, error) {
	m := make(map[string]string, len(fields)/2)
	for i := 0; i+1 < len(fields); i += 2 {
		k, _ := fields[i].(string)
		v, _ := fields[i+1].(string)
		m[k] = v
	}
	return decodeHash(key, m)
}

// decodeHash reads a record in the previous layout, a hash. A damaged
// record fails closed.
func decodeHash(key string, m map[string]string) (*store.Record, error) {
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
