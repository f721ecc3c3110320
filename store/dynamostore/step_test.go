package dynamostore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/dynamotest"
)

const stepT0 = int64(1_000_000)

func stepClaim(t *testing.T, s *dynamostore.Store, key, owner, fp string, now, leaseUntil int64) store.ClaimResult {
	t.Helper()
	res, err := s.Claim(context.Background(), store.ClaimParams{Key: key, Owner: owner, Fingerprint: fp, Now: now, LeaseUntil: leaseUntil, ExpiresAt: stepT0 + 3_600_000})
	if err != nil {
		t.Fatalf("claim by %s: %v", owner, err)
	}
	return res
}

func step(s *dynamostore.Store, r *store.Record, i int, name string, result []byte, er *store.ErrorRecord, now int64) error {
	return s.RecordStep(context.Background(), store.StepParams{
		ClaimRef: store.ClaimRef{Key: r.Key, Fence: r.Fence, Owner: r.Owner, Now: now},
		Index:    i, Step: store.Step{Name: name, Result: result, Err: er, At: now}})
}

func names(steps []store.Step) string {
	var s string
	for i, st := range steps {
		if i > 0 {
			s += ","
		}
		s += st.Name
	}
	return s
}

// Through the engine: an operation that fails with an ordinary error
// after its first step keeps the step (its lease ended, not its claim
// released); the retry takes the key over, gets the charge's result with
// its claim without running it again, runs the email, and completes,
// which drops the steps.
func TestStepsResumeThroughTheEngine(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, dynamotest.NewClient(testenv.DynamoDB(t)), dynamostore.Config{})
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	var charges, emails int
	req := idem.Request{Operation: "checkout", Key: "order-1", Payload: []byte(`{"amount":5}`)}
	op := func(fail bool) func(context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { charges++; return fmt.Sprint("ch_", charges), nil })
			if err != nil {
				return "", err
			}
			if fail {
				return "", errors.New("mail server unreachable")
			}
			if _, err := idem.Step(ctx, "email", func(context.Context) (bool, error) { emails++; return true, nil }); err != nil {
				return "", err
			}
			return "done:" + id, nil
		}
	}
	if _, err := idem.Do(ctx, e, req, op(true)); err == nil {
		t.Fatal("the failing run: no error")
	}
	res, err := idem.Do(ctx, e, req, op(false))
	if err != nil || res.Value != "done:ch_1" || res.Fence != 2 || charges != 1 || emails != 1 {
		t.Fatalf("the retry: %+v %v, %d charges, %d emails; want done:ch_1 at fence 2, one of each", res, err, charges, emails)
	}
	rec, err := s.Get(ctx, res.StoreKey)
	if err != nil || rec.Status != store.StatusCompleted || len(rec.Steps) != 0 {
		t.Fatalf("record after the retry: %+v %v, want COMPLETED without steps", rec, err)
	}
}

// A step is one request, a retried step one (answered from the item the
// refusal returns), and a takeover that resumes two: the steps come back
// with the takeover's own request.
func TestStepRequests(t *testing.T) {
	ep := testenv.DynamoDB(t)
	var cnt counter
	s := newStore(t, dynamotest.NewClient(ep), dynamostore.Config{})
	s, _ = dynamostore.New(dynamotest.NewClient(ep, cnt.option), s.Config())
	rec := stepClaim(t, s, "k", "a", "f", stepT0, stepT0+10).Record
	for _, c := range []struct {
		what string
		i    int
		name string
	}{{"a step", 0, "charge"}, {"the next step", 1, "email"}, {"a retried step", 1, "email"}} {
		before := cnt.n.Load()
		if err := step(s, rec, c.i, c.name, []byte(c.name), nil, stepT0+1); err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if got := cnt.n.Load() - before; got != 1 {
			t.Errorf("%s made %d requests, want 1", c.what, got)
		}
	}
	before := cnt.n.Load()
	res := stepClaim(t, s, "k", "b", "f", stepT0+20, stepT0+30)
	if got := cnt.n.Load() - before; got != 2 {
		t.Errorf("a takeover that resumes made %d requests, want 2", got)
	}
	if !res.Takeover || names(res.Record.Steps) != "charge,email" {
		t.Errorf("takeover: Takeover=%v, steps %q; want charge,email", res.Takeover, names(res.Record.Steps))
	}
}

