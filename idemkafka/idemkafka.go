package idemkafka

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/consume"
)

// ErrInvalidConfig is returned by [New] for an unusable [Config] or
// client options; it wraps [idem.ErrInvalidConfig].
var ErrInvalidConfig = fmt.Errorf("idemkafka: %w", idem.ErrInvalidConfig)

// ErrNoKey: the record has nothing to key it by: no value (a tombstone;
// the default key), no record key (Config.KeyFromRecordKey), or not the
// header Config.KeyHeader names. Such a record is dead-lettered.
var ErrNoKey = errors.New("idemkafka: the record has no key")

// ErrNotBegun is the error of a record whose claim was released without
// running its handler: an earlier record of its partition stopped the
// partition, a rebalance is waiting, or Run is ending. Its verdict is
// consume.Retry, and the record comes again from its partition's position.
var ErrNotBegun = errors.New("idemkafka: the record was not begun")

// ErrBehind is the error of a record that comes after its partition's
// stopping record: whatever the engine answered for it, the partition's
// position goes back to the stopping record, so it is delivered again,
// and replays its outcome if it has one recorded, or is retried.
var ErrBehind = errors.New("idemkafka: an earlier record of the partition was not settled")

// The headers a dead letter carries, besides the record's own.
const (
	// HeaderReason is the verdict's error: why the record failed for good.
	HeaderReason = "idem-dead-letter-reason"
	// HeaderTopic, HeaderPartition and HeaderOffset name the record.
	HeaderTopic     = "idem-dead-letter-topic"
	HeaderPartition = "idem-dead-letter-partition"
	HeaderOffset    = "idem-dead-letter-offset"
)

// Config configures [New].
type Config struct {
	// Operation is the idem operation name, the scope of the keys
	// (required).
	Operation string
	// HoldCrashed sets the operation's takeover policy to Hold
	// (idem.Config.HoldCrashed): a key whose holder died is not run again
	// but held for a person; its records are dead-lettered (consume.Decide). Default false: the engine's policy.
	HoldCrashed bool
	// Key returns a record's idempotency key, unscoped (the same key on
	// two topics is one record of the operation). An error dead-letters
	// the record. Default (none of Key, KeyHeader and KeyFromRecordKey
	// set): the record's value, the payload as the producer sent it,
	// hashed and scoped to the record's topic (not its partition): a copy
	// of the message is a duplicate whichever partition or offset it
	// comes at (see the package doc). Set at most one of Key, KeyHeader
	// and KeyFromRecordKey.
	Key func(*kgo.Record) (string, error)
	// KeyHeader names the header that holds a record's key (the same on
	// every publish of the message), unscoped.
	KeyHeader string
	// KeyFromRecordKey keys a record by its Kafka record key, scoped to
	// its topic. Choose it only where producers give each message a key
	// of its own: a record key usually names an entity (a customer, an
	// account), and a second, different event of that entity would then
	// be refused as a key reused with another payload (dead-lettered).
	KeyFromRecordKey bool
	// MaxPollRecords is the most records one batch takes from a poll.
	// Default 100.
	MaxPollRecords int
	// RetryDelay is how long a partition waits before its stopping record
	// comes again, when its verdict is consume.Retry or consume.Leave, or
	// consume.Done with its outcome not recorded (for consume.RetryAfter it
	// waits the verdict's Delay). Default 1s.
	RetryDelay time.Duration
	// DeadLetter, when set, receives a copy of each record whose verdict
	// is consume.DeadLetter, with HeaderReason and the record's origin in
	// its headers, before the partition moves past it. Unset, such a
	// record is logged at error level and moved past.
	DeadLetter *DeadLetter
	// Logger logs records that were not done. Default: the engine's.
	Logger *slog.Logger
	// Settled, when set, is called with every record of a batch and the
	// verdict it was settled by: the engine's (consume.Decide), or Retry
	// with ErrBehind for one after its partition's stopping record, or
	// Retry with the producer's error for a dead letter that could not be
	// produced. A Done whose Err holds consume.ErrOutcomeNotRecorded (its
	// outcome write failed for all of the engine's WriteTimeout) is not
	// committed: it stops its partition as Retry does. It is called before
	// the batch's offsets are committed. For metrics and tests.
	Settled func(*kgo.Record, consume.Verdict)
}

// DeadLetter is where dead letters go.
type DeadLetter struct {
	// Client produces them (required); it may be the consumer's own
	// client only if that is configured to produce, and is not closed
	// by the Consumer.
	Client *kgo.Client
	// Topic is the dead-letter topic (required).
	Topic string
	// Timeout bounds one dead letter's produce; past it the record is not
	// settled and its partition goes back to it. Default 10s.
	Timeout time.Duration
}

