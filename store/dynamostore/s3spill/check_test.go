package s3spill_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/s3spill"
)

var causes = []error{s3spill.ErrCredentials, s3spill.ErrAccessDenied, s3spill.ErrNoBucket, s3spill.ErrWrongRegion}

// refused checks that err is a *BucketError with cause, and nothing else.
func refused(t *testing.T, what string, err, cause error, atOpen bool, says ...string) {
	t.Helper()
	var be *s3spill.BucketError
	if !errors.As(err, &be) || !errors.Is(err, cause) || !errors.Is(err, store.ErrMisconfigured) || errors.Is(err, store.ErrUnavailable) ||
		errors.Is(err, idem.ErrInvalidConfig) != atOpen {
		t.Fatalf("%s: %v, want a *BucketError with cause %v (at open: %v)", what, err, cause, atOpen)
	}
	for _, c := range causes {
		if c != cause && errors.Is(err, c) {
			t.Errorf("%s: %v also matches %v", what, err, c)
		}
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: %q does not say %q", what, err, s)
		}
	}
	t.Logf("%s: %v", what, err)
}

func withCreds(key, secret string) func(*s3.Options) {
	return func(o *s3.Options) {
		o.Credentials = aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: key, SecretAccessKey: secret}, nil
		})
	}
}

