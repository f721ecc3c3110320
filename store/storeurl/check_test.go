package storeurl_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	dtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/redisnodes"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/s3spill"
	"github.com/seed-a1b882c0/idem/store/pgstore"
	"github.com/seed-a1b882c0/idem/store/redisstore"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// misconfigured opens raw and wants an error of type E, matching
// idem.ErrInvalidConfig and store.ErrMisconfigured, which OpenWait does
// not retry.
func misconfigured[E error](t *testing.T, raw string, o *storeurl.Options) E {
	t.Helper()
	s, err := storeurl.Open(context.Background(), raw, o)
	if err == nil {
		s.Close()
		t.Fatalf("%s opened", storeurl.Redact(raw))
	}
	var e E
	if !errors.As(err, &e) || !errors.Is(err, idem.ErrInvalidConfig) || !errors.Is(err, store.ErrMisconfigured) || storeurl.Retryable(err) {
		t.Fatalf("%s: %v (%T), want a %T", storeurl.Redact(raw), err, err, e)
	}
	t.Logf("%v", err)
	return e
}

// TestOpenFindsConfigurationFaults opens, through storeurl, stores that
// are reachable but wrongly set up, each made for the test on the real
// server: a PostgreSQL role with no rights, a Redis user refused EVALSHA,
// a DynamoDB table without TTL, a spill bucket that does not exist.
func TestOpenFindsConfigurationFaults(t *testing.T) {
	ctx := context.Background()
	t.Run("postgres role without rights", func(t *testing.T) {
		addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
		admin := fmt.Sprintf("postgres://%s@%s/test", PGUser(), addr)
		table := fmt.Sprintf("storeurl_rights_%d", time.Now().UnixNano())
		if _, err := storeurl.Migrate(ctx, admin+"?table="+table); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dropTable(t, admin, table) })
		role := fmt.Sprintf("idem_storeurl_%x", rand.Uint32())
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) }) // after the role's cleanup
		if _, err := c.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, q := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
				if _, err := c.Exec(context.Background(), q); err != nil {
					t.Errorf("cleanup: %s: %v", q, err)
				}
			}
		})
		raw := fmt.Sprintf("postgres://%s@%s/test?table=%s", role, addr, table)
		misconfigured[*pgstore.PrivilegeError](t, raw, nil)
		// The tables are in public, whose USAGE PUBLIC has: with SELECT on
		// both, the migrations are read and the missing rights named.
		for _, q := range []string{"GRANT SELECT ON idem_schema_migrations TO " + role, "GRANT SELECT ON " + table + " TO " + role} {
			if _, err := c.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		if pe := misconfigured[*pgstore.PrivilegeError](t, raw, nil); strings.Join(pe.Missing, ",") != "INSERT,UPDATE,DELETE" {
			t.Errorf("missing %v", pe.Missing)
		}
		// A passive open (idemctl) reads only.
		s, err := storeurl.Open(ctx, raw, &storeurl.Options{Passive: true})
		if err != nil {
			t.Fatalf("passive open with SELECT: %v", err)
		}
		s.Close()
	})
	t.Run("redis user refused EVALSHA", func(t *testing.T) {
		addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
		admin := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { admin.Close() }) // after the user's cleanup
		user := fmt.Sprintf("idemtest-%x", rand.Uint32())
		if err := admin.Do(ctx, "acl", "setuser", user, "on", ">pw", "~*", "+@all", "-evalsha").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := admin.Do(context.Background(), "acl", "deluser", user).Err(); err != nil {
				t.Errorf("ACL DELUSER: %v", err)
			}
		})
		e := misconfigured[*redisstore.ACLError](t, fmt.Sprintf("redis://%s:pw@%s/0?prefix=storeurl:", user, addr), nil)
		if e.Command != "EVALSHA" || e.User != user {
			t.Errorf("%+v", e)
		}
	})
	t.Run("dynamodb table without TTL", func(t *testing.T) {
		ep := testenv.DynamoDB(t)
		t.Setenv("AWS_ACCESS_KEY_ID", "local")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "local")
		cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion("us-east-1"))
		if err != nil {
			t.Fatal(err)
		}
		tr := &http.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		cfg.HTTPClient = &http.Client{Transport: tr}
		client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(ep) })
		table := fmt.Sprintf("storeurl_nottl_%d", time.Now().UnixNano())
		if _, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{TableName: aws.String(table), BillingMode: dtypes.BillingModePayPerRequest,
			AttributeDefinitions: []dtypes.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: dtypes.ScalarAttributeTypeS}},
			KeySchema:            []dtypes.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: dtypes.KeyTypeHash}}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
		})
		raw := fmt.Sprintf("dynamodb://%s?region=us-east-1&endpoint=%s", table, ep)
		if e := misconfigured[*dynamostore.TableError](t, raw, nil); !errors.Is(e, dynamostore.ErrTTL) {
			t.Errorf("%v, want ErrTTL", e)
		}
		if e := misconfigured[*dynamostore.TableError](t, fmt.Sprintf("dynamodb://storeurl_no_such_table?region=us-east-1&endpoint=%s", ep), nil); !errors.Is(e, dynamostore.ErrNoTable) {
			t.Errorf("%v, want ErrNoTable", e)
		}
	})
	t.Run("spill bucket missing", func(t *testing.T) {
		ep, s3ep := testenv.DynamoDB(t), testenv.S3(t)
		t.Setenv("AWS_ACCESS_KEY_ID", "S3RVER")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "S3RVER")
		raw := fmt.Sprintf("dynamodb://storeurl_spill_%d?region=us-east-1&endpoint=%s&create=true&spill=s3://idem-no-such-bucket/p&spillendpoint=%s&spillprobe=true",
			time.Now().UnixNano(), ep, s3ep)
		if e := misconfigured[*s3spill.BucketError](t, raw, nil); !errors.Is(e, s3spill.ErrNoBucket) {
			t.Errorf("%v, want ErrNoBucket", e)
		}
	})
}

