package idemsfn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sfn/types"
	"github.com/aws/smithy-go"

	"github.com/seed-a1b882c0/idem"
)

// API is the part of *sfn.Client a [Starter] uses.
type API interface {
	StartExecution(ctx context.Context, in *sfn.StartExecutionInput, opts ...func(*sfn.Options)) (*sfn.StartExecutionOutput, error)
	DescribeExecution(ctx context.Context, in *sfn.DescribeExecutionInput, opts ...func(*sfn.Options)) (*sfn.DescribeExecutionOutput, error)
	ListExecutions(ctx context.Context, in *sfn.ListExecutionsInput, opts ...func(*sfn.Options)) (*sfn.ListExecutionsOutput, error)
}

// OrphanPolicy says what the [Reconciler] does with an orphan: a claim
// older than Config.OrphanGrace with no execution attached and none
// started under the key's name (its starter died between claiming and
// starting).
type OrphanPolicy int

const (
	// OrphanRestart starts the execution the claim was made for, with the
	// input Config.RestartInput gives, and attaches it. Without
	// RestartInput the orphan is left for a caller's retry: [Starter.Start]
	// repairs an orphan with its own input.
	OrphanRestart OrphanPolicy = iota
	// OrphanFail marks the key FAILED with code [CodeOrphan], so callers
	// stop waiting and get an error they can act on.
	OrphanFail
)

// CodeOrphan is the code of the terminal error the [Reconciler] stores
// for an orphan under [OrphanFail].
const CodeOrphan = "idemsfn.orphan"

// Defaults of [Config].
const (
	DefaultExpectedCompletion = 5 * time.Minute
	DefaultOrphanGrace        = 30 * time.Second
)

// Config configures a [Starter]. StateMachineArn and Operation are
// required; every other field documents its default.
type Config struct {
	// StateMachineArn is the Standard workflow to start (Express workflows
	// do not keep execution names unique). An alias or version ARN works.
	StateMachineArn string
	// Operation is the idem operation name of the keys this Starter
	// starts: a Request of another operation is refused, and so is a
	// token or an event of another operation.
	Operation string
	// HoldCrashed sets the operation's takeover policy to Hold
	// (idem.Config.HoldCrashed): a duplicate after ExpectedCompletion does
	// not take the key over (Start answers the held record, not a new
	// start); the Reconciler still settles it from the execution's status
	// and extends the lease of one that runs. Default false.
	HoldCrashed bool
	// ExpectedCompletion is how long an execution should take: the claim's
	// lease. A duplicate after it takes the key over (and adopts the same
	// execution); the Reconciler asks Step Functions about executions past
	// it and extends the lease by as much while they run. Default 5m, or
	// the engine's Expiry when that is shorter; at most the engine's
	// Expiry.
	ExpectedCompletion time.Duration
	// OrphanGrace is how old a claim with no execution attached must be
	// before it counts as an orphan that [Starter.Start] and the
	// [Reconciler] repair: longer than a StartExecution call takes,
	// retries included. Default 30s.
	OrphanGrace time.Duration
	// OrphanPolicy is what the Reconciler does with an orphan whose
	// execution was never started. Default OrphanRestart.
	OrphanPolicy OrphanPolicy
	// RestartInput returns the workflow input for key, for the Reconciler
	// to restart an orphan under OrphanRestart (the record keeps the
	// payload's fingerprint, not the payload). Default none: orphans wait
	// for a caller's retry.
	RestartInput func(ctx context.Context, key idem.StoreKey) (any, error)
}

// WithDefaults returns a copy of c with every zero field set to its
// default (ExpectedCompletion is capped by the engine's Expiry in [New]).
func (c *Config) WithDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.ExpectedCompletion == 0 {
		out.ExpectedCompletion = DefaultExpectedCompletion
	}
	if out.OrphanGrace == 0 {
		out.OrphanGrace = DefaultOrphanGrace
	}
	return out
}

