// Package handdedup is the deduplication a team writes by hand over Redis
// instead of using idem: the baseline the consumer benchmarks measure idem
// against (make bench-consumers, docs/benchmarks.md). For each batch a
// consumer takes from its broker (a Kafka poll, a JetStream pull, a
// RabbitMQ prefetch window) it sends one pipeline of
//
//	SET <key> 1 NX PX <ttl>
//
// per message (go-redis sends EX for a TTL of whole seconds), runs the handlers of the messages whose key it set, in
// order, and sends one pipeline of
//
//	SET <key> <outcome> PX <ttl>
//
// per handler that succeeded (a DEL for one that failed, so that a
// redelivery runs it again); the consumer then commits or acks. A message
// whose key was already set is a duplicate: its handler does not run.
//
// It has none of idem's guarantees: no fence (a consumer whose key expired
// under it overwrites the next holder's outcome), no lease (a key whose
// holder died stays set until its TTL, and its message is never run), no
// replay of a recorded outcome, no terminal errors, no payload check.
// Test-only: no production package imports it.
package handdedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Status is what Batch did with one message.
type Status int

const (
	// Ran: its key was set, its handler succeeded and its outcome was
	// written; the consumer acks or commits it.
	Ran Status = iota
	// Duplicate: its key was already set; its handler did not run. A
	// hand-written consumer acks it.
	Duplicate
	// Failed: its handler failed and its key was deleted; the consumer
	// leaves it for redelivery.
	Failed
)

func (s Status) String() string {
	switch s {
	case Ran:
		return "ran"
	case Duplicate:
		return "duplicate"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// ErrInvalid is returned by New for an unusable argument.
var ErrInvalid = errors.New("handdedup: invalid argument")

// Dedup sends a consumer's pipelines to one Redis.
type Dedup struct {
	c      redis.Cmdable
	prefix string
	ttl    time.Duration
}

// New returns a Dedup over c whose keys are prefix + a message's key and
// live ttl (at least a millisecond).
func New(c redis.Cmdable, prefix string, ttl time.Duration) (*Dedup, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalid)
	}
	if ttl < time.Millisecond {
		return nil, fmt.Errorf("%w: ttl %v is under a millisecond (PX)", ErrInvalid, ttl)
	}
	return &Dedup{c: c, prefix: prefix, ttl: ttl}, nil
}

// Batch deduplicates one batch: keys[i] is message i's key, run(i) runs its
// handler and returns its outcome. It returns each message's Status. An
// error from Redis fails the whole batch (nothing is to be acked): the
// claim pipeline's before any handler ran, the outcome pipeline's after.
func (d *Dedup) Batch(ctx context.Context, keys []string, run func(i int) ([]byte, error)) ([]Status, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	p := d.c.Pipeline()
	claims := make([]*redis.BoolCmd, len(keys))
	for i, k := range keys {
		claims[i] = p.SetNX(ctx, d.prefix+k, "1", d.ttl)
	}
	if _, err := p.Exec(ctx); err != nil {
		return nil, fmt.Errorf("handdedup: claims: %w", err)
	}
	st := make([]Status, len(keys))
	for i, c := range claims {
		if !c.Val() {
			st[i] = Duplicate
			continue
		}
		out, err := run(i)
		if err != nil {
			st[i] = Failed
			p.Del(ctx, d.prefix+keys[i])
			continue
		}
		p.Set(ctx, d.prefix+keys[i], out, d.ttl)
	}
	if p.Len() > 0 {
		if _, err := p.Exec(ctx); err != nil {
			return nil, fmt.Errorf("handdedup: outcomes: %w", err)
		}
	}
	return st, nil
}
