package idemlambda_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemlambda"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// rec is one record of a shard in these tests: its sequence number and
// the order its payload carries. Each source turns it into its own event
// shape.
type rec struct{ seq, order string }

// shard returns n records of one shard, in order.
func shard(n int) []rec {
	rs := make([]rec, n)
	for i := range rs {
		rs[i] = rec{seq: fmt.Sprintf("4959033827149025660855969%020d", i), order: fmt.Sprintf("o-%d", i)}
	}
	return rs
}

func seqs(rs []rec) []string {
	var s []string
	for _, r := range rs {
		s = append(s, r.seq)
	}
	return s
}

// streamOpts is the configuration of a stream handler under test, for
// either source.
type streamOpts struct {
	Config           idemlambda.Config
	StopOnDeadLetter bool
	Settled          func(r rec, v consume.Verdict)
}

// streamSource is one of the stream adapters, on aws-lambda-go's event
// shape.
type streamSource struct {
	name string
	// payloadKey is a KeyJMESPath selecting the order from the payload.
	payloadKey string
	// open builds the adapter over eng whose handler calls fn with each
	// record; the returned func delivers a batch and answers the sequence
	// numbers of the response's batch item failures.
	open func(t testing.TB, eng *idem.Engine, o streamOpts, fn func(context.Context, rec) error) func(context.Context, []rec) []string
}

const streamARN = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"

func kinesisRecord(r rec) events.KinesisEventRecord {
	data, _ := json.Marshal(map[string]any{"order_id": r.order, "amount": 1999})
	return events.KinesisEventRecord{
		EventID: "shardId-000000000000:" + r.seq, EventName: "aws:kinesis:record", EventSource: "aws:kinesis",
		EventSourceArn: streamARN, EventVersion: "1.0", AwsRegion: "eu-west-1",
		Kinesis: events.KinesisRecord{
			Data:           data,
			PartitionKey:   r.order,
			SequenceNumber: r.seq, KinesisSchemaVersion: "1.0",
		},
	}
}

func kinesisRec(r events.KinesisEventRecord) rec {
	var o struct {
		OrderID string `json:"order_id"`
	}
	_ = json.Unmarshal(r.Kinesis.Data, &o)
	return rec{seq: r.Kinesis.SequenceNumber, order: o.OrderID}
}

func dynamoRecord(r rec) events.DynamoDBEventRecord {
	return events.DynamoDBEventRecord{
		EventID: "ev-" + r.seq, EventName: "INSERT", EventSource: "aws:dynamodb", EventVersion: "1.1", AWSRegion: "eu-west-1",
		EventSourceArn: "arn:aws:dynamodb:eu-west-1:123456789012:table/orders/stream/2026-11-01T00:00:00.000",
		Change: events.DynamoDBStreamRecord{
			Keys:           map[string]events.DynamoDBAttributeValue{"pk": events.NewStringAttribute(r.order)},
			NewImage:       map[string]events.DynamoDBAttributeValue{"pk": events.NewStringAttribute(r.order), "amount": events.NewNumberAttribute("1999")},
			SequenceNumber: r.seq, SizeBytes: 40, StreamViewType: "NEW_AND_OLD_IMAGES",
		},
	}
}

func dynamoRec(r events.DynamoDBEventRecord) rec {
	return rec{seq: r.Change.SequenceNumber, order: r.Change.NewImage["pk"].String()}
}

