package idemlambda_test

import (
	"context"
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/idemtest/faultstore"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// TestEveryAdapterKeepsTheInvocationDeadlineAsTheLease: Lambda ends an
// invocation at its deadline, so every adapter marks the invocation's
// context with idem.EndsAtDeadline and the engine does not renew the lease
// the deadline set, so that a retry takes over as soon as the deadline has
// passed. Each handler here runs past its deadline (which Lambda would not
// let it do): its lease is never renewed.
func TestEveryAdapterKeepsTheInvocationDeadlineAsTheLease(t *testing.T) {
	slow := func(ctx context.Context) { time.Sleep(2 * time.Minute) }
	for _, c := range []struct {
		name   string
		invoke func(t *testing.T, eng *idem.Engine) error
	}{
		{"Wrap", func(t *testing.T, eng *idem.Engine) error {
			h, err := idemlambda.Wrap(eng, "op", func(ctx context.Context, in map[string]any) (string, error) {
				slow(ctx)
				return "done", nil
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = h(invocationCtx(t), json.RawMessage(`{"id":"x"}`))
			return err
		}},
		{"WrapRaw", func(t *testing.T, eng *idem.Engine) error {
			h, err := idemlambda.WrapRaw(eng, "op", func(ctx context.Context, p []byte) ([]byte, error) {
				slow(ctx)
				return p, nil
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = h.Invoke(invocationCtx(t), []byte(`{"id":"x"}`))
			return err
		}},
		{"SQS", func(t *testing.T, eng *idem.Engine) error {
			h, err := idemlambda.SQS(eng, "op", func(ctx context.Context, m events.SQSMessage) error {
				slow(ctx)
				return nil
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = h(invocationCtx(t), events.SQSEvent{Records: []events.SQSMessage{{MessageId: "m-1", Body: "{}"}}})
			return err
		}},
		{"EventBridge", func(t *testing.T, eng *idem.Engine) error {
			h, err := idemlambda.EventBridge(eng, "op", func(ctx context.Context, ev events.EventBridgeEvent) error {
				slow(ctx)
				return nil
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return h(invocationCtx(t), events.EventBridgeEvent{ID: "e-1", Detail: json.RawMessage(`{}`)})
		}},
		{"Kinesis", func(t *testing.T, eng *idem.Engine) error {
			h, err := idemlambda.Kinesis(eng, "op", func(ctx context.Context, r events.KinesisEventRecord) error {
				slow(ctx)
				return nil
			}, &idemlambda.KinesisConfig{Config: idemlambda.Config{Logger: quiet}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = h(invocationCtx(t), events.KinesisEvent{Records: []events.KinesisEventRecord{{
				EventID: "shardId-000000000000:1", Kinesis: events.KinesisRecord{SequenceNumber: "1", Data: []byte(`{}`)}}}})
			return err
		}},
		{"DynamoDBStream", func(t *testing.T, eng *idem.Engine) error {
			h, err := idemlambda.DynamoDBStream(eng, "op", func(ctx context.Context, r events.DynamoDBEventRecord) error {
				slow(ctx)
				return nil
			}, &idemlambda.DynamoDBStreamConfig{Config: idemlambda.Config{Logger: quiet}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = h(invocationCtx(t), events.DynamoDBEvent{Records: []events.DynamoDBEventRecord{{
				EventID: "e-1", Change: events.DynamoDBStreamRecord{SequenceNumber: "1"}}}})
			return err
		}},
		{"APIGatewayV2", func(t *testing.T, eng *idem.Engine) error {
			h, err := idemlambda.APIGatewayV2(eng, "op", func(ctx context.Context, r events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
				slow(ctx)
				return events.APIGatewayV2HTTPResponse{StatusCode: 201}, nil
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			r, err := h(invocationCtx(t), events.APIGatewayV2HTTPRequest{
				RawPath: "/orders", Headers: map[string]string{"idempotency-key": `"k-1"`, "content-type": "application/json"}, Body: `{}`,
				RequestContext: events.APIGatewayV2HTTPRequestContext{HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "POST", Path: "/orders"}}})
			if err == nil && r.StatusCode != 201 {
				t.Fatalf("response %+v", r)
			}
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memstore.New(&memstore.Config{SweepInterval: -1})
				defer mem.Close()
				st := faultstore.New(mem)
				eng, err := idem.New(st, &idem.Config{Logger: quiet})
				if err != nil {
					t.Fatal(err)
				}
				if err := c.invoke(t, eng); err != nil {
					t.Fatal(err)
				}
				if st.Calls("claim") == 0 || st.Calls("complete") == 0 {
					t.Fatalf("claims %d, completes %d: the handler did not run under a claim", st.Calls("claim"), st.Calls("complete"))
				}
				if n := st.Calls("extend"); n != 0 {
					t.Fatalf("%d renewals of a lease whose invocation ends at its deadline", n)
				}
			})
		})
	}
}

// invocationCtx is the context of an invocation whose deadline is a minute
// away, ended when t ends.
func invocationCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
