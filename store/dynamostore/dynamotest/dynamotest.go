// Package dynamotest gives tests a client of DynamoDB Local, fresh tables
// on it and a TestMain that checks for leaked goroutines: the setup the
// tests of dynamostore, s3spill, idemsfn and idemdynamo share. A test without DynamoDB Local skips outside CI and
// fails in CI ([testenv.DynamoDB]). Test-only: no production package
// imports it.
package dynamotest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

// Credentials are static credentials: DynamoDB Local checks that a
// request is signed, not by whom.
var Credentials aws.CredentialsProvider = aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
	return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "idem tests"}, nil
})

// Transport carries the requests of every client [NewClient] makes, and
// may carry a test's other AWS clients (S3, Step Functions): one
// transport, so that [Main] can close its idle connections before it
// looks for leaked goroutines.
var Transport = &http.Transport{MaxIdleConnsPerHost: 512, IdleConnTimeout: 30 * time.Second}

// Main is the TestMain of a package that tests against DynamoDB Local: it
// runs the tests, closes [Transport]'s idle connections, and fails the
// run when goroutines leaked (goleak).
func Main(m *testing.M) {
	code := m.Run()
	Transport.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// NewClient returns a client of the DynamoDB endpoint ep (region
// us-east-1, [Credentials], over [Transport]). opts apply last.
func NewClient(ep string, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(ep),
		HTTPClient:   &http.Client{Transport: Transport},
		Credentials:  Credentials,
	}, opts...)
}

// Client is [NewClient] for DynamoDB Local ([testenv.DynamoDB]).
func Client(t testing.TB, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	t.Helper()
	return NewClient(testenv.DynamoDB(t), opts...)
}

var seq atomic.Uint64

// Name returns a table name no other test of this process uses, starting
// with prefix.
func Name(prefix string) string {
	return fmt.Sprintf("%s%d_%x", prefix, seq.Add(1), rand.Uint32())
}

// Table creates a fresh idem table for cfg with [dynamostore.CreateTable],
// named by [Name] from prefix, and deletes it when the test ends. It
// returns cfg with Table set.
func Table(t testing.TB, c *dynamodb.Client, prefix string, cfg dynamostore.Config) dynamostore.Config {
	t.Helper()
	cfg.Table = Name(prefix)
	if err := dynamostore.CreateTable(context.Background(), c, cfg, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := c.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(cfg.Table)}); err != nil {
			t.Errorf("delete table %s: %v", cfg.Table, err)
		}
	})
	return cfg
}
