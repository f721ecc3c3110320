package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/store"
)

// ACLError reports that Redis's ACL refuses the store's user a command
// the store needs (NOPERM): its claims and fenced writes run as Lua
// scripts (EVALSHA, and EVAL when the script is not cached), and it reads
// and writes keys under its prefix. It matches store.ErrInvalidConfig and
// store.ErrMisconfigured (errors.Is); the message has the ACL SETUSER
// that fixes it.
type ACLError struct {
	// User is the Redis user (ACL WHOAMI), when Redis said.
	User string
	// Command is what was refused: "EVALSHA", "EVAL", "INFO", or "GET"
	// of a key under the prefix.
	Command string
	Prefix  string
	// Err is Redis's refusal.
	Err error
}

func (e *ACLError) Error() string {
	user := e.User
	if user == "" {
		user = "USER"
	}
	return fmt.Sprintf("redisstore: Redis refuses %s to user %s (%v): the store runs its claims and fenced writes as Lua scripts "+
		"on keys under prefix %q, and reads INFO at open; allow them, e.g. ACL SETUSER %s +evalsha +eval +get +set +del +scan +info ~%s*",
		e.Command, user, e.Err, e.Prefix, user, e.Prefix)
}

// Is makes errors.Is(err, store.ErrInvalidConfig) and
// errors.Is(err, store.ErrMisconfigured) true.
func (e *ACLError) Is(target error) bool {
	return target == store.ErrInvalidConfig || target == store.ErrMisconfigured
}

func (e *ACLError) Unwrap() error { return e.Err }

// Check checks that Redis answers, that its ACL lets the store's user
// run what the store needs: EVAL and EVALSHA of a script that only
// returns, a GET of a key under the prefix and INFO, none of which
// writes; and that Redis keeps records until their expiry: a server
// (every master of a cluster) with maxmemory set and a maxmemory-policy
// other than noeviction is an [*EvictionError], unless
// Config.AllowEviction accepts it, and then a warning goes to
// Config.Logger. A refusal is an [*ACLError] with the ACL SETUSER to run;
// an unreachable server is store.ErrUnavailable. [Open] connects lazily
// and does not call it; storeurl.Open does.
func (s *Store) Check(ctx context.Context) error {
	if err := s.checkACL(ctx); err != nil {
		return err
	}
	err := s.checkEviction(ctx)
	if !s.cfg.AllowEviction || err != nil && !errors.Is(err, store.ErrMisconfigured) {
		return err
	}
	found := "none of the servers evicts now"
	if err != nil {
		found = err.Error()
	}
	s.cfg.Logger.Warn("redisstore: AllowEviction is set: records may be forgotten; operations may run again "+
		"(Redis may drop idem records before their expiry when its memory runs short)", "found", found)
	return nil
}

// checkACL runs Check's probes of the ACL.
func (s *Store) checkACL(ctx context.Context) error {
	if err := s.Ping(ctx); err != nil {
		return err
	}
	const src = "return 1"
	sum := sha1.Sum([]byte(src))
	probes := []struct {
		name string
		args []any
	}{
		{"EVAL", []any{"eval", src, 0}},
		{"EVALSHA", []any{"evalsha", hex.EncodeToString(sum[:]), 0}},
		{fmt.Sprintf("GET of a key under prefix %q", s.cfg.Prefix), []any{"get", s.cfg.Prefix + "idem-check"}},
	}
	for _, p := range probes {
		err := s.c.Do(ctx, p.args...).Err()
		if err == nil || errors.Is(err, redis.Nil) || noScript(err.Error()) {
			continue
		}
		if strings.HasPrefix(err.Error(), "NOPERM") {
			user, _ := s.c.Do(ctx, "acl", "whoami").Text() // best effort, for the message
			return &ACLError{User: user, Command: p.name, Prefix: s.cfg.Prefix, Err: err}
		}
		return s.translate("check", "", err)
	}
	return nil
}