func streamSources() []streamSource {
	return []streamSource{
		{
			name:       "Kinesis",
			payloadKey: "powertools_json(powertools_base64(kinesis.data)).order_id",
			open: func(t testing.TB, eng *idem.Engine, o streamOpts, fn func(context.Context, rec) error) func(context.Context, []rec) []string {
				cfg := &idemlambda.KinesisConfig{Config: o.Config, StopOnDeadLetter: o.StopOnDeadLetter}
				if o.Settled != nil {
					cfg.Settled = func(r events.KinesisEventRecord, v consume.Verdict) { o.Settled(kinesisRec(r), v) }
				}
				h, err := idemlambda.Kinesis(eng, "orders", func(ctx context.Context, r events.KinesisEventRecord) error {
					return fn(ctx, kinesisRec(r))
				}, cfg)
				if err != nil {
					t.Fatal(err)
				}
				return func(ctx context.Context, rs []rec) []string {
					var ev events.KinesisEvent
					for _, r := range rs {
						ev.Records = append(ev.Records, kinesisRecord(r))
					}
					resp, err := h(ctx, ev)
					if err != nil {
						t.Errorf("Kinesis handler: %v", err)
					}
					var failed []string
					for _, f := range resp.BatchItemFailures {
						failed = append(failed, f.ItemIdentifier)
					}
					return failed
				}
			},
		},
		{
			name:       "DynamoDB",
			payloadKey: "dynamodb.NewImage.pk.S",
			open: func(t testing.TB, eng *idem.Engine, o streamOpts, fn func(context.Context, rec) error) func(context.Context, []rec) []string {
				cfg := &idemlambda.DynamoDBStreamConfig{Config: o.Config, StopOnDeadLetter: o.StopOnDeadLetter}
				if o.Settled != nil {
					cfg.Settled = func(r events.DynamoDBEventRecord, v consume.Verdict) { o.Settled(dynamoRec(r), v) }
				}
				h, err := idemlambda.DynamoDBStream(eng, "orders", func(ctx context.Context, r events.DynamoDBEventRecord) error {
					return fn(ctx, dynamoRec(r))
				}, cfg)
				if err != nil {
					t.Fatal(err)
				}
				return func(ctx context.Context, rs []rec) []string {
					var ev events.DynamoDBEvent
					for _, r := range rs {
						ev.Records = append(ev.Records, dynamoRecord(r))
					}
					resp, err := h(ctx, ev)
					if err != nil {
						t.Errorf("DynamoDB handler: %v", err)
					}
					var failed []string
					for _, f := range resp.BatchItemFailures {
						failed = append(failed, f.ItemIdentifier)
					}
					return failed
				}
			},
		},
	}
}

// storeBackend is a store the stream tests run on.
type storeBackend struct {
	name string
	open func(t testing.TB) store.Store
}

func storeBackends() []storeBackend {
	return []storeBackend{
		{"memstore", func(t testing.TB) store.Store {
			s := memstore.New(&memstore.Config{SweepInterval: -1})
			t.Cleanup(func() { s.Close() })
			return s
		}},
		{"redis", func(t testing.TB) store.Store {
			addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
			s, err := redisstore.Open("redis://"+addr+"/0", &redisstore.Config{Prefix: fmt.Sprintf("idemlambda-streams-%d:", rand.Uint64())})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}},
	}
}

// eachStream runs f for every source on every store. eng returns a new
// engine (a sandbox of its own) over the subtest's one store.
func eachStream(t *testing.T, f func(t *testing.T, src streamSource, eng func(idem.Config) *idem.Engine)) {
	for _, src := range streamSources() {
		for _, b := range storeBackends() {
			t.Run(src.name+"/"+b.name, func(t *testing.T) {
				t.Parallel()
				st := b.open(t)
				f(t, src, func(cfg idem.Config) *idem.Engine {
					if cfg.Logger == nil {
						cfg.Logger = quiet
					}
					e, err := idem.New(st, &cfg)
					if err != nil {
						t.Fatal(err)
					}
					return e
				})
			})
		}
	}
}

// ledger counts, per record, the runs of the handler and its successes,
// and the order of the runs.
type ledger struct {
	mu        sync.Mutex
	ran       []string
	successes map[string]int
}

func newLedger() *ledger { return &ledger{successes: map[string]int{}} }

// handler returns a handler that records its runs and fails with failure
// (when not nil) for the records it names.
func (l *ledger) handler(failure func(r rec, run int) error) func(context.Context, rec) error {
	runs := map[string]int{}
	return func(ctx context.Context, r rec) error {
		l.mu.Lock()
		l.ran = append(l.ran, r.seq)
		runs[r.seq]++
		n := runs[r.seq]
		l.mu.Unlock()
		if failure != nil {
			if err := failure(r, n); err != nil {
				return err
			}
		}
		l.mu.Lock()
		l.successes[r.seq]++
		l.mu.Unlock()
		return nil
	}
}

