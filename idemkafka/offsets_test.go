package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemkafka"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func memEngine(t testing.TB) *idem.Engine {
	m := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	return newEngine(t, m, idem.Config{Lease: 30 * time.Second})
}

func keyed(topic string, partition int32, key string) *kgo.Record {
	return &kgo.Record{Topic: topic, Partition: partition, Key: []byte(key), Value: []byte(`{"order":"` + key + `"}`)}
}

// A record whose handler fails with a retryable error stops its partition
// there: the offset committed for it is that record's, never one past it,
// the records after it are not begun until it succeeded, in order, and the
// other partition goes on.
func TestOffsetsNeverPastAnUnsettledRecord(t *testing.T) {
	t.Parallel()
	seeds := brokers(t)
	tp := topic(t, seeds, 2)
	var recs []*kgo.Record
	for i := range 5 {
		recs = append(recs, keyed(tp, 0, fmt.Sprintf("a%d", i)))
	}
	for i := range 3 {
		recs = append(recs, keyed(tp, 1, fmt.Sprintf("b%d", i)))
	}
	produce(t, seeds, recs...)

	var (
		mu       sync.Mutex
		ran      []string // partition 0's runs, in order
		verdicts = map[string][]consume.Action{}
	)
	checked := make(chan struct{})
	a2 := 0
	group := "g-" + tp
	c, err := idemkafka.New(memEngine(t), &idemkafka.Config{
		Operation: "ship", RetryDelay: 50 * time.Millisecond,
		Settled: func(r *kgo.Record, v consume.Verdict) {
			mu.Lock()
			defer mu.Unlock()
			verdicts[string(r.Key)] = append(verdicts[string(r.Key)], v.Action)
		},
	}, func(ctx context.Context, r *kgo.Record) (struct{}, error) {
		k := string(r.Key)
		mu.Lock()
		if r.Partition == 0 {
			ran = append(ran, k)
		}
		if k == "a2" {
			a2++
			if a2 == 1 {
				mu.Unlock()
				return struct{}{}, errors.New("downstream timeout")
			}
		}
		mu.Unlock()
		if k == "a2" {
			<-checked // the test reads the committed offsets meanwhile
		}
		return struct{}{}, nil
	}, groupOpts(seeds, group, tp)...)
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	release := sync.OnceFunc(func() { close(checked) })
	t.Cleanup(release) // before c is stopped, if the test fails first
	// a2 failed once and runs again, held: a0 and a1 are committed, not a2.
	waitFor(t, 20*time.Second, "a2's second run", func() bool { mu.Lock(); defer mu.Unlock(); return a2 == 2 })
	waitFor(t, 10*time.Second, "partition 1 committed", func() bool { return committed(t, seeds, group, tp, 1) == 3 })
	if got := committed(t, seeds, group, tp, 0); got != 2 {
		t.Errorf("partition 0 committed at %d while a2 was not settled, want 2", got)
	}
	mu.Lock()
	if slices.Contains(ran, "a3") || slices.Contains(ran, "a4") {
		t.Errorf("records after a2 began before a2 succeeded: %v", ran)
	}
	if v := verdicts["a2"]; len(v) != 1 || v[0] != consume.Retry {
		t.Errorf("a2 settled as %v, want [retry]", v)
	}
	mu.Unlock()
	release()
	waitFor(t, 10*time.Second, "partition 0 committed", func() bool { return committed(t, seeds, group, tp, 0) == 5 })
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"a0", "a1", "a2", "a2", "a3", "a4"}; !slices.Equal(ran, want) {
		t.Errorf("partition 0 ran %v, want %v", ran, want)
	}
}

