// Package idemgrpc makes unary gRPC methods idempotent: a server
// interceptor runs each call at most once per idempotency key and replays
// its response (or its terminal error) to every retry, and a client
// interceptor gives each logical call one key that gRPC's own retries
// keep, so a retryPolicy becomes safe for methods that are not idempotent.
//
//	eng, _ := idem.New(store, nil)
//	g, err := idemrpc.New(eng, &idemrpc.Config{
//		Methods: map[string]idemrpc.Method{"/shop.v1.Orders/Create": {}},
//		Principal: func(ctx context.Context) (string, error) { ... }, // who is calling
//	})
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(auth, idemgrpc.UnaryServerInterceptor(g)),
//		grpc.ChainStreamInterceptor(idemgrpc.StreamServerInterceptor(g)),
//	)
//	shopv1.RegisterOrdersServer(srv, orders)
//	if err := idemgrpc.Check(g, srv); err != nil { ... } // a streaming or unknown method named
//
//	// A client:
//	c, _ := idemrpc.NewClient(nil)
//	cc, err := grpc.NewClient(addr, grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(c)), ...)
//
// The rules (coverage, the key in the "idempotency-key" metadata entry,
// the fingerprint, which handler errors are final) and the one mapping of
// every answer to a status code, each with its reason, are package
// idemrpc's, shared with the Connect interceptor (package idemconnect).
// In short: a replay is the stored response with the response header
// "idempotent-replayed: true" ([Replayed]); a duplicate while the first
// call runs gets ABORTED with a google.rpc.RetryInfo detail and the
// grpc-retry-pushback-ms trailer; the key reused with another request
// FAILED_PRECONDITION; a store outage UNAVAILABLE, the handler not run; a
// terminal error is stored and replayed with its code, message and
// details; any other error releases the key.
//
// # Deadlines
//
// The caller's deadline sets the claim's first lease, and the engine
// renews the lease while the handler runs, past the deadline if the
// handler runs on: a caller who gave up and retries at another server on
// the same store is refused with ABORTED until the handler's response is
// stored, then gets it; the handler never runs twice while it runs. A
// duplicate's retry delay is as long again as the first call has run (at
// least 100ms, at most until the holder's lease ends), never
// the first caller's remaining deadline, so a retryPolicy listing ABORTED
// collects the response soon after it is stored. docs/grpc.md, "Deadlines,
// leases and duplicates".
//
// # Keys across retries
//
// The client interceptor puts the key in the call's outgoing metadata
// before the ClientConn's retry machinery sends the first attempt, so
// every attempt of a retryPolicy (and every transparent retry) carries
// the same key: an attempt whose response was lost after the server ran
// it is answered from the store when retried. A call made from inside an
// idem operation gets that operation's DownstreamKey for the method, the
// same when the operation itself is retried; a context that has a key
// already ([WithKey]) keeps it, for an application's own retries.
//
// # Streaming methods
//
// Only unary methods are covered: a stream has no one response to store
// and replay. A streaming method named in idemrpc.Config.Methods fails
// idemrpc.New when its descriptor is registered, fails [Check], and is
// refused at call time with UNIMPLEMENTED by [StreamServerInterceptor].
package idemgrpc
