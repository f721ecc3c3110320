package idemsfn_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/store"
)

// countingAPI counts the Step Functions calls a Starter makes.
type countingAPI struct {
	idemsfn.API
	n atomic.Int64
}

func (c *countingAPI) StartExecution(ctx context.Context, in *sfn.StartExecutionInput, opts ...func(*sfn.Options)) (*sfn.StartExecutionOutput, error) {
	c.n.Add(1)
	return c.API.StartExecution(ctx, in, opts...)
}

func (c *countingAPI) DescribeExecution(ctx context.Context, in *sfn.DescribeExecutionInput, opts ...func(*sfn.Options)) (*sfn.DescribeExecutionOutput, error) {
	c.n.Add(1)
	return c.API.DescribeExecution(ctx, in, opts...)
}

func (c *countingAPI) ListExecutions(ctx context.Context, in *sfn.ListExecutionsInput, opts ...func(*sfn.Options)) (*sfn.ListExecutionsOutput, error) {
	c.n.Add(1)
	return c.API.ListExecutions(ctx, in, opts...)
}

// BenchmarkStart compares a bare StartExecution with Start (claim +
// StartExecution + attach) and with a duplicate Start (claim only), against
// stepfunctions-local, on memstore and Redis. store-calls/op and
// sfn-calls/op are the round trips per call.
//
//	scripts/stepfunctions-local run sh -c 'cd idemsfn && go test -run "^$" -bench Start -benchtime 2s -count 3'
func BenchmarkStart(b *testing.B) {
	c := sfnClient(b)
	machine := newMachine(b, c, passMachine)
	input := map[string]any{"order": "o-1", "amount": 1250}
	inputJSON, _ := json.Marshal(input)

	b.Run("StartExecution", func(b *testing.B) {
		prefix := unique("bare")
		i := 0
		for b.Loop() {
			i++
			if _, err := c.StartExecution(ctx, &sfn.StartExecutionInput{StateMachineArn: aws.String(machine),
				Name: aws.String(prefix + "-" + strconv.Itoa(i)), Input: aws.String(string(inputJSON))}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(1, "sfn-calls/op")
	})
	for _, k := range []struct {
		name string
		make func(testing.TB) store.Store
	}{
		{"memstore", stores[0].make},
		{"redisstore", func(t testing.TB) store.Store { return newRedisStore(t) }},
	} {
		bench := func(b *testing.B, duplicate bool) {
			r := newRig(b, k.make(b))
			api := &countingAPI{API: c}
			s := r.starter(b, api, machine, idemsfn.Config{})
			prefix := unique("k")
			if duplicate {
				if _, err := s.Start(ctx, req(prefix), input); err != nil {
					b.Fatal(err)
				}
			}
			calls, sfnCalls := r.fs.Total(), api.n.Load()
			i := 0
			for b.Loop() {
				i++
				k := prefix
				if !duplicate {
					k = prefix + "-" + strconv.Itoa(i)
				}
				got, err := s.Start(ctx, req(k), input)
				if err != nil {
					b.Fatal(err)
				}
				if got.State.Status != idem.StatusInProgress || got.ExecutionArn == "" || got.Acquired == duplicate {
					b.Fatalf("Start = %+v", got)
				}
			}
			b.ReportMetric(float64(r.fs.Total()-calls)/float64(i), "store-calls/op")
			b.ReportMetric(float64(api.n.Load()-sfnCalls)/float64(i), "sfn-calls/op")
		}
		b.Run("Start/"+k.name, func(b *testing.B) { bench(b, false) })
		b.Run("Duplicate/"+k.name, func(b *testing.B) { bench(b, true) })
	}
}