func (c *Config) validate(expiry time.Duration) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("idemsfn: %w: "+format, append([]any{idem.ErrInvalidConfig}, args...)...)
	}
	if _, _, err := parseStateMachineArn(c.StateMachineArn); err != nil {
		return bad("StateMachineArn: %v", err)
	}
	if _, err := idem.NewStoreKey(c.Operation, "", nil); err != nil {
		return bad("Operation: %v", err)
	}
	switch {
	case c.ExpectedCompletion <= 0 || c.ExpectedCompletion > expiry:
		return bad("ExpectedCompletion %v must be positive and at most the engine's Expiry %v; raise Config.Expiry of the engine or shorten it", c.ExpectedCompletion, expiry)
	case c.OrphanGrace < 0:
		return bad("OrphanGrace is %v; it must be positive (0 means the default %v)", c.OrphanGrace, DefaultOrphanGrace)
	case c.OrphanPolicy != OrphanRestart && c.OrphanPolicy != OrphanFail:
		return bad("OrphanPolicy %d is neither OrphanRestart nor OrphanFail", c.OrphanPolicy)
	}
	return nil
}

// parseStateMachineArn returns the state machine ARN without a version or
// alias qualifier, and the prefix of its executions' ARNs.
func parseStateMachineArn(arn string) (base, execPrefix string, err error) {
	p := strings.Split(arn, ":")
	if len(p) < 7 || len(p) > 8 || p[0] != "arn" || p[2] != "states" || p[5] != "stateMachine" || p[6] == "" {
		return "", "", fmt.Errorf("%q is not a state machine ARN (arn:aws:states:REGION:ACCOUNT:stateMachine:NAME)", arn)
	}
	return strings.Join(p[:7], ":"), strings.Join(p[:5], ":") + ":execution:" + p[6] + ":", nil
}

// Starter starts one Step Functions state machine at most once per
// idempotency key, and records each execution's outcome under its key.
// It is safe for concurrent use.
type Starter struct {
	e    *idem.Engine
	api  API
	cfg  Config
	base string // the state machine ARN without qualifier
	// execPrefix + name is an execution's ARN, as Step Functions builds it.
	execPrefix string
}

// New returns a Starter of cfg.StateMachineArn through api (usually an
// *sfn.Client), recording outcomes with e. It fails with
// idem.ErrInvalidConfig, saying which field is wrong.
func New(e *idem.Engine, api API, cfg Config) (*Starter, error) {
	if e == nil || api == nil {
		return nil, fmt.Errorf("idemsfn: %w: the engine and the Step Functions client are required", idem.ErrInvalidConfig)
	}
	expiry := e.Config().Expiry
	if cfg.ExpectedCompletion == 0 {
		cfg.ExpectedCompletion = min(DefaultExpectedCompletion, expiry)
	}
	c := cfg.WithDefaults()
	if err := c.validate(expiry); err != nil {
		return nil, err
	}
	s := &Starter{e: e, api: api, cfg: c}
	s.base, s.execPrefix, _ = parseStateMachineArn(c.StateMachineArn)
	return s, nil
}

// Config returns the Starter's configuration, with defaults filled in.
func (s *Starter) Config() Config { return s.cfg }

// Started is the answer of [Starter.Start].
type Started struct {
	// State is the key's record: IN_PROGRESS with the execution attached
	// (State.Ref), or the outcome of an earlier execution — COMPLETED
	// (Output holds the workflow's output: a replay) or FAILED (Start
	// also returns State.Err). It is IN_PROGRESS with no Ref when another
	// caller is starting the execution right now, or when this call could
	// not start or attach it (the claim kept as an orphan); nil when
	// StartExecution was refused and the claim released.
	State *idem.State
	// ExecutionArn is the key's execution, when known.
	ExecutionArn string
	// Output is the stored output of a COMPLETED key.
	Output json.RawMessage
	// Acquired is true when this call claimed the key (first call, or
	// takeover of a claim past its expected completion).
	Acquired bool
	// Adopted is true when the execution had been started already — by a
	// starter that died before attaching it, or for an earlier claim —
	// and this call attached it instead of starting another. (Step
	// Functions answers a start with the name and input of a running
	// execution with that execution, so a plain retry may find Adopted
	// false.)
	Adopted bool
	// Repaired is true when the key's claim was an orphan (no execution
	// attached after Config.OrphanGrace) and this call finished its start.
	Repaired bool
}

