package idemsfn

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sfn/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// ReconcilerConfig configures a [Reconciler]. A nil *ReconcilerConfig
// means all defaults.
type ReconcilerConfig struct {
	// Interval is the pause between two runs of [Reconciler.Run], on the
	// engine's configured clock (idem.Config.Clock). Default 1m.
	Interval time.Duration
	// PageSize is how many records one List call asks for. Default 100.
	PageSize int
	// OnRun, when set, receives the report and error of every run of
	// [Reconciler.Run], for logs and metrics.
	OnRun func(Report, error)
}

// WithDefaults returns a copy of c with every zero field set to its
// default.
func (c *ReconcilerConfig) WithDefaults() ReconcilerConfig {
	var out ReconcilerConfig
	if c != nil {
		out = *c
	}
	if out.Interval == 0 {
		out.Interval = time.Minute
	}
	if out.PageSize == 0 {
		out.PageSize = 100
	}
	return out
}

// Report counts what one run of the [Reconciler] did, by IN_PROGRESS
// record of the Starter's operation.
type Report struct {
	// Listed records of the operation.
	Listed int
	// Waiting: an execution attached and the expected completion not
	// passed yet; not asked about.
	Waiting int
	// Extended: the execution is still running; the expected completion
	// moved on by Config.ExpectedCompletion.
	Extended int
	// Completed and Failed: the execution had ended; its outcome was
	// recorded.
	Completed, Failed int
	// Adopted: an orphan whose execution had started; attached (and
	// settled, when it had ended: counted in Completed or Failed too).
	Adopted int
	// Restarted: an orphan whose execution had never started; started
	// with Config.RestartInput and attached (OrphanRestart).
	Restarted int
	// OrphansFailed: an orphan whose execution had never started; marked
	// FAILED with CodeOrphan (OrphanFail).
	OrphansFailed int
	// OrphansWaiting: a claim without an execution that is younger than
	// OrphanGrace, or an orphan left for a caller's retry (OrphanRestart
	// without RestartInput).
	OrphansWaiting int
	// Skipped: the record changed while being reconciled; the next run
	// sees it again if it needs to.
	Skipped int
	// Errors: records that could not be reconciled (the run's error joins
	// them).
	Errors int
}

// Reconciler finishes what events may miss: it lists the IN_PROGRESS
// records of the Starter's operation and asks Step Functions about those
// past their expected completion, recording the outcome of executions
// that ended and extending those still running; and it repairs orphans,
// claims that never got an execution attached. It needs a store that
// implements store.Lister. Run it in one process, or in a few: every write
// is fenced, so two reconcilers never record conflicting outcomes.
type Reconciler struct {
	s      *Starter
	lister store.Lister
	cfg    ReconcilerConfig

	mu      sync.Mutex
	closed  bool
	stop    chan struct{}
	running sync.WaitGroup
}

// ErrClosed: [Reconciler.Run] after [Reconciler.Close].
var ErrClosed = errors.New("idemsfn: reconciler closed")

// NewReconciler returns a reconciler of s's keys. It fails when the
// engine's store cannot list records.
func NewReconciler(s *Starter, cfg *ReconcilerConfig) (*Reconciler, error) {
	l, ok := s.e.Store().(store.Lister)
	if !ok {
		return nil, fmt.Errorf("idemsfn: %w: the engine's store %T cannot list records (store.Lister), which the reconciler needs", idem.ErrInvalidConfig, s.e.Store())
	}
	c := cfg.WithDefaults()
	if c.Interval < 0 || c.PageSize < 0 {
		return nil, fmt.Errorf("idemsfn: %w: ReconcilerConfig Interval %v and PageSize %d must be positive", idem.ErrInvalidConfig, c.Interval, c.PageSize)
	}
	return &Reconciler{s: s, lister: l, cfg: c, stop: make(chan struct{})}, nil
}

// Run reconciles every Interval, starting at once, until ctx is done (it
// returns ctx's error) or [Reconciler.Close] is called (it returns nil).
// Errors of a run go to OnRun and do not stop the loop.
func (r *Reconciler) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	r.running.Add(1)
	r.mu.Unlock()
	defer r.running.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		rep, err := r.RunOnce(ctx)
		if ctx.Err() != nil {
			break
		}
		if r.cfg.OnRun != nil {
			r.cfg.OnRun(rep, err)
		}
		select {
		case <-ctx.Done():
		case <-r.s.e.Config().Clock.After(r.cfg.Interval): // a wait: the configured clock
			continue
		}
		break
	}
	select {
	case <-r.stop:
		return nil
	default:
		return ctx.Err()
	}
}

// Close stops [Reconciler.Run] and waits until it has returned.
func (r *Reconciler) Close() error {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.stop)
	}
	r.mu.Unlock()
	r.running.Wait()
	return nil
}

