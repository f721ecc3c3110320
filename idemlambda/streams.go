package idemlambda

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
)

// StreamConfig configures the stream handlers, [Kinesis] and
// [DynamoDBStream]; R is the record type of the stream.
type StreamConfig[R any] struct {
	// Config's KeyJMESPath and ValidationJMESPath apply to each record, in
	// its JSON form as Lambda delivers it (Kinesis: eventID,
	// eventSourceARN, kinesis.data in base64, ...; DynamoDB Streams:
	// eventID, dynamodb.Keys, dynamodb.NewImage, ...). Each handler
	// documents its default key. To catch a producer that wrote the same
	// thing twice, select from the payload, as in
	// "powertools_json(powertools_base64(kinesis.data)).order_id" or
	// "dynamodb.NewImage.order_id.S".
	Config
	// StopOnDeadLetter reports a record whose verdict is consume.DeadLetter
	// like any other failure, so the shard stops at it until Lambda's
	// retry policy for the event source mapping gives up
	// (MaximumRetryAttempts, MaximumRecordAgeInSeconds; the on-failure
	// destination then gets the batch's details, and the records of that
	// batch, the ones after it included, are discarded). Set it when a
	// record must never be followed by later records of its shard once it
	// failed for good.
	//
	// By default the shard moves past a dead letter — a terminal error,
	// stored and replayed as FAILED; a result too large to store; a key
	// reused with another payload; a key that cannot be derived — because
	// retrying it cannot succeed: it is logged at error level with its
	// sequence number, Settled sees it, and a terminal error stays in the
	// store for `idemctl list --status failed` and the monitor.
	// docs/lambda-streams.md argues the choice.
	StopOnDeadLetter bool
	// Settled, when set, is called with every record the batch reached
	// (run, replayed, or reported without being begun because the
	// invocation was ending) and the verdict it was settled by
	// (consume.Decide). The records after the one reported are not
	// called: they did not run. For metrics and tests.
	Settled func(R, consume.Verdict)
}

// KinesisConfig configures [Kinesis].
type KinesisConfig = StreamConfig[events.KinesisEventRecord]

// DynamoDBStreamConfig configures [DynamoDBStream].
type DynamoDBStreamConfig = StreamConfig[events.DynamoDBEventRecord]

// Kinesis makes a per-record Kinesis Data Streams handler idempotent and
// answers the partial batch response of a stream (enable
// ReportBatchItemFailures on the event source mapping). A batch holds
// records of one shard, in order, and they run in that order, one at a
// time, each under its own key; the batch's keys are claimed together (one
// store call), and a record's outcome write overlaps the next record's
// handler:
//
//   - a record already processed is skipped with its stored outcome: fn
//     does not run again, and a replayed success counts as done;
//   - the first record whose verdict (consume.Decide) is not consume.Done
//     stops the batch: its sequence number is the one batch item failure
//     of the response, so Lambda resumes the shard at it, and the records
//     after it do not run (their claims are released; the next invocation
//     brings them). A record
//     whose key another invocation holds, whose fn failed with an error
//     that is not terminal, or whose outcome is uncertain stops the batch
//     so;
//   - a record whose verdict is consume.DeadLetter (a terminal error, now
//     or stored; a key reused with another payload; no usable key) cannot
//     succeed on a retry: it is logged and the batch goes on, unless
//     StopOnDeadLetter is set.
//
// This is not the SQS rule (report each failed record and go on): a stream
// has one position per shard, and Lambda resumes from the lowest sequence
// number reported, so every record after a failure would run again anyway,
// out of order.
//
// The default key is the record's eventID ("shardId-…:sequenceNumber",
// the sequence number qualified by its shard, the same on every retry)
// together with the stream's ARN (eventSourceARN), because shard ids
// repeat from stream to stream; a record without an eventID has no key
// (see RaiseOnMissingKey). A producer that put a record twice (a retried
// PutRecord) writes two sequence numbers: select from the data to catch
// it.
//
// The engine's Expiry must outlast every redelivery of a record (the
// stream's retention, 24 hours by default, or the mapping's
// MaximumRecordAgeInSeconds): a shorter one is logged as a warning.
//
// The returned error is nil: every failure is in the response.
func Kinesis(eng *idem.Engine, name string, fn func(context.Context, events.KinesisEventRecord) error, cfg *KinesisConfig) (func(context.Context, events.KinesisEvent) (events.KinesisEventResponse, error), error) {
	s, err := newStream(eng, name, fn, cfg, "eventID && [eventSourceARN, eventID]",
		func(r events.KinesisEventRecord) string { return r.Kinesis.SequenceNumber })
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, ev events.KinesisEvent) (events.KinesisEventResponse, error) {
		var resp events.KinesisEventResponse
		if seq, failed := s.run(ctx, ev.Records); failed {
			resp.BatchItemFailures = []events.KinesisBatchItemFailure{{ItemIdentifier: seq}}
		}
		return resp, nil
	}, nil
}