// Start starts the state machine for req at most once per key and
// returns where the key stands:
//
//   - new key (or one whose claim is past its expected completion):
//     claim, StartExecution under [ExecutionName] with the [Envelope] of
//     the claim and input, attach the execution's ARN: two store round
//     trips. If an execution with that name exists already it is adopted
//     (its ARN found with DescribeExecution, or ListExecutions) instead.
//   - duplicate while the execution runs: State IN_PROGRESS with the
//     ExecutionArn, one store round trip.
//   - after the outcome was recorded: Output (COMPLETED) or the stored
//     error (FAILED, a [*idem.TerminalError] with Replayed set).
//   - a claim with no execution attached for Config.OrphanGrace (its
//     starter died): started again under the same name with the claim's
//     own token — adopting the execution if it did start — and attached.
//
// Step Functions keeps a Standard workflow's execution names for 90 days
// after the execution closed, so a key has exactly one execution within
// that time, whatever crashes or retries happen on the way.
//
// input is the workflow's input (encoded with encoding/json;
// a json.RawMessage is used as it is); nil means req.Payload when it is
// JSON. req.Operation must be Config.Operation, or empty for it.
//
// StartExecution errors: a definite refusal (invalid name or input, no such
// state machine, access denied) releases the claim and returns a
// [*StartError] matching [ErrStartRefused]; any other failure (timeout,
// throttling, server error) keeps the claim — the execution may have
// started — and returns a [*StartError] matching [ErrStartUnknown]: a
// later Start or the [Reconciler] adopts or restarts it after
// OrphanGrace. Store failures are idem's errors.
func (s *Starter) Start(ctx context.Context, req idem.Request, input any) (Started, error) {
	switch req.Operation {
	case "":
		req.Operation = s.cfg.Operation
	case s.cfg.Operation:
	default:
		return Started{}, &idem.KeyError{Field: "operation", Value: req.Operation, Reason: "this Starter starts operation " + s.cfg.Operation}
	}
	req.HoldCrashed = req.HoldCrashed || s.cfg.HoldCrashed
	in, err := inputJSON(req, input)
	if err != nil {
		return Started{}, err
	}
	b, err := s.e.Begin(ctx, req, &idem.BeginOptions{ExpectedCompletion: s.cfg.ExpectedCompletion})
	if err != nil {
		return Started{}, err
	}
	if b.Acquired {
		return s.startClaim(ctx, b.Token, in, b.State, true)
	}
	st := b.State
	if st.Status == idem.StatusInProgress && st.Ref == "" && s.orphan(st.CreatedAt) {
		return s.startClaim(ctx, st.Token(), in, st, false)
	}
	return answer(st)
}

// orphan reports whether a claim made at created with no execution
// attached is an orphan now.
func (s *Starter) orphan(created time.Time) bool {
	return s.e.Now().Sub(created) >= s.cfg.OrphanGrace
}

// answer is Start's answer for an existing record.
func answer(st *idem.State) (Started, error) {
	r := Started{State: st, ExecutionArn: st.Ref}
	switch st.Status {
	case idem.StatusCompleted:
		if err := st.Decode(&r.Output); err != nil {
			return r, err
		}
	case idem.StatusFailed:
		return r, st.Err
	}
	return r, nil
}

