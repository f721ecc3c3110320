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
func (s *Store) do(ctx context.Context, args ...any) (reply, error) {
	cmd := redis.NewRawCmd(ctx, args...)
	_ = s.c.Process(ctx, cmd)
	b, err := cmd.Result()
	if err != nil {
		return reply{}, err
	}
	return parseReply(b)
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
func (s *Store) evalsha(ctx context.Context, sc *redis.Script, key string, args ...any) (reply, error) {
	a := make([]any, 0, 4+len(args))
	a = append(a, "evalsha", sc.Hash(), 1, key)
	a = append(a, args...)
	r, err := s.do(ctx, a...)
	if err == nil && r.kind == '-' && strings.HasPrefix(r.str, "NOSCRIPT") {
		a[0], a[1] = "eval", scriptSources[sc]
		r, err = s.do(ctx, a...)
	}
	return r, err
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