// TestOpenRefusesARedisThatMayEvict: storeurl.Open of a Redis of the
// test's own with maxmemory 8mb and volatile-lru (the managed services'
// default), then allkeys-lru, fails with an *redisstore.EvictionError,
// which OpenWait does not retry; with alloweviction=true it opens, and
// the warning that records may be forgotten and operations may run again
// goes to Options.Logger. A passive open (idemctl) only pings.
func TestOpenRefusesARedisThatMayEvict(t *testing.T) {
	t.Parallel()
	a := redisnodes.Start(t, "--maxmemory", "8mb", "--maxmemory-policy", "volatile-lru")
	raw := "redis://" + a + "/0?prefix=storeurl:"
	e := misconfigured[*redisstore.EvictionError](t, raw, nil)
	if e.Addr != a || e.Policy != "volatile-lru" || e.MaxMemory != 8<<20 {
		t.Errorf("%+v, want %s volatile-lru 8mb", e, a)
	}
	if out, err := redisnodes.Cli(a, "config", "set", "maxmemory-policy", "allkeys-lru"); err != nil || out != "OK" {
		t.Fatalf("CONFIG SET: %s, %v", out, err)
	}
	if e := misconfigured[*redisstore.EvictionError](t, raw, nil); e.Policy != "allkeys-lru" {
		t.Errorf("%+v, want allkeys-lru", e)
	}
	ctx := context.Background()
	var logs strings.Builder
	s, err := storeurl.Open(ctx, raw+"&alloweviction=true", &storeurl.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("alloweviction=true: %v", err)
	}
	s.Close()
	for _, want := range []string{"level=WARN", "AllowEviction is set: records may be forgotten; operations may run again", "allkeys-lru"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the warning lacks %q:\n%s", want, logs.String())
		}
	}
	s, err = storeurl.Open(ctx, raw, &storeurl.Options{Passive: true})
	if err != nil {
		t.Fatalf("passive: %v", err)
	}
	s.Close()
}
