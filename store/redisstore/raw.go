package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/store"
)

// reply is one RESP reply, read raw.
type reply struct {
	kind byte   // '_' nil, '$' bulk string, ':' integer, '+' status, '-' error, or the first byte of another type
	str  string // a bulk string, status or error message
	n    int64  // an integer
}

// do sends one command about key and returns its reply. The hot paths (a
// claim, a fenced write) use go-redis's RawCmd rather than typed commands:
// a nil reply (the answer to every claim of an absent key) or an error
// reply then returns without go-redis classifying it as a retryable error,
// which costs some twenty allocations a call. An error reply is a reply
// here (kind '-'), not an error: err is the failure to get a reply.
//
// On Redis Cluster that also means go-redis does not see a MOVED or ASK
// reply, so it neither follows it nor refreshes its map of the slots: do
// does both (see [Store.redirected]).
//
// With Config.WaitReplicas, a WAIT follows the command in the same
// pipeline (see [Store.send]), or, when wrote is given, on the same
// connection only if wrote says the reply is of a write; check it with
// [Store.waited].
func (s *Store) do(ctx context.Context, key string, wrote func(reply) bool, args ...any) (reply, *redis.IntCmd, error) {
	cmd := redis.NewRawCmd(ctx, args...)
	var sent func(redis.Cmder) bool
	if wrote != nil && s.cfg.WaitReplicas > 0 {
		sent = func(c redis.Cmder) bool {
			b, err := c.(*redis.RawCmd).Result()
			if err != nil {
				return false
			}
			r, err := parseReply(b)
			return err == nil && wrote(r)
		}
	}
	w := s.send(ctx, key, cmd, sent)
	b, err := cmd.Result()
	if err != nil {
		return reply{}, w, err
	}
	r, err := parseReply(b)
	if err == nil && r.kind == '-' && s.redirected(r.str) && s.cfg.WaitReplicas <= 0 {
		// The slot moved (a failover, a resharding): send the command once
		// more as a typed command, which the cluster client routes to the
		// slot's new owner itself. With WaitReplicas the write went to one
		// node's connection, which cannot follow: the caller sees the
		// error reply (unavailable) and retries once the map is fresh.
		c := redis.NewCmd(ctx, args...)
		_ = s.c.Process(ctx, c)
		return typedReply(c)
	}
	return r, w, err
}

// typedReply converts a typed command's answer to a reply.
func typedReply(c *redis.Cmd) (reply, *redis.IntCmd, error) {
	v, err := c.Result()
	var re redis.Error
	switch {
	case err == redis.Nil:
		return reply{kind: '_'}, nil, nil
	case err != nil && errors.As(err, &re) && !isNetErr(err):
		return reply{kind: '-', str: err.Error()}, nil, nil
	case err != nil:
		return reply{}, nil, err
	}
	switch v := v.(type) {
	case string:
		return reply{kind: '$', str: v}, nil, nil
	case int64:
		return reply{kind: ':', n: v}, nil, nil
	}
	return reply{kind: '*'}, nil, nil
}

// redirected reports whether an error reply says the key's slot is served
// elsewhere or the cluster cannot serve it now (MOVED, ASK, TRYAGAIN,
// CLUSTERDOWN), and on Redis Cluster asks the client to refresh its map of
// the slots.
func (s *Store) redirected(msg string) bool {
	for _, p := range [...]string{"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN"} {
		if strings.HasPrefix(msg, p) {
			s.refresh()
			return s.cluster != nil
		}
	}
	return false
}

// refresh asks a cluster client to reload its map of the slots (go-redis
// does it by itself only on a MOVED it sees, and every
// ClusterStateReloadInterval, 60 s by default: a master that died answers
// "connection refused" until then). Reloads are coalesced by go-redis.
func (s *Store) refresh() {
	if s.cluster != nil {
		s.cluster.ReloadState(context.Background())
	}
}

