package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"go.uber.org/goleak"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/idemtest/clocktest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var names atomic.Int64

// harness is the example against stepfunctions-local, on a memstore and
// a manual clock (for the orphan grace). Each test has its own activities
// and workflow, so no test's worker takes another's tasks.
type harness struct {
	t      *testing.T
	app    *App
	sfn    *sfn.Client
	clock  *clocktest.Clock
	ledger *Ledger
	srv    *httptest.Server
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	endpoint := os.Getenv("IDEM_SFN_ENDPOINT")
	if endpoint == "" {
		testenv.Missing(t, "IDEM_SFN_ENDPOINT is not set: run under scripts/stepfunctions-local run")
	}
	mem := memstore.New(nil)
	t.Cleanup(func() { _ = mem.Close() })
	clock := clocktest.New(time.Now())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng, err := idem.New(mem, &idem.Config{Clock: clock, Logger: log, Expiry: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	h := &harness{t: t, sfn: localClient(endpoint, hc), clock: clock, ledger: NewLedger(map[string]int64{"alice": 10000, "bob": 0})}
	name := fmt.Sprintf("payments-test-%d-%d", os.Getpid(), names.Add(1))
	if h.app, err = setup(context.Background(), eng, h.sfn, h.ledger, log, name); err != nil {
		t.Fatal(err)
	}
	h.srv = httptest.NewServer(h.app.API.routes())
	t.Cleanup(func() { h.srv.Client().CloseIdleConnections(); h.srv.Close() })
	return h
}

// work runs the activity workers until the test ends.
func (h *harness) work() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.app.Workers.Run(ctx) }()
	h.t.Cleanup(func() { cancel(); <-done })
}

type answer struct {
	code   int
	header http.Header
	status Status
	body   []byte
}

func (h *harness) post(client, key, body string) answer {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/transfers", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	req.Header.Set("X-Client", client)
	return h.do(req)
}

func (h *harness) get(client, location string) answer {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.srv.URL+location, nil)
	req.Header.Set("X-Client", client)
	return h.do(req)
}

func (h *harness) do(req *http.Request) answer {
	h.t.Helper()
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	a := answer{code: resp.StatusCode, header: resp.Header}
	a.body, _ = io.ReadAll(resp.Body)
	if resp.StatusCode < 300 && resp.StatusCode != http.StatusCreated {
		_ = json.Unmarshal(a.body, &a.status)
	}
	return a
}