// inputJSON is the workflow input of a Start.
func inputJSON(req idem.Request, input any) (json.RawMessage, error) {
	switch v := input.(type) {
	case nil:
		if req.Payload != nil && !req.RawPayload && json.Valid(req.Payload) {
			return req.Payload, nil
		}
		return json.RawMessage("null"), nil
	case json.RawMessage:
		if !json.Valid(v) {
			return nil, errors.New("idemsfn: input is a json.RawMessage that is not valid JSON")
		}
		return v, nil
	}
	b, err := json.Marshal(input)
	if err != nil {
		return nil, fmt.Errorf("idemsfn: input cannot be encoded as JSON: %w", err)
	}
	return b, nil
}

// startClaim starts or adopts the execution of the claim t and attaches
// it; st is the record as Begin or Status saw it.
func (s *Starter) startClaim(ctx context.Context, t idem.Token, in json.RawMessage, st *idem.State, acquired bool) (Started, error) {
	arn, desc, err := s.launch(ctx, t, in)
	if errors.Is(err, ErrStartRefused) {
		return Started{Acquired: acquired}, err // the claim is gone
	}
	if err != nil {
		return Started{State: st, Acquired: acquired}, err
	}
	r := Started{ExecutionArn: arn, Acquired: acquired, Adopted: desc != nil, Repaired: !acquired}
	if err := s.e.Attach(ctx, t, arn); err != nil {
		if !errors.Is(err, idem.ErrStaleToken) {
			// The execution runs; the claim will be repaired as an
			// orphan (same name, same execution).
			r.State = st
			return r, err
		}
		// The claim moved on while starting: settled already (a fast
		// workflow) or taken over. Answer with the record as it is.
		cur, err := s.e.Status(ctx, t.Key)
		if err != nil {
			r.State = st
			return r, err
		}
		a, err := answer(cur)
		a.ExecutionArn, a.Acquired, a.Adopted, a.Repaired = arn, r.Acquired, r.Adopted, r.Repaired
		return a, err
	}
	attached := *st
	attached.Ref = arn
	r.State = &attached
	if desc != nil && finished(desc.Status) {
		// An adopted execution that had ended already: record its
		// outcome now.
		if _, _, err := s.settle(ctx, t.Key, t, t, outcomeOf(desc)); err != nil {
			return r, err
		}
		cur, err := s.e.Status(ctx, t.Key)
		if err != nil {
			return r, err
		}
		a, err := answer(cur)
		a.ExecutionArn, a.Acquired, a.Adopted, a.Repaired = arn, r.Acquired, r.Adopted, r.Repaired
		return a, err
	}
	return r, nil
}

// launch starts the execution of the claim t under the key's name, or
// finds the one started before (desc is then its description). A
// definite refusal releases the claim.
func (s *Starter) launch(ctx context.Context, t idem.Token, in json.RawMessage) (arn string, desc *sfn.DescribeExecutionOutput, err error) {
	name := ExecutionName(t.Key)
	env, err := newEnvelope(t, in)
	if err != nil {
		return "", nil, err
	}
	out, err := s.api.StartExecution(ctx, &sfn.StartExecutionInput{
		StateMachineArn: aws.String(s.cfg.StateMachineArn),
		Name:            aws.String(name),
		Input:           aws.String(string(env)),
	})
	var exists *types.ExecutionAlreadyExists
	switch {
	case err == nil:
		return aws.ToString(out.ExecutionArn), nil, nil
	case errors.As(err, &exists):
		desc, err := s.find(ctx, t.Key, name)
		if errors.Is(err, errNoExecution) {
			err = fmt.Errorf("idemsfn: StartExecution %s answered ExecutionAlreadyExists, but no execution of that name was found: %w", name, err)
		}
		if err != nil {
			return "", nil, err
		}
		return aws.ToString(desc.ExecutionArn), desc, nil
	case refused(err):
		se := &StartError{Key: t.Key.String(), Name: name, Released: true, Err: err}
		if rerr := s.e.Release(ctx, t); rerr != nil {
			// The claim stays; it is an orphan now, repaired later.
			se.Released = false
			se.Err = errors.Join(err, rerr)
		}
		return "", nil, se
	default:
		return "", nil, &StartError{Key: t.Key.String(), Name: name, Err: err}
	}
}

