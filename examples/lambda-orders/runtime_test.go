package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

// runtimeAPI is a STAND-IN for the AWS Lambda Runtime API (AWS's own
// emulator cannot run here): the documented
// /2018-06-01/runtime/invocation/next, /{id}/response and /{id}/error
// endpoints, enough for aws-lambda-go's real runtime loop in the built
// binary to fetch invocations and post their outcomes.
type runtimeAPI struct {
	srv     *httptest.Server
	pending chan invocation
	mu      sync.Mutex
	results map[string]chan outcome
	seq     int
}

type invocation struct {
	id       string
	event    string
	deadline time.Time
}

type outcome struct {
	response string
	errType  string
	errMsg   string
}

func newRuntimeAPI(t *testing.T) *runtimeAPI {
	api := &runtimeAPI{pending: make(chan invocation, 16), results: map[string]chan outcome{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /2018-06-01/runtime/invocation/next", func(w http.ResponseWriter, r *http.Request) {
		select {
		case inv := <-api.pending:
			h := w.Header()
			h.Set("Lambda-Runtime-Aws-Request-Id", inv.id)
			h.Set("Lambda-Runtime-Deadline-Ms", strconv.FormatInt(inv.deadline.UnixMilli(), 10))
			h.Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:eu-west-1:123456789012:function:orders")
			h.Set("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000;Sampled=0")
			io.WriteString(w, inv.event)
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/response", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		api.deliver(r.PathValue("id"), outcome{response: string(b)})
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/error", func(w http.ResponseWriter, r *http.Request) {
		var e struct{ ErrorMessage, ErrorType string }
		_ = json.NewDecoder(r.Body).Decode(&e)
		api.deliver(r.PathValue("id"), outcome{errType: e.ErrorType, errMsg: e.ErrorMessage})
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("POST /2018-06-01/runtime/init/error", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		t.Errorf("function failed to initialise: %s", b)
		w.WriteHeader(http.StatusAccepted)
	})
	api.srv = httptest.NewServer(mux)
	t.Cleanup(api.srv.Close)
	return api
}

func (api *runtimeAPI) deliver(id string, o outcome) {
	api.mu.Lock()
	ch := api.results[id]
	api.mu.Unlock()
	if ch != nil {
		ch <- o
	}
}

// invoke queues event with a deadline and returns the channel its outcome
// arrives on.
func (api *runtimeAPI) invoke(event string, timeout time.Duration) (string, time.Time, chan outcome) {
	api.mu.Lock()
	api.seq++
	id := fmt.Sprintf("req-%d", api.seq)
	ch := make(chan outcome, 1)
	api.results[id] = ch
	api.mu.Unlock()
	deadline := time.Now().Add(timeout)
	api.pending <- invocation{id: id, event: event, deadline: deadline}
	return id, deadline, ch
}

// function is the built binary running against the stand-in.
type function struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startFunction(t *testing.T, binary string, env []string) *function {
	cmd := exec.Command(binary)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = &testWriter{t: t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f := &function{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(f.done) }()
	t.Cleanup(f.kill)
	return f
}

// kill ends the process as Lambda ends a timed-out one.
func (f *function) kill() {
	_ = f.cmd.Process.Signal(syscall.SIGKILL)
	<-f.done
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Logf("function: %s", strings.TrimSpace(string(p)))
	return len(p), nil
}

func TestBuiltFunctionAgainstRuntimeAPIStandIn(t *testing.T) {
	ep := testenv.DynamoDB(t)
	dir := t.TempDir()
	binary := filepath.Join(dir, "bootstrap")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("building the function: %v", err)
	}
	table := fmt.Sprintf("lambda_orders_%d", time.Now().UnixNano())
	ctx := context.Background()
	client := dynamodb.New(dynamodb.Options{
		Region: "eu-west-1", BaseEndpoint: aws.String(ep),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local"}, nil
		}),
	})
	if err := dynamostore.CreateTable(ctx, client, dynamostore.Config{Table: table}, time.Minute); err != nil {
		t.Fatal(err)
	}
	api := newRuntimeAPI(t)
	log := filepath.Join(dir, "orders.log")
	env := []string{
		"AWS_LAMBDA_RUNTIME_API=" + strings.TrimPrefix(api.srv.URL, "http://"),
		"AWS_LAMBDA_FUNCTION_NAME=orders", "AWS_LAMBDA_FUNCTION_VERSION=$LATEST", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE=256",
		"AWS_REGION=eu-west-1", "AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local",
		"IDEM_TABLE=" + table, "IDEM_DYNAMODB_ENDPOINT=" + ep, "ORDERS_LOG=" + log,
	}
	fn := startFunction(t, binary, env)
	wait := func(ch chan outcome) outcome {
		select {
		case o := <-ch:
			return o
		case <-time.After(30 * time.Second):
			t.Fatal("no outcome from the function within 30s")
			return outcome{}
		}
	}
	var res orderResult

	// A duplicate invocation replays the first's result.
	_, _, ch := api.invoke(`{"order_id":"o-1","item":"book","qty":1}`, 10*time.Second)
	first := wait(ch)
	_, _, ch = api.invoke(`{"order_id":"o-1","item":"book","qty":1}`, 10*time.Second)
	dup := wait(ch)
	if first.errType != "" || dup.response != first.response {
		t.Fatalf("duplicate: %+v vs first %+v", dup, first)
	}
	// The same order_id with another item is refused.
	_, _, ch = api.invoke(`{"order_id":"o-1","item":"pen","qty":1}`, 10*time.Second)
	if o := wait(ch); o.errType != "MismatchError" {
		t.Fatalf("reused order_id: %+v", o)
	}

	// An invocation that runs past its deadline is ended (as Lambda does)
	// and retried: the retry is held off while the deadline (the lease) has
	// not passed, and takes the order over once it has.
	slow := `{"order_id":"o-2","item":"lamp","qty":1,"work_ms":60000}`
	_, deadline, _ := api.invoke(slow, 2*time.Second)
	waitForLine(t, log, "start o-2 1")
	fn2 := startFunction(t, binary, env) // a second instance serves the early retry
	_, _, ch = api.invoke(slow, 10*time.Second)
	if o := wait(ch); o.errType != "InProgressError" {
		t.Fatalf("retry during the first attempt: %+v", o)
	}
	<-time.After(time.Until(deadline)) // the first attempt's deadline: Lambda ends it
	fn.kill()
	// Leases are decided on the store's clock, which each instance measures
	// (DynamoDB's Date header, to the second): the two instances' readings
	// of it may differ by up to a second, so the takeover comes within that
	// bound after the deadline (docs/state-machine.md, "One clock").
	<-time.After(1500 * time.Millisecond)
	_, _, ch = api.invoke(slow, 10*time.Second)
	o := wait(ch)
	if err := json.Unmarshal([]byte(o.response), &res); err != nil || res.Fence != 2 || res.OrderID != "o-2" {
		t.Fatalf("retry after the deadline: %+v (%v)", o, err)
	}
	_, _, ch = api.invoke(slow, 10*time.Second)
	if again := wait(ch); again.response != o.response {
		t.Fatalf("after the takeover, a retry replays: %+v", again)
	}
	fn2.kill()
	lines, _ := os.ReadFile(log)
	want := "start o-1 1\ndone o-1 1\nstart o-2 1\nstart o-2 2\ndone o-2 2\n"
	if string(lines) != want {
		t.Fatalf("executions:\n%s\nwant:\n%s", lines, want)
	}
}

// waitForLine returns once the log file has the line (the function writes
// it from another process).
func waitForLine(t *testing.T, path, line string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), line+"\n") {
			return
		}
		<-time.After(20 * time.Millisecond)
	}
	t.Fatalf("%s never got %q", path, line)
}
