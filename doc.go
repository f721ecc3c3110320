// Package idem makes operations take effect once: an API call, a Lambda
// invocation, a queue message or a workflow step, however often it is
// retried, duplicated concurrently or cut off half way.
//
// The first execution's result is stored under an idempotency key and
// replayed to every later call with that key; a duplicate that arrives while
// the first is running is held off; a caller that died is taken over once
// its lease runs out, and every write names its claim (fence and owner), so
// the dead caller can never change the record afterwards — not even after
// the record was deleted and claimed afresh.
//
// # The engine
//
// An [Engine] runs over a [store.Store]. [Do] runs a func(ctx) (T, error) under the
// key a [Request] names; [NewOp] wraps a func(ctx, In) (Out, error) and takes
// the key from the input. The [Result] says whether the value was replayed:
// a replay is a flag, not an error.
//
//	eng, _ := idem.New(store, nil)
//	res, err := idem.Do(ctx, eng, idem.Request{
//		Operation: "charge", // the operation
//		Key:       idemKey,  // e.g. the client's Idempotency-Key
//		Payload:   body,     // fingerprinted: same key + other payload = ErrMismatch
//	}, func(ctx context.Context) (Receipt, error) { return bank.Charge(ctx, req) })
//
// # One call
//
//  1. The store key ("<operation>[/<tenant>]#<sha256>") and the payload fingerprint are
//     derived once, before the operation runs. JSON payloads are
//     canonicalised first ([canonical.JSON]), so key order and white space
//     do not matter, while different values never collapse.
//  2. The local cache, if enabled, answers a COMPLETED key with no store
//     call.
//  3. The key is claimed in one store round trip. An existing record comes
//     back in the same trip: another payload → [ErrMismatch]; COMPLETED →
//     replay; FAILED → the stored [*TerminalError]; IN_PROGRESS →
//     [*InProgressError], or a bounded wait (Config.Wait). Duplicates inside
//     one process share one claim.
//  4. The operation runs with a context carrying the [Claim] ([FromContext]);
//     [Claim.DownstreamKey] gives a key for downstream services that stays
//     the same across retries and takeovers. The lease (Config.Lease; a
//     context deadline sets the first one) is renewed while it runs,
//     whatever the deadline, until its outcome is written; if another
//     caller took the key over, the context is cancelled with
//     [ErrLeaseLost].
//  5. Success → COMPLETED. A [*TerminalError] (see [Terminal]) → FAILED,
//     replayed later. Any other error, or a panic → the claim is released so
//     a retry can run. An outcome write that fails on a transient fault is
//     retried with backoff within Config.WriteTimeout while the lease is
//     renewed; a success whose outcome still cannot be recorded is returned
//     to its caller, logged and counted.
//
// # Guarantees, plainly
//
// The operation runs at most once per key per expiry window, provided no
// holder outlives its lease (a holder killed, frozen or cut off from the
// store for longer than its lease loses the key), and the outcome is durable
// once the store acknowledged it. A lease ends only when its holder is
// gone: a context's deadline sets the first lease, not the last, since an
// operation may run on after its caller stopped waiting; only a context
// marked [EndsAtDeadline] (an AWS Lambda invocation) keeps the deadline as
// its lease.
// After a crash mid-operation, a retry after the lease runs the operation
// again: exactly-once effects need the downstream call to be idempotent too,
// which is what [Claim.DownstreamKey] is for. With steps ([Step]) it
// resumes instead: each finished step's outcome is recorded under the
// claim, and the holder that takes the key over replays the finished steps
// and runs only the rest (docs/steps.md). A store that cannot be reached
// fails the call closed ([ErrStore]); the operation never runs unprotected
// unless Config.FailOpen says so. Leases and expiry are decided on the
// store's clock where the store has one ([store.ServerTimer]: Redis,
// PostgreSQL, DynamoDB): the engine measures its offset to it every
// Config.ClockSync and corrects every timestamp it writes and compares, so
// callers' clocks need not agree; beyond Config.MaxClockOffset it takes no
// claim over (docs/state-machine.md, "One clock").
//
// # Work that outlives the call
//
// [Engine.Begin] claims a key without running anything and returns a
// [Token] for the claim, or the key's record as a [State]: the work is
// handed to something else — a workflow, a queue worker, another process —
// which settles it later with [Engine.Complete] or [Engine.Fail] (or
// [Engine.Release] to let it run again), heartbeats with [Engine.Extend]
// and records its execution with [Engine.Attach]; every one of those is a
// fenced write, refused with a [*StaleTokenError] once the claim is no
// longer the record's. The claim's lease is the expected completion of the
// work. Inside [Do], [Detach] hands the running claim off the same way
// (idemhttp's 202 Accepted is built on it). [Engine.Status] reads a key's
// record for status endpoints and operators; a token read from a settled
// record ([State.Token]) corrects it. docs/state-machine.md draws the
// states.
//
// # Batches and cost
//
// [DoBatch] runs a batch (an SQS batch, a poll of a partition) as one
// unit: its keys are claimed together, in one round trip over a store that
// is a [store.BatchClaimer]; every claim is held until its item runs, the
// leases of the items waiting their turn renewed together (one round trip
// over a [store.BatchExtender]), and an item whose claim was lost while it
// waited does not run; its successes are written together (one round trip
// over a [store.BatchCompleter]). The operations run on at most the
// batch's concurrency of goroutines (the caller's and reused workers, not
// one per key; a consumer loop keeps them from batch to batch with a
// [WithBatchWorkers]); BatchOptions.Answered hands each key's answer to a callback
// as soon as its outcome is recorded. A call costs the engine
// about ten allocations over the store's own; a local-cache hit
// (Config.CacheEntries) none and no store call. The default [JSONCodec]
// stores []byte and json.RawMessage results as they are, without
// reflection (a []byte is not made a base64 string a third larger).
// docs/benchmarks.md has the figures.
//
// # Operations
//
// Package monitor sweeps a store for stuck work (IN_PROGRESS past its
// expected completion) and FAILED records; cmd/idemctl lists, shows and
// settles them; modules idemprom and idemotel export the engine's outcomes
// and store latencies to Prometheus and OpenTelemetry (docs/operations.md).
//
// # Stores
//
// The [store.Store] contract is six single-key atomic operations, each documented
// with what it returns for absent, expired, conflicting and fenced-out
// records; [store.Lister] and [store.Deleter] are optional powers for operators, and
// [store.BatchClaimer] for consumers of batches. Package
// memstore is the in-memory store; the durable stores are their own modules
// under store/: boltstore (an embedded file, the single-machine default),
// dynamostore, redisstore and pgstore. Package storetest is the conformance
// suite every store must pass.
//
// # Integrations
//
// Package idemhttp is net/http middleware with the IETF Idempotency-Key
// header's semantics; cmd/idem-gateway puts the same in front of any HTTP
// service as a reverse proxy; module idemlambda adapts Lambda handlers
// (typed, API Gateway, Function URL, SQS batches, EventBridge); module
// idemsfn starts AWS Step Functions executions once per key and records
// their outcomes (docs/stepfunctions.md); module idemgrpc gives unary gRPC
// and Connect methods the same, through interceptors (docs/grpc.md).
//
// # Errors
//
// Sentinel errors are grouped by operation; the typed errors that carry data
// ([*InProgressError], [*HeldError], [*MismatchError], [*TerminalError],
// [*StoreError], [*KeyError], [*PayloadError], [*StaleTokenError], and the
// store's FencedError, TooLargeError and CorruptError) match their
// sentinel with errors.Is; the others (an uncertain outcome, a step out of
// order, a malformed token) match theirs and say what is wrong.
//
// # Testing code that uses idem
//
// Set IDEM_DISABLED=true (or Config.Disabled) to run every operation
// directly with no store calls; never in production. Config.Clock takes a
// test clock; the engine also runs under testing/synctest.
package idem
