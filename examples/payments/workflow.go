package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
)

// Transfer is what POST /transfers asks for and the workflow carries in
// $.input.
type Transfer struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"` // cents
}

// Receipt is the workflow's result: what the last step stores under the
// key and every duplicate gets.
type Receipt struct {
	Transfer string `json:"transfer"` // the execution's name: one per key
	From     string `json:"from"`
	To       string `json:"to"`
	Amount   int64  `json:"amount"`
	Status   string `json:"status"`
}

// definition is the transfer workflow: debit, then credit; each an
// activity task. The credit worker completes the idempotency record
// before it reports success; a failed debit fails the record and the
// execution. Every state keeps the input's $.idem (ResultPath), which the
// last step needs.
func definition(debitArn, creditArn string) string {
	def := map[string]any{
		"Comment": "idem example: a transfer between two accounts, started once per Idempotency-Key",
		"StartAt": "Debit",
		"States": map[string]any{
			"Debit":  map[string]any{"Type": "Task", "Resource": debitArn, "ResultPath": "$.debit", "HeartbeatSeconds": 60, "Next": "Credit"},
			"Credit": map[string]any{"Type": "Task", "Resource": creditArn, "ResultPath": "$.credit", "HeartbeatSeconds": 60, "End": true},
		},
	}
	b, _ := json.Marshal(def)
	return string(b)
}

// ActivityAPI is the part of *sfn.Client the workers use.
type ActivityAPI interface {
	GetActivityTask(ctx context.Context, in *sfn.GetActivityTaskInput, opts ...func(*sfn.Options)) (*sfn.GetActivityTaskOutput, error)
	SendTaskSuccess(ctx context.Context, in *sfn.SendTaskSuccessInput, opts ...func(*sfn.Options)) (*sfn.SendTaskSuccessOutput, error)
	SendTaskFailure(ctx context.Context, in *sfn.SendTaskFailureInput, opts ...func(*sfn.Options)) (*sfn.SendTaskFailureOutput, error)
}

// Workers run the two activities against the ledger.
type Workers struct {
	API       ActivityAPI
	Starter   *idemsfn.Starter
	Ledger    *Ledger
	DebitArn  string
	CreditArn string
	Log       *slog.Logger
	// Poll is the pause after an empty GetActivityTask; AWS long-polls
	// for a minute, stepfunctions-local answers at once.
	Poll time.Duration
}

// Run polls both activities until ctx is done.
func (w *Workers) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() { defer close(done); w.loop(ctx, w.DebitArn, w.debit) }()
	w.loop(ctx, w.CreditArn, w.credit)
	<-done
}

func (w *Workers) loop(ctx context.Context, arn string, work func(context.Context, idemsfn.Envelope, idem.StoreKey, Transfer) (any, *taskError)) {
	for ctx.Err() == nil {
		task, err := w.API.GetActivityTask(ctx, &sfn.GetActivityTaskInput{ActivityArn: aws.String(arn), WorkerName: aws.String("payments")})
		if err != nil || task.TaskToken == nil {
			if err != nil && ctx.Err() == nil {
				w.Log.Warn("polling an activity", "activity", arn, "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(w.Poll):
			}
			continue
		}
		env, key, err := idemsfn.ParseEnvelope([]byte(aws.ToString(task.Input)))
		var tr Transfer
		if err == nil {
			err = json.Unmarshal(env.Input, &tr)
		}
		var out any
		var fail *taskError
		if err != nil {
			fail = &taskError{name: "BadInput", cause: err.Error()}
		} else {
			out, fail = work(ctx, env, key, tr)
		}
		if fail != nil {
			_, err = w.API.SendTaskFailure(ctx, &sfn.SendTaskFailureInput{TaskToken: task.TaskToken, Error: aws.String(fail.name), Cause: aws.String(fail.cause)})
		} else {
			b, _ := json.Marshal(out)
			_, err = w.API.SendTaskSuccess(ctx, &sfn.SendTaskSuccessInput{TaskToken: task.TaskToken, Output: aws.String(string(b))})
		}
		if err != nil && ctx.Err() == nil {
			w.Log.Warn("reporting an activity task", "activity", arn, "err", err)
		}
	}
}

type taskError struct{ name, cause string }

// debit takes the amount from the payer. Insufficient funds fail the
// transfer: the record is marked FAILED through the claim's token (the
// execution then fails too), so every duplicate gets that answer.
func (w *Workers) debit(ctx context.Context, env idemsfn.Envelope, _ idem.StoreKey, tr Transfer) (any, *taskError) {
	err := w.Ledger.Post("debit/"+env.Idem.Key, tr.From, -tr.Amount)
	if errors.Is(err, ErrInsufficientFunds) {
		if ferr := w.Starter.Fail(ctx, env.Idem.Token, "InsufficientFunds", err.Error()); ferr != nil {
			w.Log.Error("recording a failed transfer", "key", env.Idem.Key, "err", ferr)
		}
		return nil, &taskError{name: "InsufficientFunds", cause: err.Error()}
	}
	if err != nil {
		return nil, &taskError{name: "LedgerError", cause: err.Error()}
	}
	return map[string]int64{"debited": tr.Amount}, nil
}

// credit pays the payee and, as the workflow's last step, completes the
// key with the receipt.
func (w *Workers) credit(ctx context.Context, env idemsfn.Envelope, key idem.StoreKey, tr Transfer) (any, *taskError) {
	if err := w.Ledger.Post("credit/"+env.Idem.Key, tr.To, tr.Amount); err != nil {
		return nil, &taskError{name: "LedgerError", cause: err.Error()}
	}
	rc := Receipt{Transfer: idemsfn.ExecutionName(key), From: tr.From, To: tr.To, Amount: tr.Amount, Status: "settled"}
	b, _ := json.Marshal(rc)
	if err := w.Starter.Complete(ctx, env.Idem.Token, b); err != nil {
		// The execution still succeeds: the reconciler or the status
		// change event records its output.
		w.Log.Error("completing a transfer", "key", env.Idem.Key, "err", err)
	}
	return rc, nil
}
