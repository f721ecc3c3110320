package idemlambda_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/idemtest/ctltest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// An operator finds each adapter's record, in the console and with
// idemctl find (on a real Redis), from what the event carried — the SQS messageId, the EventBridge id or a field the
// KeyJMESPath selects, a Kinesis record's stream and eventID, the key a
// FuncConfig.Key returns, an API Gateway request's Idempotency-Key —
// through clientkey, which the adapters key their records with and
// idemctl find uses too.
func TestRecordIsFoundFromWhatTheEventCarried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	ctl := ctltest.Build(t)
	// An engine over a real Redis under a prefix of its own, and the URL
	// idemctl opens it by.
	newEngine := func(t *testing.T) (*idem.Engine, store.Store, string) {
		prefix := fmt.Sprintf("idemlambda-find-%d:", rand.Uint64())
		s, err := redisstore.Open("redis://"+addr+"/0", &redisstore.Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		e, err := idem.New(s, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return e, s, "redis://" + addr + "/0?prefix=" + prefix
	}
	// find finds m's record in the console and with idemctl.
	find := func(t *testing.T, s store.Store, url string, m clientkey.Material) {
		t.Helper()
		ctltest.Find(t, ctl, url, m, consoletest.FindIn(t, s, m))
	}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	quoted := func(s string) string { b, _ := json.Marshal(s); return string(b) }

	t.Run("sqs messageId", func(t *testing.T) {
		t.Parallel()
		e, s, url := newEngine(t)
		h, err := idemlambda.SQS(e, "orders", func(context.Context, events.SQSMessage) error { return nil }, nil)
		must(t, err)
		var ev events.SQSEvent
		load(t, "sqs.json", &ev)
		if r, err := h(ctx, ev); err != nil || len(r.BatchItemFailures) != 0 {
			t.Fatalf("%+v %v", r, err)
		}
		find(t, s, url, clientkey.Material{Kind: clientkey.KindJSON, Operation: "orders", Key: quoted(ev.Records[0].MessageId)})
	})
	t.Run("eventbridge id and detail", func(t *testing.T) {
		t.Parallel()
		e, s, url := newEngine(t)
		var ev events.EventBridgeEvent
		load(t, "eventbridge.json", &ev)
		byID, err := idemlambda.EventBridge(e, "placed", func(context.Context, events.EventBridgeEvent) error { return nil }, nil)
		must(t, err)
		must(t, byID(ctx, ev))
		find(t, s, url, clientkey.Material{Kind: clientkey.KindJSON, Operation: "placed", Key: quoted(ev.ID)})
		byOrder, err := idemlambda.EventBridge(e, "placed-by-order", func(context.Context, events.EventBridgeEvent) error { return nil },
			&idemlambda.Config{KeyJMESPath: "detail.orderId"})
		must(t, err)
		must(t, byOrder(ctx, ev))
		var detail struct{ OrderID json.RawMessage }
		must(t, json.Unmarshal(ev.Detail, &detail))
		find(t, s, url, clientkey.Material{Kind: clientkey.KindJSON, Operation: "placed-by-order", Key: string(detail.OrderID)})
	})
	t.Run("kinesis stream and eventID", func(t *testing.T) {
		t.Parallel()
		e, s, url := newEngine(t)
		var ev events.KinesisEvent
		load(t, "kinesis.json", &ev)
		h, err := idemlambda.Kinesis(e, "orders", func(context.Context, events.KinesisEventRecord) error { return nil }, nil)
		must(t, err)
		if r, err := h(ctx, ev); err != nil || len(r.BatchItemFailures) != 0 {
			t.Fatalf("%+v %v", r, err)
		}
		rec := ev.Records[0]
		key, _ := json.Marshal([]string{rec.EventSourceArn, rec.EventID})
		find(t, s, url, clientkey.Material{Kind: clientkey.KindJSON, Operation: "orders", Key: string(key)})
	})
	t.Run("FuncConfig.Key", func(t *testing.T) {
		t.Parallel()
		e, s, url := newEngine(t)
		type order struct{ ID string }
		h, err := idemlambda.Wrap(e, "charge", func(context.Context, order) (int, error) { return 1, nil },
			&idemlambda.FuncConfig[order, int]{Key: func(_ context.Context, o order) (string, error) { return o.ID, nil }})
		must(t, err)
		if _, err := h(ctx, json.RawMessage(`{"ID":"order-42"}`)); err != nil {
			t.Fatal(err)
		}
		find(t, s, url, clientkey.Material{Kind: clientkey.KindKey, Operation: "charge", Key: "order-42"})
		// Like every explicit key, one over idem.MaxKeyLen is refused.
		long := strings.Repeat("k", idem.MaxKeyLen+1)
		if _, err := h(ctx, json.RawMessage(`{"ID":"`+long+`"}`)); !errors.Is(err, idem.ErrInvalidKey) {
			t.Fatalf("a key of %d bytes: %v, want idem.ErrInvalidKey", len(long), err)
		}
	})
	t.Run("api gateway Idempotency-Key", func(t *testing.T) {
		t.Parallel()
		e, s, url := newEngine(t)
		h, err := idemlambda.APIGatewayV1(e, "orders", func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
			return events.APIGatewayProxyResponse{StatusCode: 201}, nil
		}, &idemlambda.HTTPConfig[events.APIGatewayProxyRequest]{Principal: func(e events.APIGatewayProxyRequest) (string, error) {
			sub, _ := e.RequestContext.Authorizer["claims"].(map[string]any)["sub"].(string)
			return sub, nil
		}})
		must(t, err)
		var ev events.APIGatewayProxyRequest
		load(t, "apigw-v1.json", &ev)
		if r, err := h(ctx, ev); err != nil || r.StatusCode != 201 {
			t.Fatalf("%+v %v", r, err)
		}
		sub := ev.RequestContext.Authorizer["claims"].(map[string]any)["sub"].(string)
		find(t, s, url, clientkey.Material{Kind: clientkey.KindHTTP, Operation: "orders", Method: ev.HTTPMethod, Route: ev.Resource,
			Principal: sub, Key: ev.Headers["Idempotency-Key"]})
	})
}
