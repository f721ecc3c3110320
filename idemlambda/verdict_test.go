package idemlambda_test

import (
	"context"
	"slices"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
)

// The consumers' table (idemtest/consumetest) through the SQS and stream
// adapters, on aws-lambda-go's event shapes: every situation settles the
// record by consume's verdict, and exactly the records not Done are
// reported as batch item failures — for streams, which move past a dead
// letter unless StopOnDeadLetter is set, the records neither Done nor
// DeadLetter.
func TestVerdicts(t *testing.T) {
	t.Run("SQS", func(t *testing.T) {
		consumetest.Run(t, func(t *testing.T, f *consumetest.Fixture, key string, payload []byte, handle func(context.Context) error) consume.Verdict {
			var got consume.Verdict
			h, err := idemlambda.SQS(f.Engine, "verdicts", func(ctx context.Context, _ events.SQSMessage) error { return handle(ctx) },
				&idemlambda.SQSConfig{Config: idemlambda.Config{Operation: f.Operation, ValidationJMESPath: "body"},
					Settled: func(_ events.SQSMessage, v consume.Verdict) { got = v }})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := h(context.Background(), events.SQSEvent{Records: []events.SQSMessage{{
				MessageId: key, Body: string(payload), EventSourceARN: "arn:aws:sqs:eu-west-1:123456789012:orders",
			}}})
			if err != nil {
				t.Fatal(err)
			}
			if reported := len(resp.BatchItemFailures) == 1 && resp.BatchItemFailures[0].ItemIdentifier == key; reported == (got.Action == consume.Done) {
				t.Errorf("verdict %v, batch item failures %+v", got.Action, resp.BatchItemFailures)
			}
			return got
		})
	})
	for _, stop := range []bool{false, true} {
		for _, src := range streamSources() {
			name := src.name
			if stop {
				name += "/StopOnDeadLetter"
			}
			t.Run(name, func(t *testing.T) {
				consumetest.Run(t, func(t *testing.T, f *consumetest.Fixture, key string, payload []byte, handle func(context.Context) error) consume.Verdict {
					var got consume.Verdict
					// The record's sequence number is the key (the default
					// key is its eventID, made from it) and its order is
					// the payload, which the validation selects.
					r := rec{seq: key, order: string(payload)}
					deliver := src.open(t, f.Engine, streamOpts{
						Config:           idemlambda.Config{Operation: f.Operation, ValidationJMESPath: src.payloadKey},
						StopOnDeadLetter: stop,
						Settled: func(r rec, v consume.Verdict) {
							if r.seq == key {
								got = v
							}
						},
					}, func(ctx context.Context, r rec) error {
						if r.seq != key {
							return nil // the record after it
						}
						return handle(ctx)
					})
					failed := deliver(context.Background(), []rec{r, {seq: key + "-next", order: "next"}})
					want := got.Action != consume.Done && (stop || got.Action != consume.DeadLetter)
					if reported := slices.Equal(failed, []string{key}); reported != want || (!want && failed != nil) {
						t.Errorf("verdict %v, batch item failures %v", got.Action, failed)
					}
					return got
				})
			})
		}
	}
}
