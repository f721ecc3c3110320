package storeurl_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"nothing":                                    "no scheme",
		"ftp://x":                                    `unknown scheme "ftp"`,
		"bolt://host/path.db":                        `host "host" given`,
		"dynamodb://":                                "no table",
		"dynamodb://t?create=maybe":                  "create:",
		"dynamodb://t?spill=http://b":                "write spill=s3://BUCKET/PREFIX",
		"dynamodb://t?spillendpoint=http://e":        "need spill=s3://BUCKET/PREFIX",
		"dynamodb://t?spill=s3://b&spillover=0":      "spillover=",
		"dynamodb://t?spill=s3://b&spillover=1e9":    "spillover=",
		"dynamodb://t?spill=s3://b&spillpathstyle=x": "spillpathstyle:",
		"redis+cluster://h:1?waitreplicas=-1":        `waitreplicas="-1"`,
		"redis://h:1?waittimeout=soon":               `waittimeout="soon"`,
		"redis://h:1?alloweviction=maybe":            `alloweviction="maybe"`,
	} {
		_, err := storeurl.Parse(raw)
		var ue *storeurl.Error
		if !errors.As(err, &ue) || !strings.Contains(ue.Reason, want) || !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%s: %v, want a storeurl.Error saying %q", raw, err, want)
		}
	}
}

func TestParseTakesItsOwnParameters(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]storeurl.URL{
		"memory:":                 {Kind: storeurl.Memory},
		"bolt:///var/x.db":        {Kind: storeurl.Bolt, Path: "/var/x.db"},
		"bolt:rel/x.db":           {Kind: storeurl.Bolt, Path: "rel/x.db"},
		"redis://h:1/2?prefix=p:": {Kind: storeurl.Redis, Prefix: "p:", Conn: "redis://h:1/2"},
		"redis+cluster://h:1?addr=h:2&prefix=p:&waitreplicas=1&waittimeout=500": {Kind: storeurl.Redis, Prefix: "p:", WaitReplicas: 1, WaitTimeout: 500, Conn: "redis+cluster://h:1?addr=h%3A2"},
		"rediss+sentinel://h:1?master_name=m":                                   {Kind: storeurl.Redis, Conn: "rediss+sentinel://h:1?master_name=m"},
		"postgres://u@h/db?sslmode=disable&table=t":                             {Kind: storeurl.Postgres, Table: "t", Conn: "postgres://u@h/db?sslmode=disable"},
		"postgres://u@h/db": {Kind: storeurl.Postgres, Table: "idem_records", Conn: "postgres://u@h/db"},
		"dynamodb://T?region=r&endpoint=http://e&index=i&create=1": {Kind: storeurl.DynamoDB, Table: "T", Region: "r", Endpoint: "http://e", Index: "i", Create: true},
		"dynamodb://T?openindex=open":                              {Kind: storeurl.DynamoDB, Table: "T", OpenIndex: "open"},
		"dynamodb://T?spill=s3://b/p/q&spillsse=aws:kms&spillkmskey=k&spillover=1000": {Kind: storeurl.DynamoDB, Table: "T",
			SpillBucket: "b", SpillPrefix: "p/q", SpillSSE: "aws:kms", SpillKMSKey: "k", SpillOver: 1000},
		"dynamodb://T?spill=s3://b&spillendpoint=http://127.0.0.1:9": {Kind: storeurl.DynamoDB, Table: "T", SpillBucket: "b", SpillEndpoint: "http://127.0.0.1:9", SpillPathStyle: true},
		"redis://h:1/2?alloweviction=true&prefix=p:":                 {Kind: storeurl.Redis, Prefix: "p:", AllowEviction: true, Conn: "redis://h:1/2"},
	} {
		u, err := storeurl.Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		want.Raw = raw
		if *u != want {
			t.Errorf("%s:\n got %+v\nwant %+v", raw, *u, want)
		}
	}
}

func TestPassiveChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	missing := filepath.Join(t.TempDir(), "missing.db")
	if _, err := storeurl.Open(ctx, "bolt://"+missing, &storeurl.Options{Passive: true}); err == nil {
		t.Fatal("a passive open of a missing bolt file succeeded")
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the passive open created %s: %v", missing, err)
	}
	_, err := storeurl.Open(ctx, "dynamodb://t?create=true", &storeurl.Options{Passive: true})
	var ue *storeurl.Error
	if !errors.As(err, &ue) || !strings.Contains(ue.Reason, "create=true") {
		t.Fatalf("passive create=true: %v", err)
	}
	if _, err := storeurl.Migrate(ctx, "memory:"); !errors.Is(err, storeurl.ErrNotApplicable) {
		t.Fatalf("migrate memory: %v", err)
	}
	if err := storeurl.CreateTable(ctx, "bolt:x.db", time.Second); !errors.Is(err, storeurl.ErrNotApplicable) {
		t.Fatalf("create-table bolt: %v", err)
	}
}

// roundTrip claims and completes one key through s, then reads and lists
// it back.
func roundTrip(t *testing.T, s *storeurl.Opened) {
	t.Helper()
	ctx := context.Background()
	key := fmt.Sprintf("storeurl#%064x", time.Now().UnixNano())
	now := store.Millis(time.Now())
	res, err := s.Claim(ctx, store.ClaimParams{Key: key, Owner: "test", Fingerprint: "fp", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000})
	if err != nil || !res.Acquired {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: key, Fence: res.Record.Fence, Owner: "test", Now: now}, ExpiresAt: now + 3_600_000, Result: []byte(`"ok"`)}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, key)
	if err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != `"ok"` {
		t.Fatalf("get: %+v %v", rec, err)
	}
	if s.Lister() == nil {
		t.Fatalf("%s store has no Lister", s.URL.Kind)
	}
}