// WithDefaults returns a copy of c with defaults filled in, for the engine
// e. A nil c is an empty Config.
func (c *Config) WithDefaults(e *idem.Engine) Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.MaxPollRecords == 0 {
		out.MaxPollRecords = 100
	}
	if out.RetryDelay == 0 {
		out.RetryDelay = time.Second
	}
	if out.Logger == nil {
		out.Logger = e.Config().Logger
	}
	if out.DeadLetter != nil && out.DeadLetter.Timeout == 0 {
		d := *out.DeadLetter
		d.Timeout = 10 * time.Second
		out.DeadLetter = &d
	}
	return out
}

func (c *Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.Operation == "":
		return bad("Operation is empty; name the operation, such as \"orders.ship\"")
	case (c.Key != nil) && (c.KeyHeader != "" || c.KeyFromRecordKey) || c.KeyHeader != "" && c.KeyFromRecordKey:
		return bad("more than one of Key, KeyHeader and KeyFromRecordKey is set; set one, or none to key records by their value")
	case c.MaxPollRecords < 0:
		return bad("MaxPollRecords is %d; use 0 (100) or more", c.MaxPollRecords)
	case c.RetryDelay < 0:
		return bad("RetryDelay is %v; use 0 (1s) or more", c.RetryDelay)
	case c.DeadLetter != nil && (c.DeadLetter.Client == nil || c.DeadLetter.Topic == ""):
		return bad("DeadLetter needs a Client and a Topic")
	}
	return nil
}

// Func is a record handler whose result is stored and replayed.
type Func[T any] func(ctx context.Context, r *kgo.Record) (T, error)

// Consumer runs a consumer group's records through the engine and commits
// each partition's offset up to its first record that is not settled:
// whose outcome is not recorded, and that was not dead-lettered. See the
// package doc.
type Consumer struct {
	e   *idem.Engine
	cfg Config
	cl  *kgo.Client
	// batch runs one partition's records through the engine and returns
	// each record's verdict; stop tells it to begin no more records.
	batch func(ctx context.Context, recs []*kgo.Record, stop func() bool) []consume.Verdict

	// rebalance is set when a rebalance waits for the batch in hand: the
	// batch begins no more records.
	rebalance atomic.Bool
	running   atomic.Bool

	mu sync.Mutex
	// pending are offsets found settled whose commit failed: committed
	// again with the next batch, or when their partitions are revoked.
	pending map[string]map[int32]kgo.EpochOffset
	// paused are the partitions waiting before their stopping record
	// comes again, and when it may.
	paused map[tp]time.Time
}

type tp struct {
	topic     string
	partition int32
}

// New returns a Consumer of the group that opts configure (kgo.SeedBrokers,
// kgo.ConsumerGroup and kgo.ConsumeTopics at least; required: a group),
// whose records run fn at most once per key. New adds to opts what the
// Consumer needs and the caller must not set: kgo.DisableAutoCommit,
// kgo.BlockRebalanceOnPoll, and the kgo.OnPartitionsCallbackBlocked,
// OnPartitionsRevoked and OnPartitionsLost callbacks. kgo.FetchMaxWait
// bounds how soon a paused partition is fetched again; a second or less
// suits RetryDelay's default.
func New[T any](e *idem.Engine, cfg *Config, fn Func[T], opts ...kgo.Opt) (*Consumer, error) {
	if e == nil || fn == nil {
		return nil, fmt.Errorf("%w: engine and handler are required", ErrInvalidConfig)
	}
	c := &Consumer{e: e, cfg: cfg.WithDefaults(e), pending: map[string]map[int32]kgo.EpochOffset{}, paused: map[tp]time.Time{}}
	if err := c.cfg.validate(); err != nil {
		return nil, err
	}
	w := &handler[T]{c: c, fn: fn}
	c.batch = w.partition
	opts = append(opts[:len(opts):len(opts)],
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) { c.rebalance.Store(true) }),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g == "" {
		cl.Close()
		return nil, fmt.Errorf("%w: no consumer group; set kgo.ConsumerGroup", ErrInvalidConfig)
	}
	c.cl = cl
	return c, nil
}

// Client is the Consumer's client, for what the Consumer does not do
// (metadata, admin requests). Polling, committing and seeking on it are
// the Consumer's.
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Close leaves the group, committing first what is settled and not yet
// committed, and closes the client. Call it after Run returned.
func (c *Consumer) Close() { c.cl.Close() }

