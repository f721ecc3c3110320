package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// stepEnc is a step as layout.go lays it out.
func stepEnc(st store.Step) string {
	sized := func(s string) string { return strconv.Itoa(len(s)) + ":" + s }
	v := sized(st.Name) + strconv.FormatInt(st.At, 10) + ";"
	switch {
	case st.Err != nil:
		return v + "e" + sized(st.Err.Code) + sized(st.Err.Message) + sized(string(st.Err.Body))
	case st.Result != nil:
		return v + "r" + sized(string(st.Result))
	}
	return v + "n"
}

// appends is how many APPENDs the server has run (INFO commandstats).
func appends(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	txt, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(txt, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_append:calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}

// TestLongStepsAppendInPlace: on a record longer than the head a step
// reads first, a step is written in place (the header overwritten, the
// step appended), to the very bytes the whole rewrite writes; a header
// that changes length (10 steps, a size past 1000) is rewritten whole; the
// key keeps its expiry; a retry changes nothing; and the refusals (order,
// size, another claim, expiry) are those of a short record. A user whose
// ACL lacks GETRANGE, SETRANGE or APPEND records the same steps through
// the whole rewrite.
func TestLongStepsAppendInPlace(t *testing.T) {
	const maxResult = 6000
	run := func(t *testing.T, s *redisstore.Store, c *redis.Client, inPlace bool) {
		ctx := context.Background()
		now := store.Millis(time.Now()) // the native expiry follows ExpiresAt
		claim := store.ClaimParams{Key: "k", Fingerprint: "fp", Owner: "a", Now: now, LeaseUntil: now + 10, ExpiresAt: now + 60_000}
		res, err := s.Claim(ctx, claim)
		if err != nil {
			t.Fatal(err)
		}
		ref := store.ClaimRef{Key: "k", Fence: res.Record.Fence, Owner: "a", Now: now + 1}
		get := func() string {
			v, err := c.Get(ctx, s.Prefix()+"k").Result()
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		plain := get()
		appended := appends(t, c)
		var steps []store.Step
		enc, total := "", 0
		for i := range 12 {
			st := store.Step{Name: "s" + strconv.Itoa(i), At: now + 1 + int64(i)}
			switch i % 3 {
			case 0:
				st.Result = []byte(strings.Repeat(string(rune('a'+i)), 250))
			case 1:
				st.Err = &store.ErrorRecord{Code: "c;1:", Message: "m", Body: []byte(strings.Repeat(";", 200))}
			}
			if err := s.RecordStep(ctx, store.StepParams{ClaimRef: ref, Index: i, Step: st}); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			steps, enc, total = append(steps, st), enc+stepEnc(st), total+st.Size()
			want := plain + strconv.Itoa(i+1) + ";" + strconv.Itoa(total) + ";" + enc
			if v := get(); v != want {
				t.Fatalf("after step %d:\n%q\nwant\n%q", i, v, want)
			}
			if i > 0 { // a retry of the step before changes nothing
				if err := s.RecordStep(ctx, store.StepParams{ClaimRef: ref, Index: i - 1, Step: steps[i-1]}); err != nil {
					t.Fatalf("retry of step %d: %v", i-1, err)
				}
				if v := get(); v != want {
					t.Fatalf("a retry of step %d changed the record", i-1)
				}
			}
		}
		// Steps 2-11 find a record longer than the head; steps 5 (size
		// past 1000) and 9 (the 10th) change the header's length.
		if n := appends(t, c) - appended; inPlace && n < 8 {
			t.Errorf("%d steps appended in place, want 8", n)
		}
		if ttl := c.PTTL(ctx, s.Prefix()+"k").Val(); ttl < 50*time.Second {
			t.Errorf("the record's expiry after steps: %v, want the claim's (~60s)", ttl)
		}
		got, err := s.Get(ctx, "k")
		if err != nil || len(got.Steps) != 12 || string(got.Steps[9].Result) != strings.Repeat("j", 250) || got.Steps[10].Err.Code != "c;1:" {
			t.Fatalf("Get: %+v, %v; want the 12 steps", got, err)
		}

		before := get()
		big := store.Step{Name: "big", Result: make([]byte, maxResult-total+1)}
		for _, c := range []struct {
			name string
			p    store.StepParams
			want error
		}{
			{"a step past the next", store.StepParams{ClaimRef: ref, Index: 13, Step: steps[0]}, store.ErrInvalidParams},
			{"another name at a recorded step", store.StepParams{ClaimRef: ref, Index: 3, Step: steps[4]}, store.ErrInvalidParams},
			{"steps over the size limit", store.StepParams{ClaimRef: ref, Index: 12, Step: big}, store.ErrTooLarge},
			{"another claim", store.StepParams{ClaimRef: store.ClaimRef{Key: "k", Fence: ref.Fence + 1, Owner: "a", Now: now + 1}, Index: 12, Step: steps[0]}, store.ErrFenced},
			{"another owner", store.StepParams{ClaimRef: store.ClaimRef{Key: "k", Fence: ref.Fence, Owner: "b", Now: now + 1}, Index: 12, Step: steps[0]}, store.ErrFenced},
			{"past the expiry", store.StepParams{ClaimRef: store.ClaimRef{Key: "k", Fence: ref.Fence, Owner: "a", Now: now + 60_000}, Index: 12, Step: steps[0]}, store.ErrNotFound},
		} {
			if err := s.RecordStep(ctx, c.p); !errors.Is(err, c.want) {
				t.Errorf("%s: %v, want %v", c.name, err, c.want)
			}
			if get() != before {
				t.Fatalf("%s changed the record", c.name)
			}
		}
	}
	t.Run("InPlace", func(t *testing.T) {
		s, c := newStore(t, redisstore.Config{MaxResultBytes: maxResult})
		run(t, s, c, true)
	})
	// The documented ACL without the in-place commands, and one that
	// refuses only APPEND: the header written in place is put back.
	for name, rules := range map[string][]string{
		"WithoutRangeCommands": {"+evalsha", "+eval", "+get", "+set", "+del", "+scan"},
		"WithoutAppend":        {"+evalsha", "+eval", "+get", "+set", "+del", "+scan", "+getrange", "+setrange"},
	} {
		t.Run(name, func(t *testing.T) {
			prefix := fmt.Sprintf("idemstepacl%x:", rand.Uint32())
			s, err := redisstore.Open(aclUser(t, append(rules, "~"+prefix+"*")...), &redisstore.Config{Prefix: prefix, MaxResultBytes: maxResult})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			admin := newClient(t, addr(t))
			t.Cleanup(func() { deletePrefix(admin, prefix) })
			run(t, s, admin, false)
		})
	}
}
