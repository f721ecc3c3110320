// Package idemsfn starts an AWS Step Functions state machine at most once
// per idempotency key, and records each execution's outcome under its key,
// so that a retried or duplicated request gets the running execution, and
// later its output or its error, instead of a second execution.
//
// It is idem's asynchronous API ([idem.Engine.Begin], tokens, Attach,
// Complete, Fail) applied to Step Functions; see docs/stepfunctions.md for
// the whole picture.
//
// # Starting once
//
// [Starter.Start] claims the key, starts the execution under a name derived
// from the key ([ExecutionName]) with the claim in its input (the
// [Envelope]) and attaches the execution's ARN to the claim: two store round
// trips. A duplicate while the execution runs costs one and gets the same
// ARN; after the outcome was recorded, it gets the output (a replay) or the
// stored error. Step Functions refuses a second execution with a name used
// in the last 90 days, so whatever crashes and retries happen, a key has
// one execution: a start that finds the name taken adopts that execution
// (DescribeExecution, or ListExecutions where execution ARNs are not built
// from the state machine's) instead of starting another.
//
// # Orphans
//
// A starter that dies between its claim and attaching the execution leaves
// an orphan: a claim with no execution attached, and maybe an execution
// running. Once the claim is older than Config.OrphanGrace, the next Start
// of the key repairs it — starts again under the same name with the
// orphan's own token, which adopts the execution if there is one, and
// attaches it — and so does the [Reconciler], which can also fail orphans
// whose execution never started ([OrphanFail]). A StartExecution that
// failed for good (invalid input, no such state machine) releases the
// claim instead ([ErrStartRefused]); one that may have started an
// execution keeps it ([ErrStartUnknown]).
//
// # Completing
//
// The outcome can come four ways, all fenced, and all accepted through
// whichever claim of the key is current (a takeover after the expected
// completion adopts the same execution, so the completion of that execution
// is the key's, whichever claim started it):
//
//   - the workflow's last step: an activity worker or a Lambda function
//     calls [Starter.Complete] or [Starter.Fail] with $.idem.token;
//   - with dynamostore, the workflow writes the record itself: the ASL
//     states of [DynamoDBCompleteStates] (Step Functions' DynamoDB
//     integration, no Lambda);
//   - EventBridge's "Step Functions Execution Status Change" events, handed
//     to [Starter.HandleEvent] (SUCCEEDED completes; FAILED, TIMED_OUT and
//     ABORTED fail; a redrive to success corrects a FAILED record);
//   - the [Reconciler], which asks Step Functions about executions past
//     their expected completion (events are best effort), and extends the
//     ones still running.
//
// # Limits
//
// Standard workflows only: Express workflows do not keep execution names
// unique. The one-execution-per-key guarantee lasts while Step Functions
// keeps the name: 90 days after the execution closed. A failed execution
// can be redriven for 14 days; a redrive's success corrects a FAILED key
// through its SUCCEEDED event, not through a worker's token.
// Outputs are stored as JSON with the engine's codec, which must be the
// default [idem.JSONCodec] for [DynamoDBCompleteStates] and for replays to
// decode.
package idemsfn