// Run polls batches of records and runs each through the engine until ctx
// is done, then returns nil once the batch in hand is settled and
// committed; it returns an error when the client was closed or the group
// failed for good. A batch in hand when ctx ends begins no more records
// (their claims are released, and they come again to whoever consumes the
// partition next). Run must not be called twice at once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: Run is already running", ErrInvalidConfig)
	}
	defer c.running.Store(false)
	for {
		if ctx.Err() != nil {
			return nil
		}
		// A rebalance signalled before this poll has run (polls wait for
		// rebalances); one signalled from here on stops the next batch.
		c.rebalance.Store(false)
		// While a partition is paused the poll ends when it is due. One
		// context per poll at most, and its cancel always called: a
		// context never cancelled stays among ctx's children until ctx
		// ends, one more each poll.
		pollCtx, cancel := ctx, context.CancelFunc(func() {})
		if next, ok := c.resume(); ok {
			pollCtx, cancel = context.WithDeadline(ctx, next)
		}
		fs := c.cl.PollRecords(pollCtx, c.cfg.MaxPollRecords)
		cancel()
		if fs.IsClientClosed() {
			c.cl.AllowRebalance()
			return kgo.ErrClientClosed
		}
		fs.EachError(func(t string, p int32, err error) {
			switch {
			case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			case errors.As(err, new(*kgo.ErrGroupSession)):
				c.cfg.Logger.Warn("idemkafka: the group session failed; its partitions are lost", "op", c.cfg.Operation, "err", err)
			default:
				c.cfg.Logger.Warn("idemkafka: fetch error", "op", c.cfg.Operation, "topic", t, "partition", p, "err", err)
			}
		})
		c.runBatch(ctx, fs)
		c.cl.AllowRebalance()
	}
}

// resume resumes the paused partitions whose time has come and returns
// when the next one is due.
func (c *Consumer) resume() (next time.Time, ok bool) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	due := map[string][]int32{}
	for p, at := range c.paused {
		if !at.After(now) {
			due[p.topic] = append(due[p.topic], p.partition)
			delete(c.paused, p)
			continue
		}
		if !ok || at.Before(next) {
			next, ok = at, true
		}
	}
	if len(due) > 0 {
		c.cl.ResumeFetchPartitions(due)
	}
	return next, ok
}

// part is one partition's records in a batch, and what became of them.
type part struct {
	tp     tp
	recs   []*kgo.Record
	commit *kgo.Record   // the last record of the settled prefix
	stop   *kgo.Record   // the first record not settled
	delay  time.Duration // before stop comes again
	vs     []consume.Verdict
}

// runBatch runs a poll's records, each partition's in order and the
// partitions at once, then commits each partition's settled prefix and
// sends each stopped partition back to its stopping record.
func (c *Consumer) runBatch(ctx context.Context, fs kgo.Fetches) {
	var parts []*part
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) > 0 {
			parts = append(parts, &part{tp: tp{p.Topic, p.Partition}, recs: p.Records})
		}
	})
	if len(parts) == 0 {
		return
	}
	stop := func() bool { return c.rebalance.Load() || ctx.Err() != nil }
	run := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Go(func() { c.settle(run, p, c.batch(run, p.recs, stop)) })
	}
	wg.Wait()

	commit := map[string]map[int32]kgo.EpochOffset{}
	seek := map[string]map[int32]kgo.EpochOffset{}
	pause := map[string][]int32{}
	c.mu.Lock()
	for t, ps := range c.pending {
		for p, o := range ps {
			put(commit, tp{t, p}, o)
		}
	}
	c.pending = map[string]map[int32]kgo.EpochOffset{}
	now := time.Now()
	for _, p := range parts {
		if r := p.commit; r != nil {
			put(commit, p.tp, kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1})
		}
		if r := p.stop; r != nil {
			put(seek, p.tp, kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset})
			pause[p.tp.topic] = append(pause[p.tp.topic], p.tp.partition)
			c.paused[p.tp] = now.Add(p.delay)
		}
	}
	c.mu.Unlock()
	if c.cfg.Settled != nil {
		for _, p := range parts {
			for i, r := range p.recs {
				c.cfg.Settled(r, p.vs[i])
			}
		}
	}
	if len(pause) > 0 {
		c.cl.PauseFetchPartitions(pause)
		c.cl.SetOffsets(seek)
	}
	c.commit(context.WithoutCancel(ctx), commit)
}

func put(m map[string]map[int32]kgo.EpochOffset, p tp, o kgo.EpochOffset) {
	if m[p.topic] == nil {
		m[p.topic] = map[int32]kgo.EpochOffset{}
	}
	m[p.topic][p.partition] = o
}