// RunOnce reconciles every IN_PROGRESS record of the Starter's operation
// once, and reports what it did. Records it could not reconcile are
// counted in Report.Errors and their errors joined in the returned error;
// the others are reconciled all the same.
func (r *Reconciler) RunOnce(ctx context.Context) (Report, error) {
	var rep Report
	var errs []error
	p := store.ListParams{Status: store.StatusInProgress, Limit: r.cfg.PageSize}
	for {
		p.Now = store.Millis(r.s.e.Now())
		page, err := r.lister.List(ctx, p)
		if err != nil {
			return rep, errors.Join(append(errs, fmt.Errorf("idemsfn: list IN_PROGRESS records: %w", err))...)
		}
		for _, rec := range page.Records {
			key, err := idem.ParseStoreKey(rec.Key)
			if err != nil || key.Operation != r.s.cfg.Operation {
				continue
			}
			rep.Listed++
			if err := r.one(ctx, key, rec, &rep); err != nil {
				rep.Errors++
				errs = append(errs, fmt.Errorf("idemsfn: reconcile %s: %w", rec.Key, err))
			}
			if ctx.Err() != nil {
				return rep, errors.Join(append(errs, ctx.Err())...)
			}
		}
		if page.Next == "" {
			return rep, errors.Join(errs...)
		}
		p.Cursor = page.Next
	}
}

// one reconciles one IN_PROGRESS record.
func (r *Reconciler) one(ctx context.Context, key idem.StoreKey, rec *store.Record, rep *Report) error {
	s := r.s
	now := s.e.Now()
	// The record's token, signed as the engine signs every token it hands
	// out (Config.TokenKey): a token made here by hand would be refused.
	t := s.e.StateOf(rec).Token()
	if rec.Ref == "" {
		if !s.orphan(store.FromMillis(rec.CreatedAt)) {
			rep.OrphansWaiting++
			return nil
		}
		return r.orphan(ctx, key, t, rep)
	}
	if store.Millis(now) < rec.LeaseUntil {
		rep.Waiting++
		return nil
	}
	desc, err := s.describe(ctx, rec.Ref)
	if err != nil {
		return err
	}
	// The writes are linked to the call that began the work.
	t = t.WithTraceOf(workToken(desc.Input))
	if !finished(desc.Status) {
		// RUNNING, or PENDING_REDRIVE.
		err := s.e.Extend(ctx, t, s.cfg.ExpectedCompletion)
		if errors.Is(err, idem.ErrStaleToken) {
			rep.Skipped++
			return nil
		}
		if err == nil {
			rep.Extended++
		}
		return err
	}
	return r.settle(ctx, key, t, desc.Status, outcomeOf(desc), rep)
}

// settle records an ended execution's outcome and counts it.
func (r *Reconciler) settle(ctx context.Context, key idem.StoreKey, t idem.Token, status types.ExecutionStatus, o outcome, rep *Report) error {
	a, _, err := r.s.settle(ctx, key, t, t, o)
	switch a {
	case ActionCompleted, ActionRedriven:
		rep.Completed++
	case ActionFailed:
		rep.Failed++
	case "":
	default:
		rep.Skipped++
	}
	return err
}

// orphan repairs a claim with no execution attached after OrphanGrace.
func (r *Reconciler) orphan(ctx context.Context, key idem.StoreKey, t idem.Token, rep *Report) error {
	s := r.s
	desc, err := s.find(ctx, key, ExecutionName(key))
	switch {
	case err == nil:
		// Its starter started it and died before attaching it.
		t = t.WithTraceOf(workToken(desc.Input))
		if err := s.e.Attach(ctx, t, *desc.ExecutionArn); err != nil {
			if errors.Is(err, idem.ErrStaleToken) {
				rep.Skipped++
				return nil
			}
			return err
		}
		rep.Adopted++
		if finished(desc.Status) {
			return r.settle(ctx, key, t, desc.Status, outcomeOf(desc), rep)
		}
		return nil
	case !errors.Is(err, errNoExecution):
		return err
	}
	switch {
	case s.cfg.OrphanPolicy == OrphanFail:
		err := s.e.Fail(ctx, t, &idem.TerminalError{Code: CodeOrphan,
			Message: fmt.Sprintf("no execution was started within %v of the claim (its starter stopped between claiming and starting)", s.cfg.OrphanGrace)})
		if errors.Is(err, idem.ErrStaleToken) {
			rep.Skipped++
			return nil
		}
		if err == nil {
			rep.OrphansFailed++
		}
		return err
	case s.cfg.RestartInput == nil:
		rep.OrphansWaiting++
		return nil
	}
	input, err := s.cfg.RestartInput(ctx, key)
	if err != nil {
		return fmt.Errorf("RestartInput: %w", err)
	}
	in, err := inputJSON(idem.Request{}, input)
	if err != nil {
		return err
	}
	arn, desc, err := s.launch(ctx, t, in)
	if err != nil {
		return err
	}
	if err := s.e.Attach(ctx, t, arn); err != nil {
		if errors.Is(err, idem.ErrStaleToken) {
			rep.Skipped++
			return nil
		}
		return err
	}
	if desc != nil {
		// Started meanwhile by someone else: adopted after all.
		rep.Adopted++
		if finished(desc.Status) {
			return r.settle(ctx, key, t, desc.Status, outcomeOf(desc), rep)
		}
		return nil
	}
	rep.Restarted++
	return nil
}
