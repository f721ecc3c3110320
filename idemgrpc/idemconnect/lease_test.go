package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/seed-a1b882c0/idem/idemgrpc/internal/ordertest"
)

// Environment of TestLeaseServerChild, set by the test that starts it.
const (
	envChildRedis  = "IDEMCONNECT_LEASE_REDIS"
	envChildPrefix = "IDEMCONNECT_LEASE_PREFIX"
	envChildRuns   = "IDEMCONNECT_LEASE_RUNS"
)

// TestLeaseServerChild is server A of TestHandlerOutlivingItsDeadline, in
// a process of its own: an engine on the parent's Redis (same key prefix),
// whose Create handler notes each execution in a file and works on for
// 800ms whatever its context says, as most handlers do.
func TestLeaseServerChild(t *testing.T) {
	if os.Getenv(envChildPrefix) == "" {
		t.Skip("run by TestHandlerOutlivingItsDeadline")
	}
	e := newEnv(t, ordertest.RedisStoreAt(t, os.Getenv(envChildRedis), os.Getenv(envChildPrefix)), nil)
	runs := &ordertest.Runs{Path: os.Getenv(envChildRuns)}
	e.orders.CreateFunc = func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		if err := runs.Add("A"); err != nil {
			return nil, err
		}
		time.Sleep(800 * time.Millisecond) // on past the caller's deadline
		return structpb.NewStruct(map[string]any{"served_by": "A"})
	}
	ordertest.Ready(e.url)
	select {} // until the parent kills this process
}

// TestHandlerOutlivingItsDeadline: two processes, one Redis, over Connect.
// Server A (a child process) runs a handler for 800ms; its caller's
// deadline (Connect-Timeout-Ms) is 300ms. The caller's retry, with the same
// key, goes to server B (this process): B does not run it again — A's
// lease, taken from the deadline, is renewed while A's handler runs — and,
// coming back after the delay each refusal names, the retry gets A's
// stored response.
func TestHandlerOutlivingItsDeadline(t *testing.T) {
	t.Parallel()
	addr := redisAddr(t)
	prefix := fmt.Sprintf("idemconnect-lease-%d:", rand.Uint64())
	runs := &ordertest.Runs{Path: filepath.Join(t.TempDir(), "runs")}
	urlA := ordertest.StartChild(t, "TestLeaseServerChild", envChildRedis+"="+addr, envChildPrefix+"="+prefix,
		envChildRuns+"="+runs.Path)
	b := newEnv(t, ordertest.RedisStoreAt(t, addr, prefix), nil)
	b.orders.CreateFunc = func(context.Context, *structpb.Struct) (*structpb.Struct, error) {
		if err := runs.Add("B"); err != nil {
			return nil, err
		}
		return structpb.NewStruct(map[string]any{"served_by": "B"})
	}
	key := fmt.Sprintf("order-%d", rand.Uint64())
	call := func(ctx context.Context, c *connect.Client[structpb.Struct, structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		req := connect.NewRequest(ordertest.Order("o-1", 10))
		req.Header().Set("Idempotency-Key", key)
		return c.CallUnary(ctx, req)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := call(ctx, connect.NewClient[structpb.Struct, structpb.Struct](b.http, urlA+ordertest.Create))
	cancel()
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("first call: %v, want deadline_exceeded", err)
	}
	var res *connect.Response[structpb.Struct]
	until := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithDeadline(context.Background(), until)
		res, err = call(ctx, b.create)
		cancel()
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeAborted {
			break
		}
		var delay time.Duration
		for _, d := range ce.Details() {
			if v, err := d.Value(); err == nil {
				if ri, ok := v.(*errdetails.RetryInfo); ok {
					delay = ri.GetRetryDelay().AsDuration()
				}
			}
		}
		if delay <= 0 {
			t.Fatalf("retry at B: %v without a RetryInfo delay", err)
		}
		<-time.After(delay)
	}
	if err != nil {
		t.Fatalf("retry at B: %v", err)
	}
	if !replayed(res.Header()) || res.Msg.GetFields()["served_by"].GetStringValue() != "A" {
		t.Fatalf("retry at B: %v (header %v), want A's response replayed", res.Msg, res.Header())
	}
	if got := runs.Lines(); !slices.Equal(got, []string{"A"}) {
		t.Fatalf("executions %v, want A's alone", got)
	}
}
