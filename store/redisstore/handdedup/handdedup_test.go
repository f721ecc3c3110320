package handdedup_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/redisstore/handdedup"
)

// pipelines counts the round trips a client sends with keys under prefix
// (commands and pipelines; a connection's handshake is not counted).
type pipelines struct {
	prefix string
	n      atomic.Int64
}

func (p *pipelines) count(cmds ...redis.Cmder) {
	for _, c := range cmds {
		if k, ok := c.Args()[min(1, len(c.Args())-1)].(string); ok && strings.HasPrefix(k, p.prefix) {
			p.n.Add(1)
			return
		}
	}
}

func (p *pipelines) DialHook(next redis.DialHook) redis.DialHook { return next }
func (p *pipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { p.count(cmd); return next(ctx, cmd) }
}
func (p *pipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { p.count(cmds...); return next(ctx, cmds) }
}

func client(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")})
	t.Cleanup(func() { c.Close() })
	return c
}

// One batch is two round trips: the claims' SET NX, then the outcomes'
// SET (a DEL for a failed handler); a key already set is a duplicate whose
// handler does not run, and a failed handler's key is gone, so that its
// redelivery runs it.
func TestBatch(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("handdedup-test-%x:", rand.Uint64())
	t.Cleanup(func() { c.Del(context.Background(), prefix+"a", prefix+"b", prefix+"c", prefix+"d") })
	if err := c.Set(ctx, prefix+"b", "earlier", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	rt := &pipelines{prefix: prefix}
	c.AddHook(rt)
	d, err := handdedup.New(c, prefix, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var ran []int
	st, err := d.Batch(ctx, []string{"a", "b", "c", "d"}, func(i int) ([]byte, error) {
		ran = append(ran, i)
		if i == 2 {
			return nil, errors.New("handler failed")
		}
		return []byte(fmt.Sprintf("outcome %d", i)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []handdedup.Status{handdedup.Ran, handdedup.Duplicate, handdedup.Failed, handdedup.Ran}; !slices.Equal(st, want) {
		t.Errorf("statuses %v, want %v", st, want)
	}
	if !slices.Equal(ran, []int{0, 2, 3}) {
		t.Errorf("handlers run %v, want [0 2 3] in order (not the duplicate's)", ran)
	}
	if n := rt.n.Load(); n != 2 {
		t.Errorf("%d round trips, want 2 (one pipeline of claims, one of outcomes)", n)
	}
	for k, want := range map[string]string{"a": "outcome 0", "b": "earlier", "d": "outcome 3"} {
		if got, err := c.Get(ctx, prefix+k).Result(); err != nil || got != want {
			t.Errorf("%s = %q, %v; want %q", k, got, err, want)
		}
		if ttl := c.PTTL(ctx, prefix+k).Val(); ttl <= 0 || ttl > time.Minute {
			t.Errorf("%s has TTL %v, want (0, 1m]", k, ttl)
		}
	}
	if n := c.Exists(ctx, prefix+"c").Val(); n != 0 {
		t.Error("the failed handler's key is still set: its redelivery would be taken for a duplicate")
	}

	// The same keys again: the recorded ones are duplicates, the failed
	// one runs.
	ran = nil
	st, err = d.Batch(ctx, []string{"a", "c"}, func(i int) ([]byte, error) { ran = append(ran, i); return []byte("again"), nil })
	if err != nil || !slices.Equal(st, []handdedup.Status{handdedup.Duplicate, handdedup.Ran}) || !slices.Equal(ran, []int{1}) {
		t.Errorf("redelivery: %v, %v, ran %v; want [duplicate ran], ran [1]", st, err, ran)
	}
}

// A Redis that cannot be reached fails the batch before any handler runs.
func TestBatchUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	d, err := handdedup.New(c, "x:", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.Batch(context.Background(), []string{"a"}, func(int) ([]byte, error) {
		t.Error("a handler ran without its claim")
		return nil, nil
	})
	if err == nil || st != nil {
		t.Errorf("Batch = %v, %v; want an error", st, err)
	}
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	if _, err := handdedup.New(nil, "x:", time.Minute); !errors.Is(err, handdedup.ErrInvalid) {
		t.Errorf("nil client: %v, want ErrInvalid", err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { c.Close() })
	if _, err := handdedup.New(c, "x:", time.Microsecond); !errors.Is(err, handdedup.ErrInvalid) {
		t.Errorf("ttl 1µs: %v, want ErrInvalid", err)
	}
}
