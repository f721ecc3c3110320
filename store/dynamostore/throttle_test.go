package dynamostore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
)

// throttleProxy is a fault proxy: an HTTP reverse proxy in front of
// DynamoDB Local that answers the next requests it is told to with a
// throttling error, as DynamoDB does when a table or the account is over
// its capacity, and forwards the others.
type throttleProxy struct {
	*httptest.Server
	code      atomic.Pointer[string]
	left      atomic.Int64 // requests still to throttle
	throttled atomic.Int64 // requests answered with a throttling error
	forwarded atomic.Int64
}

func newThrottleProxy(t *testing.T, ep string) *throttleProxy {
	target, err := url.Parse(ep)
	if err != nil {
		t.Fatal(err)
	}
	p := &throttleProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = transport
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.left.Add(-1) >= 0 {
			p.throttled.Add(1)
			code := *p.code.Load()
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"__type":"com.amazonaws.dynamodb.v20120810#%s","message":"fault proxy: %s"}`, code, code)
			return
		}
		p.forwarded.Add(1)
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

// throttle makes the next n requests fail with code.
func (p *throttleProxy) throttle(code string, n int) {
	p.code.Store(&code)
	p.left.Store(int64(n))
}

// storeCalls is an Observer that counts store calls by operation and
// result, as the exporters label them.
type storeCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *storeCalls) Observe(string, observe.Outcome) {}
func (c *storeCalls) StoreCall(op observe.StoreOp, _ time.Duration, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[string(op)+"/"+string(observe.StoreResultOf(err))]++
}

func (c *storeCalls) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

// DynamoDB's throttling (ProvisionedThroughputExceededException,
// ThrottlingException, RequestLimitExceeded) answered by a fault proxy in
// front of DynamoDB Local: the SDK's standard retryer retries it with
// backoff, so a call throttled fewer times than its attempts succeeds;
// one throttled past them fails with store.ErrThrottled (also
// unavailable: the operation does not run), counted under the "throttled"
// label; an outcome write throttled past the SDK's attempts is retried by
// the engine and recorded. Nothing runs twice, nothing is lost.
func TestThrottling(t *testing.T) {
	ep := testenv.DynamoDB(t)
	direct := dynamotest.NewClient(ep)
	cfg := newTable(t, direct, dynamostore.Config{})
	p := newThrottleProxy(t, ep)
	attempts := 0
	c := dynamotest.NewClient(p.URL, func(o *dynamodb.Options) {
		// The SDK's standard retryer (3 attempts, exponential jittered
		// backoff), its pauses cut from up to 20 s to 10 ms for the test.
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.Backoff = retry.NewExponentialJitterBackoff(10 * time.Millisecond)
			attempts = so.MaxAttempts
		})
	})
	s, err := dynamostore.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var calls storeCalls
	// ClockSync off: the test counts each call's requests and throttles the
	// next ones; the measurement of the store's clock is TestClockSkew's.
	e, err := idem.New(s, &idem.Config{RenewInterval: -1, Observer: &calls, WriteTimeout: 10 * time.Second, ClockSync: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	runs := map[string]int{}
	call := func(key string, during func()) (idem.Result[string], error) {
		return idem.Do(ctx, e, idem.Request{Operation: "op", Key: key}, func(context.Context) (string, error) {
			runs[key]++
			if during != nil {
				during()
			}
			return "done " + key, nil
		})
	}

	for _, code := range []string{"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"} {
		// Throttled once less than the SDK tries: the claim succeeds.
		p.throttle(code, attempts-1)
		before := p.forwarded.Load()
		if res, err := call("retried-"+code, nil); err != nil || res.Value != "done retried-"+code || res.Recorded != idem.StatusCompleted {
			t.Fatalf("%s: call throttled %d times: %+v %v", code, attempts-1, res, err)
		}
		if n := p.forwarded.Load() - before; n != 2 {
			t.Errorf("%s: %d requests reached DynamoDB, want 2 (the claim after its throttles, the complete)", code, n)
		}

		// Throttled past the SDK's attempts: the claim fails, throttled.
		p.throttle(code, attempts)
		_, err := call("refused-"+code, nil)
		if !errors.Is(err, store.ErrThrottled) || !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), code) {
			t.Fatalf("%s: claim throttled %d times: %v, want ErrThrottled", code, attempts, err)
		}
		if runs["refused-"+code] != 0 {
			t.Fatalf("%s: the operation ran without a claim", code)
		}
	}
	if n := calls.get("claim/throttled"); n != 3 {
		t.Errorf("claims counted throttled: %d, want 3 (%v)", n, calls.n)
	}

	// The outcome write throttled past the SDK's attempts: the engine
	// retries it, and the outcome is recorded once.
	res, err := call("complete", func() { p.throttle("ThrottlingException", attempts+1) })
	if err != nil || res.Recorded != idem.StatusCompleted {
		t.Fatalf("call whose complete was throttled %d times: %+v %v", attempts+1, res, err)
	}
	if n, ok := calls.get("complete/throttled"), calls.get("complete/ok"); n != 1 || ok != 4 {
		t.Errorf("completes counted throttled %d, ok %d; want 1 and 4 (%v)", n, ok, calls.n)
	}
	for key, n := range runs {
		if n > 1 {
			t.Errorf("%s ran %d times", key, n)
		}
	}
	for _, key := range []string{"complete", "retried-ThrottlingException"} {
		res, err := call(key, nil)
		if err != nil || !res.Replayed || res.Value != "done "+key {
			t.Errorf("replay of %s: %+v %v", key, res, err)
		}
	}
	if p.throttled.Load() != int64(3*(2*attempts-1)+attempts+1) {
		t.Errorf("the proxy throttled %d requests, want %d", p.throttled.Load(), 3*(2*attempts-1)+attempts+1)
	}
}
