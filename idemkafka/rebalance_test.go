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

// A second consumer joins the group while the first has a batch in
// flight (its handlers held until the rebalance waits for it): the first begins no more records, finishes the ones running,
// commits what is settled and lets the rebalance go on; the second takes
// its partitions from there. No record is skipped, and none runs twice.
func TestRebalanceWithRecordsInFlight(t *testing.T) {
	t.Parallel()
	const partitions, perPartition = 4, 10
	seeds := brokers(t)
	tp := topic(t, seeds, partitions)
	var recs []*kgo.Record
	for p := range int32(partitions) {
		for i := range perPartition {
			recs = append(recs, keyed(tp, p, fmt.Sprintf("p%d-%d", p, i)))
		}
	}
	produce(t, seeds, recs...)

	e := memEngine(t)
	group := "g-" + tp
	gate := make(chan struct{})
	var (
		mu      sync.Mutex
		runs    = map[string]int{}
		by      = map[string]int{} // records run by each consumer
		notBegA int
		held    int // a's handlers waiting at the gate
	)
	consumer := func(name string, settled func(*kgo.Record, consume.Verdict)) *idemkafka.Consumer {
		c, err := idemkafka.New(e, &idemkafka.Config{Operation: "ship", Settled: settled},
			func(ctx context.Context, r *kgo.Record) (struct{}, error) {
				if name == "a" && r.Offset == 0 {
					mu.Lock()
					held++
					mu.Unlock()
					<-gate // the first record of each partition runs across the rebalance
				}
				mu.Lock()
				runs[string(r.Key)]++
				by[name]++
				mu.Unlock()
				return struct{}{}, nil
			}, groupOpts(seeds, group, tp)...)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := consumer("a", func(_ *kgo.Record, v consume.Verdict) {
		if errors.Is(v.Err, idemkafka.ErrNotBegun) {
			mu.Lock()
			notBegA++
			mu.Unlock()
		}
	})
	start(t, a)
	open := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open) // before a is stopped, if the test fails first
	// a's first batch holds the first record of a partition or more (a
	// poll returns the partitions whose fetches have come back).
	waitFor(t, 20*time.Second, "a's first batch", func() bool { mu.Lock(); defer mu.Unlock(); return held > 0 })
	b := consumer("b", nil)
	start(t, b)
	waitFor(t, 20*time.Second, "the rebalance to wait for a's batch", func() bool { return idemkafka.RebalanceWaiting(a) })
	open()

	waitFor(t, 30*time.Second, "every partition committed to its end", func() bool {
		for p := range int32(partitions) {
			if committed(t, seeds, group, tp, p) != perPartition {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	for _, r := range recs {
		if n := runs[string(r.Key)]; n != 1 {
			t.Errorf("%s ran %d times, want 1", r.Key, n)
		}
	}
	if notBegA == 0 {
		t.Errorf("a began every record of its batch while the rebalance waited")
	}
	// Which consumer ran the rest depends on when the cooperative
	// rebalance's second round moves partitions to b.
	t.Logf("records run by consumer: %v", by)
}