// A record the verdict dead-letters goes to the dead-letter topic with the
// reason and its origin in headers, and the partition moves past it: a
// terminal error, and a record without a key (a tombstone: no value to key
// it by, under the default key).
func TestDeadLetterTopic(t *testing.T) {
	t.Parallel()
	seeds := brokers(t)
	tp, dlq := topic(t, seeds, 2), topic(t, seeds, 1)
	produce(t, seeds,
		keyed(tp, 0, "declined"),
		&kgo.Record{Topic: tp, Partition: 0}, // a tombstone: no key, no value
		keyed(tp, 0, "ok"),
		keyed(tp, 1, "ok-1"),
	)
	producer, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	var (
		mu    sync.Mutex
		ran   = map[string]int{}
		noKey []consume.Verdict
	)
	group := "g-" + tp
	c, err := idemkafka.New(memEngine(t), &idemkafka.Config{
		Operation:  "ship",
		DeadLetter: &idemkafka.DeadLetter{Client: producer, Topic: dlq},
		Settled: func(r *kgo.Record, v consume.Verdict) {
			if len(r.Key) == 0 {
				mu.Lock()
				noKey = append(noKey, v)
				mu.Unlock()
			}
		},
	}, func(ctx context.Context, r *kgo.Record) (struct{}, error) {
		mu.Lock()
		ran[fmt.Sprintf("%d/%s", r.Partition, r.Key)]++
		mu.Unlock()
		if string(r.Key) == "declined" {
			return struct{}{}, idem.Terminal(errors.New("card declined"), "declined")
		}
		return struct{}{}, nil
	}, groupOpts(seeds, group, tp)...)
	if err != nil {
		t.Fatal(err)
	}
	run := start(t, c)
	waitFor(t, 20*time.Second, "both partitions committed", func() bool {
		return committed(t, seeds, group, tp, 0) == 3 && committed(t, seeds, group, tp, 1) == 1
	})
	run.stop()
	mu.Lock()
	if want := map[string]int{"0/declined": 1, "0/ok": 1, "1/ok-1": 1}; fmt.Sprint(ran) != fmt.Sprint(want) {
		t.Errorf("ran %v, want %v", ran, want)
	}
	// The record without a key is settled by consume.Decide's verdict for
	// "no usable key", as every consumer's is.
	for _, v := range noKey {
		if v.Action != consume.DeadLetter || !errors.Is(v.Err, consume.ErrNoKey) || !errors.Is(v.Err, idemkafka.ErrNoKey) {
			t.Errorf("record without a key: %v %v, want DeadLetter with consume.ErrNoKey and idemkafka.ErrNoKey", v.Action, v.Err)
		}
	}
	if len(noKey) == 0 {
		t.Error("the record without a key was not settled")
	}
	mu.Unlock()

	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(got) < 2 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, r) })
	}
	if len(got) != 2 {
		t.Fatalf("%d dead letters, want 2", len(got))
	}
	header := func(r *kgo.Record, k string) string {
		for _, h := range r.Headers {
			if h.Key == k {
				return string(h.Value)
			}
		}
		return ""
	}
	for i, want := range []struct{ key, offset, reason string }{{"declined", "0", "card declined"}, {"", "1", "no key"}} {
		r := got[i]
		if string(r.Key) != want.key || header(r, idemkafka.HeaderTopic) != tp || header(r, idemkafka.HeaderPartition) != "0" ||
			header(r, idemkafka.HeaderOffset) != want.offset || !strings.Contains(header(r, idemkafka.HeaderReason), want.reason) {
			t.Errorf("dead letter %d: key %q headers %v, want key %q from %s/0 at %s, reason with %q", i, r.Key, r.Headers, want.key, tp, want.offset, want.reason)
		}
	}
}

// New refuses what cannot work, naming it.
func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	e := memEngine(t)
	fn := func(context.Context, *kgo.Record) (struct{}, error) { return struct{}{}, nil }
	for _, c := range []struct {
		name string
		cfg  *idemkafka.Config
		opts []kgo.Opt
		want string
	}{
		{"no operation", &idemkafka.Config{}, []kgo.Opt{kgo.ConsumerGroup("g")}, "Operation"},
		{"key and header", &idemkafka.Config{Operation: "x", KeyHeader: "k", Key: func(*kgo.Record) (string, error) { return "", nil }}, []kgo.Opt{kgo.ConsumerGroup("g")}, "KeyHeader"},
		{"header and record key", &idemkafka.Config{Operation: "x", KeyHeader: "k", KeyFromRecordKey: true}, []kgo.Opt{kgo.ConsumerGroup("g")}, "KeyFromRecordKey"},
		{"key and record key", &idemkafka.Config{Operation: "x", Key: func(*kgo.Record) (string, error) { return "", nil }, KeyFromRecordKey: true}, []kgo.Opt{kgo.ConsumerGroup("g")}, "KeyFromRecordKey"},
		{"dead letter without topic", &idemkafka.Config{Operation: "x", DeadLetter: &idemkafka.DeadLetter{}}, []kgo.Opt{kgo.ConsumerGroup("g")}, "DeadLetter"},
		{"no group", &idemkafka.Config{Operation: "x"}, nil, "group"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := idemkafka.New(e, c.cfg, fn, append(c.opts, kgo.SeedBrokers("127.0.0.1:1"))...)
			if !errors.Is(err, idemkafka.ErrInvalidConfig) || !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("New: %v, want ErrInvalidConfig naming %s", err, c.want)
			}
		})
	}
}

// A record sent twice (a producer's retry), the copies next to each other
// in one poll, runs once: the later copy replays the first one's outcome
// and is settled as done, with no wait for a key held in flight.
func TestDuplicateInOnePoll(t *testing.T) {
	t.Parallel()
	seeds := brokers(t)
	tp := topic(t, seeds, 1)
	produce(t, seeds, keyed(tp, 0, "a"), keyed(tp, 0, "a"), keyed(tp, 0, "b"), keyed(tp, 0, "b"))
	var (
		mu       sync.Mutex
		ran      []string
		verdicts []consume.Action
	)
	group := "g-" + tp
	c, err := idemkafka.New(memEngine(t), &idemkafka.Config{
		Operation: "ship", RetryDelay: time.Hour,
		Settled: func(r *kgo.Record, v consume.Verdict) {
			mu.Lock()
			defer mu.Unlock()
			verdicts = append(verdicts, v.Action)
		},
	}, func(ctx context.Context, r *kgo.Record) (struct{}, error) {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, string(r.Key))
		return struct{}{}, nil
	}, groupOpts(seeds, group, tp)...)
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	waitFor(t, 20*time.Second, "the partition committed", func() bool { return committed(t, seeds, group, tp, 0) == 4 })
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(ran, []string{"a", "b"}) || !slices.Equal(verdicts, []consume.Action{consume.Done, consume.Done, consume.Done, consume.Done}) {
		t.Errorf("ran %v, settled %v; want [a b], four done", ran, verdicts)
	}
}