// DynamoDBStream makes a per-record DynamoDB Streams handler idempotent
// and answers the partial batch response of a stream (enable
// ReportBatchItemFailures on the event source mapping). Records run in
// order and the first that is not done stops the batch, as for [Kinesis];
// the batch item failure names its dynamodb.SequenceNumber.
//
// The default key is the record's eventID, which DynamoDB Streams makes
// globally unique and keeps on every retry. Each write to the table is a
// record of its own, so two writes of the same item are two keys; to run
// once per item version, select it, as in
// "[dynamodb.Keys.pk.S, dynamodb.NewImage.version.N]".
//
// The returned error is nil: every failure is in the response.
func DynamoDBStream(eng *idem.Engine, name string, fn func(context.Context, events.DynamoDBEventRecord) error, cfg *DynamoDBStreamConfig) (func(context.Context, events.DynamoDBEvent) (events.DynamoDBEventResponse, error), error) {
	s, err := newStream(eng, name, fn, cfg, "eventID",
		func(r events.DynamoDBEventRecord) string { return r.Change.SequenceNumber })
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
		var resp events.DynamoDBEventResponse
		if seq, failed := s.run(ctx, ev.Records); failed {
			resp.BatchItemFailures = []events.DynamoDBBatchItemFailure{{ItemIdentifier: seq}}
		}
		return resp, nil
	}, nil
}

// streamRetention is how long Kinesis and DynamoDB Streams keep a record
// by default, and so how long Lambda may deliver it again when the event
// source mapping sets no MaximumRecordAgeInSeconds.
const streamRetention = 24 * time.Hour

// stream is what the stream handlers share: the ordered walk through a
// shard's batch.
type stream[R any] struct {
	eng *idem.Engine
	k   *keyer
	c   StreamConfig[R]
	fn  func(context.Context, R) error
	seq func(R) string
}

func newStream[R any](eng *idem.Engine, name string, fn func(context.Context, R) error, cfg *StreamConfig[R], defaultKey string, seq func(R) string) (*stream[R], error) {
	if eng == nil || fn == nil {
		return nil, fmt.Errorf("%w: idemlambda: engine and handler are required", idem.ErrInvalidConfig)
	}
	s := &stream[R]{eng: eng, fn: fn, seq: seq}
	if cfg != nil {
		s.c = *cfg
	}
	var err error
	if s.k, err = newKeyer(name, &s.c.Config, defaultKey); err != nil {
		return nil, err
	}
	if exp := eng.Config().Expiry; exp < streamRetention {
		s.k.log.Warn("idemlambda: the engine's Expiry is shorter than a stream's default retention: a record Lambda delivers again after its key expired runs again (raise idem.Config.Expiry; docs/lambda-streams.md)",
			"operation", s.k.operation, "expiry", exp, "retention", streamRetention)
	}
	return s, nil
}

// run runs records in order and returns the sequence number of the first
// record to report, with failed true, or failed false when the shard may
// move past the whole batch.
//
// The records run in segments: a segment is the records, from where the
// last one ended, that each have a key of their own in the batch (by far
// the common case: the whole batch). A segment's keys are claimed together
// (idem.DoBatch: one round trip over a store with batch claims), its
// handlers then run one at a time in the shard's order, and each record's
// outcome write overlaps the next record's handler. A record without a
// key, one whose key cannot be derived, and one whose key an earlier
// record of the batch has run alone, as a single record does, between the
// segments.
func (s *stream[R]) run(ctx context.Context, records []R) (seq string, failed bool) {
	seen := make(map[string]bool, len(records))
	for i := 0; i < len(records); {
		j, ids := i, make([]idem.Identity, 0, len(records)-i)
		for ; j < len(records); j++ {
			id, ok, err := recordIdentity(s.k, records[j])
			if err != nil || !ok || seen[id.StoreKey.String()] {
				break
			}
			seen[id.StoreKey.String()] = true
			ids = append(ids, id)
		}
		if j > i+1 {
			for k, v := range s.segment(ctx, records[i:j], ids) {
				if seq, stop := s.settle(records[i+k], v); stop {
					return seq, true
				}
			}
			i = j
			continue
		}
		r := records[i]
		var v consume.Verdict
		if err := ctx.Err(); err != nil {
			// The invocation is ending: the record is not begun, and the
			// shard resumes at it.
			v = consume.Verdict{Action: consume.Retry, Err: err}
		} else {
			v = record(ctx, s.eng, s.k, r, func(ctx context.Context) error { return s.fn(ctx, r) })
		}
		if seq, stop := s.settle(r, v); stop {
			return seq, true
		}
		i++
	}
	return "", false
}

