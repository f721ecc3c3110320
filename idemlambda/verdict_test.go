package idemlambda_test

import (
	"context"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/idemtest/consumetest"
)

// The consumers' table (idemtest/consumetest) through the SQS adapter, on
// aws-lambda-go's SQS event shape: every situation settles the record by
// consume's verdict, and exactly the records not Done are reported as
// batch item failures.
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
}
