package idemnats_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	verdict "github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemnats"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
)

// The consumers' table (idemtest/consumetest), through a real JetStream,
// on each path: every situation settles the message by consume's verdict.
// On the batch path each case's message arrives in one batch after
// another message (a fresh key whose handler succeeds), so its key is
// claimed in a batch claim; it must be settled by the same verdict as
// alone, and the other message must be acked whatever happened to it.
func TestVerdicts(t *testing.T) {
	for _, pa := range paths {
		t.Run(pa.name, func(t *testing.T) {
			js, s, subj := stream(t)
			n := 0
			consumetest.Run(t, func(t *testing.T, f *consumetest.Fixture, key string, payload []byte, handle func(context.Context) error) verdict.Verdict {
				ctx := context.Background()
				n++
				sub := fmt.Sprintf("%s.%d", subj, n)
				keys := []string{key}
				if pa.batch {
					keys = []string{"other-" + sub, key}
				}
				for i, k := range keys {
					m := nats.NewMsg(sub)
					m.Header.Set("Idem-Key", k)
					m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("%s/%d", sub, i)) // one publish per delivery: JetStream's own dedup stays out of the way
					m.Data = payload
					if _, err := js.PublishMsg(ctx, m); err != nil {
						t.Fatal(err)
					}
				}
				c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{FilterSubject: sub, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				var msgs []jetstream.Msg
				for len(msgs) < len(keys) {
					msgs = append(msgs, fetchN(t, c, len(keys)-len(msgs), 5*time.Second)...)
				}
				p := pa.wrap(t, f.Engine, &idemnats.Config{Operation: f.Operation, AckWait: 10 * time.Second, Key: func(m jetstream.Msg) (string, error) {
					if k := m.Headers().Get("Idem-Key"); k != "" {
						return k, nil
					}
					return "", errors.New("no Idem-Key")
				}}, func(ctx context.Context, m jetstream.Msg) (struct{}, error) {
					if m.Headers().Get("Idem-Key") != key {
						return struct{}{}, nil
					}
					return struct{}{}, handle(ctx)
				})
				ds, errs := p(ctx, msgs)
				if !pa.batch {
					return verdictOf(ds[0], errs[0])
				}
				if f.Store.Calls("claim_batch") == 0 {
					t.Error("the batch's keys were not claimed in a batch claim")
				}
				if ds[0] != idemnats.Acked {
					t.Errorf("the other message of the batch: %v (%v), want acked", ds[0], errs[0])
				}
				return verdictOf(ds[1], errs[1])
			})
		})
	}
}

// verdictOf is the verdict a disposition carries out.
func verdictOf(d idemnats.Disposition, err error) verdict.Verdict {
	return verdict.Verdict{Action: map[idemnats.Disposition]verdict.Action{
		idemnats.Acked: verdict.Done, idemnats.Termed: verdict.DeadLetter, idemnats.Delayed: verdict.RetryAfter,
		idemnats.Nakked: verdict.Retry, idemnats.Left: verdict.Leave,
	}[d], Err: err}
}
