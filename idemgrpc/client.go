package idemgrpc

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
)

// UnaryClientInterceptor returns the client interceptor that gives each
// call an idempotency key once per logical call: the key is in the call's
// outgoing metadata before gRPC's own retries (a service config
// retryPolicy, transparent retries) resend it, so every attempt carries
// the same key, and a method that is not idempotent becomes safe to retry.
//
// A call whose outgoing metadata has a key already keeps it: an
// application that retries a call itself sets the key once
// (metadata.AppendToOutgoingContext) and reuses that context. Otherwise
// the key is c.Key's: the DownstreamKey of the idem operation the call is
// made from, or a new one.
func UnaryClientInterceptor(c *idemrpc.Client) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(withKey(ctx, c, method), method, req, reply, cc, opts...)
	}
}

// withKey returns ctx with a key for a call of method in its outgoing
// metadata, or ctx itself when it has one or method gets none.
func withKey(ctx context.Context, c *idemrpc.Client, method string) context.Context {
	name := c.KeyMetadata()
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(name)) > 0 {
		return ctx
	}
	key, ok := c.Key(ctx, method)
	if !ok {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, name, key)
}

// WithKey returns ctx with key as the idempotency key of the calls made
// with it, in the outgoing metadata entry idemrpc.DefaultKeyMetadata: for
// an application that retries a call itself, or passes on its caller's
// key. The client interceptor keeps a key set this way.
func WithKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, idemrpc.DefaultKeyMetadata, key)
}
