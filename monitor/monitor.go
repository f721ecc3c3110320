// Package monitor watches an idem store for work that should have finished
// and has not: it sweeps a [store.Lister] on an interval and reports how
// many records are IN_PROGRESS, how many of those are stuck (IN_PROGRESS
// past their expected completion), how many are FAILED, and the age of the
// oldest IN_PROGRESS one.
//
// Each record that newly becomes stuck or FAILED is logged once, with who
// held it, since when and for which execution, and handed to
// Config.OnEvent (an alert, a ticket, a reconciler). Every sweep's
// [Snapshot] goes to Config.OnSweep, where a program sets its gauges
// (idemctl watch serves them to Prometheus). The work of one sweep is
// bounded by Config.MaxRecords.
//
// A store that can read its backend's settings ([store.SettingsChecker]:
// redisstore's maxmemory-policy) is asked on every sweep too, since an
// operator can change them under a running program: a check that starts
// failing with store.ErrMisconfigured is logged (Error) once, and once
// more (Info) when it passes again (one that cannot be read, once, Warn); every sweep's answers are in
// [Snapshot.Settings] (idemctl exports them as
// idem_store_misconfigured{check="eviction"}).
//
// "Stuck" is decided on the store's clock, as the engine decides leases:
// the monitor's clock is corrected to the clock of a store that tells its
// time ([store.ServerClock]: Redis, PostgreSQL, DynamoDB), so a host whose
// clock runs minutes ahead does not report live work as stuck, and one
// whose clock runs behind still reports work whose lease has passed. A
// sweep that cannot read the store's clock fails (Snapshot.Err) and
// counts nothing. memstore and boltstore have no clock of their own: they
// run in their holders' process, whose clock wrote the leases, and the
// monitor's clock is used as it is.
//
// A stuck record is settled by hand with idemctl (resolve, release) or by
// the code that owns the work; see docs/idemctl.md.
package monitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// Config configures a [Monitor]. A nil *Config means all defaults.
type Config struct {
	// Interval is the time between sweeps. Default 1m.
	Interval time.Duration
	// MaxRecords bounds the records one sweep reads of each status it
	// reads (IN_PROGRESS, then FAILED), so that many records of one never
	// hide the other. A sweep that reaches it stops that status's listing
	// early and says so (Snapshot.Truncated): its counts are lower
	// bounds. Default 10,000.
	MaxRecords int
	// PageSize is the page size asked of the store. Default 500, at most
	// MaxRecords.
	PageSize int
	// SweepTimeout bounds one sweep. Default Interval.
	SweepTimeout time.Duration
	// Clock times the sweeps. Which records are stuck, and their ages,
	// are decided on it corrected to the store's clock
	// ([store.ServerClock]), as the engine decides leases: measured at
	// a sweep once the last measurement is ServerClockInterval old, when
	// the store tells its time (redisstore, pgstore, dynamostore) and the
	// clock is real time. A host whose clock runs ahead then does not
	// count live work as stuck. Default store.SystemClock.
	Clock store.Clock
	// Logger receives one line per newly stuck or failed record (Warn),
	// per failed sweep (Error), and per store setting that became wrong
	// (Error), right again (Info) or unreadable (Warn). Default
	// slog.Default().
	Logger *slog.Logger
	// OnSweep, when set, is called after every sweep with its snapshot,
	// on the monitor's goroutine.
	OnSweep func(Snapshot)
	// OnEvent, when set, is called once for each record that newly became
	// stuck or FAILED, on the monitor's goroutine.
	OnEvent func(Event)
}

// WithDefaults returns a copy of c with every zero field set to its
// default. A nil c gives all defaults.
func (c *Config) WithDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Interval == 0 {
		out.Interval = time.Minute
	}
	if out.MaxRecords == 0 {
		out.MaxRecords = 10_000
	}
	if out.PageSize == 0 {
		out.PageSize = 500
	}
	out.PageSize = min(out.PageSize, out.MaxRecords)
	if out.SweepTimeout == 0 {
		out.SweepTimeout = out.Interval
	}
	if out.Clock == nil {
		out.Clock = store.SystemClock{}
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *Config) validate() error {
	switch {
	case c.Interval < 0:
		return fmt.Errorf("%w: monitor Interval is %v; it must be positive", idem.ErrInvalidConfig, c.Interval)
	case c.MaxRecords < 0 || c.PageSize < 0:
		return fmt.Errorf("%w: monitor MaxRecords %d and PageSize %d must be positive", idem.ErrInvalidConfig, c.MaxRecords, c.PageSize)
	case c.SweepTimeout < 0:
		return fmt.Errorf("%w: monitor SweepTimeout is %v; it must be positive", idem.ErrInvalidConfig, c.SweepTimeout)
	}
	return nil
}