// send sends cmd about key and, with Config.WaitReplicas, a WAIT right
// after it in one pipeline, which go-redis sends down one connection: WAIT
// counts the replicas holding the writes of its own connection, so it
// must follow the write on the connection that sent it (a WAIT on another
// pooled connection would not wait for it). On Redis Cluster the pipeline
// is the client of the master that holds key's slot: the cluster client
// would send a WAIT, which names no key, to any node. The WAIT is
// returned, nil without WaitReplicas.
//
// A command that may write nothing (a claim that finds a live record: a
// replay, a conflict) names wrote, which tells from its reply whether it
// wrote: it is then sent alone on a connection of its own, and the WAIT
// follows on that connection only if it wrote. A replay never waits for
// replicas: with one down, it would wait all of WaitTimeout for nothing.
func (s *Store) send(ctx context.Context, key string, cmd redis.Cmder, wrote func(redis.Cmder) bool) *redis.IntCmd {
	if s.cfg.WaitReplicas <= 0 {
		_ = s.c.Process(ctx, cmd)
		return nil
	}
	if wrote != nil {
		conn, err := s.connFor(ctx, key)
		if err != nil {
			cmd.SetErr(err)
			return nil
		}
		if conn != nil {
			defer conn.Close()
			_ = conn.Process(ctx, cmd)
			if !wrote(cmd) {
				return nil
			}
			w := s.waitCmd(ctx)
			_ = conn.Process(ctx, w)
			return w
		}
	}
	pipe, err := s.pipeFor(ctx, key)
	if err != nil {
		cmd.SetErr(err)
		return nil
	}
	_ = pipe.Process(ctx, cmd)
	w := s.waitCmd(ctx)
	_ = pipe.Process(ctx, w)
	_, _ = pipe.Exec(ctx) // errors are per command
	return w
}

// connFor returns a connection of its own to the node that holds key (on
// Redis Cluster its slot's master), to be closed after use; nil when the
// client lends none (an AutoPipeliner, a Ring).
func (s *Store) connFor(ctx context.Context, key string) (*redis.Conn, error) {
	if s.cluster != nil {
		node, err := s.cluster.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return s.lend(ctx, node)
	}
	if c, ok := s.c.(*redis.Client); ok { // a plain or a Sentinel failover client
		return s.lend(ctx, c)
	}
	return nil, nil
}

// lend returns one of c's connections for the caller's use alone (Conn),
// once c has set up a connection of its own: go-redis's Conn shares its
// client's options but not their lock, and the first connection a client
// sets up may write them (maintenance notifications turned off on a server
// without them), which would race with a Conn setting up another. Until
// one Ping has succeeded no Conn is lent: the Ping's error is the caller's
// (the node cannot be reached either way), not a Conn that would set up a
// connection alongside another.
func (s *Store) lend(ctx context.Context, c *redis.Client) (*redis.Conn, error) {
	v, _ := s.lent.LoadOrStore(c, new(lender))
	l := v.(*lender)
	if !l.ready.Load() {
		l.mu.Lock()
		if !l.ready.Load() {
			if err := c.Ping(ctx).Err(); err != nil {
				l.mu.Unlock()
				return nil, err
			}
			l.ready.Store(true)
		}
		l.mu.Unlock()
	}
	return c.Conn(), nil
}

// lender is a client whose first connection is set up (see lend).
type lender struct {
	mu    sync.Mutex
	ready atomic.Bool
}

// pipeFor returns a pipeline to the node that holds key: on Redis Cluster
// its slot's master, elsewhere the client's own.
func (s *Store) pipeFor(ctx context.Context, key string) (redis.Pipeliner, error) {
	if s.cluster == nil {
		return s.c.Pipeline(), nil
	}
	node, err := s.cluster.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	return node.Pipeline(), nil
}

func (s *Store) waitCmd(ctx context.Context) *redis.IntCmd {
	return redis.NewIntCmd(ctx, "wait", s.cfg.WaitReplicas, s.cfg.WaitTimeout)
}