func TestOpenWorkingStores(t *testing.T) {
	ctx := context.Background()
	open := func(t *testing.T, raw string, o *storeurl.Options) {
		t.Helper()
		s, err := storeurl.Open(ctx, raw, o)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		}()
		roundTrip(t, s)
		// The store names its backend for the spans of its calls.
		scheme, _, _ := strings.Cut(raw, ":")
		want := map[string]string{"memory": "memory", "bolt": "bbolt", "redis": "redis", "redis+cluster": "redis",
			"redis+sentinel": "redis", "postgres": "postgresql", "dynamodb": "aws.dynamodb"}[scheme]
		if sn, ok := s.Store.(store.SystemNamer); !ok || sn.SystemName() != want {
			t.Errorf("%s store %T: not a store.SystemNamer naming %q", scheme, s.Store, want)
		}
	}
	t.Run("memory", func(t *testing.T) { open(t, "memory:", nil) })
	t.Run("bolt", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "a", "s.db")
		open(t, "bolt://"+path, nil)
		open(t, "bolt://"+path, &storeurl.Options{Passive: true})
	})
	t.Run("bolt default path", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "d.db")
		open(t, "bolt://", &storeurl.Options{DefaultBoltPath: path})
		if _, err := os.Stat(path); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("redis", func(t *testing.T) {
		addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
		open(t, "redis://"+addr+"/0?prefix=storeurl:", &storeurl.Options{Passive: true})
	})
	t.Run("redis cluster", func(t *testing.T) {
		a := testenv.RedisCluster(t)
		open(t, "redis+cluster://"+a[0]+"?addr="+a[1]+"&prefix=storeurl:&waitreplicas=1", nil)
	})
	t.Run("redis sentinel", func(t *testing.T) {
		sentinel := os.Getenv("IDEM_REDIS_SENTINEL_ADDR")
		if sentinel == "" {
			testenv.Missing(t, "no Redis Sentinel: IDEM_REDIS_SENTINEL_ADDR is not set (make test starts one with scripts/redis-replicas)")
		}
		open(t, "redis+sentinel://"+sentinel+"?master_name=idem&prefix=storeurl:&waitreplicas=1", nil)
	})
	t.Run("postgres", func(t *testing.T) {
		addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
		table := fmt.Sprintf("storeurl_%d", time.Now().UnixNano())
		raw := fmt.Sprintf("postgres://%s@%s/test?table=%s", PGUser(), addr, table)
		if s, err := storeurl.Open(ctx, raw, &storeurl.Options{Passive: true}); err == nil || !strings.Contains(err.Error(), "does not exist") {
			s.Close()
			t.Fatalf("passive open before migrate: %v, want one saying the table does not exist", err)
		}
		ms, err := storeurl.Migrate(ctx, raw)
		if err != nil || len(ms) == 0 {
			t.Fatalf("migrate: %v %v", ms, err)
		}
		open(t, raw, &storeurl.Options{Passive: true})
		open(t, raw, nil)
	})
	t.Run("dynamodb", func(t *testing.T) {
		ep := testenv.DynamoDB(t)
		t.Setenv("AWS_ACCESS_KEY_ID", "local")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "local")
		raw := fmt.Sprintf("dynamodb://storeurl_%d?region=us-east-1&endpoint=%s", time.Now().UnixNano(), ep)
		if err := storeurl.CreateTable(ctx, raw, time.Minute); err != nil {
			t.Fatal(err)
		}
		open(t, raw, &storeurl.Options{Passive: true})
		open(t, raw+"&create=true", nil)
	})
	t.Run("dynamodb spilling to s3", func(t *testing.T) {
		ep, s3ep := testenv.DynamoDB(t), testenv.S3(t)
		t.Setenv("AWS_ACCESS_KEY_ID", "S3RVER")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "S3RVER")
		bucket := fmt.Sprintf("storeurl-%d", time.Now().UnixNano())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, s3ep+"/"+bucket, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("create bucket: %v %v", resp, err)
		}
		resp.Body.Close()
		defer http.DefaultClient.CloseIdleConnections()
		raw := fmt.Sprintf("dynamodb://storeurl_%d?region=us-east-1&endpoint=%s&create=true&spill=s3://%s/idem&spillendpoint=%s&spillover=1000",
			time.Now().UnixNano(), ep, bucket, s3ep)
		s, err := storeurl.Open(ctx, raw, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		now := time.Now().UnixMilli()
		res, err := s.Claim(ctx, store.ClaimParams{Key: "k", Owner: "o", Fingerprint: "fp", Now: now, LeaseUntil: now + 60_000, ExpiresAt: now + 3_600_000})
		if err != nil {
			t.Fatal(err)
		}
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
		if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k", Fence: res.Record.Fence, Owner: "o", Now: now}, ExpiresAt: now + 3_600_000, Result: big}); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Get(ctx, "k")
		if err != nil || !bytes.Equal(rec.Result, big) {
			t.Fatalf("get: %v", err)
		}
		list, err := http.Get(s3ep + "/" + bucket + "?list-type=2&prefix=idem/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(list.Body)
		list.Body.Close()
		if !bytes.Contains(body, []byte("<Key>idem/k/1-")) {
			t.Fatalf("bucket listing has no spilled object:\n%s", body)
		}
	})
}

// PGUser is the PostgreSQL user of the tests: $IDEM_PG_USER, else postgres.
func PGUser() string {
	if u := os.Getenv("IDEM_PG_USER"); u != "" {
		return u
	}
	return "postgres"
}
