// Command payments is the seed's transfer told end to end with idem and
// AWS Step Functions:
//
//	POST /transfers  {"from":"alice","to":"bob","amount":2500}  Idempotency-Key: "t-1"
//	  → 202 Accepted, Location: /transfers/status/<id>
//	  → the transfer workflow debits alice and credits bob (activity workers
//	    in this process); its last step completes the key with the receipt
//	GET  /transfers/status/<id>  → {"status":"COMPLETED","execution":"arn:...","result":{...}}
//	POST /transfers  (the same request again) → 201, the receipt, Idempotent-Replayed: true
//
// However often the client retries, and whatever dies half way, each
// transfer starts one execution and moves the money once: the execution's
// name is derived from the key, a starter that died between claiming and
// starting is repaired by the next retry (or the reconciler), and the
// ledger applies each posting once.
//
// It needs a Step Functions endpoint: stepfunctions-local on loopback,
// started by the project's script, serves:
//
//	scripts/stepfunctions-local run go run ./examples/payments
//
// Keys live in the embedded file store (-state, default
// .cache/payments/payments.db), so a restart keeps them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/store/boltstore"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8081", "address of the transfers API")
	endpoint := flag.String("sfn-endpoint", os.Getenv("IDEM_SFN_ENDPOINT"), "Step Functions endpoint (stepfunctions-local)")
	state := flag.String("state", filepath.Join(".cache", "payments", "payments.db"), "the idempotency store (a file)")
	accounts := flag.String("accounts", "alice=10000,bob=0", "opening balances in cents")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*listen, *endpoint, *state, *accounts, log); err != nil {
		log.Error("payments", "err", err)
		os.Exit(1)
	}
}

func run(listen, endpoint, state, accounts string, log *slog.Logger) error {
	if endpoint == "" {
		return errors.New("no Step Functions endpoint: set -sfn-endpoint or run under scripts/stepfunctions-local run")
	}
	balances, err := parseAccounts(accounts)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(state), 0o755); err != nil {
		return err
	}
	st, err := boltstore.Open(state, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	eng, err := idem.New(st, &idem.Config{Expiry: 24 * time.Hour})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	app, err := setup(ctx, eng, localClient(endpoint, nil), NewLedger(balances), log, "payments")
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	log.Info("payments: serving", "addr", ln.Addr().String(), "state_machine", app.StateMachineArn)
	srv := &http.Server{Handler: app.API.routes(), ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Shutdown(context.Background()) }()
	go app.Reconciler.Run(ctx)
	go app.Workers.Run(ctx)
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// App is everything the example runs.
type App struct {
	API             *API
	Workers         *Workers
	Reconciler      *idemsfn.Reconciler
	StateMachineArn string
}

// setup creates the two activities (idempotent by name on Step
// Functions) and a workflow, all named after name, and wires the parts
// together.
func setup(ctx context.Context, eng *idem.Engine, c *sfn.Client, ledger *Ledger, log *slog.Logger, name string) (*App, error) {
	arn := func(name string) (string, error) {
		out, err := c.CreateActivity(ctx, &sfn.CreateActivityInput{Name: aws.String(name)})
		if err != nil {
			return "", fmt.Errorf("creating activity %s: %w", name, err)
		}
		return aws.ToString(out.ActivityArn), nil
	}
	debit, err := arn(name + "-debit")
	if err != nil {
		return nil, err
	}
	credit, err := arn(name + "-credit")
	if err != nil {
		return nil, err
	}
	sm, err := c.CreateStateMachine(ctx, &sfn.CreateStateMachineInput{
		Name:       aws.String(name + "-transfer-" + strconv.FormatInt(time.Now().UnixNano(), 36)),
		Definition: aws.String(definition(debit, credit)),
		RoleArn:    aws.String("arn:aws:iam::123456789012:role/payments"),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the state machine: %w", err)
	}
	starter, err := idemsfn.New(eng, c, idemsfn.Config{
		StateMachineArn:    aws.ToString(sm.StateMachineArn),
		Operation:          operation,
		ExpectedCompletion: 5 * time.Minute,
		OrphanGrace:        10 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	rec, err := idemsfn.NewReconciler(starter, &idemsfn.ReconcilerConfig{Interval: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	return &App{
		API:             &API{Engine: eng, Starter: starter, Log: log},
		Workers:         &Workers{API: c, Starter: starter, Ledger: ledger, DebitArn: debit, CreditArn: credit, Log: log, Poll: 100 * time.Millisecond},
		Reconciler:      rec,
		StateMachineArn: aws.ToString(sm.StateMachineArn),
	}, nil
}

// localClient is a Step Functions client of a local endpoint, through hc
// (nil: the SDK's default).
func localClient(endpoint string, hc *http.Client) *sfn.Client {
	o := sfn.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
	}
	if hc != nil {
		o.HTTPClient = hc
	}
	return sfn.New(o)
}

func parseAccounts(s string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, kv := range strings.Split(s, ",") {
		name, v, ok := strings.Cut(kv, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || name == "" || err != nil || n < 0 {
			return nil, fmt.Errorf("-accounts: %q is not name=cents", kv)
		}
		out[name] = n
	}
	return out, nil
}
