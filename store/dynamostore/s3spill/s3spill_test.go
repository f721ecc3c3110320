package s3spill_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	dtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/faultproxy"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
	"github.com/seed-a1b882c0/idem/store/dynamostore/s3spill"
	"github.com/seed-a1b882c0/idem/store/storetest"
)

// transport is the one the test clients share (dynamotest.Main closes its
// idle connections before it looks for leaked goroutines).
var transport = dynamotest.Transport

func TestMain(m *testing.M) { dynamotest.Main(m) }

// env returns DynamoDB Local's and s3rver's endpoints (see testenv for
// when tests skip).
func env(t testing.TB) (dynamo, s3ep string) {
	t.Helper()
	return testenv.DynamoDB(t), testenv.S3(t)
}

// creds are the keys s3rver accepts.
func creds() aws.CredentialsProvider {
	return aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		return aws.Credentials{AccessKeyID: "S3RVER", SecretAccessKey: "S3RVER", Source: "idem tests"}, nil
	})
}

// s3Client is a path-style client for ep (s3rver serves no virtual hosts).
func s3Client(ep string, opts ...func(*s3.Options)) *s3.Client {
	return s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(ep), UsePathStyle: true,
		HTTPClient: &http.Client{Transport: transport}, Credentials: creds(),
	}, opts...)
}

var seq atomic.Uint64

func name(kind string) string { return fmt.Sprintf("idem-%s-%d-%x", kind, seq.Add(1), rand.Uint32()) }

// fixture is a fresh table and bucket with a store spilling to it.
type fixture struct {
	s     *dynamostore.Store
	dyn   *dynamodb.Client
	s3    *s3.Client
	sp    *s3spill.Spiller
	table string
	bkt   string
}

// setup creates a table and a bucket, removed when the test ends. spillEP,
// when set, is the endpoint the spiller talks to (a fault proxy).
func setup(t testing.TB, cfg dynamostore.Config, spillEP string, opts ...func(*s3.Options)) *fixture {
	t.Helper()
	dep, sep := env(t)
	ctx := context.Background()
	f := &fixture{dyn: dynamotest.NewClient(dep), s3: s3Client(sep), bkt: name("b")}
	if _, err := f.s3.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(f.bkt)}); err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	t.Cleanup(func() { emptyBucket(t, f.s3, f.bkt) })
	cfg = dynamotest.Table(t, f.dyn, "idem_t_", cfg)
	f.table = cfg.Table
	sc := f.s3
	if spillEP != "" || len(opts) > 0 {
		if spillEP == "" {
			spillEP = sep
		}
		sc = s3Client(spillEP, opts...)
	}
	var err error
	if f.sp, err = s3spill.New(sc, s3spill.Config{Bucket: f.bkt, Prefix: "spill"}); err != nil {
		t.Fatal(err)
	}
	cfg.Spiller = f.sp
	if f.s, err = dynamostore.New(f.dyn, cfg); err != nil {
		t.Fatal(err)
	}
	return f
}

func emptyBucket(t testing.TB, c *s3.Client, bkt string) {
	ctx := context.Background()
	for _, k := range objects(t, c, bkt) {
		if _, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(bkt), Key: aws.String(k)}); err != nil {
			t.Errorf("delete object: %v", err)
		}
	}
	if _, err := c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bkt)}); err != nil {
		t.Errorf("delete bucket: %v", err)
	}
}

func objects(t testing.TB, c *s3.Client, bkt string) []string {
	t.Helper()
	out, err := c.ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(bkt)})
	if err != nil {
		t.Fatalf("list objects: %v", err)
	}
	var keys []string
	for _, o := range out.Contents {
		keys = append(keys, *o.Key)
	}
	return keys
}

func payload(n int, seed byte) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{seed})
	_, _ = r.Read(b)
	return b
}