func (l *ledger) runs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ran)
}

// exactlyOnce fails t unless every record succeeded exactly once.
func (l *ledger) exactlyOnce(t *testing.T, rs []rec) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range rs {
		if n := l.successes[r.seq]; n != 1 {
			t.Errorf("record %s succeeded %d times, want once", r.seq, n)
		}
	}
}

// TestStreamRunsInOrderAndReplays: a batch runs its records one after the
// other in the shard's order; delivered again, every record is skipped
// with its stored outcome (done, not reported) and nothing runs.
func TestStreamRunsInOrderAndReplays(t *testing.T) {
	t.Parallel()
	eachStream(t, func(t *testing.T, src streamSource, eng func(idem.Config) *idem.Engine) {
		l := newLedger()
		var settled []consume.Verdict
		deliver := src.open(t, eng(idem.Config{}), streamOpts{Settled: func(_ rec, v consume.Verdict) { settled = append(settled, v) }}, l.handler(nil))
		rs := shard(6)
		ctx := context.Background()
		if failed := deliver(ctx, rs); failed != nil {
			t.Fatalf("first delivery reported %v", failed)
		}
		if got := l.runs(); !slices.Equal(got, seqs(rs)) {
			t.Fatalf("ran %v, want the shard's order %v", got, seqs(rs))
		}
		settled = nil
		if failed := deliver(ctx, rs); failed != nil {
			t.Fatalf("replay reported %v", failed)
		}
		if len(l.runs()) != len(rs) || len(settled) != len(rs) {
			t.Fatalf("replay: %d runs, %d settled", len(l.runs()), len(settled))
		}
		for _, v := range settled {
			if v.Action != consume.Done {
				t.Fatalf("a replayed record settled as %v (%v)", v.Action, v.Err)
			}
		}
		l.exactlyOnce(t, rs)
	})
}

// TestStreamStopsAtTheFirstFailure: the third record of six fails; the
// response names it alone, and the records after it do not run. Lambda
// then delivers again — the same batch, or the batch from the reported
// record onward — and the shard completes: the records done before are
// replayed, the failed one runs again, the rest run once; nothing runs
// twice and nothing is skipped.
func TestStreamStopsAtTheFirstFailure(t *testing.T) {
	t.Parallel()
	for _, redelivery := range []string{"same batch", "from the reported record"} {
		t.Run(redelivery, func(t *testing.T) {
			t.Parallel()
			eachStream(t, func(t *testing.T, src streamSource, eng func(idem.Config) *idem.Engine) {
				rs := shard(6)
				l := newLedger()
				deliver := src.open(t, eng(idem.Config{}), streamOpts{}, l.handler(func(r rec, run int) error {
					if r.seq == rs[2].seq && run == 1 {
						return errors.New("downstream timeout")
					}
					return nil
				}))
				ctx := context.Background()
				failed := deliver(ctx, rs)
				if !slices.Equal(failed, []string{rs[2].seq}) {
					t.Fatalf("reported %v, want only %s", failed, rs[2].seq)
				}
				if got := l.runs(); !slices.Equal(got, seqs(rs[:3])) {
					t.Fatalf("ran %v, want %v and nothing after the failure", got, seqs(rs[:3]))
				}
				again := rs
				if redelivery == "from the reported record" {
					again = rs[2:]
				}
				if failed := deliver(ctx, again); failed != nil {
					t.Fatalf("redelivery reported %v", failed)
				}
				if got := l.runs(); !slices.Equal(got, seqs(append(rs[:3:3], rs[2:]...))) {
					t.Fatalf("ran %v: want the failed record again, then the rest once, in order", got)
				}
				l.exactlyOnce(t, rs)
			})
		})
	}
}

