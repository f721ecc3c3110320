package idemamqp_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/seed-a1b882c0/idem/idemamqp"
)

// path is one way through idemamqp: each delivery alone (Handle, Run) or
// the deliveries received together (HandleBatch, RunBatch). The behaviours
// both must keep are written once, over paths, and run on each.
type path struct {
	name  string
	batch bool
}

var paths = []path{{"single", false}, {"batch", true}}

// pathNamed is the path of that name (for a child process).
func pathNamed(t testing.TB, name string) path {
	for _, p := range paths {
		if p.name == name {
			return p
		}
	}
	t.Fatalf("no path %q", name)
	return path{}
}

// handle settles ds through c on the path: HandleBatch (all at once), or
// Handle for each delivery in turn.
func (p path) handle(ctx context.Context, c *idemamqp.Consumer, ds []amqp.Delivery) []idemamqp.Settlement {
	if p.batch {
		return c.HandleBatch(ctx, ds, 0)
	}
	ss := make([]idemamqp.Settlement, len(ds))
	for i, d := range ds {
		ss[i] = c.Handle(ctx, d)
	}
	return ss
}
