package idem_test

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

var tokenKey = []byte("0123456789abcdef-test-token-key")

// With Config.TokenKey, the engine signs the tokens it hands out, another
// engine with the key settles the claim through one, and a token that was
// forged, altered, re-signed with another key or not signed at all is
// refused with ErrInvalidToken before any store call.
func TestSignedTokens(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{TokenKey: tokenKey})
	worker := en.another(t, idem.Config{TokenKey: tokenKey})
	ctx := context.Background()
	b, err := en.eng.Begin(ctx, req("signed"), &idem.BeginOptions{ExpectedCompletion: time.Minute})
	if err != nil || !b.Acquired {
		t.Fatalf("%+v %v", b, err)
	}
	good := b.Token.String()
	parse := func(s string) idem.Token {
		tok, err := idem.ParseToken(s, "charge")
		if err != nil {
			t.Fatalf("parse %q: %v", s, err)
		}
		return tok
	}
	tok := parse(good)

	altered := tok
	altered.Owner = "someone-else/1/x/1"
	refetched := tok
	refetched.Fence++
	unsigned := idem.Token{Key: tok.Key, Fence: tok.Fence, Owner: tok.Owner, Status: tok.Status}
	other := setup(t, idem.Config{TokenKey: []byte("another-key-of-16-bytes-or-more")})
	ob, err := other.eng.Begin(ctx, req("signed"), nil)
	if err != nil {
		t.Fatal(err)
	}
	wrongKey := parse(ob.Token.String())
	// The last byte of the MAC flipped in the encoded form (the owner
	// follows the MAC).
	raw, err := base64.RawURLEncoding.DecodeString(good)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-len(tok.Owner)-1] ^= 1
	flipped := parse(base64.RawURLEncoding.EncodeToString(raw))

	for name, bad := range map[string]idem.Token{"altered owner": altered, "another fence": refetched, "unsigned": unsigned, "signed with another key": wrongKey} {
		before := en.store.Total()
		for op, err := range map[string]error{
			"complete": worker.Complete(ctx, bad, 1),
			"fail":     worker.Fail(ctx, bad, errors.New("x")),
			"release":  worker.Release(ctx, bad),
			"extend":   worker.Extend(ctx, bad, time.Minute),
			"attach":   worker.Attach(ctx, bad, "ref"),
		} {
			if !errors.Is(err, idem.ErrInvalidToken) {
				t.Errorf("%s token, %s: %v, want ErrInvalidToken", name, op, err)
			}
		}
		if n := en.store.Total() - before; n != 0 {
			t.Errorf("%s token: %d store calls, want none before the signature is checked", name, n)
		}
	}
	if err := worker.Complete(ctx, flipped, 1); !errors.Is(err, idem.ErrInvalidToken) {
		t.Errorf("a token with a flipped signature byte: %v, want ErrInvalidToken", err)
	}

	// The genuine token settles the claim, from another engine.
	if err := worker.Complete(ctx, tok, 42); err != nil {
		t.Fatalf("complete with the signed token: %v", err)
	}
	res, err := idem.Do(ctx, en.eng, req("signed"), func(context.Context) (int, error) { return 0, errors.New("ran again") })
	if err != nil || !res.Replayed || res.Value != 42 {
		t.Fatalf("replay after a signed completion: %+v %v", res, err)
	}
	// An engine without the key takes signed tokens as any other.
	st, err := en.eng.Status(ctx, tok.Key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Token().String() == idem.Token.String(idem.Token{Key: tok.Key, Fence: st.Fence, Owner: st.Owner, Status: st.Status}) {
		t.Error("State.Token of a signing engine is not signed")
	}
	plain := en.another(t, idem.Config{})
	if err := plain.Release(ctx, st.Token()); err != nil {
		t.Errorf("an engine without a key refused a signed token: %v", err)
	}
}

func TestTokenKeyTooShort(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{})
	if _, err := idem.New(en.store, &idem.Config{TokenKey: []byte("short")}); !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "16") {
		t.Fatalf("a 5-byte TokenKey: %v, want ErrInvalidConfig naming the minimum", err)
	}
}

// A record listed from the store (a reconciler's view) gives, through
// StateOf, a token signed like every other the engine hands out: the
// engine settles the key with it, where a token made by hand from the
// record is refused.
func TestStateOfAListedRecordSignsItsToken(t *testing.T) {
	t.Parallel()
	en := setup(t, idem.Config{TokenKey: tokenKey})
	ctx := context.Background()
	b, err := en.eng.Begin(ctx, req("listed"), &idem.BeginOptions{ExpectedCompletion: time.Minute})
	if err != nil || !b.Acquired {
		t.Fatalf("%+v %v", b, err)
	}
	page, err := en.mem.List(ctx, store.ListParams{Status: store.StatusInProgress, Limit: 10, Now: store.Millis(en.clock.Now())})
	if err != nil || len(page.Records) != 1 {
		t.Fatalf("%+v %v", page, err)
	}
	rec := page.Records[0]
	byHand := idem.Token{Key: b.Token.Key, Fence: rec.Fence, Owner: rec.Owner, Status: idem.StatusInProgress}
	if err := en.eng.Extend(ctx, byHand, time.Minute); !errors.Is(err, idem.ErrInvalidToken) {
		t.Fatalf("a token made by hand from the record: %v, want ErrInvalidToken", err)
	}
	st := en.eng.StateOf(rec)
	if st.Key != rec.Key || st.Status != idem.StatusInProgress || st.Fence != rec.Fence {
		t.Fatalf("StateOf = %+v", st)
	}
	if err := en.eng.Complete(ctx, st.Token(), 7); err != nil {
		t.Fatalf("Complete through StateOf's token: %v", err)
	}
}
