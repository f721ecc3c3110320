package idemlambda

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
)

// SQSConfig configures [SQS].
type SQSConfig struct {
	// Config's KeyJMESPath and ValidationJMESPath apply to each record
	// (its SQS JSON: messageId, body, attributes, ...). The default key is
	// the messageId, which SQS keeps across redeliveries; to catch a
	// producer that sent the same thing twice, select from the body, as in
	// "powertools_json(body).order_id".
	Config
	// Concurrency is how many records of a batch run at once. The
	// records' keys are claimed together first — in one round trip over a
	// store with batch claims (store.BatchClaimer: Redis, memory), else
	// concurrently — and their completions go out concurrently, so a batch
	// costs about two store round trips of latency, not two per record.
	// Default 10. A
	// FIFO queue's batch (source ARN ending in ".fifo") always runs in
	// order, one record at a time.
	Concurrency int
	// Settled, when set, is called with every record and the verdict it
	// was settled by (consume.Decide): Done records are not reported, all
	// others are. For metrics and tests.
	Settled func(events.SQSMessage, consume.Verdict)
}

// SQS makes a per-record SQS handler idempotent and reports partial batch
// failures (enable ReportBatchItemFailures on the event source mapping).
// Each record is settled by the verdict of consume.Decide, the one rule of
// every idem consumer (its package doc has the table and the reasons): a
// record whose verdict is consume.Done is not reported, so SQS deletes it;
// every other record is reported as a batch item failure, so SQS delivers
// it again after its visibility timeout, until the queue's redrive policy
// moves it aside:
//
//   - a record already processed is replayed: fn does not run, and it is
//     not reported;
//   - a record whose fn succeeded is not reported once its outcome is
//     recorded, nor when the store failed for all of WriteTimeout after fn
//     ran (a redelivery would run it again after the lease; the stuck
//     record is for an operator); it is reported when its outcome write was
//     refused because the key was taken over while fn ran;
//   - a record whose key another invocation holds is reported;
//   - a record whose fn fails is reported (a terminal error is stored and
//     reported on every delivery without running fn again);
//   - in a FIFO batch, the first record not Done stops the batch and every
//     later record is reported too, to keep the order.
//
// The returned error is nil unless the event itself is unusable.
func SQS(eng *idem.Engine, name string, fn func(context.Context, events.SQSMessage) error, cfg *SQSConfig) (func(context.Context, events.SQSEvent) (events.SQSEventResponse, error), error) {
	if eng == nil || fn == nil {
		return nil, fmt.Errorf("%w: idemlambda: engine and handler are required", idem.ErrInvalidConfig)
	}
	var c SQSConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 10
	}
	k, err := newKeyer(name, &c.Config, "messageId")
	if err != nil {
		return nil, err
	}
	settled := func(m events.SQSMessage, v consume.Verdict) {
		if c.Settled != nil {
			c.Settled(m, v)
		}
	}
	return func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
		var resp events.SQSEventResponse
		fail := func(id string) {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: id})
		}
		if len(ev.Records) > 0 && strings.HasSuffix(ev.Records[0].EventSourceARN, ".fifo") {
			for i, m := range ev.Records {
				v := record(ctx, eng, k, m, func(ctx context.Context) error { return fn(ctx, m) })
				settled(m, v)
				if v.Action != consume.Done {
					logFailure(k, m.MessageId, v)
					for _, rest := range ev.Records[i:] {
						fail(rest.MessageId)
					}
					break
				}
			}
			return resp, nil
		}
		// The records' keys are claimed together (one round trip over a
		// store with batch claims, such as Redis's pipeline); records
		// without a key run unprotected, as single records do.
		vs := make([]consume.Verdict, len(ev.Records))
		var (
			ids         []idem.Identity
			at          []int // ids[j] is the key of ev.Records[at[j]]
			unprotected []int
		)
		for i, m := range ev.Records {
			id, ok, err := recordIdentity(k, m)
			switch {
			case err != nil:
				vs[i] = noKey(eng, err)
			case !ok:
				unprotected = append(unprotected, i)
			default:
				ids, at = append(ids, id), append(at, i)
			}
		}
		results, berrs := idem.DoBatch(idem.EndsAtDeadline(ctx), eng, ids, &idem.BatchOptions[struct{}]{Concurrency: c.Concurrency}, func(ctx context.Context, j int) (struct{}, error) {
			return struct{}{}, fn(ctx, ev.Records[at[j]])
		})
		now := eng.Now()
		for j := range berrs {
			vs[at[j]] = consume.Decide(results[j], berrs[j], now)
		}
		sem := make(chan struct{}, c.Concurrency)
		var wg sync.WaitGroup
		for _, i := range unprotected {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				vs[i] = unprotectedVerdict(fn(ctx, ev.Records[i]))
			})
		}
		wg.Wait()
		for i, v := range vs {
			settled(ev.Records[i], v)
			if v.Action != consume.Done {
				logFailure(k, ev.Records[i].MessageId, v)
				fail(ev.Records[i].MessageId)
			}
		}
		return resp, nil
	}, nil
}

