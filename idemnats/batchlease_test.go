package idemnats_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seed-a1b882c0/idem/idemnats"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
	"github.com/seed-a1b882c0/idem/store"
)

// TestBatchHoldsItsClaims: consumetest's two members on a real JetStream,
// each a ConsumeBatch of its own (batches of 3, Concurrency 1) on a
// durable consumer of its own subject of one stream, over one store (memstore, Redis):
// no item of X's batch runs after its claim lapsed while it waited behind
// the slow head, and Y's copies of the tail, held off while X holds them,
// are acked as replays.
func TestBatchHoldsItsClaims(t *testing.T) { batchTail(t, consumetest.BatchHoldsItsClaims) }

// TestBatchSkipsLapsedClaims: the same, X's renewals of the tail failing
// until Y has taken it over and run it: X does not run the tail, leaves
// it (Leave), and acks its redeliveries as replays of Y's outcomes.
func TestBatchSkipsLapsedClaims(t *testing.T) { batchTail(t, consumetest.BatchSkipsLapsedClaims) }

// batchTail runs scenario through this adapter's members, over each store.
func batchTail(t *testing.T, scenario func(*testing.T, store.Store, consumetest.NewMember)) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			js, s, subj := stream(t)
			n := 0
			scenario(t, b.store(t), func(t *testing.T, c consumetest.MemberConfig) consumetest.Member {
				n++
				return &natsMember{js: js, s: s, subj: fmt.Sprintf("%s.member%d", subj, n), c: c}
			})
		})
	}
}

// natsMember is a consumetest.Member: ConsumeBatch on a durable consumer
// of its own subject.
type natsMember struct {
	js   jetstream.JetStream
	s    jetstream.Stream
	subj string
	c    consumetest.MemberConfig
}

func (m *natsMember) Publish(t *testing.T, key string, payload []byte) {
	msg := nats.NewMsg(m.subj)
	msg.Header.Set("Order-Id", key)
	msg.Header.Set(nats.MsgIdHdr, m.subj+"/"+key) // the copies are distinct publishes to the stream
	msg.Data = payload
	if _, err := m.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

func (m *natsMember) Start(t *testing.T) {
	const ackWait = 2 * time.Second // at most the engine's Lease
	cons, err := m.s.CreateOrUpdateConsumer(context.Background(), jetstream.ConsumerConfig{
		FilterSubject: m.subj, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	p, err := idemnats.WrapBatch(m.c.Engine, &idemnats.Config{Operation: m.c.Operation, Key: orderKey, AckWait: ackWait, Concurrency: m.c.Concurrency},
		func(ctx context.Context, msg jetstream.Msg) (struct{}, error) {
			return struct{}{}, m.c.Handle(ctx, msg.Headers().Get("Order-Id"))
		})
	if err != nil {
		t.Fatal(err)
	}
	consumeBatches(t, cons, &idemnats.BatchConfig{Size: m.c.Size, Batches: 1, Wait: 250 * time.Millisecond},
		func(ctx context.Context, msgs []jetstream.Msg) ([]idemnats.Disposition, []error) {
			ds, errs := p(ctx, msgs)
			for i, d := range ds {
				m.c.Settled(msgs[i].Headers().Get("Order-Id"), d == idemnats.Acked)
			}
			return ds, errs
		})
}
