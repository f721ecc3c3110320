// Package idemhttp is net/http middleware that gives an API the semantics of
// the IETF Idempotency-Key header (draft-ietf-httpapi-idempotency-key-header):
//
//   - a covered request (POST and PATCH by default) with an Idempotency-Key
//     runs its handler once; its response (status, headers, body) is stored
//     and replayed to every retry with the same key, marked
//     "Idempotent-Replayed: true". Every header is replayed but cookies,
//     credentials, authentication challenges, hop-by-hop headers, Date and
//     Content-Length ([NeverReplayed]), or only those in
//     Config.ReplayHeaders when it is set;
//   - a retry while the first is still running gets 409 with Retry-After
//     (or waits, when the engine's Config.Wait is set);
//   - the same key with another request (method, path, query, configured
//     headers, body) gets 422;
//   - a malformed or repeated key gets 400, and so does a missing one when
//     Config.Required is set; a body over the limit gets 413 and one that
//     stalls or trickles in past Config.BodyTimeout (or the server's
//     ReadTimeout) gets 408, both before anything is stored; an unreachable
//     store gets 503 and the handler does not run;
//   - responses with status below 500 are final; a 5xx or a panic releases
//     the key so a retry runs the handler again.
//
// Every refusal is an RFC 9457 problem+json body; [ProblemFor] is the one
// place where errors become statuses, and Config.ErrorHandler may rewrite
// the answer.
//
// The key's scope holds the caller's principal (Config.Principal), the
// method and the route, so a replay only ever reaches the caller that made
// the original request. Without a principal, every caller shares one key
// space and gets any response stored under a key it learns or guesses, so
// set one in any service with more than one client.
package idemhttp