// commit commits offsets; what could not be committed is pending, for the
// next batch or the partitions' revocation.
func (c *Consumer) commit(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) {
	if len(offsets) == 0 {
		return
	}
	var cerr error
	c.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		cerr = commitError(resp, err)
	})
	if cerr == nil {
		return
	}
	c.cfg.Logger.Warn("idemkafka: offset commit failed; kept for the next commit", "op", c.cfg.Operation, "err", cerr)
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range offsets {
		for p, o := range ps {
			if cur, ok := c.pending[t][p]; !ok || cur.Offset < o.Offset {
				put(c.pending, tp{t, p}, o)
			}
		}
	}
}

// settle walks a partition's verdicts in order: the settled prefix
// (done with its outcome recorded, or dead-lettered) is committed, and the
// first record that is not settled stops the partition there.
func (c *Consumer) settle(ctx context.Context, p *part, vs []consume.Verdict) {
	p.vs = vs
	for i, r := range p.recs {
		if p.stop != nil {
			p.vs[i] = consume.Verdict{Action: consume.Retry, Err: ErrBehind}
			continue
		}
		v := vs[i]
		switch v.Action {
		case consume.Done:
			if v.Err == nil {
				p.commit = r
				continue
			}
			// Done, its outcome not recorded (consume.ErrOutcomeNotRecorded):
			// the store never learnt that it ran, so the offset does not
			// move past it.
			p.stop, p.delay = r, c.cfg.RetryDelay
		case consume.DeadLetter:
			if err := c.deadLetter(ctx, r, v); err != nil {
				p.vs[i] = consume.Verdict{Action: consume.Retry, Err: errors.Join(v.Err, err)}
				p.stop, p.delay = r, c.cfg.RetryDelay
				continue
			}
			p.commit = r
			continue
		case consume.RetryAfter:
			p.stop, p.delay = r, v.Delay
		default:
			p.stop, p.delay = r, c.cfg.RetryDelay
			if errors.Is(v.Err, ErrNotBegun) {
				p.delay = 0 // nothing failed: it comes again at once
			}
		}
		if !errors.Is(v.Err, ErrNotBegun) {
			c.cfg.Logger.Info("idemkafka: record not settled; its partition goes back to it", "op", c.cfg.Operation, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "verdict", v.Action.String(), "err", v.Err)
		}
	}
}

// deadLetter produces r's dead letter, when there is a DeadLetter, and
// logs it.
func (c *Consumer) deadLetter(ctx context.Context, r *kgo.Record, v consume.Verdict) error {
	c.cfg.Logger.Error("idemkafka: record failed for good; its partition moves past it", "op", c.cfg.Operation, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", v.Err, "dead_letter_topic", c.dlqTopic())
	d := c.cfg.DeadLetter
	if d == nil {
		return nil
	}
	reason := "dead letter"
	if v.Err != nil {
		reason = v.Err.Error()
	}
	headers := append(r.Headers[:len(r.Headers):len(r.Headers)],
		kgo.RecordHeader{Key: HeaderReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderPartition, Value: []byte(strconv.FormatInt(int64(r.Partition), 10))},
		kgo.RecordHeader{Key: HeaderOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
	)
	dl := &kgo.Record{Topic: d.Topic, Key: r.Key, Value: r.Value, Headers: headers}
	ctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	if err := d.Client.ProduceSync(ctx, dl).FirstErr(); err != nil {
		return fmt.Errorf("idemkafka: producing the dead letter to %s: %w", d.Topic, err)
	}
	return nil
}

func (c *Consumer) dlqTopic() string {
	if c.cfg.DeadLetter == nil {
		return ""
	}
	return c.cfg.DeadLetter.Topic
}

// revoked commits, for the partitions revoked, what was settled and not
// committed (a batch commits before it lets a rebalance run, so this is
// only what a failed commit left), and forgets their pauses.
func (c *Consumer) revoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.commit(ctx, c.forget(revoked))
}

// lost forgets the partitions lost: nothing can be committed for them.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	if offsets := c.forget(lost); len(offsets) > 0 {
		c.cfg.Logger.Warn("idemkafka: partitions lost with settled offsets not committed; their records replay", "op", c.cfg.Operation, "offsets", fmt.Sprint(offsets))
	}
}

func (c *Consumer) forget(gone map[string][]int32) map[string]map[int32]kgo.EpochOffset {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]map[int32]kgo.EpochOffset{}
	for t, ps := range gone {
		for _, p := range ps {
			if o, ok := c.pending[t][p]; ok {
				put(out, tp{t, p}, o)
				delete(c.pending[t], p)
			}
			delete(c.paused, tp{t, p})
		}
	}
	c.cl.ResumeFetchPartitions(gone) // a pause outlives the assignment in the client
	return out
}

