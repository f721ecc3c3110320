package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemkafka"
)

// countingParent is a cancelable context that is not one of package
// context's own, so a context derived from it registers with it through
// its AfterFunc method, and one cancelled unregisters (calls stop): the
// registrations still held are the children nobody cancelled.
type countingParent struct {
	context.Context // Background: no deadline, no values

	mu         sync.Mutex
	done       chan struct{}
	err        error
	funcs      map[int]func()
	registered int
}

func newCountingParent() *countingParent {
	return &countingParent{Context: context.Background(), done: make(chan struct{}), funcs: map[int]func(){}}
}

func (p *countingParent) Done() <-chan struct{} { return p.done }

func (p *countingParent) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// AfterFunc is what package context calls to tie a child to p.
func (p *countingParent) AfterFunc(f func()) (stop func() bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id := p.registered
	p.registered++
	if p.err != nil {
		go f()
		return func() bool { return false }
	}
	p.funcs[id] = f
	return func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		_, ok := p.funcs[id]
		delete(p.funcs, id)
		return ok
	}
}

func (p *countingParent) cancel() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return
	}
	p.err = context.Canceled
	close(p.done)
	for _, f := range p.funcs {
		go f()
	}
	p.funcs = nil
}

// counts returns how many children were ever tied to p and how many are
// still.
func (p *countingParent) counts() (registered, live int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registered, len(p.funcs)
}

// Polls while a partition is paused leave no context behind: Run's
// context holds no more children after fifty of them than after one (it
// kept one per poll, never cancelled, until Run's context ended).
func TestPausedPartitionPollsLeakNoContext(t *testing.T) {
	t.Parallel()
	seeds := brokers(t)
	tp := topic(t, seeds, 2)
	// Partition 0's record always fails: the partition waits an hour
	// before it comes again, paused for the whole test. Partition 1's
	// records come one a poll.
	produce(t, seeds, keyed(tp, 0, "stuck"))
	settled := make(chan string, 100)
	c, err := idemkafka.New(memEngine(t), &idemkafka.Config{
		Operation: "ship", RetryDelay: time.Hour,
		Settled: func(r *kgo.Record, v consume.Verdict) { settled <- string(r.Key) },
	}, func(ctx context.Context, r *kgo.Record) (struct{}, error) {
		if string(r.Key) == "stuck" {
			return struct{}{}, errors.New("downstream timeout")
		}
		return struct{}{}, nil
	}, groupOpts(seeds, "g-"+tp, tp)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := newCountingParent()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		ctx.cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		c.Close()
	}()
	next := func(want string) {
		t.Helper()
		select {
		case k := <-settled:
			if k != want {
				t.Fatalf("settled %q, want %q", k, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%q not settled", want)
		}
	}
	next("stuck")
	producer, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	const polls = 50
	for i := range polls {
		r := keyed(tp, 1, fmt.Sprintf("r%d", i))
		if err := producer.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		next(string(r.Key))
	}
	// The poll under way holds one child; a batch's engine calls hold
	// theirs only while they run.
	deadline := time.Now().Add(10 * time.Second)
	for {
		registered, live := ctx.counts()
		if registered < polls {
			t.Fatalf("only %d children were ever tied to Run's context over %d polls: the test did not see the polls", registered, polls)
		}
		if live <= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d polls with a partition paused, Run's context holds %d children never cancelled (of %d)", polls, live, registered)
		}
		time.Sleep(10 * time.Millisecond) // a batch's last calls may still be returning
	}
}
