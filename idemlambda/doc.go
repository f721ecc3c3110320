// Package idemlambda makes AWS Lambda handlers idempotent with idem: a
// retried, redelivered or duplicated invocation gets the first one's result
// (or stored terminal error) instead of running again, a duplicate that
// arrives while the first runs is held off, and an invocation that timed out
// is taken over once its deadline has passed — the claim's lease is the
// invocation's deadline. Lambda ends an invocation there, so every adapter
// marks its context with idem.EndsAtDeadline: the engine does not renew
// that lease, as it renews one taken from a deadline a handler may outlive
// (a gRPC caller's).
//
//   - [Wrap] wraps a typed handler func(ctx, In) (Out, error) for
//     lambda.StartHandlerFunc; [WrapRaw] a byte handler for lambda.Start.
//     The key comes from a func of the input or a JMESPath expression over
//     the raw event (Powertools' event_key_jmespath, with its
//     powertools_json, powertools_base64 and powertools_base64_gzip
//     functions); a second expression validates the payload.
//   - [APIGatewayV1], [APIGatewayV2] and [FunctionURL] answer with the
//     Idempotency-Key header semantics of package idemhttp, because they
//     run its middleware: problem+json 400/401/409/410/413/422/503 proxy
//     responses, replays marked "Idempotent-Replayed: true".
//   - [SQS] runs the records of a batch concurrently, each under its own
//     key, and reports partial batch failures; FIFO batches run in order.
//   - [Kinesis] and [DynamoDBStream] run the records of a shard in order,
//     each under its own key, and answer a stream's partial batch
//     response: the first record not done is reported and stops the batch
//     (see "Stream sources" below).
//   - [EventBridge] keys on the event id, or on a selection of the event.
//
// docs/lambda.md maps every Powertools idempotency option to
// its idem counterpart.
//
// # Work that outlives the invocation
//
// A claim's lease is the invocation's deadline, so a handler that hands its
// work off (starts a workflow, queues a job) and returns must keep the key
// from being taken over once its invocation ends: it calls
// idem.Detach(ctx, expectedCompletion, ref) with the context it was given,
// and gets the claim's token for the work (see [Wrap], "Handing work off",
// and ExampleWrap_handOff). The HTTP adapters do the same through idemhttp's
// asynchronous mode: with HTTPConfig.StatusPath set, the handler calls
// idemhttp.AcceptContext(ctx) and answers 202 with the Location and
// Retry-After it returns; retries get 202 and the status until a worker
// settles the key (with an idemhttp middleware of the same Operation:
// Complete, Fail), and GET events for the Location get the status
// resource.
//
// # Stream sources
//
// A Kinesis or DynamoDB Streams batch is a run of one shard's records, and
// Lambda keeps one position per shard: it resumes at the lowest sequence
// number a response reports and delivers everything after it again. So
// the stream handlers do not follow the SQS rule (report every failed
// record, settle the rest). They claim the keys of a batch together (one
// store call), then run the handlers one at a time, in order, a record's
// outcome write overlapping the next one's handler, each record settled by
// consume.Decide's verdict:
//
//   - Done (run and recorded, or replayed: a record processed before is
//     skipped with its stored outcome): the next record;
//   - RetryAfter, Retry, Leave (held by another invocation, a retryable
//     error, an uncertain outcome, the invocation ending): the record's
//     sequence number is the response's one batch item failure, and the
//     records after it do not run (their claims, made with the batch's,
//     are released), so the shard resumes there;
//   - DeadLetter (a terminal error, stored and replayed; a key reused with
//     another payload; no usable key): logged and passed, since a retry
//     cannot succeed and Lambda's only way to give up on a stream record
//     (MaximumRetryAttempts, then the on-failure destination) discards the
//     records behind it too; StreamConfig.StopOnDeadLetter reports it
//     instead.
//
// The default key is the record's eventID (for Kinesis with the stream's
// ARN); KeyJMESPath selects from the payload instead. The event source
// mapping must have ReportBatchItemFailures in its FunctionResponseTypes,
// or Lambda ignores the response and moves past the whole batch; and the
// engine's Expiry must outlast every redelivery of a record (the stream's
// retention, or the mapping's MaximumRecordAgeInSeconds), or a late retry
// runs the record again. docs/lambda-streams.md has the mapping's settings
// and the guarantees per record.
//
// # HTTP events
//
// The HTTP adapters convert at the edge, as aws-lambda-go's lambdaurl
// does: an event becomes an *http.Request, idemhttp's middleware decides
// (key, scope, fingerprint, body limit, claim, replay or refusal), and its
// answer becomes the proxy response. When the middleware passes the
// request on, the handler runs on the original event, the caller gets the
// handler's response as returned, and the middleware stores what was
// written from it. A handler error aborts the request, so the middleware
// releases the key, and is returned to Lambda. The handler's context is
// the middleware's: idem.FromContext gives the claim, and
// idemhttp.MarkUncertain works as in an http.Handler.
//
// So there is one implementation of the HTTP rules, not a copy per
// transport that drifts from it. The price is a conversion per event,
// small beside a store round trip, and that a replayed body is sent
// base64-encoded exactly when it is not UTF-8, whatever the first
// response's IsBase64Encoded was.
package idemlambda
