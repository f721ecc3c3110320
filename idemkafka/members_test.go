package idemkafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemkafka"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// membersLease is the engines' lease in TestSlowHeadRecordTwoMembers: the
// slow record's handler outlasts it, so the claims of the records behind
// it would lapse if they were not renewed while they wait.
const membersLease = 2 * time.Second

// Two members of one group, an engine each over one store, one partition
// each. Member X's partition holds [a record whose handler outlasts the
// lease, M1, M2]; the same messages M1 and M2 (same key header, same
// payload) are then produced to the partition member Y consumes, while X
// runs the slow record. X claimed M1 and M2 with its batch and holds them
// while they wait behind the slow record (their leases renewed together):
// Y meets them held (consume.RetryAfter) until X has recorded them, and
// then replays them. Every key runs exactly once, and both partitions are
// committed to their ends. Real time: the lease must pass in another
// member.
func TestSlowHeadRecordTwoMembers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		store func(t *testing.T) store.Store
	}{
		{"memstore", func(t *testing.T) store.Store {
			m := memstore.New(&memstore.Config{SweepInterval: -1})
			t.Cleanup(func() { m.Close() })
			return m
		}},
		{"redis", func(t *testing.T) store.Store {
			return redisStore(t, fmt.Sprintf("idemkafka-members-%d:", rand.Uint64()))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			slowHeadRecordTwoMembers(t, c.store(t))
		})
	}
}

func slowHeadRecordTwoMembers(t *testing.T, st store.Store) {
	seeds := brokers(t)
	tp := topic(t, seeds, 2)
	group := "g-" + tp
	const slow = 3500 * time.Millisecond
	var (
		mu       sync.Mutex
		runs     = map[string]int{}
		ranBy    = map[string]string{}  // key → the member that ran it
		held     = map[string]int{}     // Y's verdicts RetryAfter, by key
		owns     = map[string][]int32{} // member → its partitions
		slowRan  = make(chan struct{})
		slowOnce sync.Once
	)
	member := func(name string) *idemkafka.Consumer {
		e := newEngine(t, st, idem.Config{Lease: membersLease, Expiry: time.Minute, Owner: name})
		opts := append(groupOpts(seeds, group, tp),
			// An eager balancer: every rebalance assigns each member its
			// whole share anew, which OnPartitionsAssigned then names.
			kgo.Balancers(kgo.RangeBalancer()),
			// A session that outlasts a loaded machine's missed
			// heartbeats: a member dropped from the group mid-test would
			// hand its partition to the other.
			kgo.SessionTimeout(10*time.Second),
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
				mu.Lock()
				defer mu.Unlock()
				owns[name] = assigned[tp]
			}),
		)
		c, err := idemkafka.New(e, &idemkafka.Config{Operation: "ship", KeyHeader: "Idem-Key", RetryDelay: 100 * time.Millisecond,
			Settled: func(r *kgo.Record, v consume.Verdict) {
				if name == "y" && v.Action == consume.RetryAfter {
					mu.Lock()
					held[string(r.Headers[0].Value)]++
					mu.Unlock()
				}
			}},
			func(ctx context.Context, r *kgo.Record) (struct{}, error) {
				k := string(r.Headers[0].Value)
				mu.Lock()
				runs[k]++
				ranBy[k] = name
				mu.Unlock()
				if k == "slow" {
					slowOnce.Do(func() { close(slowRan) })
					select {
					case <-time.After(slow):
					case <-ctx.Done():
						return struct{}{}, ctx.Err()
					}
				}
				return struct{}{}, nil
			}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	began := time.Now()
	start(t, member("x"))
	start(t, member("y"))
	// Once the group has given each member one partition, the member
	// named x plays X, and its partition is A.
	waitFor(t, 20*time.Second, "one partition for each member", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(owns["x"]) == 1 && len(owns["y"]) == 1 && owns["x"][0] != owns["y"][0]
	})
	mu.Lock()
	a := owns["x"][0]
	mu.Unlock()
	b := 1 - a
	rec := func(p int32, key string) *kgo.Record {
		return &kgo.Record{Topic: tp, Partition: p, Value: []byte(`{"order":"` + key + `"}`), Headers: []kgo.RecordHeader{{Key: "Idem-Key", Value: []byte(key)}}}
	}
	t.Logf("group settled after %v", time.Since(began).Round(time.Millisecond))
	began = time.Now()
	produce(t, seeds, rec(a, "slow"), rec(a, "m1"), rec(a, "m2"))
	select {
	case <-slowRan: // X holds the claims of m1 and m2 now, behind the slow record
	case <-time.After(20 * time.Second):
		t.Fatal("the slow record never ran")
	}
	produce(t, seeds, rec(b, "m1"), rec(b, "m2"))

	waitFor(t, 30*time.Second, "both partitions committed to their ends", func() bool {
		return committed(t, seeds, group, tp, a) == 3 && committed(t, seeds, group, tp, b) == 2
	})
	t.Logf("committed %v after the first produce", time.Since(began).Round(time.Millisecond))
	mu.Lock()
	defer mu.Unlock()
	if held["m1"] == 0 {
		t.Errorf("Y never met m1 held by X (%v): the scenario did not happen", held)
	}
	if want := map[string]int{"m1": 1, "m2": 1, "slow": 1}; fmt.Sprint(runs) != fmt.Sprint(want) {
		t.Errorf("handler runs %v, want %v: a key ran in both members", runs, want)
	}
	if len(owns["x"]) != 1 || owns["x"][0] != a || len(owns["y"]) != 1 {
		t.Errorf("the assignment changed during the test: %v", owns)
	}
	if want := map[string]string{"m1": "x", "m2": "x", "slow": "x"}; fmt.Sprint(ranBy) != fmt.Sprint(want) {
		t.Errorf("ran by %v, want X to have run every key (it claimed them all first)", ranBy)
	}
}
