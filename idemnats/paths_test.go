package idemnats_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemnats"
)

// path is one way through idemnats: each message alone (Wrap, and
// jetstream's Consume) or the messages fetched together (WrapBatch, and
// ConsumeBatch). The behaviours both must keep are written once, over
// paths, and run on each.
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

// wrap makes fn idempotent on the path, as a ProcessBatch: on the single
// path, Wrap's Process for each message in turn.
func (p path) wrap(t testing.TB, e *idem.Engine, cfg *idemnats.Config, fn idemnats.Func[struct{}]) idemnats.ProcessBatch {
	t.Helper()
	if p.batch {
		pb, err := idemnats.WrapBatch(e, cfg, fn)
		if err != nil {
			t.Fatal(err)
		}
		return pb
	}
	one, err := idemnats.Wrap(e, cfg, fn)
	if err != nil {
		t.Fatal(err)
	}
	return func(ctx context.Context, msgs []jetstream.Msg) ([]idemnats.Disposition, []error) {
		ds, errs := make([]idemnats.Disposition, len(msgs)), make([]error, len(msgs))
		for i, m := range msgs {
			ds[i], errs[i] = one(ctx, m)
		}
		return ds, errs
	}
}

// consume hands c's messages to pb until the test ends: one at a time
// from jetstream's Consume on the single path, in batches of 16 from
// ConsumeBatch on the batch path.
func (p path) consume(t *testing.T, c jetstream.Consumer, pb idemnats.ProcessBatch) {
	t.Helper()
	if p.batch {
		consumeBatches(t, c, &idemnats.BatchConfig{Size: 16}, pb)
		return
	}
	cc, err := c.Consume(func(m jetstream.Msg) { pb(context.Background(), []jetstream.Msg{m}) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
}
