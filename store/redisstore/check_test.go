package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// aclUser creates a Redis user with rules for one test (ACL SETUSER),
// deleted when it ends, and returns the URL that connects as it.
func aclUser(t *testing.T, rules ...string) string {
	t.Helper()
	a := addr(t)
	admin := redis.NewClient(&redis.Options{Addr: a})
	t.Cleanup(func() { admin.Close() })
	user := fmt.Sprintf("idemtest-%x", rand.Uint32())
	args := []any{"acl", "setuser", user, "reset", "on", ">pw"}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() {
		if err := admin.Do(context.Background(), "acl", "deluser", user).Err(); err != nil {
			t.Errorf("ACL DELUSER %s: %v", user, err)
		}
	})
	return fmt.Sprintf("redis://%s:pw@%s/0", user, a)
}

// TestCheckFindsWhatTheACLRefuses opens stores as users made for the
// test: one refused EVAL and EVALSHA, one refused only EVALSHA, one
// allowed only keys of another prefix — each an *ACLError at Check,
// matching idem.ErrInvalidConfig and store.ErrMisconfigured, with the
// ACL SETUSER that fixes it; a user with what the store needs passes.
func TestCheckFindsWhatTheACLRefuses(t *testing.T) {
	ctx := context.Background()
	check := func(url string) error {
		s, err := redisstore.Open(url, &redisstore.Config{Prefix: "idemcheck:"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		return s.Check(ctx)
	}
	for _, c := range []struct {
		name    string
		rules   []string
		refused string
	}{
		{"no scripts", []string{"~*", "+@all", "-evalsha", "-eval"}, "EVAL"},
		{"no EVALSHA", []string{"~*", "+@all", "-evalsha"}, "EVALSHA"},
		{"other keys", []string{"~other:*", "+@all"}, `GET of a key under prefix "idemcheck:"`},
	} {
		url := aclUser(t, c.rules...)
		err := check(url)
		var ae *redisstore.ACLError
		if !errors.As(err, &ae) || ae.Command != c.refused || !errors.Is(err, idem.ErrInvalidConfig) || !errors.Is(err, store.ErrMisconfigured) ||
			errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s: %v, want an *ACLError refusing %s", c.name, err, c.refused)
			continue
		}
		for _, s := range []string{"ACL SETUSER " + ae.User + " +evalsha +eval", "NOPERM", "~idemcheck:*"} {
			if !strings.Contains(err.Error(), s) || ae.User == "" {
				t.Errorf("%s: %q does not say %q", c.name, err, s)
			}
		}
		t.Logf("%s: %v", c.name, err)
	}
	if err := check(aclUser(t, "~idemcheck:*", "+@all")); err != nil {
		t.Fatalf("a user with what the store needs: %v", err)
	}
}

// TestBatchesWithTheDocumentedACL: a user with exactly the ACL the docs
// give (no SCRIPT LOAD) claims and completes in batches after the server's
// script cache was flushed, as after a restart or a failover: the writes
// Redis has no script for go again with the script's source (EVAL).
func TestBatchesWithTheDocumentedACL(t *testing.T) {
	prefix := fmt.Sprintf("idembatchacl%x:", rand.Uint32())
	url := aclUser(t, "+evalsha", "+eval", "+get", "+set", "+del", "+scan", "~"+prefix+"*")
	s, err := redisstore.Open(url, &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	admin := redis.NewClient(&redis.Options{Addr: addr(t)})
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	now := time.Now().Add(time.Hour).UnixMilli()
	keys := []string{"a#1", "a#2", "a#3"}
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ps := make([]store.ClaimParams, len(keys))
	for i, k := range keys {
		ps[i] = store.ClaimParams{Key: k, Owner: "o", Fingerprint: "fp", Now: now, LeaseUntil: now + 10_000, ExpiresAt: now + 60_000}
	}
	res, errs := s.ClaimBatch(ctx, ps)
	for i := range keys {
		if errs[i] != nil || !res[i].Acquired {
			t.Fatalf("claim %s after SCRIPT FLUSH: %+v, %v", keys[i], res[i], errs[i])
		}
	}
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	cs := make([]store.CompleteParams, len(keys))
	for i, k := range keys {
		cs[i] = store.CompleteParams{ClaimRef: store.ClaimRef{Key: k, Fence: res[i].Record.Fence, Owner: "o", Now: now}, ExpiresAt: now + 60_000, Result: []byte(k)}
	}
	for i, err := range s.CompleteBatch(ctx, cs) {
		if err != nil {
			t.Errorf("complete %s after SCRIPT FLUSH: %v", keys[i], err)
		}
	}
	for _, k := range keys {
		r, err := s.Get(ctx, k)
		if err != nil || r.Status != store.StatusCompleted || string(r.Result) != k {
			t.Errorf("%s: %+v, %v; want COMPLETED", k, r, err)
		}
	}
}
