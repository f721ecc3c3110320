package redisstore_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/store/redisstore"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

// TestGoldenLayout: the value Redis holds for each golden record, made
// through the store's operations (its scripts among them), is that of
// testdata/golden; and a value of that layout reads back as the golden
// record. A change of the layout fails it.
func TestGoldenLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClient(t, addr(t), func(o *redis.Options) { o.ReadTimeout, o.WriteTimeout = 0, 0 })
	made, read := newPrefix(t, c), newPrefix(t, c)
	s, err := redisstore.New(c, &redisstore.Config{Prefix: made})
	if err != nil {
		t.Fatal(err)
	}
	other, err := redisstore.New(c, &redisstore.Config{Prefix: read})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range storetest.GoldenRecords() {
		storetest.MakeGolden(t, s, g)
		v, err := c.Get(ctx, made+g.Record.Key).Bytes()
		if err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		v = storetest.GoldenFile(t, filepath.Join("testdata", "golden", g.Name+".redis"), v)
		if err := c.Set(ctx, read+g.Record.Key, v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := other.Get(ctx, g.Record.Key)
		if err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		storetest.CheckGolden(t, g, got)
	}
}