// handler runs one partition's records through the engine.
type handler[T any] struct {
	c  *Consumer
	fn Func[T]
}

// partition claims the keys of a partition's records in one DoBatch, which
// holds every claim until its record runs, and runs fn for them in order,
// one at a time; a record's success is recorded with the others that
// succeeded meanwhile while the next record runs. Once a record's fn fails
// with an error that is not terminal (so the partition will stop there),
// or stop says so, the records after it are not begun.
func (w *handler[T]) partition(ctx context.Context, recs []*kgo.Record, stop func() bool) []consume.Verdict {
	vs := make([]consume.Verdict, len(recs))
	ids := make([]idem.Identity, 0, len(recs))
	at := make([]int, 0, len(recs))
	for i, r := range recs {
		id, err := w.identity(r)
		if err != nil {
			// No usable key: consume.Decide's verdict, as for every consumer.
			vs[i] = consume.Decide(idem.Result[T]{}, consume.NoKey(err), w.c.e.Now())
			continue
		}
		ids = append(ids, id)
		at = append(at, i)
	}
	if len(ids) == 0 {
		return vs
	}
	var stopped atomic.Bool
	// A key named twice (a producer's retry, often next to the first
	// send) starts a new DoBatch after the first copy's outcome is
	// recorded, so the later copy replays it rather than meeting it in
	// flight.
	for len(ids) > 0 {
		n := segment(ids)
		if stopped.Load() || stop() {
			for _, i := range at {
				vs[i] = consume.Verdict{Action: consume.Retry, Err: ErrNotBegun}
			}
			break
		}
		seg, segAt := ids[:n], at[:n]
		res, errs := idem.DoBatch(ctx, w.c.e, seg, &idem.BatchOptions[T]{Concurrency: 1}, func(ctx context.Context, j int) (T, error) {
			if stopped.Load() || stop() {
				var zero T
				return zero, ErrNotBegun
			}
			v, err := w.fn(ctx, recs[segAt[j]])
			if err != nil && !errors.Is(err, idem.ErrTerminal) {
				stopped.Store(true)
			}
			return v, err
		})
		now := w.c.e.Now()
		for j, i := range segAt {
			vs[i] = consume.Decide(res[j], errs[j], now)
		}
		ids, at = ids[n:], at[n:]
	}
	return vs
}

// segment is how many of ids, from the first, name no key twice.
func segment(ids []idem.Identity) int {
	seen := make(map[idem.StoreKey]bool, len(ids))
	for i, id := range ids {
		if seen[id.StoreKey] {
			return i
		}
		seen[id.StoreKey] = true
	}
	return len(ids)
}

// identity is r's key and fingerprint, from package clientkey (which
// idemctl find and the console derive keys with): by default its value's
// digest under its topic (clientkey.PayloadIdentity); with a key chosen,
// that key (under its topic for the record key) and its value's digest as
// the fingerprint (clientkey.KeyIdentity); its takeover policy is
// Config.HoldCrashed.
func (w *handler[T]) identity(r *kgo.Record) (idem.Identity, error) {
	id, err := w.keyed(r)
	id.HoldCrashed = w.c.cfg.HoldCrashed && err == nil
	return id, err
}

func (w *handler[T]) keyed(r *kgo.Record) (idem.Identity, error) {
	cfg := &w.c.cfg
	var key, tenant string
	switch {
	case cfg.Key != nil:
		k, err := cfg.Key(r)
		if err != nil {
			return idem.Identity{}, fmt.Errorf("idemkafka: no key: %w", err)
		}
		key = k
	case cfg.KeyHeader != "":
		for _, h := range r.Headers {
			if h.Key == cfg.KeyHeader && len(h.Value) > 0 {
				key = string(h.Value)
			}
		}
	case cfg.KeyFromRecordKey:
		key, tenant = string(r.Key), clientkey.TopicTenant(r.Topic)
	default:
		if len(r.Value) == 0 {
			return idem.Identity{}, ErrNoKey
		}
		return clientkey.PayloadIdentity(cfg.Operation, r.Topic, r.Value)
	}
	if key == "" {
		return idem.Identity{}, ErrNoKey
	}
	fp := sha256.Sum256(r.Value)
	return clientkey.KeyIdentity(cfg.Operation, tenant, key, &fp)
}

// commitError is the first error of an offset commit.
func commitError(resp *kmsg.OffsetCommitResponse, err error) error {
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, err)
			}
		}
	}
	return nil
}