// A record whose outcome write fails for all of the engine's WriteTimeout
// (done, consume.ErrOutcomeNotRecorded) stops its partition there: the
// offset committed is that record's, the records after it come again
// behind it (idemkafka.ErrBehind) and replay their recorded outcomes
// without running again, and the records whose outcomes were not
// recorded run again once their leases have passed (the store never
// learnt that they ran).
func TestCommitStopsAtUnrecordedOutcome(t *testing.T) {
	t.Parallel()
	seeds := brokers(t)
	tp := topic(t, seeds, 1)
	const op = "ship"
	var recs []*kgo.Record
	for i := range 6 {
		recs = append(recs, &kgo.Record{Topic: tp, Value: []byte(`{"n":1}`), Headers: []kgo.RecordHeader{{Key: "Idem-Key", Value: fmt.Appendf(nil, "k%d", i)}}})
	}
	produce(t, seeds, recs...)

	m := memstore.New(&memstore.Config{SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	fs := faultstore.New(m)
	var (
		mu       sync.Mutex
		runs     = map[string]int{}
		verdicts = map[string][]consume.Verdict{}
	)
	// k2's and k4's Completes fail while their first runs are the only
	// ones: past WriteTimeout, each retry included.
	faulted := map[string]string{} // store key → record key
	for _, k := range []string{"k2", "k4"} {
		sk, err := idem.NewStoreKey(op, "", []byte(k))
		if err != nil {
			t.Fatal(err)
		}
		faulted[sk.String()] = k
	}
	fs.FailKeys("complete", func(key string) error {
		k, ok := faulted[key]
		if !ok {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if runs[k] == 1 {
			return fmt.Errorf("connection refused: %w", store.ErrUnavailable)
		}
		return nil
	})
	e := newEngine(t, fs, idem.Config{Lease: time.Second, WriteTimeout: 150 * time.Millisecond})
	checked := make(chan struct{})
	group := "g-" + tp
	c, err := idemkafka.New(e, &idemkafka.Config{
		Operation: op, KeyHeader: "Idem-Key", RetryDelay: 50 * time.Millisecond,
		Settled: func(r *kgo.Record, v consume.Verdict) {
			mu.Lock()
			defer mu.Unlock()
			k := string(r.Headers[0].Value)
			verdicts[k] = append(verdicts[k], v)
		},
	}, func(ctx context.Context, r *kgo.Record) (struct{}, error) {
		k := string(r.Headers[0].Value)
		mu.Lock()
		runs[k]++
		again := k == "k2" && runs[k] == 2
		mu.Unlock()
		if again {
			<-checked // the test reads the committed offset meanwhile
		}
		return struct{}{}, nil
	}, groupOpts(seeds, group, tp)...)
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	release := sync.OnceFunc(func() { close(checked) })
	t.Cleanup(release) // before c is stopped, if the test fails first

	// k2 runs again after its lease: until then, the offset stays at it.
	waitFor(t, 20*time.Second, "k2's second run", func() bool { mu.Lock(); defer mu.Unlock(); return runs["k2"] == 2 })
	if got := committed(t, seeds, group, tp, 0); got != 2 {
		t.Errorf("committed offset %d while k2's outcome was not recorded, want 2 (k2's)", got)
	}
	mu.Lock()
	if v := verdicts["k2"]; len(v) == 0 || v[0].Action != consume.Done || !errors.Is(v[0].Err, consume.ErrOutcomeNotRecorded) {
		t.Errorf("k2 first settled as %v, want done with consume.ErrOutcomeNotRecorded", v)
	}
	mu.Unlock()
	release()
	waitFor(t, 20*time.Second, "the partition committed", func() bool { return committed(t, seeds, group, tp, 0) == 6 })

	mu.Lock()
	defer mu.Unlock()
	if want := map[string]int{"k0": 1, "k1": 1, "k2": 2, "k3": 1, "k4": 2, "k5": 1}; fmt.Sprint(runs) != fmt.Sprint(want) {
		t.Errorf("handler runs %v, want %v: a recorded record ran again, or an unrecorded one did not", runs, want)
	}
	// The records behind k2 were settled as behind it until k2 was
	// recorded; those recorded then replayed (done, not run again).
	for _, k := range []string{"k3", "k5"} {
		vs := verdicts[k]
		for i, v := range vs {
			last := i == len(vs)-1
			if last && (v.Action != consume.Done || v.Err != nil) || !last && !errors.Is(v.Err, idemkafka.ErrBehind) {
				t.Errorf("%s settled as %v, want behind k2 and then done", k, vs)
				break
			}
		}
		if len(vs) < 2 {
			t.Errorf("%s settled as %v, want behind k2 at least once, and then done", k, vs)
		}
	}
}