// Snapshot is what one sweep found.
type Snapshot struct {
	// At is when the sweep started, on the store's clock (see
	// Config.Clock): the instant "stuck" and ages refer to.
	At time.Time
	// InProgress counts IN_PROGRESS records, Stuck those of them past
	// their expected completion, Failed the FAILED records.
	InProgress, Stuck, Failed int
	// Held counts the stuck records held for an operator (claimed under
	// the takeover policy Hold: no retry takes them over; a person
	// settles them).
	Held int
	// OldestInProgress is the age of the oldest IN_PROGRESS record (since
	// its claim), zero when there is none.
	OldestInProgress time.Duration
	// Truncated is true when the sweep stopped at Config.MaxRecords: the
	// counts are lower bounds.
	Truncated bool
	// Err is the listing's failure; the counts are then those read before it.
	Err error

	// byOp breaks the counts down by operation (see ByOperation); a
	// pointer, so that a Snapshot stays comparable.
	byOp *map[string]Counts
	// settings are the store's setting checks (see Settings); a pointer,
	// likewise.
	settings *[]store.SettingCheck
}

// Settings returns the answers of the store's setting checks at this
// sweep ([store.SettingsChecker]), nil when the store has none. A check
// whose Err matches store.ErrMisconfigured found a setting that lets the
// store forget records before their expiry (Redis eviction): operations
// may run again. The slice is a copy.
func (s Snapshot) Settings() []store.SettingCheck {
	if s.settings == nil {
		return nil
	}
	return slices.Clone(*s.settings)
}

// Misconfigured reports whether one of the store's setting checks at this
// sweep found a setting wrong (its Err matches store.ErrMisconfigured).
func (s Snapshot) Misconfigured() bool {
	if s.settings == nil {
		return false
	}
	for _, c := range *s.settings {
		if errors.Is(c.Err, store.ErrMisconfigured) {
			return true
		}
	}
	return false
}

// ByOperation returns the snapshot's counts by operation (the store key's
// operation name; "" for a key that does not parse), which add up to its
// totals; nil when the sweep counted nothing. The operator console shows
// it. The map is a copy.
func (s Snapshot) ByOperation() map[string]Counts {
	if s.byOp == nil {
		return nil
	}
	return maps.Clone(*s.byOp)
}

// Counts are one operation's share of a [Snapshot].
type Counts struct {
	InProgress, Stuck, Failed, Held int
	OldestInProgress                time.Duration
}

// count adds r to the snapshot's counts of its operation.
func (s *Snapshot) count(r *store.Record, now time.Time) {
	op := ""
	if sk, err := idem.ParseStoreKey(r.Key); err == nil {
		op = sk.Operation
	}
	if s.byOp == nil {
		m := make(map[string]Counts)
		s.byOp = &m
	}
	c := (*s.byOp)[op]
	switch r.Status {
	case store.StatusInProgress:
		c.InProgress++
		c.OldestInProgress = max(c.OldestInProgress, now.Sub(store.FromMillis(r.CreatedAt)))
		if r.LeaseExpired(store.Millis(now)) {
			c.Stuck++
			if r.Hold {
				c.Held++
			}
		}
	case store.StatusFailed:
		c.Failed++
	}
	(*s.byOp)[op] = c
}

// Kind says why an [Event] was raised.
type Kind int

// The kinds of event.
const (
	// Stuck: an IN_PROGRESS record is past its expected completion.
	Stuck Kind = iota + 1
	// Failed: a record is FAILED.
	Failed
)

