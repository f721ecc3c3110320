// Package idemrpc holds the rules of idempotent unary RPCs that the gRPC
// interceptors (package idemgrpc) and the Connect interceptor (package
// idemconnect) share: which calls are covered, where the key comes from,
// what is fingerprinted, and the one mapping of every answer to a
// google.rpc.Status. It imports neither gRPC nor Connect.
//
// A [Guard] is made once from an engine and a [Config]; the transports run
// every call through [Guard.Do] and turn a refusal into their own error
// with [StatusFor] (through [Guard.Status]).
//
// # One call
//
//   - Coverage: the methods of Config.Methods, by full name, each with its
//     options ([Method]); with Config.ByIdempotencyLevel also every unary
//     method whose descriptor leaves the standard option
//     idempotency_level unset (a method marked NO_SIDE_EFFECTS or
//     IDEMPOTENT in its .proto file is safe to call again by its own
//     declaration). Streaming methods are never covered: one named in
//     Methods is a [*StreamingMethodError], at New when its descriptor
//     is known, else at call time.
//   - The key is the request metadata entry Config.KeyMetadata
//     ("idempotency-key"; over Connect the HTTP header Idempotency-Key):
//     1 to 255 bytes of printable ASCII, sent once ([ParseKey]). A
//     covered call without one runs unprotected, unless Method.Required.
//   - The store key is the method's operation (Method.Operation, by
//     default the full method name with dots: "shop.v1.Orders.Create"),
//     scoped by the caller's principal (Config.Principal, hashed) and
//     the key. The fingerprint is a SHA-256 over the full method name,
//     the request message in deterministic protocol buffers encoding
//     (map entries sorted) and the values of Method.FingerprintMetadata.
//     Deterministic encoding is stable for one message definition and
//     one protobuf runtime, which is what a retry of one client meets;
//     it is not a canonical form across languages, so a client that
//     re-encodes a request differently (unknown fields dropped, another
//     runtime) gets FAILED_PRECONDITION rather than a wrong replay.
//   - A response is stored as a google.protobuf.Any of its deterministic
//     encoding, and decoded on replay into its own message type, found by
//     its type URL in Config.Types. The engine's codec must store []byte
//     results as they are, as idem.JSONCodec does.
//
// # Answers, each decided once
//
// The codes follow the meanings google.rpc.Code gives them, and agree with
// the statuses idemhttp answers over HTTP (by the HTTP mapping of
// google.rpc.Code), so that a service and its gateway tell a client the
// same thing.
//
//   - First call: the handler runs, with a context carrying the claim
//     (idem.FromContext); its answer goes back unchanged.
//   - Replay: the stored response, decoded into the method's response
//     type, with the response metadata [ReplayedMetadata]
//     ("idempotent-replayed: true"). A replay is an answer, not an error.
//   - Duplicate while the first call runs: ABORTED, with a
//     google.rpc.RetryInfo detail giving the delay of
//     idem.InProgressError.RetryAfter — as long again as the first call
//     has run, at least 100ms, at most until the holder's
//     lease ends; never the first caller's remaining deadline, since the
//     lease is renewed while the handler runs — (and over gRPC the
//     grpc-retry-pushback-ms trailer, which a retryPolicy obeys). ABORTED is the code for a concurrency
//     conflict, and the HTTP mapping of 409, idemhttp's answer; not
//     UNAVAILABLE, which would tell operators the server failed and
//     which every retry policy retries at its own pace: a client that
//     wants to retry a duplicate lists ABORTED in its policy and waits
//     the pushback. With the engine's Config.Wait the duplicate waits
//     for the outcome instead.
//   - The key reused with another request: FAILED_PRECONDITION, with a
//     google.rpc.PreconditionFailure of type IDEMPOTENCY_KEY_REUSED. The
//     request is not malformed in itself (INVALID_ARGUMENT would say so):
//     it is refused because of what the key is already bound to, and the
//     client must not retry it with that key (gRPC's advice for
//     FAILED_PRECONDITION). idemhttp answers 422.
//   - A terminal error (below): stored, and replayed to every retry with
//     its code, message and details, marked replayed. The first caller
//     gets the same status as the replays: the one inside the error,
//     without text wrapped around it.
//   - The store cannot be reached: UNAVAILABLE with RetryInfo
//     (Config.StoreRetryAfter, default 1s); the handler does not run
//     (the engine fails closed). UNAVAILABLE is gRPC's code for "retry
//     the same call later", which is safe here since nothing ran, and
//     the code retry policies usually list; idemhttp answers 503.
//   - A missing key where one is required, or a malformed or repeated
//     key (an [*idem.KeyError], as every key error is):
//     INVALID_ARGUMENT with a google.rpc.BadRequest naming
//     idempotency-key: the request itself is wrong, whatever the state.
//   - Config.Principal refuses the call: UNAUTHENTICATED.
//   - A stored outcome that cannot be read (a damaged record, a response
//     type missing from Config.Types) or a response that was too large
//     to be stored: DATA_LOSS. The handler ran and is not run again, and
//     its response cannot be given back: the client must not take it
//     for a transient fault, nor send the call again under a new key
//     without looking. idemhttp answers 500 and 410.
//   - A streaming method named for coverage: UNIMPLEMENTED, logged;
//     a request that is not a protocol buffers message: INTERNAL. Both
//     are server configuration faults, found by New or idemgrpc.Check
//     before any call where the descriptors are known.
//   - The call's context ended before the handler ran: CANCELLED or
//     DEADLINE_EXCEEDED.
//
// # Which errors are final
//
// A handler's error is terminal when Config.Terminal says so of its code,
// or when it is marked with idem.Terminal. [DefaultTerminal] keeps
// INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
// FAILED_PRECONDITION and OUT_OF_RANGE: answers about the request, which
// the same request would get again (the codes google.rpc.Code maps to
// 4xx, which idemhttp stores too). Every other code releases the key, so
// a retry runs the handler again: UNAVAILABLE, DEADLINE_EXCEEDED,
// RESOURCE_EXHAUSTED, ABORTED and CANCELLED say "try again";
// INTERNAL, UNKNOWN and DATA_LOSS are faults a retry may not meet;
// UNAUTHENTICATED may pass with refreshed credentials; UNIMPLEMENTED may
// pass once a server that implements the method is deployed. An error
// marked with idem.Uncertain keeps the claim until its lease ends.
//
// A stored terminal error's code is "grpc." and the status code's name
// ("grpc.FAILED_PRECONDITION", as idemctl lists it), or the code of
// idem.Terminal; its body is the google.rpc.Status, details included.
package idemrpc