// TestCheckAgainstS3rver checks buckets on s3rver: a usable bucket passes
// (with the probe too, which leaves no object), a missing one and an
// unknown access key are refused with their causes.
func TestCheckAgainstS3rver(t *testing.T) {
	_, sep := env(t)
	ctx := context.Background()
	f := setup(t, dynamostore.Config{}, "")
	check := func(c *s3.Client, cfg s3spill.Config) error {
		sp, err := s3spill.New(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return sp.Check(ctx)
	}
	if err := check(s3Client(sep), s3spill.Config{Bucket: f.bkt, Prefix: "spill"}); err != nil {
		t.Fatalf("a usable bucket: %v", err)
	}
	if err := check(s3Client(sep), s3spill.Config{Bucket: f.bkt, Prefix: "spill", Probe: true}); err != nil {
		t.Fatalf("a usable bucket, probed: %v", err)
	}
	if objs := objects(t, f.s3, f.bkt); len(objs) != 0 {
		t.Fatalf("the probe left %v", objs)
	}
	if err := f.s.Check(ctx); err != nil {
		t.Fatalf("dynamostore's Check with the spiller: %v", err)
	}
	refused(t, "missing bucket", check(s3Client(sep), s3spill.Config{Bucket: "idem-no-such-bucket"}), s3spill.ErrNoBucket, true,
		"idem-no-such-bucket", "404", "create the bucket")
	refused(t, "unknown access key", check(s3Client(sep, withCreds("NOSUCHKEY", "S3RVER")), s3spill.Config{Bucket: f.bkt}), s3spill.ErrCredentials, true,
		"InvalidAccessKeyId", "check the access key")
	refused(t, "unknown access key, probed", check(s3Client(sep, withCreds("NOSUCHKEY", "S3RVER")), s3spill.Config{Bucket: f.bkt, Probe: true}),
		s3spill.ErrCredentials, true)
	// Through dynamostore, as storeurl.Open calls it.
	sp, err := s3spill.New(s3Client(sep), s3spill.Config{Bucket: "idem-no-such-bucket"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := dynamostore.New(f.dyn, dynamostore.Config{Table: f.table, Spiller: sp})
	if err != nil {
		t.Fatal(err)
	}
	refused(t, "dynamostore's Check", s.Check(ctx), s3spill.ErrNoBucket, true)
}

// fakeS3 is a FAKE S3 endpoint, not a server: it answers HeadBucket with
// head (status and headers, no body, as S3 does) and every GET with get
// (status and an S3 error document with code). It shows what s3rver
// cannot: s3rver does not verify SigV4 signatures (so never answers
// SignatureDoesNotMatch), has no regions (so never 301), and grants
// every permission.
func fakeS3(t *testing.T, head int, headHeader http.Header, get int, code string) *s3.Client {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodHead:
			for k, v := range headHeader {
				w.Header()[k] = v
			}
			w.WriteHeader(head)
		default:
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(get)
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>fake</Message></Error>`, code)
		}
	}))
	t.Cleanup(srv.Close)
	return s3Client(srv.URL, func(o *s3.Options) { o.RetryMaxAttempts = 1 })
}

// TestCheckAgainstAFakeS3 covers the refusals s3rver cannot make, with a
// fake (see fakeS3).
func TestCheckAgainstAFakeS3(t *testing.T) {
	ctx := context.Background()
	check := func(c *s3.Client) error {
		sp, err := s3spill.New(c, s3spill.Config{Bucket: "b", Prefix: "p"})
		if err != nil {
			t.Fatal(err)
		}
		return sp.Check(ctx)
	}
	refused(t, "signature mismatch", check(fakeS3(t, 403, nil, 403, "SignatureDoesNotMatch")), s3spill.ErrCredentials, true, "SignatureDoesNotMatch")
	refused(t, "access denied", check(fakeS3(t, 403, nil, 403, "AccessDenied")), s3spill.ErrAccessDenied, true, "AccessDenied", "s3:PutObject")
	refused(t, "another region", check(fakeS3(t, 301, http.Header{"X-Amz-Bucket-Region": {"eu-west-3"}}, 301, "PermanentRedirect")),
		s3spill.ErrWrongRegion, true, "301", "region eu-west-3", "region=")
	refused(t, "no such bucket", check(fakeS3(t, 404, nil, 404, "NoSuchBucket")), s3spill.ErrNoBucket, true)
	if err := check(fakeS3(t, 403, nil, 404, "NoSuchKey")); err != nil {
		t.Fatalf("HeadBucket denied (no s3:ListBucket), GetObject allowed: %v, want no error", err)
	}
	if err := check(fakeS3(t, 500, nil, 500, "InternalError")); !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrMisconfigured) {
		t.Fatalf("a 500: %v, want store.ErrUnavailable", err)
	}
}

// logCount counts the log records at each level, by message.
type logCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *logCount) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCount) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == nil {
		l.n = map[string]int{}
	}
	l.n[r.Level.String()+" "+r.Message]++
	return nil
}
func (l *logCount) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCount) WithGroup(string) slog.Handler      { return l }

// TestRefusalAtRunTimeIsNotRetried: S3 refusing a spill at run time (the
// bucket gone: 404 NoSuchBucket; the access key unknown: 403
// InvalidAccessKeyId — both from s3rver) fails the outcome write at once,
// with no retry for WriteTimeout, logged and counted once; Do returns the
// result (the operation ran) with nothing recorded, and the key stays
// IN_PROGRESS until its lease ends.
func TestRefusalAtRunTimeIsNotRetried(t *testing.T) {
	_, sep := env(t)
	f := setup(t, dynamostore.Config{}, "")
	for _, c := range []struct {
		name   string
		bucket string
		opts   []func(*s3.Options)
		cause  error
	}{
		{"bucket gone", "idem-gone-bucket", nil, s3spill.ErrNoBucket},
		{"access key unknown", f.bkt, []func(*s3.Options){withCreds("ROTATEDKEY", "S3RVER")}, s3spill.ErrCredentials},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			sp, err := s3spill.New(s3Client(sep, c.opts...), s3spill.Config{Bucket: c.bucket, Prefix: "spill"})
			if err != nil {
				t.Fatal(err)
			}
			s, err := dynamostore.New(f.dyn, dynamostore.Config{Table: f.table, Spiller: sp})
			if err != nil {
				t.Fatal(err)
			}
			var n observe.Counters
			logs := &logCount{}
			e, err := idem.New(s, &idem.Config{WriteTimeout: 10 * time.Second, Observer: &n, Logger: slog.New(logs), RenewInterval: -1, Lease: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			big := payload(1<<20, 9)
			key := "refused-" + strings.ReplaceAll(c.name, " ", "-")
			start := time.Now()
			res, err := idem.Do(ctx, e, idem.Request{Operation: "report", Key: key}, func(context.Context) ([]byte, error) { return big, nil })
			took := time.Since(start)
			if err != nil || !bytes.Equal(res.Value, big) || res.Recorded != 0 {
				t.Fatalf("Do: %v, recorded %v; want the result, nothing recorded", err, res.Recorded)
			}
			if took > 3*time.Second {
				t.Errorf("Do took %v: the write was retried (WriteTimeout 10s)", took)
			}
			if r, s := n.Count(observe.OutcomeWriteRetried), n.Count(observe.OutcomeStoreError); r != 0 || s != 1 || n.Count(observe.OutcomeCompleteFailed) != 1 {
				t.Errorf("write retried %d, store error %d, complete failed %d; want 0, 1, 1", r, s, n.Count(observe.OutcomeCompleteFailed))
			}
			logs.mu.Lock()
			if got := logs.n["ERROR idem: store complete failed after the operation ran"]; got != 1 || logs.n["WARN idem: store write failed; retrying"] != 0 {
				t.Errorf("logs: %v; want the failure logged once, no retry", logs.n)
			}
			logs.mu.Unlock()
			rec, err := s.Get(ctx, mustKey(t, "report", key))
			if err != nil || rec.Status != store.StatusInProgress {
				t.Fatalf("record: %+v %v; want IN_PROGRESS", rec, err)
			}
			// The store's own answer, as the engine got it.
			now := time.Now().UnixMilli()
			err = s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: rec.Key, Fence: rec.Fence, Owner: rec.Owner, Now: now}, ExpiresAt: now + 60_000, Result: big})
			refused(t, "Complete", err, c.cause, false)
		})
	}
}