// TestStreamDeadLetter: a record whose handler fails with a terminal error
// is stored FAILED. By default the shard moves past it at once, and a
// redelivery replays its stored error and runs nothing. With
// StopOnDeadLetter it is reported and the shard stays there: every
// delivery replays its stored error without running it again.
func TestStreamDeadLetter(t *testing.T) {
	t.Parallel()
	declined := func(r rec, run int) error {
		if r.order == "o-1" {
			return idem.Terminal(errors.New("card declined"), "declined")
		}
		return nil
	}
	t.Run("reported", func(t *testing.T) {
		t.Parallel()
		eachStream(t, func(t *testing.T, src streamSource, eng func(idem.Config) *idem.Engine) {
			rs := shard(4)
			l := newLedger()
			var last consume.Verdict
			deliver := src.open(t, eng(idem.Config{}), streamOpts{StopOnDeadLetter: true, Settled: func(_ rec, v consume.Verdict) { last = v }}, l.handler(declined))
			for range 3 {
				if failed := deliver(context.Background(), rs[1:]); !slices.Equal(failed, []string{rs[1].seq}) {
					t.Fatalf("reported %v, want %s", failed, rs[1].seq)
				}
				var te *idem.TerminalError
				if last.Action != consume.DeadLetter || !errors.As(last.Err, &te) || te.Code != "declined" {
					t.Fatalf("settled %v (%v), want a dead letter with the stored error", last.Action, last.Err)
				}
			}
			if got := l.runs(); !slices.Equal(got, []string{rs[1].seq}) {
				t.Fatalf("ran %v: the terminal record once, nothing after it", got)
			}
		})
	})
	t.Run("skipped", func(t *testing.T) {
		t.Parallel()
		eachStream(t, func(t *testing.T, src streamSource, eng func(idem.Config) *idem.Engine) {
			rs := shard(4)
			l := newLedger()
			var dead []consume.Verdict
			deliver := src.open(t, eng(idem.Config{}), streamOpts{Settled: func(r rec, v consume.Verdict) {
				if r.seq == rs[1].seq {
					dead = append(dead, v)
				}
			}}, l.handler(declined))
			for range 2 {
				if failed := deliver(context.Background(), rs); failed != nil {
					t.Fatalf("reported %v", failed)
				}
			}
			for _, v := range dead {
				var te *idem.TerminalError
				if v.Action != consume.DeadLetter || !errors.As(v.Err, &te) || te.Code != "declined" {
					t.Fatalf("settled %v (%v), want a dead letter with the stored error", v.Action, v.Err)
				}
			}
			if got := l.runs(); !slices.Equal(got, seqs(rs)) {
				t.Fatalf("ran %v, want each record once, in order", got)
			}
		})
	})
}

// TestStreamRecordHeldElsewhere: a record whose key another invocation
// holds (here the same order keyed from the payload, being handled from
// another shard) is reported, and the records after it wait; once the
// other invocation is done, the redelivery replays its outcome and runs
// the rest.
func TestStreamRecordHeldElsewhere(t *testing.T) {
	t.Parallel()
	eachStream(t, func(t *testing.T, src streamSource, eng func(idem.Config) *idem.Engine) {
		opts := streamOpts{Config: idemlambda.Config{KeyJMESPath: src.payloadKey}}
		rs := shard(5)
		l := newLedger()
		inside, release := make(chan struct{}), make(chan struct{})
		other := src.open(t, eng(idem.Config{}), opts, func(ctx context.Context, r rec) error {
			close(inside)
			<-release
			return l.handler(nil)(ctx, r)
		})
		var wg sync.WaitGroup
		elsewhere := rec{seq: "1" + rs[2].seq[1:], order: rs[2].order} // another shard, the same order
		wg.Go(func() {
			if failed := other(context.Background(), []rec{elsewhere}); failed != nil {
				t.Errorf("the other shard reported %v", failed)
			}
		})
		<-inside
		var verdicts []consume.Action
		opts.Settled = func(_ rec, v consume.Verdict) { verdicts = append(verdicts, v.Action) }
		deliver := src.open(t, eng(idem.Config{}), opts, l.handler(nil))
		if failed := deliver(context.Background(), rs); !slices.Equal(failed, []string{rs[2].seq}) {
			t.Fatalf("reported %v, want %s", failed, rs[2].seq)
		}
		if want := []consume.Action{consume.Done, consume.Done, consume.RetryAfter}; !slices.Equal(verdicts, want) {
			t.Fatalf("verdicts %v, want %v", verdicts, want)
		}
		close(release)
		wg.Wait()
		if failed := deliver(context.Background(), rs[2:]); failed != nil {
			t.Fatalf("redelivery reported %v", failed)
		}
		if got := l.runs(); !slices.Equal(got, []string{rs[0].seq, rs[1].seq, elsewhere.seq, rs[3].seq, rs[4].seq}) {
			t.Fatalf("ran %v", got)
		}
	})
}