// settled polls the status resource until the transfer is settled: the
// workflow runs in stepfunctions-local, another process, in real time.
func (h *harness) settled(client, location string) Status {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		a := h.get(client, location)
		if a.code != http.StatusOK {
			h.t.Fatalf("GET %s: %d %s", location, a.code, a.body)
		}
		if a.status.Status != "IN_PROGRESS" {
			return a.status
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.t.Fatalf("%s still IN_PROGRESS after 30s", location)
	return Status{}
}

// executions lists the workflow's executions.
func (h *harness) executions() []string {
	h.t.Helper()
	out, err := h.sfn.ListExecutions(context.Background(), &sfn.ListExecutionsInput{StateMachineArn: aws.String(h.app.StateMachineArn)})
	if err != nil {
		h.t.Fatal(err)
	}
	var arns []string
	for _, e := range out.Executions {
		arns = append(arns, aws.ToString(e.ExecutionArn))
	}
	return arns
}

func (h *harness) balances(alice, bob int64) {
	h.t.Helper()
	if b := h.ledger.Balances(); b["alice"] != alice || b["bob"] != bob {
		h.t.Fatalf("balances %v, want alice %d bob %d", b, alice, bob)
	}
}

const transfer25 = `{"from":"alice","to":"bob","amount":2500}`

// The whole story: 202 and a status URL, a duplicate during the workflow
// gets 202 and the same execution, the workflow completes the key, a
// duplicate after it gets the receipt, the money moved once, one execution.
func TestTransferIsAppliedOnce(t *testing.T) {
	h := newHarness(t)
	first := h.post("acme", "t-1", transfer25)
	loc := first.header.Get("Location")
	if first.code != http.StatusAccepted || !strings.HasPrefix(loc, statusPath) || !strings.Contains(first.status.Execution, ":execution:") {
		t.Fatalf("first POST: %d %s (Location %q)", first.code, first.body, loc)
	}
	dup := h.post("acme", "t-1", transfer25)
	if dup.code != http.StatusAccepted || dup.header.Get("Location") != loc || dup.status.Execution != first.status.Execution {
		t.Fatalf("duplicate during the workflow: %d %s (Location %q)", dup.code, dup.body, dup.header.Get("Location"))
	}
	if a := h.get("intruder", loc); a.code != http.StatusNotFound {
		t.Fatalf("another client read the status: %d", a.code)
	}
	h.work()
	st := h.settled("acme", loc)
	var rc Receipt
	if st.Status != "COMPLETED" || json.Unmarshal(st.Result, &rc) != nil || rc.Amount != 2500 || rc.Status != "settled" {
		t.Fatalf("settled status: %+v", st)
	}
	after := h.post("acme", "t-1", transfer25)
	if after.code != http.StatusCreated || after.header.Get("Idempotent-Replayed") != "true" || !strings.Contains(string(after.body), `"settled"`) {
		t.Fatalf("duplicate after the workflow: %d %s", after.code, after.body)
	}
	if other := h.post("acme", "t-1", `{"from":"alice","to":"bob","amount":1}`); other.code != http.StatusUnprocessableEntity {
		t.Fatalf("the key with another transfer: %d %s", other.code, other.body)
	}
	h.balances(7500, 2500)
	if ex := h.executions(); len(ex) != 1 || ex[0] != first.status.Execution {
		t.Fatalf("executions %v, want exactly %s", ex, first.status.Execution)
	}
}

// crashing stands for a starter process that dies around StartExecution:
// before it (the call never leaves) or after it (the execution started,
// the starter never attached it).
type crashing struct {
	idemsfn.API
	after bool
}

var errKilled = errors.New("starter killed")

func (c crashing) StartExecution(ctx context.Context, in *sfn.StartExecutionInput, opts ...func(*sfn.Options)) (*sfn.StartExecutionOutput, error) {
	if c.after {
		if _, err := c.API.StartExecution(ctx, in, opts...); err != nil {
			return nil, err
		}
	}
	return nil, errKilled
}

// The orchestration gap: the starter claimed the key and died before or
// after StartExecution. A retry within the orphan grace is told the
// transfer is starting; after it, the retry starts (or adopts) exactly
// one execution, and the money moves once.
func TestStarterKilledAroundStartExecution(t *testing.T) {
	for _, after := range []bool{false, true} {
		t.Run(map[bool]string{false: "BeforeStart", true: "BeforeAttach"}[after], func(t *testing.T) {
			h := newHarness(t)
			dying, err := idemsfn.New(h.app.API.Engine, crashing{API: h.sfn, after: after}, h.app.API.Starter.Config())
			if err != nil {
				t.Fatal(err)
			}
			req := idem.Request{Operation: operation, Tenant: "acme", Key: "t-2", Payload: []byte(transfer25)}
			var tr Transfer
			_ = json.Unmarshal([]byte(transfer25), &tr)
			if _, err := dying.Start(context.Background(), req, tr); !errors.Is(err, errKilled) {
				t.Fatalf("the dying starter: %v", err)
			}
			want := 0
			if after {
				want = 1
			}
			if ex := h.executions(); len(ex) != want {
				t.Fatalf("%d executions after the starter died, want %d", len(ex), want)
			}
			soon := h.post("acme", "t-2", transfer25)
			if soon.code != http.StatusAccepted || soon.status.Execution != "" {
				t.Fatalf("retry within the orphan grace: %d %s", soon.code, soon.body)
			}
			h.clock.Advance(h.app.API.Starter.Config().OrphanGrace)
			retry := h.post("acme", "t-2", transfer25)
			if retry.code != http.StatusAccepted || retry.status.Execution == "" {
				t.Fatalf("retry after the orphan grace: %d %s", retry.code, retry.body)
			}
			ex := h.executions()
			if len(ex) != 1 || ex[0] != retry.status.Execution {
				t.Fatalf("executions %v, want exactly the retry's %s", ex, retry.status.Execution)
			}
			h.work()
			if st := h.settled("acme", retry.header.Get("Location")); st.Status != "COMPLETED" {
				t.Fatalf("status: %+v", st)
			}
			h.balances(7500, 2500)
			if ex := h.executions(); len(ex) != 1 {
				t.Fatalf("executions %v after the retry, want one", ex)
			}
		})
	}
}

// A workflow that fails (insufficient funds at the debit) marks the key
// FAILED, and a retry gets that failure, not a second attempt.
func TestFailedTransferIsReplayed(t *testing.T) {
	h := newHarness(t)
	big := `{"from":"alice","to":"bob","amount":999999}`
	first := h.post("acme", "t-3", big)
	if first.code != http.StatusAccepted {
		t.Fatalf("first POST: %d %s", first.code, first.body)
	}
	h.work()
	st := h.settled("acme", first.header.Get("Location"))
	if st.Status != "FAILED" || !strings.Contains(st.Error, "InsufficientFunds") {
		t.Fatalf("status of a failed transfer: %+v", st)
	}
	again := h.post("acme", "t-3", big)
	if again.code != http.StatusUnprocessableEntity || again.header.Get("Idempotent-Replayed") != "true" || !strings.Contains(string(again.body), "InsufficientFunds") {
		t.Fatalf("retry of a failed transfer: %d %s", again.code, again.body)
	}
	h.balances(10000, 0)
	if ex := h.executions(); len(ex) != 1 {
		t.Fatalf("executions %v, want one", ex)
	}
}

// A workflow that times out runs no Catch and no last step: the
// "Execution Status Change" event marks the key FAILED. stepfunctions-local
// never times an execution out and sends no events, so the event here is
// synthesized, as EventBridge would deliver it, from the real execution.
func TestTimedOutWorkflowFailsTheKey(t *testing.T) {
	h := newHarness(t)
	first := h.post("acme", "t-4", transfer25)
	if first.code != http.StatusAccepted {
		t.Fatalf("first POST: %d %s", first.code, first.body)
	}
	desc, err := h.sfn.DescribeExecution(context.Background(), &sfn.DescribeExecutionInput{ExecutionArn: aws.String(first.status.Execution)})
	if err != nil {
		t.Fatal(err)
	}
	stop := time.Now().UnixMilli()
	synthesized := idemsfn.Event{
		Version: "0", ID: "synthesized-timeout", DetailType: idemsfn.EventDetailType, Source: idemsfn.EventSource,
		Time: time.Now().UTC(), Region: "us-east-1", Resources: []string{first.status.Execution},
		Detail: idemsfn.EventDetail{
			ExecutionArn: first.status.Execution, StateMachineArn: h.app.StateMachineArn, Name: aws.ToString(desc.Name),
			Status: "TIMED_OUT", StartDate: desc.StartDate.UnixMilli(), StopDate: &stop, Input: desc.Input,
		},
	}
	if _, err := h.app.API.Starter.HandleEvent(context.Background(), synthesized); err != nil {
		t.Fatalf("HandleEvent: %v", err)
	}
	st := h.get("acme", first.header.Get("Location")).status
	if st.Status != "FAILED" || !strings.Contains(st.Error, "TIMED_OUT") && !strings.Contains(st.Error, "Timeout") {
		t.Fatalf("status after the timeout event: %+v", st)
	}
	again := h.post("acme", "t-4", transfer25)
	if again.code != http.StatusUnprocessableEntity || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of a timed-out transfer: %d %s", again.code, again.body)
	}
	h.balances(10000, 0) // no worker ran: nothing moved
}
