package idemgrpc_test

// A handler that outlives its caller's deadline keeps its claim: the lease
// the deadline set is renewed while the handler runs, so a retry at another
// server on the same store is held off and gets the stored response; and a
// duplicate is told to come back on a delay that lets the guide's retry
// policy collect the response soon after it is stored.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemgrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
	"github.com/seed-a1b882c0/idem/idemgrpc/internal/ordertest"
	"github.com/seed-a1b882c0/idem/observe"
)

// Environment of TestLeaseServerChild, set by the tests that start it.
const (
	envChildRedis  = "IDEMGRPC_LEASE_REDIS"
	envChildPrefix = "IDEMGRPC_LEASE_PREFIX"
	envChildRuns   = "IDEMGRPC_LEASE_RUNS"
	envChildWork   = "IDEMGRPC_LEASE_WORK"
)

// guideServiceConfig is the service config of docs/grpc.md's client
// example, for the test service: the retry policy a reader copies.
func guideServiceConfig(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "grpc.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)grpc.WithDefaultServiceConfig\\(`(.*?)`\\)").FindSubmatch(b)
	if m == nil || !strings.Contains(string(m[1]), `"ABORTED"`) {
		t.Fatal("docs/grpc.md has no service config with a retry policy listing ABORTED")
	}
	return strings.ReplaceAll(string(m[1]), "shop.v1.Orders", ordertest.Service)
}

// TestLeaseServerChild is server A of TestHandlerOutlivingItsDeadline, in
// a process of its own: an engine on the parent's Redis (same key prefix),
// whose Create handler notes each execution in a file and works on for
// its time whatever its context says, as most handlers do.
func TestLeaseServerChild(t *testing.T) {
	if os.Getenv(envChildPrefix) == "" {
		t.Skip("run by TestHandlerOutlivingItsDeadline")
	}
	work, err := time.ParseDuration(os.Getenv(envChildWork))
	if err != nil {
		t.Fatal(err)
	}
	st := ordertest.RedisStoreAt(t, os.Getenv(envChildRedis), os.Getenv(envChildPrefix))
	e := newEnv(t, st, options{noClient: true})
	runs := &ordertest.Runs{Path: os.Getenv(envChildRuns)}
	e.orders.CreateFunc = func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		if err := runs.Add("A"); err != nil {
			return nil, err
		}
		time.Sleep(work) // on past the caller's deadline
		return structpb.NewStruct(map[string]any{"served_by": "A"})
	}
	ordertest.Ready(e.cc.Target())
	select {} // until the parent kills this process
}

// TestHandlerOutlivingItsDeadline: two processes, one Redis. Server A (a
// child process) runs a handler for 800ms; its caller's deadline is 300ms.
// The caller's retry, with the same key, goes to server B (this process):
// B does not run it again — A's lease, taken from the deadline, is renewed
// while A's handler runs — and the retry gets A's stored response.
func TestHandlerOutlivingItsDeadline(t *testing.T) {
	t.Parallel()
	addr := redisAddr(t)
	prefix := fmt.Sprintf("idemgrpc-lease-%d:", rand.Uint64())
	runs := &ordertest.Runs{Path: filepath.Join(t.TempDir(), "runs")}
	a := ordertest.StartChild(t, "TestLeaseServerChild", envChildRedis+"="+addr, envChildPrefix+"="+prefix,
		envChildRuns+"="+runs.Path, envChildWork+"=800ms")
	b := newEnv(t, ordertest.RedisStoreAt(t, addr, prefix), options{
		dialOptions: []grpc.DialOption{grpc.WithDefaultServiceConfig(guideServiceConfig(t))},
	})
	b.orders.CreateFunc = func(context.Context, *structpb.Struct) (*structpb.Struct, error) {
		if err := runs.Add("B"); err != nil {
			return nil, err
		}
		return structpb.NewStruct(map[string]any{"served_by": "B"})
	}
	c, err := idemrpc.NewClient(nil)
	if err != nil {
		t.Fatal(err)
	}
	ccA, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(c)))
	if err != nil {
		t.Fatal(err)
	}
	defer ccA.Close()

	key := idemgrpc.WithKey(context.Background(), fmt.Sprintf("order-%d", rand.Uint64()))
	ctx, cancel := context.WithTimeout(key, 300*time.Millisecond)
	_, err = ordertest.Call(ctx, ccA, ordertest.Create, ordertest.Order("o-1", 10))
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v, want DEADLINE_EXCEEDED", err)
	}
	// The caller retries at B, as the guide's client does (its retry policy
	// lists ABORTED), and again after the delay a refusal names, within 5s.
	var (
		out    *structpb.Struct
		header metadata.MD
	)
	until := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithDeadline(key, until)
		out, err = ordertest.Call(ctx, b.cc, ordertest.Create, ordertest.Order("o-1", 10), grpc.Header(&header))
		cancel()
		if status.Code(err) != codes.Aborted {
			break
		}
		d := retryDelay(status.Convert(err))
		if d <= 0 {
			t.Fatalf("retry at B: %v without a RetryInfo delay", err)
		}
		<-time.After(d)
	}
	if err != nil {
		t.Fatalf("retry at B: %v", err)
	}
	if !idemgrpc.Replayed(header) || out.GetFields()["served_by"].GetStringValue() != "A" {
		t.Fatalf("retry at B: %v (header %v), want A's response replayed", out, header)
	}
	if got := runs.Lines(); !slices.Equal(got, []string{"A"}) {
		t.Fatalf("executions %v, want A's alone", got)
	}
}