// TestStreamBadKey: a record with no key under RaiseOnMissingKey is a
// dead letter: skipped by default, reported with StopOnDeadLetter (the
// records after it wait). Without RaiseOnMissingKey it runs unprotected
// and the batch goes on.
func TestStreamBadKey(t *testing.T) {
	t.Parallel()
	eachStream(t, func(t *testing.T, src streamSource, eng func(idem.Config) *idem.Engine) {
		rs := shard(4)
		rs[1].order = "" // the payload key selects ""
		for _, c := range []struct {
			name          string
			raise, stop   bool
			wantFailed    []string
			wantRuns      []string
			wantMissingIs bool
		}{
			{"raise", true, false, nil, []string{rs[0].seq, rs[2].seq, rs[3].seq}, true},
			{"raise and stop", true, true, []string{rs[1].seq}, seqs(rs[:1]), true},
			{"unprotected", false, false, nil, seqs(rs), false},
		} {
			l := newLedger()
			var missing error
			deliver := src.open(t, eng(idem.Config{}), streamOpts{
				Config:           idemlambda.Config{Operation: "orders-" + strings.ReplaceAll(c.name, " ", "-"), KeyJMESPath: src.payloadKey, RaiseOnMissingKey: c.raise, Logger: quiet},
				StopOnDeadLetter: c.stop,
				Settled: func(r rec, v consume.Verdict) {
					if r.seq == rs[1].seq {
						missing = v.Err
						if c.raise && (v.Action != consume.DeadLetter || !errors.Is(v.Err, consume.ErrNoKey)) {
							t.Errorf("%s: the record without a key settled as %v (%v), want consume.NoKey's dead letter", c.name, v.Action, v.Err)
						}
					}
				},
			}, l.handler(nil))
			if failed := deliver(context.Background(), rs); !slices.Equal(failed, c.wantFailed) {
				t.Errorf("%s: reported %v, want %v", c.name, failed, c.wantFailed)
			}
			if got := l.runs(); !slices.Equal(got, c.wantRuns) {
				t.Errorf("%s: ran %v, want %v", c.name, got, c.wantRuns)
			}
			if errors.Is(missing, idemlambda.ErrMissingKey) != c.wantMissingIs {
				t.Errorf("%s: verdict error %v", c.name, missing)
			}
		}
	})
}

// TestStreamConcurrentInvocations: two invocations deliver the same batch
// at once (a retry racing an invocation still running, or one order
// arriving on two shards), each then redelivering from the record it
// reported until its answer is empty, as Lambda does; some records fail
// on their first run. Every record succeeds exactly once, and each
// invocation runs its records in the shard's order. Run with -count=50.
func TestStreamConcurrentInvocations(t *testing.T) {
	t.Parallel()
	eachStream(t, func(t *testing.T, src streamSource, eng func(idem.Config) *idem.Engine) {
		rs := shard(12)
		l := newLedger()
		var mu sync.Mutex
		firstRun := map[string]bool{}
		var wg sync.WaitGroup
		for range 2 {
			var order []string
			// Each invocation in a sandbox of its own, so that they meet
			// in the store. Wait: a record held by the other waits for its
			// outcome instead of spinning through redeliveries.
			e := eng(idem.Config{Wait: 10 * time.Second})
			deliver := src.open(t, e, streamOpts{}, func(ctx context.Context, r rec) error {
				order = append(order, r.seq)
				mu.Lock()
				first := !firstRun[r.seq]
				firstRun[r.seq] = true
				mu.Unlock()
				return l.handler(func(r rec, _ int) error {
					if first && r.seq[len(r.seq)-1]%3 == 0 {
						return errors.New("flaky downstream")
					}
					return nil
				})(ctx, r)
			})
			wg.Go(func() {
				batch := rs
				for range 100 {
					failed := deliver(context.Background(), batch)
					if failed == nil {
						break
					}
					i := slices.Index(seqs(rs), failed[0])
					if i < 0 || len(failed) != 1 {
						t.Errorf("reported %v", failed)
						return
					}
					batch = rs[i:]
				}
				if !slices.IsSorted(order) {
					t.Errorf("an invocation ran %v, out of the shard's order", order)
				}
			})
		}
		wg.Wait()
		l.exactlyOnce(t, rs)
	})
}

