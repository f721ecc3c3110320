package idemkafka_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemkafka"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
)

// deliver is consumetest's Deliver through a consumer group on a topic of
// its own: records (the case's last) are produced to one partition and
// consumed by a Consumer until the case's record is settled; it returns
// that record's verdict and checks the offset committed for it: past it
// when it is settled (done with its outcome recorded, or dead-lettered),
// nothing when it is not.
func deliver(t *testing.T, seeds []string, f *consumetest.Fixture, payload []byte, keys []string, handle func(context.Context) error, key string) consume.Verdict {
	tp := topic(t, seeds, 1)
	var recs []*kgo.Record
	for _, k := range keys {
		recs = append(recs, &kgo.Record{Topic: tp, Value: payload, Headers: []kgo.RecordHeader{{Key: "Idem-Key", Value: []byte(k)}}})
	}
	produce(t, seeds, recs...)
	last := int64(len(keys) - 1)
	var (
		mu   sync.Mutex
		vs   = map[int64]consume.Verdict{}
		got  = make(chan struct{})
		once sync.Once
	)
	group := "g-" + tp
	c, err := idemkafka.New(f.Engine, &idemkafka.Config{
		Operation: f.Operation, KeyHeader: "Idem-Key", RetryDelay: time.Hour,
		Settled: func(r *kgo.Record, v consume.Verdict) {
			mu.Lock()
			defer mu.Unlock()
			if _, ok := vs[r.Offset]; !ok {
				vs[r.Offset] = v
			}
			if r.Offset == last {
				once.Do(func() { close(got) })
			}
		},
	}, func(ctx context.Context, r *kgo.Record) (struct{}, error) {
		if string(r.Headers[0].Value) != key {
			return struct{}{}, nil
		}
		return struct{}{}, handle(ctx)
	}, groupOpts(seeds, group, tp)...)
	if err != nil {
		t.Fatal(err)
	}
	run := start(t, c)
	select {
	case <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("the record was never settled")
	}
	run.stop()
	mu.Lock()
	defer mu.Unlock()
	v := vs[last]
	want := int64(-1)
	switch {
	case v.Action == consume.Done && v.Err == nil, v.Action == consume.DeadLetter:
		want = last + 1
	default:
		if last > 0 {
			want = last // the others before it, settled
		}
	}
	if got := committed(t, seeds, group, tp, 0); got != want {
		t.Errorf("%v: committed offset %d, want %d", v.Action, got, want)
	}
	for o := range last {
		if vs[o].Action != consume.Done {
			t.Errorf("record %d before the case's: %v (%v), want done", o, vs[o].Action, vs[o].Err)
		}
	}
	return v
}

// The consumers' table (idemtest/consumetest), through a consumer group:
// every situation settles the record by consume's verdict, and the offset
// is committed past it only when that verdict settles it.
func TestVerdicts(t *testing.T) {
	seeds := brokers(t)
	consumetest.Run(t, func(t *testing.T, f *consumetest.Fixture, key string, payload []byte, handle func(context.Context) error) consume.Verdict {
		return deliver(t, seeds, f, payload, []string{key}, handle, key)
	})
}

// The same table through a batch: each case's record comes after another
// record of its partition (a fresh key whose handler succeeds) in one
// poll, so the two keys are claimed in one batch claim; the case's record
// must be settled by the same verdict as alone, and the other one done
// and committed.
func TestVerdictsBatch(t *testing.T) {
	seeds := brokers(t)
	var n atomic.Int64
	consumetest.Run(t, func(t *testing.T, f *consumetest.Fixture, key string, payload []byte, handle func(context.Context) error) consume.Verdict {
		v := deliver(t, seeds, f, payload, []string{fmt.Sprintf("other-%d", n.Add(1)), key}, handle, key)
		if f.Store.Calls("claim_batch") == 0 {
			t.Error("the batch's keys were not claimed in a batch claim")
		}
		return v
	})
}