// evalArgs is the command that runs sc on key with args by its SHA-1
// (EVALSHA). A server that has not cached the script answers NOSCRIPT
// (noScript); the caller then sends it again with its source
// (toSource), which also caches it: the documented ACL has no SCRIPT LOAD.
func evalArgs(sc *redis.Script, key string, args []any) []any {
	a := make([]any, 0, 4+len(args))
	a = append(a, "evalsha", sc.Hash(), 1, key)
	return append(a, args...)
}

// toSource turns evalArgs' EVALSHA into an EVAL of sc's source, in place.
func toSource(a []any, sc *redis.Script) { a[0], a[1] = "eval", scriptSources[sc] }

// noScript reports whether an error reply says the server does not have
// the script (NOSCRIPT): the one test of the three paths that send
// scripts (typed commands, raw replies, batches).
func noScript(reply string) bool { return strings.HasPrefix(reply, "NOSCRIPT") }

// script sends sc by its SHA-1 as a typed command (for replies go-redis
// decodes: arrays), and its source once more on NOSCRIPT; with
// Config.WaitReplicas, followed by a WAIT (see [Store.send]).
func (s *Store) script(ctx context.Context, sc *redis.Script, key string, wrote func(redis.Cmder) bool, args ...any) (*redis.Cmd, *redis.IntCmd) {
	cmd := scriptCmd(ctx, sc, key, args, false)
	w := s.send(ctx, key, cmd, wrote)
	if err := cmd.Err(); err != nil && noScript(err.Error()) {
		cmd = scriptCmd(ctx, sc, key, args, true)
		w = s.send(ctx, key, cmd, wrote)
	}
	return cmd, w
}

func parseReply(b []byte) (reply, error) {
	line, rest, ok := bytes.Cut(b, []byte("\r\n"))
	if !ok || len(line) == 0 {
		return reply{}, fmt.Errorf("redisstore: malformed reply %q", b)
	}
	r := reply{kind: line[0]}
	switch r.kind {
	case '_':
	case '+', '-':
		r.str = string(line[1:])
	case ':':
		n, err := strconv.ParseInt(string(line[1:]), 10, 64)
		if err != nil {
			return reply{}, fmt.Errorf("redisstore: malformed integer reply %q", line)
		}
		r.n = n
	case '$':
		n, err := strconv.Atoi(string(line[1:]))
		switch {
		case err != nil:
			return reply{}, fmt.Errorf("redisstore: malformed bulk reply %q", line)
		case n < 0:
			r.kind = '_'
		case len(rest) < n:
			return reply{}, fmt.Errorf("redisstore: short bulk reply")
		default:
			r.str = string(rest[:n])
		}
	}
	return r, nil
}

// evalsha runs sc by its SHA-1, and sends its source once more if Redis
// does not have it (NOSCRIPT).
func (s *Store) evalsha(ctx context.Context, sc *redis.Script, key string, args ...any) (reply, *redis.IntCmd, error) {
	a := evalArgs(sc, key, args)
	r, w, err := s.do(ctx, key, nil, a...)
	if err == nil && r.kind == '-' && noScript(r.str) {
		toSource(a, sc)
		r, w, err = s.do(ctx, key, nil, a...)
	}
	return r, w, err
}

// errorReply translates an error reply for op on key, as translate does a
// go-redis error: a damaged record (see damaged), or the server unable to
// serve the call (LOADING, READONLY, OOM, MOVED...).
func (s *Store) errorReply(op, key string, r reply) error {
	s.redirected(r.str)
	if damaged(r.str) {
		return &store.CorruptError{Key: key, Reason: r.str}
	}
	if strings.HasPrefix(r.str, "NOPERM") {
		return &ACLError{Command: op, Prefix: s.cfg.Prefix, Err: errors.New(r.str)}
	}
	return fmt.Errorf("redisstore: %s %s: %w: %s", op, key, store.ErrUnavailable, r.str)
}