// TestStreamInvocationTimedOut: an invocation hangs in its third record
// until Lambda ends it at its deadline, and Lambda retries the whole
// batch. The retry replays the two records done, takes the third over
// (its lease was the dead invocation's deadline) and runs the rest; the
// dead invocation's late end changes nothing.
func TestStreamInvocationTimedOut(t *testing.T) {
	for _, src := range streamSources() {
		t.Run(src.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memstore.New(&memstore.Config{SweepInterval: -1})
				defer mem.Close()
				rs := shard(5)
				l := newLedger()
				killed := make(chan struct{})
				var kill sync.Once
				defer kill.Do(func() { close(killed) })
				var hung atomic.Bool
				handler := l.handler(func(r rec, run int) error {
					if r.seq == rs[2].seq && hung.CompareAndSwap(false, true) {
						<-killed // the sandbox is frozen past the deadline
						return errors.New("killed")
					}
					return nil
				})
				// Each invocation in its own sandbox: an engine of its own on
				// the shared store.
				sandbox := func() func(context.Context, []rec) []string {
					eng, err := idem.New(mem, &idem.Config{Logger: quiet})
					if err != nil {
						t.Fatal(err)
					}
					return src.open(t, eng, streamOpts{Config: idemlambda.Config{Logger: quiet}}, handler)
				}
				deliver := sandbox()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				dead := make(chan []string, 1)
				go func() { dead <- deliver(ctx, rs) }()
				synctest.Wait()
				time.Sleep(time.Minute + time.Second) // fake time: past the deadline
				retry := sandbox()
				if failed := retry(context.Background(), rs); failed != nil {
					t.Fatalf("retry reported %v", failed)
				}
				kill.Do(func() { close(killed) })
				<-dead // its answer goes nowhere: Lambda ended the invocation
				if failed := sandbox()(context.Background(), rs); failed != nil {
					t.Fatalf("a later redelivery reported %v", failed)
				}
				want := append(seqs(rs[:3]), seqs(rs[2:])...)
				if got := l.runs(); !slices.Equal(got, want) {
					t.Fatalf("ran %v, want %v", got, want)
				}
				l.exactlyOnce(t, rs)
			})
		})
	}
}

// TestStreamKeyFromThePayload: on AWS's event shapes, a producer's second
// put of an order (a new sequence number, the same data) is caught by a key
// over the payload; the default key (the record's eventID) runs it.
func TestStreamKeyFromThePayload(t *testing.T) {
	t.Parallel()
	t.Run("Kinesis", func(t *testing.T) {
		t.Parallel()
		var ev events.KinesisEvent
		load(t, "kinesis.json", &ev)
		for _, c := range []struct {
			key  string
			runs int64
		}{{"", 3}, {"powertools_json(powertools_base64(kinesis.data)).order_id", 2}} {
			var runs atomic.Int64
			h, err := idemlambda.Kinesis(engine(t, idem.Config{}), "orders", func(context.Context, events.KinesisEventRecord) error {
				runs.Add(1)
				return nil
			}, &idemlambda.KinesisConfig{Config: idemlambda.Config{KeyJMESPath: c.key}})
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if r, err := h(context.Background(), ev); err != nil || len(r.BatchItemFailures) != 0 {
					t.Fatalf("key %q: %+v %v", c.key, r, err)
				}
			}
			if runs.Load() != c.runs {
				t.Errorf("key %q: %d runs, want %d", c.key, runs.Load(), c.runs)
			}
		}
	})
	t.Run("DynamoDB", func(t *testing.T) {
		t.Parallel()
		var ev events.DynamoDBEvent
		load(t, "dynamodb-stream.json", &ev)
		for _, c := range []struct {
			key  string
			runs int64
		}{{"", 3}, {"[dynamodb.Keys.pk.S, dynamodb.NewImage.version.N]", 3}, {"dynamodb.Keys.pk.S", 2}} {
			var runs atomic.Int64
			h, err := idemlambda.DynamoDBStream(engine(t, idem.Config{}), "orders", func(context.Context, events.DynamoDBEventRecord) error {
				runs.Add(1)
				return nil
			}, &idemlambda.DynamoDBStreamConfig{Config: idemlambda.Config{KeyJMESPath: c.key}})
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if r, err := h(context.Background(), ev); err != nil || len(r.BatchItemFailures) != 0 {
					t.Fatalf("key %q: %+v %v", c.key, r, err)
				}
			}
			if runs.Load() != c.runs {
				t.Errorf("key %q: %d runs, want %d", c.key, runs.Load(), c.runs)
			}
		}
	})
}

