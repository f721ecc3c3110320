package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

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
