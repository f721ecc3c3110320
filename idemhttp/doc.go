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
//     (or waits, when the engine's Config.Wait is set); a retry of work
//     the handler handed off gets 202 (see below);
//   - the same key with another request (method, path, query, configured
//     headers, body) gets 422;
//   - a malformed or repeated key (an [*idem.KeyError], as every key
//     error is) gets 400, and so does a missing one when
//     Config.Required is set; a body over the limit gets 413 and one that
//     stalls or trickles in past Config.BodyTimeout (or the server's
//     ReadTimeout) gets 408, both before anything is stored; an unreachable
//     store gets 503 and the handler does not run;
//   - responses with status below 500 are final, but 408, 425 and 429
//     (the request was not run: [DefaultRelease]); those, a 5xx or a
//     panic release the key so a retry runs the handler again.
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
//
// Stored responses are encoded by the engine's codec. Give an engine that
// serves the middleware [ResponseCodec] (idem.Config.Codec): it writes the
// same JSON as the default codec, so existing records stay readable, but
// without reflection.
//
// # Asynchronous work: 202 and a status resource
//
// With Config.StatusPath set ("/idempotency/status/"), a handler can
// accept work instead of doing it: it calls [Accept], answers 202
// Accepted, and hands the token's string form to a worker (a queue, a
// workflow, another process):
//
//	func transfer(w http.ResponseWriter, r *http.Request) {
//		tok, err := idemhttp.Accept(w, r) // sets Location and Retry-After
//		if err != nil {
//			http.Error(w, "cannot accept", http.StatusServiceUnavailable) // a 5xx releases the key
//			return
//		}
//		jobs.Enqueue(job{Token: tok.String(), Body: body})
//		w.WriteHeader(http.StatusAccepted)
//	}
//
//	// The worker, in any process with a middleware of the same Operation
//	// over an engine on the same store:
//	err := mw.Complete(ctx, j.Token, idemhttp.Response{Status: 201, Header: h, Body: b})
//	// or mw.Fail(ctx, j.Token, idemhttp.Problem{Status: 402, Title: "Card declined"}),
//	// mw.Release, mw.Extend (heartbeat), mw.Attach (the execution reference).
//
// Accept hands the request's claim off ([idem.Detach]): its expected
// completion becomes now + Config.ExpectedCompletion (default 10 minutes),
// the status resource is attached as its execution reference, and nothing
// is stored when the handler returns (or panics). Then:
//
//   - a retry with the key while the work runs gets 202, the same
//     Location, Retry-After (until the expected completion) and the
//     status resource as its body — not 409, which stays the answer to a
//     retry of a request still running in its handler;
//   - once the worker completed, a retry gets the stored response,
//     "Idempotent-Replayed: true"; once it failed, the stored problem
//     with its status, marked the same way;
//   - the middleware serves GET (and HEAD) {StatusPath}{id}: a
//     [StatusResource] as application/json — status, execution, created,
//     expected_completion, completed_at, and the result (status, headers,
//     the body as JSON when it is JSON, else body_base64) or the problem.
//     The id is the hex digest of the request's store key, and the key is
//     found again from the reader's principal: another caller's id, an
//     unknown one or an expired record gets 404 (problem
//     "status-not-found"), another method 405;
//   - a worker's token is refused before any write when it is malformed
//     or of another operation ([idem.ErrInvalidToken]), and by the store
//     once its claim is no longer the record's ([idem.ErrStaleToken]):
//     the expected completion passed and a retry took the key over, or
//     the key was settled or released. Past the expected completion, with
//     no Extend, a retry runs the handler again.
package idemhttp
