package idemsfn_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
	"github.com/seed-a1b882c0/idem/store/memstore"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// The servers of these tests: stepfunctions-local (IDEM_SFN_ENDPOINT,
// started by scripts/stepfunctions-local), DynamoDB Local
// (IDEM_DYNAMODB_ENDPOINT, scripts/dynamodb-local) and Redis
// (IDEM_REDIS_ADDR, default 127.0.0.1:6379). A missing one skips its tests
// outside CI and fails them in CI (testenv).

var staticCredentials = aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
	return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "idem tests"}, nil
})

// sfnClient returns a client of stepfunctions-local.
func sfnClient(t testing.TB) *sfn.Client {
	t.Helper()
	ep := os.Getenv("IDEM_SFN_ENDPOINT")
	if ep == "" {
		testenv.Missing(t, "no stepfunctions-local: IDEM_SFN_ENDPOINT is not set (make test starts one with scripts/stepfunctions-local)")
	}
	return sfn.New(sfn.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(ep), Credentials: staticCredentials,
		HTTPClient: &http.Client{Transport: transport},
	})
}

var seq atomic.Uint64

// unique returns a name no other test of this process uses.
func unique(prefix string) string {
	return fmt.Sprintf("%s%d_%x", prefix, seq.Add(1), rand.Uint32())
}

// newActivity creates an activity of a unique name. Tests leave their
// activities and state machines in place: stepfunctions-local crashes
// (activity.js: "Cannot read properties of undefined") when an activity is
// deleted while an execution still waits in a task of it, and the tests
// leave executions running. The server keeps everything in memory and is
// stopped after the run.
func newActivity(t testing.TB, c *sfn.Client) string {
	t.Helper()
	out, err := c.CreateActivity(ctx, &sfn.CreateActivityInput{Name: aws.String(unique("act"))})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.ActivityArn)
}

// newMachine creates a state machine of a unique name (left in place, as
// activities are).
func newMachine(t testing.TB, c *sfn.Client, definition string) string {
	t.Helper()
	out, err := c.CreateStateMachine(ctx, &sfn.CreateStateMachineInput{
		Name: aws.String(unique("sm")), Definition: aws.String(definition),
		RoleArn: aws.String("arn:aws:iam::123456789012:role/idem-tests"),
	})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.StateMachineArn)
}

// activityMachine is a workflow of one activity task whose result is the
// workflow's output, as idemsfn's docs describe: the task's result goes to
// $.output (the envelope's $.idem stays), and the last state outputs it.
func activityMachine(activity string) string {
	return `{"StartAt":"Work","States":{
		"Work":{"Type":"Task","Resource":"` + activity + `","ResultPath":"$.output","Next":"Done"},
		"Done":{"Type":"Pass","OutputPath":"$.output","End":true}}}`
}

// passMachine ends at once.
const passMachine = `{"StartAt":"P","States":{"P":{"Type":"Pass","End":true}}}`

// task is one activity task a worker received.
type task struct {
	token string // the Step Functions task token
	env   idemsfn.Envelope
}