func (k Kind) String() string {
	switch k {
	case Stuck:
		return "stuck"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Event is a record that newly became stuck or FAILED.
type Event struct {
	Kind Kind
	// Key is the store key; Operation its operation name.
	Key, Operation string
	// Owner is who claimed the record; Ref the execution it was handed
	// to, if any.
	Owner, Ref string
	// Fence is the claim's fence: a later claim of the key is a new event.
	Fence uint64
	// Held is set on a Stuck record held for an operator (the takeover
	// policy Hold): no retry will take it over, a person must settle it.
	Held bool
	// CreatedAt is when the claim was made, LeaseUntil when it
	// should have been done, CompletedAt when a FAILED record failed.
	CreatedAt, LeaseUntil, CompletedAt time.Time
	// ErrCode and ErrMessage are a FAILED record's stored error.
	ErrCode, ErrMessage string
}

// Monitor sweeps a store on an interval. Close stops it.
type Monitor struct {
	l     store.Lister
	cfg   Config
	clock *store.ServerClock // cfg.Clock corrected to the store's: records are judged by it

	// seen holds the events raised already (key, fence, kind), pruned to
	// what the last complete sweep found.
	seen map[seenKey]bool
	// wrong holds the names of the setting checks that failed with
	// store.ErrMisconfigured at the last sweep that could read them;
	// unreadable those that could not be read at the last sweep.
	wrong, unreadable map[string]bool

	mu   sync.Mutex
	last Snapshot

	sweepMu sync.Mutex // one sweep at a time
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
}

type seenKey struct {
	key   string
	fence uint64
	kind  Kind
}

// New returns a monitor of l that sweeps only when [Monitor.Sweep] is
// called; [Start] returns one that sweeps by itself.
func New(l store.Lister, cfg *Config) (*Monitor, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: monitor needs a store.Lister", idem.ErrInvalidConfig)
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Monitor{l: l, cfg: c, clock: store.NewServerClock(l, c.Clock), seen: make(map[seenKey]bool), wrong: make(map[string]bool), unreadable: make(map[string]bool)}, nil
}

// Start returns a monitor of l that sweeps at once and then every
// Config.Interval on a goroutine of its own, until Close.
func Start(l store.Lister, cfg *Config) (*Monitor, error) {
	m, err := New(l, cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan struct{})
	go m.run(ctx)
	return m, nil
}

func (m *Monitor) run(ctx context.Context) {
	defer close(m.done)
	for {
		m.sweepOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-m.cfg.Clock.After(m.cfg.Interval):
		}
	}
}

func (m *Monitor) sweepOnce(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, m.cfg.SweepTimeout)
	defer cancel()
	_, _ = m.Sweep(sctx)
}

// Close stops the monitor's sweeps and waits for a running one to end. It
// is safe to call more than once, and on a monitor made by New.
func (m *Monitor) Close() error {
	m.once.Do(func() {
		if m.cancel != nil {
			m.cancel()
			<-m.done
		}
	})
	return nil
}

// Last returns the snapshot of the last sweep (zero before the first).
func (m *Monitor) Last() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// Sweep reads the store once: its settings, when it is a
// [store.SettingsChecker], and IN_PROGRESS and FAILED records, at most
// Config.MaxRecords of each status. It raises an event for each newly stuck or
// FAILED record, logs a setting check that changed its answer, calls
// Config.OnSweep and returns the snapshot, with the listing's error if it
// failed.
func (m *Monitor) Sweep(ctx context.Context) (Snapshot, error) {
	m.sweepMu.Lock()
	defer m.sweepMu.Unlock()
	var snap Snapshot
	if sc, ok := m.l.(store.SettingsChecker); ok {
		checks := sc.CheckSettings(ctx)
		snap.settings = &checks
		m.noteSettings(checks)
	}
	// Records are judged on the store's clock: without it, a sweep counts
	// nothing rather than count live work as stuck.
	clockErr := m.clock.Sync(ctx)
	now := m.clock.Now()
	snap.At = now
	found := make(map[seenKey]bool)
	var events []Event
	if clockErr != nil {
		snap.Err = clockErr
	}
	for _, status := range []store.Status{store.StatusInProgress, store.StatusFailed} {
		if snap.Err != nil {
			break
		}
		// Each status has a budget of its own: a backlog of IN_PROGRESS
		// records never hides the FAILED ones (nor their gauge and alert).
		budget := m.cfg.MaxRecords
		err := m.list(ctx, status, now, &budget, &snap.Truncated, func(r *store.Record) {
			snap.count(r, now)
			switch {
			case r.Status == store.StatusInProgress:
				snap.InProgress++
				if age := now.Sub(store.FromMillis(r.CreatedAt)); age > snap.OldestInProgress {
					snap.OldestInProgress = age
				}
				if r.LeaseExpired(store.Millis(now)) {
					snap.Stuck++
					if r.Hold {
						snap.Held++
					}
					events = m.note(events, found, Stuck, r)
				}
			case r.Status == store.StatusFailed:
				snap.Failed++
				events = m.note(events, found, Failed, r)
			}
		})
		if err != nil {
			snap.Err = err
			break
		}
	}
	if snap.Err == nil && !snap.Truncated {
		// Forget what is no longer there, so a record that comes back is
		// reported again and the set stays as small as the store's backlog.
		for k := range m.seen {
			if !found[k] {
				delete(m.seen, k)
			}
		}
	}
	for _, ev := range events {
		m.report(ev)
	}
	if snap.Err != nil {
		m.cfg.Logger.Error("idem monitor: sweep failed", "err", snap.Err)
	} else if snap.Truncated {
		m.cfg.Logger.Warn("idem monitor: sweep stopped at MaxRecords; counts are lower bounds", "max_records", m.cfg.MaxRecords)
	}
	m.mu.Lock()
	m.last = snap
	m.mu.Unlock()
	if m.cfg.OnSweep != nil {
		m.cfg.OnSweep(snap)
	}
	return snap, snap.Err
}

