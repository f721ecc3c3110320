package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// trips counts the commands sent but an EVAL, which follows an EVALSHA
// only when Redis lost the script (a SCRIPT FLUSH by another test on the
// same server).
type trips struct{ cmds atomic.Int64 }

func (c *trips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *trips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n != "hello" && n != "client" && n != "eval" {
			c.cmds.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *trips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestOneRoundTripPerStep: a step is one command (the fenced script), and
// a takeover returns the finished steps in the claim's own answer (SET NX
// GET, then the claim script), with nothing read besides.
func TestOneRoundTripPerStep(t *testing.T) {
	s, c := newStore(t, redisstore.Config{})
	ctx := context.Background()
	e, err := idem.New(s, &idem.Config{RenewInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	var cnt trips
	c.AddHook(&cnt)
	op := func(ctx context.Context) (string, error) {
		a, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { return "ch_1", nil })
		if err != nil {
			return "", err
		}
		b, err := idem.Step(ctx, "email", func(context.Context) (string, error) { return "sent", nil })
		return a + b, err
	}
	// The first call reads the clock and loads the scripts.
	if _, err := idem.Do(ctx, e, idem.Request{Operation: "order", Key: "warm"}, op); err != nil {
		t.Fatal(err)
	}
	before := cnt.cmds.Load()
	if _, err := idem.Do(ctx, e, idem.Request{Operation: "order", Key: "k1"}, op); err != nil {
		t.Fatal(err)
	}
	if n := cnt.cmds.Load() - before; n != 4 {
		t.Errorf("a call with two steps sent %d commands, want 4 (SET NX GET, a script per step, the Complete's)", n)
	}

	now := store.Millis(time.Now()) // the native expiry follows ExpiresAt
	claim := store.ClaimParams{Key: "k2", Fingerprint: "fp", Owner: "a", Now: now, LeaseUntil: now + 10, ExpiresAt: now + 60_000}
	res, err := s.Claim(ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	before = cnt.cmds.Load()
	if err := s.RecordStep(ctx, store.StepParams{ClaimRef: store.ClaimRef{Key: "k2", Fence: res.Record.Fence, Owner: "a", Now: now + 1}, Step: store.Step{Name: "charge", Result: []byte("ch_1"), At: now + 1}}); err != nil {
		t.Fatal(err)
	}
	if n := cnt.cmds.Load() - before; n != 1 {
		t.Errorf("RecordStep sent %d commands, want 1", n)
	}
	before = cnt.cmds.Load()
	claim.Owner, claim.Now = "b", now+10
	res, err = s.Claim(ctx, claim)
	if err != nil || !res.Takeover || len(res.Record.Steps) != 1 || string(res.Record.Steps[0].Result) != "ch_1" {
		t.Fatalf("takeover: %+v, %v; want the step carried", res, err)
	}
	if n := cnt.cmds.Load() - before; n != 2 {
		t.Errorf("a takeover sent %d commands, want 2 (SET NX GET, the claim script)", n)
	}
}

// TestStepsLayout: a record's steps are its IN_PROGRESS payload, and the
// record before them is laid out as without steps; Extend keeps them; a
// damaged step payload fails closed, for Get and for the next step.
func TestStepsLayout(t *testing.T) {
	s, c := newStore(t, redisstore.Config{})
	ctx := context.Background()
	now := store.Millis(time.Now()) // the native expiry follows ExpiresAt
	claim := store.ClaimParams{Key: "k", Fingerprint: "fp", Owner: "a", Now: now, LeaseUntil: now + 10, ExpiresAt: now + 60_000}
	res, err := s.Claim(ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	ref := store.ClaimRef{Key: "k", Fence: res.Record.Fence, Owner: "a", Now: now + 1}
	plain, err := c.Get(ctx, s.Prefix()+"k").Result()
	if err != nil {
		t.Fatal(err)
	}
	steps := []store.Step{
		{Name: "charge", Result: []byte("ch;1:"), At: now + 1},
		{Name: "mail", Err: &store.ErrorRecord{Code: "full", Message: "m", Body: []byte("b")}, At: now + 2},
		{Name: "none", At: now + 3},
	}
	for i, st := range steps {
		if err := s.RecordStep(ctx, store.StepParams{ClaimRef: ref, Index: i, Step: st}); err != nil {
			t.Fatal(err)
		}
	}
	v, err := c.Get(ctx, s.Prefix()+"k").Result()
	if err != nil {
		t.Fatal(err)
	}
	at := func(d int64) string { return strconv.FormatInt(now+d, 10) }
	want := plain + "3;" + "21;" + "6:charge" + at(1) + ";r5:ch;1:" + "4:mail" + at(2) + ";e4:full1:m1:b" + "4:none" + at(3) + ";n"
	if v != want {
		t.Fatalf("record with steps:\n%q\nwant\n%q", v, want)
	}
	if err := s.Extend(ctx, store.ExtendParams{ClaimRef: ref, LeaseUntil: now + 20, Ref: "exec-1"}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "k")
	if err != nil || len(got.Steps) != 3 || got.LeaseUntil != now+20 || got.Ref != "exec-1" || got.Steps[2].Result != nil || got.Steps[1].Err.Code != "full" {
		t.Fatalf("after Extend: %+v, %v; want the steps kept", got, err)
	}
	for _, bad := range []string{"3;22;", "x;0;", "2;21;"} { // size, count, steps not as counted
		v, _ := c.Get(ctx, s.Prefix()+"k").Result()
		i := strings.Index(v, "3;21;")
		if err := c.Set(ctx, s.Prefix()+"k2", v[:i]+bad+v[i+5:], 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "k2"); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("Get of a record whose steps start %q: %v, want ErrCorrupt", bad, err)
		}
	}
}
