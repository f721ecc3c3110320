package idemkafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemkafka"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
)

// sharedStore is consumetest's store on the real Redis, which idemctl and
// a child consumer open too.
func sharedStore(t testing.TB, prefix string) (store.Store, string) {
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	return redisStore(t, prefix), "redis://" + addr + "/0?prefix=" + prefix
}

// consumetest's find scenario: an operator who has what the producer sent
// finds the record through clientkey, which the consumer keys its records
// with: by default from the record's value and topic (-payload), and
// under KeyFromRecordKey from its record key and topic.
func TestRecordIsFoundFromWhatTheProducerSent(t *testing.T) {
	t.Parallel()
	consumetest.RecordIsFound(t, sharedStore, func(t *testing.T, e *idem.Engine) []clientkey.Material {
		seeds := brokers(t)
		tp := topic(t, seeds, 1)
		value := "{\"order\": 42}\n" // byte for byte, white space and all
		produce(t, seeds, &kgo.Record{Topic: tp, Key: []byte("customer-7"), Value: []byte(value)})
		var made []clientkey.Material
		for _, c := range []struct {
			cfg      idemkafka.Config
			material clientkey.Material
		}{
			{idemkafka.Config{Operation: "ship"}, clientkey.Material{Kind: clientkey.KindPayload, Operation: "ship", Topic: tp, Key: value}},
			{idemkafka.Config{Operation: "ship-by-customer", KeyFromRecordKey: true}, clientkey.Material{Kind: clientkey.KindKey, Operation: "ship-by-customer", Topic: tp, Key: "customer-7"}},
		} {
			done := make(chan struct{}, 1)
			c.cfg.Settled = func(_ *kgo.Record, v consume.Verdict) {
				if v.Action == consume.Done {
					done <- struct{}{}
				}
			}
			cons, err := idemkafka.New(e, &c.cfg, func(context.Context, *kgo.Record) (struct{}, error) { return struct{}{}, nil },
				groupOpts(seeds, "g-"+c.cfg.Operation+"-"+tp, tp)...)
			if err != nil {
				t.Fatal(err)
			}
			run := start(t, cons)
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("%s: the record was not done", c.cfg.Operation)
			}
			run.stop()
			made = append(made, c.material)
		}
		return made
	})
}
