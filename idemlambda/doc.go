// Package idemlambda makes AWS Lambda handlers idempotent with idem: a
// retried, redelivered or duplicated invocation gets the first one's result
// (or stored terminal error) instead of running again, a duplicate that
// arrives while the first runs is held off, and an invocation that timed out
// is taken over once its deadline has passed — the claim's lease is the
// invocation's deadline.
//
//   - [Wrap] wraps a typed handler func(ctx, In) (Out, error) for
//     lambda.StartHandlerFunc; [WrapRaw] a byte handler for lambda.Start.
//     The key comes from a func of the input or a JMESPath expression over
//     the raw event (Powertools' event_key_jmespath, with its
//     powertools_json, powertools_base64 and powertools_base64_gzip
//     functions); a second expression validates the payload.
//   - [APIGatewayV1], [APIGatewayV2] and [FunctionURL] answer with the
//     Idempotency-Key header semantics of package idemhttp: problem+json
//     400/409/422/503 proxy responses, replays marked
//     "Idempotent-Replayed: true".
//   - [SQS] runs the records of a batch concurrently, each under its own
//     key, and reports partial batch failures; FIFO batches run in order.
//   - [EventBridge] keys on the event id, or on a selection of the event.
//
// The README's Lambda section maps every Powertools idempotency option to
// its idem counterpart.
package idemlambda