// noteSettings logs the setting checks whose answer changed since the
// last sweep that could read them, and those that newly cannot be read.
func (m *Monitor) noteSettings(checks []store.SettingCheck) {
	for _, c := range checks {
		wrong := errors.Is(c.Err, store.ErrMisconfigured)
		if c.Err != nil && !wrong {
			if !m.unreadable[c.Name] {
				m.unreadable[c.Name] = true
				m.cfg.Logger.Warn("idem monitor: cannot read a store setting; it is not checked until it can be", "check", c.Name, "err", c.Err)
			}
			continue
		}
		delete(m.unreadable, c.Name)
		switch {
		case wrong && !m.wrong[c.Name]:
			m.wrong[c.Name] = true
			m.cfg.Logger.Error("idem monitor: a store setting lets records be forgotten before their expiry; operations may run again",
				"check", c.Name, "err", c.Err)
		case c.Err == nil && m.wrong[c.Name]:
			delete(m.wrong, c.Name)
			m.cfg.Logger.Info("idem monitor: the store setting is right again", "check", c.Name)
		}
	}
}

// list pages through the records of status, at most *budget of them.
func (m *Monitor) list(ctx context.Context, status store.Status, now time.Time, budget *int, truncated *bool, fn func(*store.Record)) error {
	cursor := ""
	for {
		if *budget <= 0 {
			*truncated = true
			return nil
		}
		res, err := m.l.List(ctx, store.ListParams{Status: status, Now: store.Millis(now), Limit: min(m.cfg.PageSize, *budget), Cursor: cursor})
		if err != nil {
			return fmt.Errorf("listing %s records: %w", status, err)
		}
		for _, r := range res.Records {
			if *budget <= 0 {
				*truncated = true
				return nil
			}
			*budget--
			fn(r)
		}
		if res.Next == "" {
			return nil
		}
		if res.Next == cursor {
			return errors.New("store listing did not advance its cursor")
		}
		cursor = res.Next
	}
}

// note marks r as found, and adds its event when it is new.
func (m *Monitor) note(events []Event, found map[seenKey]bool, kind Kind, r *store.Record) []Event {
	k := seenKey{key: r.Key, fence: r.Fence, kind: kind}
	found[k] = true
	if m.seen[k] {
		return events
	}
	m.seen[k] = true
	ev := Event{Kind: kind, Key: r.Key, Owner: r.Owner, Ref: r.Ref, Fence: r.Fence, Held: kind == Stuck && r.Hold,
		CreatedAt: store.FromMillis(r.CreatedAt), LeaseUntil: store.FromMillis(r.LeaseUntil)}
	if sk, err := idem.ParseStoreKey(r.Key); err == nil {
		ev.Operation = sk.Operation
	}
	if r.CompletedAt != 0 {
		ev.CompletedAt = store.FromMillis(r.CompletedAt)
	}
	if r.Err != nil {
		ev.ErrCode, ev.ErrMessage = r.Err.Code, r.Err.Message
	}
	return append(events, ev)
}

// report logs ev and hands it to the hook.
func (m *Monitor) report(ev Event) {
	attrs := []any{"key", ev.Key, "owner", ev.Owner, "created", ev.CreatedAt, "ref", ev.Ref, "fence", ev.Fence}
	switch ev.Kind {
	case Stuck:
		attrs = append(attrs, "lease_until", ev.LeaseUntil)
		if ev.Held {
			m.cfg.Logger.Warn("idem monitor: record held for an operator: its holder was lost, and its takeover policy is Hold (resolve or release it)", attrs...)
			break
		}
		m.cfg.Logger.Warn("idem monitor: record stuck past its expected completion", attrs...)
	case Failed:
		attrs = append(attrs, "failed_at", ev.CompletedAt, "code", ev.ErrCode, "message", ev.ErrMessage)
		m.cfg.Logger.Warn("idem monitor: record failed", attrs...)
	}
	if m.cfg.OnEvent != nil {
		m.cfg.OnEvent(ev)
	}
}