func logFailure(k *keyer, id string, v consume.Verdict) {
	k.log.Info("idemlambda: record reported as a batch item failure", "operation", k.operation, "message_id", id, "verdict", v.Action.String(), "err", v.Err)
}

// unprotectedVerdict is the verdict of a record run without a key: done,
// or to be tried again.
func unprotectedVerdict(err error) consume.Verdict {
	if err != nil {
		return consume.Verdict{Action: consume.Retry, Err: err}
	}
	return consume.Verdict{Action: consume.Done}
}

// noKey is the verdict of a record whose identity could not be derived
// (err, from recordIdentity): consume.Decide's for "no usable key".
func noKey(eng *idem.Engine, err error) consume.Verdict {
	return consume.Decide(idem.Result[struct{}]{}, consume.NoKey(err), eng.Now())
}

// recordIdentity derives the identity of one record (of any source); ok is
// false when it has no key and runs unprotected (without RaiseOnMissingKey),
// and an error means no usable key (see noKey).
func recordIdentity[M any](k *keyer, m M) (idem.Identity, bool, error) {
	raw, err := json.Marshal(m)
	if err != nil {
		return idem.Identity{}, false, fmt.Errorf("idemlambda: record cannot be encoded: %w", err)
	}
	event, err := decode(raw)
	if err != nil {
		return idem.Identity{}, false, err
	}
	return k.identity(event)
}

// record runs one record (of any source) under its key and returns its
// verdict.
func record[M any](ctx context.Context, eng *idem.Engine, k *keyer, m M, run func(context.Context) error) consume.Verdict {
	id, ok, err := recordIdentity(k, m)
	if err != nil {
		return noKey(eng, err)
	}
	if !ok {
		return unprotectedVerdict(run(ctx))
	}
	res, err := idem.DoIdentity(idem.EndsAtDeadline(ctx), eng, id, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, run(ctx)
	})
	return consume.Decide(res, err, eng.Now())
}

// EventBridge makes an EventBridge (CloudWatch Events) handler idempotent.
// The default key is the event's id; select from the event instead with
// KeyJMESPath, such as "detail.orderId", to catch a producer that put the
// same event twice. The event is settled by consume.Decide's verdict: nil
// for consume.Done, else its error, so that EventBridge (for an
// asynchronous invocation, Lambda's retries) tries it again: a duplicate
// while the first runs fails with *idem.InProgressError.
func EventBridge(eng *idem.Engine, name string, fn func(context.Context, events.EventBridgeEvent) error, cfg *Config) (func(context.Context, events.EventBridgeEvent) error, error) {
	if eng == nil || fn == nil {
		return nil, fmt.Errorf("%w: idemlambda: engine and handler are required", idem.ErrInvalidConfig)
	}
	k, err := newKeyer(name, cfg, "id")
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, ev events.EventBridgeEvent) error {
		v := record(ctx, eng, k, ev, func(ctx context.Context) error { return fn(ctx, ev) })
		if v.Action == consume.Done {
			return nil
		}
		return v.Err
	}, nil
}
