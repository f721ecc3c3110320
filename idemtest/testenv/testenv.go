// Package testenv decides whether a test that needs a real server runs,
// skips or fails: outside CI a missing server skips the test, saying why;
// in CI (the CI variable set) it fails it. Test-only.
package testenv

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// Missing skips t outside CI and fails it in CI, with why.
func Missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set, so this test must run)", why)
	}
	t.Skip(why)
}

// Reach returns the host:port of a server named what, from the
// environment variable env or else def, once a TCP connection to it
// succeeds; otherwise it calls Missing.
func Reach(t testing.TB, what, env, def string) string {
	t.Helper()
	addr := os.Getenv(env)
	if addr == "" {
		addr = def
	}
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		Missing(t, what+" at "+addr+" is unreachable ("+err.Error()+"); set "+env)
		return ""
	}
	c.Close()
	return addr
}

// RedisCluster returns the seed addresses of the Redis Cluster under test
// (scripts/redis-cluster, which sets IDEM_REDIS_CLUSTER_ADDRS), or calls
// Missing.
func RedisCluster(t testing.TB) []string {
	t.Helper()
	v := os.Getenv("IDEM_REDIS_CLUSTER_ADDRS")
	if v == "" {
		Missing(t, "no Redis Cluster: set IDEM_REDIS_CLUSTER_ADDRS (make test starts one with scripts/redis-cluster)")
		return nil
	}
	return strings.Split(v, ",")
}

// DynamoDB returns the endpoint of DynamoDB Local (IDEM_DYNAMODB_ENDPOINT,
// which scripts/dynamodb-local sets), or calls Missing.
func DynamoDB(t testing.TB) string {
	t.Helper()
	return endpoint(t, "IDEM_DYNAMODB_ENDPOINT", "no DynamoDB Local", "make test starts one with scripts/dynamodb-local")
}

// S3 returns the endpoint of the S3 server under test (IDEM_S3_ENDPOINT,
// which scripts/s3rver sets), or calls Missing.
func S3(t testing.TB) string {
	t.Helper()
	return endpoint(t, "IDEM_S3_ENDPOINT", "no S3 server", "make test starts s3rver with scripts/s3rver")
}

// endpoint returns the value of env, or calls Missing saying what is
// missing and how to start it.
func endpoint(t testing.TB, env, what, start string) string {
	t.Helper()
	ep := os.Getenv(env)
	if ep == "" {
		Missing(t, what+": "+env+" is not set ("+start+")")
	}
	return ep
}
