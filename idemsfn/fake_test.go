package idemsfn_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sfn/types"
)

// fakeSFN is an in-memory Step Functions with AWS's semantics for the
// three calls a Starter makes, for the tests that need no server: a start
// with the name and input of a running execution answers with that
// execution; any other start with a used name fails with
// ExecutionAlreadyExists. Faults are injected per call.
type fakeSFN struct {
	// region is put in execution ARNs instead of the state machine's, as
	// stepfunctions-local does with "local", when not empty.
	region string

	mu    sync.Mutex
	execs map[string]*fakeExec // by name
	names []string             // in start order
	calls map[string]int
	// startFault, when set, is asked before each StartExecution (n counts
	// from 1): a non-nil error fails the call; applied true applies the
	// start first (a lost reply).
	startFault func(n int) (err error, applied bool)
	// describeFault, when set, fails DescribeExecution calls.
	describeFault func(arn string) error
}

type fakeExec struct {
	arn, name, input, output, errName, cause string
	status                                   types.ExecutionStatus
}

func newFakeSFN() *fakeSFN {
	return &fakeSFN{execs: map[string]*fakeExec{}, calls: map[string]int{}}
}

func (f *fakeSFN) count(call string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[call]
}

func (f *fakeSFN) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

// executions returns how many executions have name.
func (f *fakeSFN) executions(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, x := range f.names {
		if x == name {
			n++
		}
	}
	return n
}

// only returns the one execution started, or panics.
func (f *fakeSFN) only() fakeExec {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.names) != 1 {
		panic(fmt.Sprintf("%d executions, want 1", len(f.names)))
	}
	return *f.execs[f.names[0]]
}

// finish ends the execution named name.
func (f *fakeSFN) finish(name string, status types.ExecutionStatus, output, errName, cause string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	x := f.execs[name]
	x.status, x.output, x.errName, x.cause = status, output, errName, cause
}

// put adds an execution as if started by someone else.
func (f *fakeSFN) put(sm, name, input string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.start(sm, name, input).arn
}

func (f *fakeSFN) start(sm, name, input string) *fakeExec {
	p := strings.Split(sm, ":")
	if f.region != "" {
		p[3] = f.region
	}
	x := &fakeExec{arn: strings.Join(p[:5], ":") + ":execution:" + p[6] + ":" + name, name: name, input: input, status: types.ExecutionStatusRunning}
	f.execs[name] = x
	f.names = append(f.names, name)
	return x
}

func (f *fakeSFN) StartExecution(_ context.Context, in *sfn.StartExecutionInput, _ ...func(*sfn.Options)) (*sfn.StartExecutionOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["start"]++
	apply := func() (*sfn.StartExecutionOutput, error) {
		name, input := aws.ToString(in.Name), aws.ToString(in.Input)
		if x, ok := f.execs[name]; ok {
			if x.status == types.ExecutionStatusRunning && x.input == input {
				return &sfn.StartExecutionOutput{ExecutionArn: aws.String(x.arn), StartDate: aws.Time(time.Now())}, nil
			}
			return nil, &types.ExecutionAlreadyExists{Message: aws.String("Execution Already Exists: '" + x.arn + "'")}
		}
		x := f.start(aws.ToString(in.StateMachineArn), name, input)
		return &sfn.StartExecutionOutput{ExecutionArn: aws.String(x.arn), StartDate: aws.Time(time.Now())}, nil
	}
	if f.startFault != nil {
		if err, applied := f.startFault(f.calls["start"]); err != nil {
			if applied {
				_, _ = apply()
			}
			return nil, err
		}
	}
	return apply()
}

func (f *fakeSFN) DescribeExecution(_ context.Context, in *sfn.DescribeExecutionInput, _ ...func(*sfn.Options)) (*sfn.DescribeExecutionOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["describe"]++
	arn := aws.ToString(in.ExecutionArn)
	if f.describeFault != nil {
		if err := f.describeFault(arn); err != nil {
			return nil, err
		}
	}
	for _, x := range f.execs {
		if x.arn == arn {
			out := &sfn.DescribeExecutionOutput{ExecutionArn: aws.String(x.arn), Name: aws.String(x.name), Input: aws.String(x.input), Status: x.status}
			if x.output != "" {
				out.Output = aws.String(x.output)
			}
			if x.errName != "" {
				out.Error = aws.String(x.errName)
			}
			if x.cause != "" {
				out.Cause = aws.String(x.cause)
			}
			return out, nil
		}
	}
	return nil, &types.ExecutionDoesNotExist{Message: aws.String("Execution Does Not Exist: '" + arn + "'")}
}

func (f *fakeSFN) ListExecutions(_ context.Context, in *sfn.ListExecutionsInput, _ ...func(*sfn.Options)) (*sfn.ListExecutionsOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["list"]++
	from, _ := strconv.Atoi(aws.ToString(in.NextToken))
	size := int(in.MaxResults)
	if size <= 0 || size > 2 {
		size = 2 // small pages, so paging is exercised
	}
	out := &sfn.ListExecutionsOutput{}
	for i := from; i < len(f.names) && i < from+size; i++ {
		x := f.execs[f.names[i]]
		out.Executions = append(out.Executions, types.ExecutionListItem{ExecutionArn: aws.String(x.arn), Name: aws.String(x.name), Status: x.status})
	}
	if from+size < len(f.names) {
		out.NextToken = aws.String(strconv.Itoa(from + size))
	}
	return out, nil
}

// byArn returns the execution arn.
func (f *fakeSFN) byArn(arn string) fakeExec {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, x := range f.execs {
		if x.arn == arn {
			return *x
		}
	}
	panic("no execution " + arn)
}