// startWorker polls activity for tasks until the test ends and hands them
// over. stepfunctions-local answers GetActivityTask at once when there is
// no task (AWS waits up to a minute), so the worker polls with backoff.
func startWorker(t testing.TB, c *sfn.Client, activity string) <-chan task {
	t.Helper()
	tasks := make(chan task, 16)
	wctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		backoff := 5 * time.Millisecond
		for wctx.Err() == nil {
			out, err := c.GetActivityTask(wctx, &sfn.GetActivityTaskInput{ActivityArn: aws.String(activity), WorkerName: aws.String("idem-test")})
			if err == nil && aws.ToString(out.TaskToken) != "" {
				backoff = 5 * time.Millisecond
				env := envelope(t, aws.ToString(out.Input))
				tasks <- task{token: aws.ToString(out.TaskToken), env: env}
				continue
			}
			select {
			case <-wctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 100*time.Millisecond)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return tasks
}

// next waits for the next task.
func next(t testing.TB, tasks <-chan task) task {
	t.Helper()
	select {
	case tk := <-tasks:
		return tk
	case <-time.After(20 * time.Second):
		t.Fatal("no activity task within 20s")
		return task{}
	}
}

// waitStatus waits until the execution arn has status (stepfunctions-local
// advances executions on a one-second loop).
func waitStatus(t testing.TB, c *sfn.Client, arn, status string) *sfn.DescribeExecutionOutput {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := c.DescribeExecution(ctx, &sfn.DescribeExecutionInput{ExecutionArn: aws.String(arn)})
		if err != nil {
			t.Fatal(err)
		}
		if string(d.Status) == status {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s is %s after 20s, want %s", arn, d.Status, status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// executionsNamed counts the executions of machine named name.
func executionsNamed(t testing.TB, c *sfn.Client, machine, name string) int {
	t.Helper()
	n := 0
	p := sfn.NewListExecutionsPaginator(c, &sfn.ListExecutionsInput{StateMachineArn: aws.String(machine)})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range out.Executions {
			if aws.ToString(x.Name) == name {
				n++
			}
		}
	}
	return n
}

// A storeKind makes a fresh store for one test.
type storeKind struct {
	name string
	make func(t testing.TB) store.Store
}

// stores are the stores the tests against servers run on: memstore and
// two that talk to a server.
var stores = []storeKind{
	{"memstore", func(t testing.TB) store.Store {
		mem := memstore.New(&memstore.Config{SweepInterval: -1})
		t.Cleanup(func() { _ = mem.Close() })
		return mem
	}},
	{"dynamostore", func(t testing.TB) store.Store { return newDynamoStore(t, dynamostore.Config{}) }},
	{"redisstore", func(t testing.TB) store.Store { return newRedisStore(t) }},
}

// forStores runs f for every store kind, as parallel subtests: once as
// it is, and once with a rig whose engine signs its tokens
// (Config.TokenKey, see signedStore), so that every path that settles a
// key — Start, workers, events, the Reconciler — is shown to work with
// signed tokens too.
func forStores(t *testing.T, f func(t *testing.T, newStore func(t testing.TB) store.Store)) {
	for _, k := range stores {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f(t, k.make)
		})
		t.Run(k.name+"/signed", func(t *testing.T) {
			t.Parallel()
			f(t, func(t testing.TB) store.Store { return signedStore{k.make(t)} })
		})
	}
}

// signedStore marks a store whose rig (newRig) signs its engine's tokens
// with tokenKey.
type signedStore struct{ store.Store }

// tokenKey is the Config.TokenKey of the signed rigs.
var tokenKey = []byte("idemsfn-test-token-key-0123456789")

// dynamoClient returns a client of DynamoDB Local.
func dynamoClient(t testing.TB) *dynamodb.Client {
	t.Helper()
	return dynamotest.Client(t)
}

// newDynamoStore returns a dynamostore on a fresh table of DynamoDB Local,
// deleted when the test ends.
func newDynamoStore(t testing.TB, cfg dynamostore.Config) *dynamostore.Store {
	t.Helper()
	c := dynamoClient(t)
	cfg = dynamotest.Table(t, c, "idemsfn_", cfg)
	s, err := dynamostore.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newRedisStore returns a redisstore under a fresh key prefix, whose keys
// are deleted when the test ends.
func newRedisStore(t testing.TB) *redisstore.Store {
	t.Helper()
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	c := redis.NewClient(&redis.Options{Addr: addr})
	prefix := unique("idemsfn:") + ":"
	t.Cleanup(func() {
		keys, _ := c.Keys(context.Background(), prefix+"*").Result()
		if len(keys) > 0 {
			_ = c.Del(context.Background(), keys...).Err()
		}
		_ = c.Close()
	})
	s, err := redisstore.New(c, &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