// A takeover decides on the item as it finds it, steps included, when
// another process's claim lands between its two requests: it keeps steps
// only when the current item is a takeover under its own fingerprint, and
// its answer says what the item holds.
func TestTakeoverStepsWhenTheItemChangesUnderIt(t *testing.T) {
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	for _, tc := range []struct {
		name       string
		firstFP    string // the item the racer sees
		otherFP    string // the claim taken between its requests
		otherLease int64
		otherSteps int // steps the other claim records (over any it keeps)
		acquired   bool
		wantSteps  string
		wantWrites int
	}{
		// Seen: a resume. The item became another fingerprint's: a third
		// request takes it over without steps.
		{"resume, then another fingerprint", "f", "g", 1, 0, true, "", 3},
		// Seen: a resume. The item was taken over under the same
		// fingerprint, which recorded a step: kept with the others.
		{"resume, then the same fingerprint", "f", "f", 1, 1, true, "charge,s1", 2},
		// Seen: a resume. The other claim is live: a conflict.
		{"resume, then a live claim", "f", "g", 1_000, 0, false, "", 2},
		// Seen: another fingerprint's. The item became a resume with a
		// step: the plain takeover removes it, and says so.
		{"no resume, then the same fingerprint", "g", "f", 1, 1, true, "", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, c, dynamostore.Config{})
			first := stepClaim(t, s, "k", "first", tc.firstFP, stepT0, stepT0+1).Record
			if err := step(s, first, 0, "charge", []byte("ch_1"), nil, stepT0); err != nil {
				t.Fatal(err)
			}
			api := &interleaving{API: c}
			api.between = func(n int) {
				if n != 1 {
					return
				}
				now := stepT0 + 10
				res := stepClaim(t, s, "k", "other", tc.otherFP, now, now+tc.otherLease)
				if !res.Takeover {
					t.Fatalf("the claim between the racer's requests did not take over: %+v", res)
				}
				for i := range tc.otherSteps {
					j := len(res.Record.Steps) + i
					if err := step(s, res.Record, j, fmt.Sprint("s", j), nil, nil, now); err != nil {
						t.Fatal(err)
					}
				}
			}
			racer, err := dynamostore.New(api, s.Config())
			if err != nil {
				t.Fatal(err)
			}
			res := stepClaim(t, racer, "k", "racer", "f", stepT0+100, stepT0+200)
			if res.Acquired != tc.acquired || res.Acquired && (!res.Takeover || res.Record.Fence != 3) {
				t.Fatalf("claim = %+v, record %+v; want acquired %v (a takeover, fence 3)", res, res.Record, tc.acquired)
			}
			got, err := s.Get(context.Background(), "k")
			if err != nil {
				t.Fatal(err)
			}
			if tc.acquired && (names(res.Record.Steps) != tc.wantSteps || names(got.Steps) != tc.wantSteps) {
				t.Errorf("steps: answer %q, item %q; want %q in both", names(res.Record.Steps), names(got.Steps), tc.wantSteps)
			}
			if !tc.acquired && (res.Record.Owner != "other" || got.Owner != "other") {
				t.Errorf("conflict with %s, item held by %s; want other", res.Record.Owner, got.Owner)
			}
			if api.n != tc.wantWrites {
				t.Errorf("claim sent %d writes, want %d", api.n, tc.wantWrites)
			}
		})
	}
}