// settle hands r's verdict to Settled and says whether the batch stops at
// r (its sequence number is then the batch item failure).
func (s *stream[R]) settle(r R, v consume.Verdict) (string, bool) {
	if s.c.Settled != nil {
		s.c.Settled(r, v)
	}
	switch {
	case v.Action == consume.Done:
	case v.Action == consume.DeadLetter && !s.c.StopOnDeadLetter:
		s.k.log.Error("idemlambda: stream record failed for good; the shard moves past it", "operation", s.k.operation, "sequence_number", s.seq(r), "err", v.Err)
	default:
		s.k.log.Info("idemlambda: stream record reported as the batch item failure; the shard resumes there", "operation", s.k.operation, "sequence_number", s.seq(r), "verdict", v.Action.String(), "err", v.Err)
		return s.seq(r), true
	}
	return "", false
}

// stops says whether a verdict stops the batch.
func (s *stream[R]) stops(v consume.Verdict) bool {
	return v.Action != consume.Done && (v.Action != consume.DeadLetter || s.c.StopOnDeadLetter)
}

// streamWindow is how many records of a segment are in flight at once:
// one runs its handler while the outcome writes of those before it land.
const streamWindow = 32

// errNotRun ends the operation of a record after one that stopped the
// batch: the engine releases its claim, as if it had not been claimed,
// and the record is left for the next invocation.
var errNotRun = errors.New("idemlambda: not run: an earlier record of the shard stopped the batch")

// segment runs records (each with its own key, ids[k]) in order, as run
// does one by one: their keys claimed together, then each handler in turn
// once the one before it has returned (or its record answered without
// running, a replay), so that the handlers keep the shard's order while
// the outcome writes overlap. Once a record stops the batch — its handler
// failed (not terminal, or StopOnDeadLetter), or its answer is a verdict
// that stops — the handlers after it do not run: their claims are
// released (errNotRun). It returns each record's verdict.
func (s *stream[R]) segment(ctx context.Context, records []R, ids []idem.Identity) []consume.Verdict {
	n := len(records)
	turn := make([]chan struct{}, n) // closed once record k's handler returned, or it answered without one
	for k := range turn {
		turn[k] = make(chan struct{})
	}
	ran := make([]bool, n) // the handler of record k was entered: its turn closes there
	var first atomic.Int64 // the first record that stops the batch; n while none does
	first.Store(int64(n))
	stop := func(k int) {
		for f := first.Load(); int64(k) < f && !first.CompareAndSwap(f, int64(k)); f = first.Load() {
		}
	}
	res, errs := idem.DoBatch(idem.EndsAtDeadline(ctx), s.eng, ids, &idem.BatchOptions[struct{}]{
		Concurrency: streamWindow,
		Answered: func(k int, res idem.Result[struct{}], err error) {
			if s.stops(consume.Decide(res, err, s.eng.Now())) {
				stop(k)
			}
			if !ran[k] {
				close(turn[k])
			}
		},
	}, func(ctx context.Context, k int) (struct{}, error) {
		ran[k] = true
		defer close(turn[k])
		if k > 0 {
			select {
			case <-turn[k-1]:
			case <-ctx.Done():
			}
		}
		if err := ctx.Err(); err != nil {
			return struct{}{}, err // the invocation is ending: not begun
		}
		if first.Load() < int64(k) {
			return struct{}{}, errNotRun
		}
		err := s.fn(ctx, records[k])
		var te *idem.TerminalError
		if err != nil && (s.c.StopOnDeadLetter || !errors.As(err, &te)) {
			stop(k)
		}
		return struct{}{}, err
	})
	vs := make([]consume.Verdict, n)
	now := s.eng.Now()
	for k := range vs {
		vs[k] = consume.Decide(res[k], errs[k], now)
	}
	return vs
}