// TestGuideRetryPolicyCollectsTheStoredResponse: the client of docs/grpc.md,
// with its retry policy listing ABORTED, sends a duplicate to server B
// while server A (another engine on the same Redis) runs the first call
// (400ms; that caller's deadline is 5s). B answers ABORTED with a pushback
// of as long again as A has run — never A's caller's deadline — and the
// policy's attempts collect the stored response within one pushback of it
// being stored, well within the duplicate's own 2s deadline.
func TestGuideRetryPolicyCollectsTheStoredResponse(t *testing.T) {
	t.Parallel()
	addr := redisAddr(t)
	prefix := fmt.Sprintf("idemgrpc-policy-%d:", rand.Uint64())
	stored := &storedAt{}
	a := newEnv(t, ordertest.RedisStoreAt(t, addr, prefix), options{engine: idem.Config{Observer: stored}})
	started := make(chan struct{})
	a.orders.CreateFunc = func(context.Context, *structpb.Struct) (*structpb.Struct, error) {
		close(started)
		time.Sleep(400 * time.Millisecond)
		return structpb.NewStruct(map[string]any{"served_by": "A"})
	}
	attempts := &pushbacks{}
	b := newEnv(t, ordertest.RedisStoreAt(t, addr, prefix), options{
		dialOptions: []grpc.DialOption{grpc.WithDefaultServiceConfig(guideServiceConfig(t)), grpc.WithStatsHandler(attempts)},
	})

	key := idemgrpc.WithKey(context.Background(), fmt.Sprintf("order-%d", rand.Uint64()))
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(key, 5*time.Second)
		defer cancel()
		_, err := ordertest.Call(ctx, a.cc, ordertest.Create, ordertest.Order("o-1", 10))
		first <- err
	}()
	<-started
	<-time.After(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(key, 2*time.Second)
	defer cancel()
	var header metadata.MD
	out, err := ordertest.Call(ctx, b.cc, ordertest.Create, ordertest.Order("o-1", 10), grpc.Header(&header))
	got := time.Now()
	if err != nil {
		t.Fatalf("duplicate through the retry policy: %v (pushbacks %v)", err, attempts.list())
	}
	if err := <-first; err != nil {
		t.Fatalf("first call: %v", err)
	}
	if !idemgrpc.Replayed(header) || out.GetFields()["served_by"].GetStringValue() != "A" {
		t.Fatalf("duplicate: %v (header %v), want A's response replayed", out, header)
	}
	if a.orders.Creates.Load() != 1 || b.orders.Creates.Load() != 0 {
		t.Fatalf("executions: A %d, B %d", a.orders.Creates.Load(), b.orders.Creates.Load())
	}
	pb := attempts.list()
	if len(pb) == 0 {
		t.Fatal("the duplicate was never refused: it came after the outcome")
	}
	for _, d := range pb {
		if d > time.Second {
			t.Fatalf("pushbacks %v: one is past what A had run (at most 0.5s)", pb)
		}
	}
	// Within one pushback (the last one told) of the response being stored,
	// with 150ms for the round trips and the scheduler.
	if late := got.Sub(stored.at()); late > pb[len(pb)-1]+150*time.Millisecond {
		t.Fatalf("response collected %v after it was stored; pushbacks %v", late, pb)
	}
}

// storedAt notes when an engine's first Complete landed.
type storedAt struct {
	observe.Counters
	mu sync.Mutex
	t  time.Time
}

func (s *storedAt) StoreCall(op observe.StoreOp, d time.Duration, err error) {
	if op == observe.StoreComplete && err == nil {
		s.mu.Lock()
		if s.t.IsZero() {
			s.t = time.Now()
		}
		s.mu.Unlock()
	}
	s.Counters.StoreCall(op, d, err)
}

func (s *storedAt) at() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.t
}

// pushbacks is a client stats handler that notes the pushback trailer of
// every attempt the retry policy makes.
type pushbacks struct {
	mu sync.Mutex
	d  []time.Duration
}

func (p *pushbacks) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (p *pushbacks) HandleRPC(_ context.Context, s stats.RPCStats) {
	tr, ok := s.(*stats.InTrailer)
	if !ok {
		return
	}
	if v := tr.Trailer.Get(idemgrpc.PushbackMetadata); len(v) == 1 {
		if ms, err := strconv.Atoi(v[0]); err == nil {
			p.mu.Lock()
			p.d = append(p.d, time.Duration(ms)*time.Millisecond)
			p.mu.Unlock()
		}
	}
}
func (p *pushbacks) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (p *pushbacks) HandleConn(context.Context, stats.ConnStats)                       {}

func (p *pushbacks) list() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.d)
}
