package redisstore

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/store"
)

// reply is one RESP reply, read raw.
type reply struct {
	kind byte   // '_' nil, '$' bulk string, ':' integer, '+' status, '-' error, or the first byte of another type
	str  string // a bulk string, status or error message
	n    int64  // an integer
}

// do sends one command and returns its reply. The hot paths (a claim, a
// fenced write) use go-redis's RawCmd rather than typed commands: a nil
// reply (the answer to every claim of an absent key) or an error reply
// then returns without go-redis classifying it as a retryable error,
// which costs some twenty allocations a call. An error reply is a reply
// here (kind '-'), not an error: err is the failure to get a reply.
//
// With Config.WaitReplicas, a WAIT follows the command in the same
// pipeline (see [Store.send]); check it with [Store.waited].
func (s *Store) do(ctx context.Context, args ...any) (reply, *redis.IntCmd, error) {
	cmd := redis.NewRawCmd(ctx, args...)
	w := s.send(ctx, cmd)
	b, err := cmd.Result()
	if err != nil {
		return reply{}, w, err
	}
	r, err := parseReply(b)
	return r, w, err
}

// send sends cmd and, with Config.WaitReplicas, a WAIT right after it in
// one pipeline, which go-redis sends down one connection: WAIT counts the
// replicas holding the writes of its own connection, so it must follow
// the write on the connection that sent it (a WAIT on another pooled
// connection would not wait for it). The WAIT is returned, nil without
// WaitReplicas.
func (s *Store) send(ctx context.Context, cmd redis.Cmder) *redis.IntCmd {
	if s.cfg.WaitReplicas <= 0 {
		_ = s.c.Process(ctx, cmd)
		return nil
	}
	pipe := s.c.Pipeline()
	_ = pipe.Process(ctx, cmd)
	w := s.waitCmd(ctx)
	_ = pipe.Process(ctx, w)
	_, _ = pipe.Exec(ctx) // errors are per command
	return w
}

func (s *Store) waitCmd(ctx context.Context) *redis.IntCmd {
	return redis.NewIntCmd(ctx, "wait", s.cfg.WaitReplicas, s.cfg.WaitTimeout)
}

// script sends sc by its SHA-1 as a typed command (for replies go-redis
// decodes: arrays), and its source once more on NOSCRIPT; with
// Config.WaitReplicas, followed by a WAIT (see [Store.send]).
func (s *Store) script(ctx context.Context, sc *redis.Script, key string, args ...any) (*redis.Cmd, *redis.IntCmd) {
	a := make([]any, 0, 4+len(args))
	a = append(a, "evalsha", sc.Hash(), 1, key)
	a = append(a, args...)
	cmd := redis.NewCmd(ctx, a...)
	w := s.send(ctx, cmd)
	if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		a[0], a[1] = "eval", scriptSources[sc]
		cmd = redis.NewCmd(ctx, a...)
		w = s.send(ctx, cmd)
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
	a := make([]any, 0, 4+len(args))
	a = append(a, "evalsha", sc.Hash(), 1, key)
	a = append(a, args...)
	r, w, err := s.do(ctx, a...)
	if err == nil && r.kind == '-' && strings.HasPrefix(r.str, "NOSCRIPT") {
		a[0], a[1] = "eval", scriptSources[sc]
		r, w, err = s.do(ctx, a...)
	}
	return r, w, err
}

// errorReply translates an error reply for op on key, as translate does a
// go-redis error: a type or script error is a damaged record; anything
// else (LOADING, READONLY, OOM...) is the server unable to serve the call.
func errorReply(op, key string, r reply) error {
	if strings.HasPrefix(r.str, "WRONGTYPE") || strings.Contains(r.str, "user_script") || strings.HasPrefix(r.str, "idem: ") {
		return &store.CorruptError{Key: key, Reason: r.str}
	}
	return fmt.Errorf("redisstore: %s %s: %w: %s", op, key, store.ErrUnavailable, r.str)
}