func engine(t testing.TB, s store.Store, cfg *idem.Config) *idem.Engine {
	t.Helper()
	if cfg == nil {
		cfg = &idem.Config{}
	}
	cfg.RenewInterval = -1
	cfg.Logger = slog.New(slog.DiscardHandler)
	e, err := idem.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// Results of 1 MiB and 10 MiB go to S3 and come back byte for byte; the
// operation runs once.
func TestLargeResultsReplayByteIdentical(t *testing.T) {
	var tagging headers
	f := setup(t, dynamostore.Config{}, "", tagging.option)
	e := engine(t, f.s, nil)
	for _, n := range []int{1 << 20, 10 << 20} {
		big := payload(n, byte(n>>20))
		runs := 0
		key := fmt.Sprintf("r%d", n)
		for i := range 2 {
			res, err := idem.Do(context.Background(), e, idem.Request{Operation: "report", Key: key}, func(context.Context) ([]byte, error) {
				runs++
				return big, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(res.Value, big) || res.Replayed != (i == 1) {
				t.Fatalf("%d bytes, call %d: %d bytes back, equal %v, replayed %v", n, i, len(res.Value), bytes.Equal(res.Value, big), res.Replayed)
			}
		}
		if runs != 1 {
			t.Fatalf("%d bytes: ran %d times", n, runs)
		}
	}
	if got := len(objects(t, f.s3, f.bkt)); got != 2 {
		t.Fatalf("%d objects, want 2", got)
	}
	for _, k := range objects(t, f.s3, f.bkt) {
		if !strings.HasPrefix(k, "spill/") {
			t.Fatalf("object %q outside the prefix", k)
		}
	}
	// s3rver ignores the x-amz-tagging header of a PutObject (S3 applies
	// it): the test checks what was sent. The engine's default expiry is
	// a day.
	for _, h := range tagging.all() {
		q, err := url.ParseQuery(h)
		if err != nil || q.Get(s3spill.TagExpiryDays) != "1" || q.Get(s3spill.TagExpiresAt) == "" {
			t.Fatalf("x-amz-tagging %q", h)
		}
	}
	if n := len(tagging.all()); n != 2 {
		t.Fatalf("%d PutObjects with tags, want 2", n)
	}
}

// headers records the x-amz-tagging header of every request a client sends.
type headers struct {
	mu   sync.Mutex
	seen []string
}

func (h *headers) option(o *s3.Options) {
	o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("idem-tags", func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			if req, ok := in.Request.(*smithyhttp.Request); ok {
				if v := req.Header.Get("X-Amz-Tagging"); v != "" {
					h.mu.Lock()
					h.seen = append(h.seen, v)
					h.mu.Unlock()
				}
			}
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
	})
}

func (h *headers) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.seen...)
}

// An object deleted or altered behind the store's back fails closed with
// *s3spill.LoadError (store.ErrCorrupt), and the operation does not run
// again.
func TestTamperedObjectFailsClosed(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, f *fixture, key string, data []byte)
	}{
		{"deleted", func(t *testing.T, f *fixture, key string, _ []byte) {
			if _, err := f.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(f.bkt), Key: aws.String(key)}); err != nil {
				t.Fatal(err)
			}
		}},
		{"one byte changed", func(t *testing.T, f *fixture, key string, data []byte) {
			alt := bytes.Clone(data)
			alt[len(alt)/2] ^= 1
			put(t, f, key, alt)
		}},
		{"truncated", func(t *testing.T, f *fixture, key string, data []byte) { put(t, f, key, data[:len(data)-1]) }},
		{"extended", func(t *testing.T, f *fixture, key string, data []byte) { put(t, f, key, append(bytes.Clone(data), 0)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t, dynamostore.Config{}, "")
			e := engine(t, f.s, nil)
			big := payload(1<<20, 7)
			runs := 0
			do := func() (idem.Result[[]byte], error) {
				return idem.Do(ctx, e, idem.Request{Operation: "report", Key: "k"}, func(context.Context) ([]byte, error) {
					runs++
					return big, nil
				})
			}
			if _, err := do(); err != nil {
				t.Fatal(err)
			}
			objs := objects(t, f.s3, f.bkt)
			if len(objs) != 1 {
				t.Fatalf("objects %v", objs)
			}
			out, err := f.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(f.bkt), Key: aws.String(objs[0])})
			if err != nil {
				t.Fatal(err)
			}
			var stored bytes.Buffer
			_, _ = stored.ReadFrom(out.Body)
			out.Body.Close()
			tc.tamper(t, f, objs[0], stored.Bytes())
			res, err := do()
			var le *s3spill.LoadError
			if !errors.Is(err, store.ErrCorrupt) || !errors.As(err, &le) || errors.Is(err, store.ErrUnavailable) || runs != 1 || res.Value != nil {
				t.Fatalf("replay after the object was %s: err %v, runs %d, %d bytes; want a *LoadError (ErrCorrupt), no run, no value", tc.name, err, runs, len(res.Value))
			}
		})
	}
}

