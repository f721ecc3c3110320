package s3spill_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/s3spill"
)

func TestObjectKeyPerWrite(t *testing.T) {
	t.Parallel()
	sp, err := s3spill.New(&s3.Client{}, s3spill.Config{Bucket: "b", Prefix: "p"})
	if err != nil {
		t.Fatal(err)
	}
	p := dynamostore.SpillParams{Key: "scope/t#ab", Fence: 3, Owner: "o", Data: []byte("x")}
	k := sp.ObjectKey(p)
	if !strings.HasPrefix(k, "p/scope%2Ft%23ab/3-") || len(k) != len("p/scope%2Ft%23ab/3-")+8+1+64 {
		t.Fatalf("object key %q", k)
	}
	for name, q := range map[string]dynamostore.SpillParams{
		"other data":  {Key: p.Key, Fence: 3, Owner: "o", Data: []byte("y")},
		"other owner": {Key: p.Key, Fence: 3, Owner: "o2", Data: []byte("x")},
		"other fence": {Key: p.Key, Fence: 4, Owner: "o", Data: []byte("x")},
	} {
		if sp.ObjectKey(q) == k {
			t.Errorf("%s: same object key %q", name, k)
		}
	}
}

func TestRefRoundTrip(t *testing.T) {
	t.Parallel()
	r := s3spill.Ref{Bucket: "b", Key: "p/k%23x/1-abc-def", Len: 42}
	r.SHA256[0] = 0xab
	got, err := s3spill.ParseRef(r.String())
	if err != nil || got != r {
		t.Fatalf("%s: %+v %v", r, got, err)
	}
	for _, bad := range []string{"", "mem://x", "s3://b/k", "s3://b/k?len=1", "s3://b/k?len=-1&sha256=" + strings.Repeat("0", 64), "s3:///k?len=1&sha256=" + strings.Repeat("0", 64)} {
		var le *s3spill.LoadError
		if _, err := s3spill.ParseRef(bad); !errors.As(err, &le) || !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("ParseRef(%q): %v, want a *LoadError", bad, err)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]s3spill.Config{
		"no bucket":       {},
		"unknown SSE":     {Bucket: "b", SSE: "rot13"},
		"KMS key w/o KMS": {Bucket: "b", SSE: "AES256", KMSKeyID: "k"},
	} {
		if _, err := s3spill.New(&s3.Client{}, c); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := s3spill.New(nil, s3spill.Config{Bucket: "b"}); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil client: %v", err)
	}
}