// The item layout of steps: a list of maps under "steps" (name, at, and
// data or the error's attributes), their size in "steps_bytes", both
// removed by Complete.
func TestStepItemLayout(t *testing.T) {
	ctx := context.Background()
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	s := newStore(t, c, dynamostore.Config{})
	rec := stepClaim(t, s, "k", "a", "f", stepT0, stepT0+10).Record
	if err := step(s, rec, 0, "charge", []byte("ch_1"), nil, stepT0+1); err != nil {
		t.Fatal(err)
	}
	if err := step(s, rec, 1, "email", nil, &store.ErrorRecord{Code: "refused", Message: "full", Body: []byte("552")}, stepT0+2); err != nil {
		t.Fatal(err)
	}
	item := func() map[string]types.AttributeValue {
		out, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.Config().Table), ConsistentRead: aws.Bool(true),
			Key: map[string]types.AttributeValue{s.Config().KeyAttr: &types.AttributeValueMemberS{Value: "k"}}})
		if err != nil {
			t.Fatal(err)
		}
		return out.Item
	}
	it := item()
	l, ok := it["steps"].(*types.AttributeValueMemberL)
	if !ok || len(l.Value) != 2 {
		t.Fatalf("steps attribute %#v, want a list of 2", it["steps"])
	}
	want := []map[string]string{
		{"name": "S:charge", "at": "N:1000001", "data": "B:ch_1"},
		{"name": "S:email", "at": "N:1000002", "error_code": "S:refused", "error_message": "S:full", "error_body": "B:552"},
	}
	for i, v := range l.Value {
		m, ok := v.(*types.AttributeValueMemberM)
		if !ok {
			t.Fatalf("steps[%d] is %T, want a map", i, v)
		}
		got := map[string]string{}
		for k, a := range m.Value {
			switch a := a.(type) {
			case *types.AttributeValueMemberS:
				got[k] = "S:" + a.Value
			case *types.AttributeValueMemberN:
				got[k] = "N:" + a.Value
			case *types.AttributeValueMemberB:
				got[k] = "B:" + string(a.Value)
			default:
				got[k] = fmt.Sprintf("%T", a)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want[i]) {
			t.Errorf("steps[%d] = %v, want %v", i, got, want[i])
		}
	}
	// "charge"+"ch_1" and "email"+"full"+"552": store.Step.Size.
	if n, ok := it["steps_bytes"].(*types.AttributeValueMemberN); !ok || n.Value != "22" {
		t.Errorf("steps_bytes = %#v, want N 22", it["steps_bytes"])
	}
	if err := s.Complete(ctx, store.CompleteParams{ClaimRef: store.ClaimRef{Key: "k", Fence: rec.Fence, Owner: rec.Owner, Now: stepT0 + 3}, ExpiresAt: stepT0 + 3_600_000, Result: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	it = item()
	for _, a := range []string{"steps", "steps_bytes"} {
		if _, ok := it[a]; ok {
			t.Errorf("COMPLETED item keeps %s", a)
		}
	}
}

// Steps within MaxResultBytes but an item over DynamoDB's 400 KB (the
// limit raised to the item's own, which leaves no room for the other
// attributes) are refused by DynamoDB: a *store.TooLargeError, and the
// item keeps the steps it had.
func TestStepOverTheItemLimit(t *testing.T) {
	c := dynamotest.NewClient(testenv.DynamoDB(t))
	s := newStore(t, c, dynamostore.Config{MaxResultBytes: dynamostore.MaxItemBytes})
	rec := stepClaim(t, s, "k", "a", "f", stepT0, stepT0+10).Record
	if err := step(s, rec, 0, "one", make([]byte, 300_000), nil, stepT0); err != nil {
		t.Fatal(err)
	}
	err := step(s, rec, 1, "two", make([]byte, dynamostore.MaxItemBytes-300_000-6), nil, stepT0)
	var tl *store.TooLargeError
	if !errors.As(err, &tl) || !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("a step filling MaxItemBytes: %v, want a *TooLargeError", err)
	}
	got, err := s.Get(context.Background(), "k")
	if err != nil || names(got.Steps) != "one" {
		t.Fatalf("after the refused step: %v, steps %q; want one", err, names(got.Steps))
	}
}