func put(t *testing.T, f *fixture, key string, data []byte) {
	t.Helper()
	if _, err := f.s3.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(f.bkt), Key: aws.String(key), Body: bytes.NewReader(data)}); err != nil {
		t.Fatal(err)
	}
}

// S3 unreachable while the result is stored: the engine retries the
// write within WriteTimeout and, when S3 comes back, completes; when it
// does not, the record is not COMPLETED (no reference to a missing object)
// and the failure is counted, never passed off as stored.
func TestS3UnreachableDuringComplete(t *testing.T) {
	_, sep := env(t)
	ctx := context.Background()
	noRetry := func(o *s3.Options) { o.RetryMaxAttempts = 1 }

	t.Run("comes back", func(t *testing.T) {
		p, err := faultproxy.New(strings.TrimPrefix(sep, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		f := setup(t, dynamostore.Config{}, "http://"+p.Addr(), noRetry)
		var c observe.Counters
		e := engine(t, f.s, &idem.Config{WriteTimeout: 10 * time.Second, Observer: &c})
		big := payload(1<<20, 3)
		p.ResetRequests(3)
		if _, err := idem.Do(ctx, e, idem.Request{Operation: "report", Key: "k"}, func(context.Context) ([]byte, error) { return big, nil }); err != nil {
			t.Fatal(err)
		}
		if c.Count(observe.OutcomeWriteRetried) == 0 || c.Count(observe.OutcomeCompleteFailed) != 0 || p.Reset.Load() != 3 {
			t.Fatalf("retried %d, complete failed %d, resets %d; want retries and a completion", c.Count(observe.OutcomeWriteRetried), c.Count(observe.OutcomeCompleteFailed), p.Reset.Load())
		}
		r, err := f.s.Get(ctx, mustKey(t, "report", "k"))
		if err != nil || r.Status != store.StatusCompleted || len(r.Result) < len(big) {
			t.Fatalf("record after retries: err %v; want COMPLETED with the result", err)
		}
	})

	t.Run("stays away", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close() // nothing listens there now
		f := setup(t, dynamostore.Config{}, "http://"+addr, noRetry)
		var c observe.Counters
		const wt = 2 * time.Second
		e := engine(t, f.s, &idem.Config{WriteTimeout: wt, Observer: &c})
		start := time.Now()
		_, _ = idem.Do(ctx, e, idem.Request{Operation: "report", Key: "k"}, func(context.Context) ([]byte, error) { return payload(1<<20, 4), nil })
		if d := time.Since(start); d > wt+time.Second {
			t.Fatalf("Do took %v with WriteTimeout %v", d, wt)
		}
		if c.Count(observe.OutcomeWriteRetried) == 0 || c.Count(observe.OutcomeCompleteFailed) != 1 {
			t.Fatalf("retried %d, complete failed %d; want retries, then the failure counted", c.Count(observe.OutcomeWriteRetried), c.Count(observe.OutcomeCompleteFailed))
		}
		r, err := f.s.Get(ctx, mustKey(t, "report", "k"))
		if err != nil || r.Status == store.StatusCompleted {
			t.Fatalf("record after S3 stayed away: err %v; want it, not COMPLETED", err)
		}
		if objs := objects(t, f.s3, f.bkt); len(objs) != 0 {
			t.Fatalf("objects %v", objs)
		}
	})
}

func mustKey(t *testing.T, op, key string) string {
	t.Helper()
	k, err := idem.NewStoreKey(op, "", []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return k.String()
}

// Results up to MaxResultBytes stay in the item; one byte more is spilled.
func TestThreshold(t *testing.T) {
	ctx := context.Background()
	f := setup(t, dynamostore.Config{}, "")
	limit := f.s.Config().MaxResultBytes
	now := time.Now().UnixMilli()
	for i, n := range []int{limit - 1, limit, limit + 1} {
		key := fmt.Sprintf("k%d", i)
		res, err := f.s.Claim(ctx, store.ClaimParams{Key: key, Owner: "o", Fingerprint: "fp", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000})
		if err != nil {
			t.Fatal(err)
		}
		data := payload(n, byte(i))
		if err := f.s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: res.Record.Fence, Owner: "o", Now: now}, ExpiresAt: now + 3_600_000, Result: data}); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		out, err := f.dyn.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(f.table), Key: map[string]dtypes.AttributeValue{"id": &dtypes.AttributeValueMemberS{Value: key}}})
		if err != nil {
			t.Fatal(err)
		}
		_, inline := out.Item["data"]
		_, spilled := out.Item["data_ref"]
		if inline != (n <= limit) || spilled != (n > limit) {
			t.Fatalf("%d bytes (limit %d): inline %v, spilled %v", n, limit, inline, spilled)
		}
		r, err := f.s.Get(ctx, key)
		if err != nil || !bytes.Equal(r.Result, data) {
			t.Fatalf("%d bytes: read back %v", n, err)
		}
	}
	if got := len(objects(t, f.s3, f.bkt)); got != 1 {
		t.Fatalf("%d objects, want 1", got)
	}
}

