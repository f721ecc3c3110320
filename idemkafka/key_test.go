package idemkafka_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemkafka"
)

// keyTest runs a consumer under cfg on a topic of two partitions: it
// produces recs (Topic set here) and waits until the group committed want
// records on partitions 0 and 1; it returns the values run and each
// offset's verdict, by partition.
type keyTest struct {
	t     *testing.T
	seeds []string
	tp    string
	group string

	mu  sync.Mutex
	ran []string
	vs  map[int32][]consume.Verdict
}

func newKeyTest(t *testing.T, cfg idemkafka.Config) *keyTest {
	k := &keyTest{t: t, seeds: brokers(t), vs: map[int32][]consume.Verdict{}}
	k.tp = topic(t, k.seeds, 2)
	k.group = "g-" + k.tp
	cfg.Operation, cfg.RetryDelay = "ship", 50*time.Millisecond
	cfg.Settled = func(r *kgo.Record, v consume.Verdict) {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.vs[r.Partition] = append(k.vs[r.Partition], v)
	}
	c, err := idemkafka.New(memEngine(t), &cfg, func(ctx context.Context, r *kgo.Record) (struct{}, error) {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.ran = append(k.ran, string(r.Value))
		return struct{}{}, nil
	}, groupOpts(k.seeds, k.group, k.tp)...)
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	return k
}

// send produces recs to the test's topic and waits until partition's
// committed offset is at.
func (k *keyTest) send(partition int32, at int64, recs ...*kgo.Record) {
	k.t.Helper()
	for _, r := range recs {
		r.Topic, r.Partition = k.tp, partition
	}
	produce(k.t, k.seeds, recs...)
	waitFor(k.t, 20*time.Second, "the records committed", func() bool { return committed(k.t, k.seeds, k.group, k.tp, partition) == at })
}

// A record key usually names an entity: two different events of one
// customer share it. By default a record is keyed by its value under its
// topic, so both run; and a copy of a record is a duplicate in whichever
// partition it comes (a producer's retry after a repartition, a
// mirrored copy). With KeyFromRecordKey the second event is a key reused
// with another payload: dead-lettered.
func TestDefaultKeyIsTheValueUnderTheTopic(t *testing.T) {
	t.Parallel()
	placed := func() *kgo.Record {
		return &kgo.Record{Key: []byte("customer-7"), Value: []byte(`{"order":42,"event":"placed"}`)}
	}
	paid := func() *kgo.Record {
		return &kgo.Record{Key: []byte("customer-7"), Value: []byte(`{"order":42,"event":"paid"}`)}
	}
	t.Run("default", func(t *testing.T) {
		t.Parallel()
		k := newKeyTest(t, idemkafka.Config{})
		k.send(0, 2, placed(), paid())
		k.send(1, 1, placed()) // the copy, in the other partition
		k.mu.Lock()
		defer k.mu.Unlock()
		if len(k.ran) != 2 || k.ran[0] != string(placed().Value) || k.ran[1] != string(paid().Value) {
			t.Errorf("ran %q, want placed and paid, once each", k.ran)
		}
		for p, vs := range k.vs {
			for _, v := range vs {
				if v.Action != consume.Done {
					t.Errorf("partition %d: %v %v, want every record done", p, v.Action, v.Err)
				}
			}
		}
	})
	t.Run("KeyFromRecordKey", func(t *testing.T) {
		t.Parallel()
		k := newKeyTest(t, idemkafka.Config{KeyFromRecordKey: true})
		k.send(0, 2, placed(), paid())
		k.mu.Lock()
		defer k.mu.Unlock()
		if len(k.ran) != 1 {
			t.Errorf("ran %q, want placed alone", k.ran)
		}
		if vs := k.vs[0]; len(vs) != 2 || vs[0].Action != consume.Done || vs[1].Action != consume.DeadLetter || !errors.Is(vs[1].Err, idem.ErrMismatch) {
			t.Errorf("verdicts %+v, want done, then a dead letter: a key reused", vs)
		}
	})
}