// TestKinesisDefaultKey: the default key is the eventID qualified by the
// stream: the same eventID on two streams is two records; a record
// without an eventID has no key.
func TestKinesisDefaultKey(t *testing.T) {
	t.Parallel()
	var ev events.KinesisEvent
	load(t, "kinesis.json", &ev)
	other := ev.Records[0]
	other.EventSourceArn = "arn:aws:kinesis:eu-west-1:123456789012:stream/refunds"
	noID := ev.Records[1]
	noID.EventID = ""
	var runs atomic.Int64
	h, err := idemlambda.Kinesis(engine(t, idem.Config{}), "orders", func(context.Context, events.KinesisEventRecord) error {
		runs.Add(1)
		return nil
	}, &idemlambda.KinesisConfig{Config: idemlambda.Config{Logger: quiet}})
	if err != nil {
		t.Fatal(err)
	}
	batch := events.KinesisEvent{Records: []events.KinesisEventRecord{ev.Records[0], other, noID}}
	for range 2 {
		if r, err := h(context.Background(), batch); err != nil || len(r.BatchItemFailures) != 0 {
			t.Fatalf("%+v %v", r, err)
		}
	}
	// Both eventIDs once; the record without one on each delivery.
	if runs.Load() != 4 {
		t.Fatalf("%d runs, want 4", runs.Load())
	}
	strict, err := idemlambda.Kinesis(engine(t, idem.Config{}), "orders", func(context.Context, events.KinesisEventRecord) error { return nil },
		&idemlambda.KinesisConfig{Config: idemlambda.Config{RaiseOnMissingKey: true, Logger: quiet}, StopOnDeadLetter: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := strict(context.Background(), batch)
	if err != nil || len(r.BatchItemFailures) != 1 || r.BatchItemFailures[0].ItemIdentifier != noID.Kinesis.SequenceNumber {
		t.Fatalf("without an eventID under RaiseOnMissingKey: %+v %v", r, err)
	}
}

func TestStreamConfigErrors(t *testing.T) {
	t.Parallel()
	eng := engine(t, idem.Config{})
	if _, err := idemlambda.Kinesis(nil, "orders", func(context.Context, events.KinesisEventRecord) error { return nil }, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("no engine: %v", err)
	}
	if _, err := idemlambda.DynamoDBStream(eng, "orders", nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("no handler: %v", err)
	}
	var xe *idemlambda.ExprError
	if _, err := idemlambda.DynamoDBStream(eng, "orders", func(context.Context, events.DynamoDBEventRecord) error { return nil },
		&idemlambda.DynamoDBStreamConfig{Config: idemlambda.Config{KeyJMESPath: "dynamodb.Keys["}}); !errors.As(err, &xe) {
		t.Errorf("broken expression: %v", err)
	}
}

// TestStreamStopsWhenTheInvocationEnds: once the invocation's context is
// done, no further record begins; the first not begun is reported, and
// the redelivery from it completes the shard.
func TestStreamStopsWhenTheInvocationEnds(t *testing.T) {
	t.Parallel()
	eachStream(t, func(t *testing.T, src streamSource, eng func(idem.Config) *idem.Engine) {
		rs := shard(4)
		l := newLedger()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var last consume.Verdict
		deliver := src.open(t, eng(idem.Config{}), streamOpts{Settled: func(_ rec, v consume.Verdict) { last = v }}, l.handler(func(r rec, run int) error {
			if r.seq == rs[1].seq {
				cancel() // the invocation ends while this record's handler finishes
			}
			return nil
		}))
		if failed := deliver(ctx, rs); !slices.Equal(failed, []string{rs[2].seq}) {
			t.Fatalf("reported %v, want %s, the first record not begun", failed, rs[2].seq)
		}
		if !errors.Is(last.Err, context.Canceled) || last.Action != consume.Retry {
			t.Fatalf("the record not begun settled as %v (%v)", last.Action, last.Err)
		}
		if got := l.runs(); !slices.Equal(got, seqs(rs[:2])) {
			t.Fatalf("ran %v", got)
		}
		if failed := deliver(context.Background(), rs[2:]); failed != nil {
			t.Fatalf("redelivery reported %v", failed)
		}
		l.exactlyOnce(t, rs)
	})
}

// TestStreamWarnsOfAShortExpiry: an engine whose records expire before the
// stream's default retention is named at construction.
func TestStreamWarnsOfAShortExpiry(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		expiry time.Duration
		warned bool
	}{{time.Hour, true}, {48 * time.Hour, false}} {
		var log strings.Builder
		_, err := idemlambda.DynamoDBStream(engine(t, idem.Config{Expiry: c.expiry}), "orders", func(context.Context, events.DynamoDBEventRecord) error { return nil },
			&idemlambda.DynamoDBStreamConfig{Config: idemlambda.Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(log.String(), "Expiry is shorter"); got != c.warned {
			t.Errorf("Expiry %v: warned %t, want %t (%q)", c.expiry, got, c.warned, log.String())
		}
	}
}

// TestKinesisDataThatIsNotJSON: a key expression that fails on a record's
// data (powertools_json over bytes that are no JSON) makes the record a
// dead letter with the *ExprError: passed by default, reported with
// StopOnDeadLetter.
func TestKinesisDataThatIsNotJSON(t *testing.T) {
	t.Parallel()
	var ev events.KinesisEvent
	load(t, "kinesis.json", &ev)
	ev.Records[1].Kinesis.Data = []byte("not json")
	for _, stop := range []bool{false, true} {
		var runs atomic.Int64
		var bad consume.Verdict
		h, err := idemlambda.Kinesis(engine(t, idem.Config{Expiry: 48 * time.Hour}), "orders", func(context.Context, events.KinesisEventRecord) error {
			runs.Add(1)
			return nil
		}, &idemlambda.KinesisConfig{
			Config:           idemlambda.Config{KeyJMESPath: "powertools_json(powertools_base64(kinesis.data)).order_id", Logger: quiet},
			StopOnDeadLetter: stop,
			Settled: func(r events.KinesisEventRecord, v consume.Verdict) {
				if r.Kinesis.SequenceNumber == ev.Records[1].Kinesis.SequenceNumber {
					bad = v
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		r, err := h(context.Background(), ev)
		var xe *idemlambda.ExprError
		if err != nil || bad.Action != consume.DeadLetter || !errors.As(bad.Err, &xe) {
			t.Fatalf("stop %t: %v; the record settled as %v (%v)", stop, err, bad.Action, bad.Err)
		}
		wantRuns, wantFailed := int64(1), 1 // the first order, then the stop
		if !stop {
			wantRuns, wantFailed = 1, 0 // the third record repeats the first order: replayed
		}
		if runs.Load() != wantRuns || len(r.BatchItemFailures) != wantFailed {
			t.Errorf("stop %t: %d runs, failures %+v", stop, runs.Load(), r.BatchItemFailures)
		}
		if stop && r.BatchItemFailures[0].ItemIdentifier != ev.Records[1].Kinesis.SequenceNumber {
			t.Errorf("reported %+v", r.BatchItemFailures)
		}
	}
}