// The conformance suite with the spiller on: the store has no size limit
// of its own, so the suite stores 1 MiB.
func TestConformance(t *testing.T) {
	env(t)
	// Results spill to S3 (no limit of the store's own); steps stay in the
	// item, under its 384 KiB.
	storetest.Run(t, storetest.Features{MaxStepBytes: 384 << 10, StormGoroutines: 64, LinOps: 1000}, func(t *testing.T) store.Store {
		return setup(t, dynamostore.Config{}, "").s
	})
}

// A refused Complete spills before the store refuses it: its object is
// new, and the stored result and its object are untouched.
func TestRefusedWriteKeepsStoredObject(t *testing.T) {
	ctx := context.Background()
	f := setup(t, dynamostore.Config{MaxResultBytes: 1000}, "")
	now := time.Now().UnixMilli()
	res, err := f.s.Claim(ctx, store.ClaimParams{Key: "k", Owner: "o", Fingerprint: "fp", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000})
	if err != nil {
		t.Fatal(err)
	}
	first := payload(5000, 1)
	if err := f.s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k", Fence: res.Record.Fence, Owner: "o", Now: now}, ExpiresAt: now + 3_600_000, Result: first}); err != nil {
		t.Fatal(err)
	}
	err = f.s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k", Fence: res.Record.Fence, Owner: "o", From: store.StatusFailed, Now: now + 1}, ExpiresAt: now + 3_600_000, Result: payload(5000, 2)})
	if !errors.Is(err, store.ErrFenced) {
		t.Fatalf("Complete From FAILED of a COMPLETED record: %v, want ErrFenced", err)
	}
	r, err := f.s.Get(ctx, "k")
	if err != nil || !bytes.Equal(r.Result, first) {
		t.Fatalf("stored result after a refused write: %v", err)
	}
	if got := len(objects(t, f.s3, f.bkt)); got != 2 {
		t.Fatalf("%d objects, want 2 (the stored one and the refused write's orphan)", got)
	}
}
