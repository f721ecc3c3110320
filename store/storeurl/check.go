package storeurl

import (
	"context"
)

// Open opens the store raw names and checks it against its server, so that
// a fault in its configuration is found now rather than at the first
// request: each store's Check, where it has one (PostgreSQL: the role's
// privileges on the table; Redis: that the server answers, its ACL
// lets the user run the store's scripts, and no server may evict keys
// (maxmemory with a policy other than noeviction; alloweviction=true
// accepts it, with a warning to Options.Logger); DynamoDB: the table's key schema
// and TTL attribute, and with spill= the bucket), else its Ping. With
// Options.Passive only the Ping is made: a read-only tool needs fewer
// rights. Such faults are typed errors of the store's package that match
// store.ErrInvalidConfig and store.ErrMisconfigured, and say what to fix;
// an unreachable server is store.ErrUnavailable ([OpenWait] retries
// those). Close the returned store when done.
func Open(ctx context.Context, raw string, o *Options) (*Opened, error) {
	s, err := open(ctx, raw, o)
	if err != nil {
		return nil, err
	}
	if err := check(ctx, s.Store, o != nil && o.Passive); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// check runs the store's Check (not when passive), else its Ping, if it
// has either.
func check(ctx context.Context, s any, passive bool) error {
	if c, ok := s.(interface{ Check(context.Context) error }); ok && !passive {
		return c.Check(ctx)
	}
	if p, ok := s.(interface{ Ping(context.Context) error }); ok {
		return p.Ping(ctx)
	}
	return nil
}
