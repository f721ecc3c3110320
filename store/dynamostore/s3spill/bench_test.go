package s3spill_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

// Reproduce: scripts/dynamodb-local run scripts/s3rver run sh -c 'cd store/dynamostore/s3spill && go test -run "^$" -bench Replay -benchmem -count 5'
// DynamoDB Local and s3rver on loopback: the figures measure the clients,
// the extra request and the copies, not AWS latency.

// rawCodec stores []byte results as they are, so sizes are the bytes
// stored (JSON would base64 them).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = data
	return nil
}

// BenchmarkReplay is a duplicate call whose result is stored inline in the
// item (300 KB) or spilled to S3 (300 KB with the threshold lowered, and
// 1 MiB): the added latency of a spilled replay is one GetObject and the
// SHA-256 of the result.
func BenchmarkReplay(b *testing.B) {
	for _, c := range []struct {
		name  string
		size  int
		limit int
	}{
		{"inline-300KB", 300 << 10, 0},
		{"spilled-300KB", 300 << 10, 1000},
		{"spilled-1MiB", 1 << 20, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			f := setup(b, dynamostore.Config{MaxResultBytes: c.limit}, "")
			e := engine(b, f.s, &idem.Config{Codec: rawCodec{}})
			data := payload(c.size, 9)
			ctx := context.Background()
			req := idem.Request{Operation: "report", Key: fmt.Sprint(c.name)}
			do := func() idem.Result[[]byte] {
				res, err := idem.Do(ctx, e, req, func(context.Context) ([]byte, error) { return data, nil })
				if err != nil {
					b.Fatal(err)
				}
				return res
			}
			do()
			b.SetBytes(int64(c.size))
			b.ResetTimer()
			for b.Loop() {
				if res := do(); !res.Replayed || !bytes.Equal(res.Value, data) {
					b.Fatal("not a replay of the stored result")
				}
			}
		})
	}
}