// refusedCodes are StartExecution errors after which no execution was
// started, whatever attempt the SDK made before.
var refusedCodes = map[string]bool{
	"InvalidName": true, "InvalidExecutionInput": true, "InvalidArn": true,
	"StateMachineDoesNotExist": true, "StateMachineDeleting": true, "ValidationException": true,
	"KmsAccessDeniedException": true, "KmsInvalidStateException": true,
	"AccessDeniedException": true, "UnrecognizedClientException": true, "InvalidParameterValue": true,
	"MissingParameter": true, "MissingRequiredParameter": true,
}

// refused reports whether a StartExecution error is a definite refusal.
func refused(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && refusedCodes[ae.ErrorCode()]
}

// errNoExecution: no execution has the key's name.
var errNoExecution = errors.New("idemsfn: no execution of that name")

// maxListPages bounds the ListExecutions fallback of find.
const maxListPages = 50

// find returns the execution of key named name, checking that its input
// is key's envelope. It asks DescribeExecution for the ARN Step Functions
// gives that name, then looks for the name with ListExecutions (a server
// whose execution ARNs are built otherwise: stepfunctions-local puts
// region "local" in every one). errNoExecution: there is none.
func (s *Starter) find(ctx context.Context, key idem.StoreKey, name string) (*sfn.DescribeExecutionOutput, error) {
	desc, err := s.describe(ctx, s.execPrefix+name)
	if errors.Is(err, errNoExecution) {
		var arn string
		if arn, err = s.list(ctx, name); err == nil {
			desc, err = s.describe(ctx, arn)
		}
	}
	if err != nil {
		return nil, err
	}
	arn := aws.ToString(desc.ExecutionArn)
	_, k, perr := ParseEnvelope([]byte(aws.ToString(desc.Input)))
	switch {
	case perr != nil:
		return nil, &ForeignExecutionError{Key: key.String(), ExecutionArn: arn, Reason: "its input is not an idemsfn envelope"}
	case k.String() != key.String():
		return nil, &ForeignExecutionError{Key: key.String(), ExecutionArn: arn, Reason: "its input names " + k.String()}
	}
	return desc, nil
}

// describe is DescribeExecution; errNoExecution when there is none.
func (s *Starter) describe(ctx context.Context, arn string) (*sfn.DescribeExecutionOutput, error) {
	desc, err := s.api.DescribeExecution(ctx, &sfn.DescribeExecutionInput{ExecutionArn: aws.String(arn)})
	var none *types.ExecutionDoesNotExist
	if errors.As(err, &none) {
		return nil, fmt.Errorf("%w: %s", errNoExecution, arn)
	}
	if err != nil {
		return nil, fmt.Errorf("idemsfn: DescribeExecution %s: %w", arn, err)
	}
	return desc, nil
}

// list finds the ARN of the execution named name with ListExecutions.
func (s *Starter) list(ctx context.Context, name string) (string, error) {
	in := &sfn.ListExecutionsInput{StateMachineArn: aws.String(s.cfg.StateMachineArn), MaxResults: 1000}
	for range maxListPages {
		out, err := s.api.ListExecutions(ctx, in)
		if err != nil {
			return "", fmt.Errorf("idemsfn: ListExecutions: %w", err)
		}
		for _, x := range out.Executions {
			if aws.ToString(x.Name) == name {
				return aws.ToString(x.ExecutionArn), nil
			}
		}
		if aws.ToString(out.NextToken) == "" {
			return "", fmt.Errorf("%w: %s (listed)", errNoExecution, name)
		}
		in.NextToken = out.NextToken
	}
	return "", fmt.Errorf("idemsfn: execution %s not found in %d pages of ListExecutions", name, maxListPages)
}

// finished reports whether an execution status is final.
func finished(st types.ExecutionStatus) bool {
	switch st {
	case types.ExecutionStatusSucceeded, types.ExecutionStatusFailed, types.ExecutionStatusTimedOut, types.ExecutionStatusAborted:
		return true
	}
	return false
}
