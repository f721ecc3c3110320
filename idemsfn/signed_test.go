package idemsfn_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/store"
)

// With Config.TokenKey, the token an execution's input carries is signed:
// the worker completes the key with it, while the same token altered (its
// owner) or stripped of its signature is refused as invalid before any
// store call, through Complete and Fail alike. (Every end-to-end test
// also runs with a signing engine: forStores.)
func TestLocalSignedTokenRefusedAlteredOrUnsigned(t *testing.T) {
	t.Parallel()
	l := newLocalRig(t, func(t testing.TB) store.Store { return signedStore{stores[0].make(t)} }, idemsfn.Config{})
	if _, err := l.s.Start(ctx, req("o-signed"), map[string]int{"amount": 1}); err != nil {
		t.Fatal(err)
	}
	tk := next(t, l.tasks)
	good, err := idem.ParseToken(tk.env.Idem.Token, "orders")
	if err != nil {
		t.Fatal(err)
	}
	altered := good
	altered.Owner = "someone/else"
	unsigned := idem.Token{Key: good.Key, Fence: good.Fence, Owner: good.Owner, Status: good.Status}
	for name, tok := range map[string]string{"altered": altered.String(), "unsigned": unsigned.String()} {
		calls := l.fs.Total()
		if err := l.s.Complete(ctx, tok, json.RawMessage(`{"forged":true}`)); !errors.Is(err, idem.ErrInvalidToken) {
			t.Errorf("Complete with an %s token: %v, want idem.ErrInvalidToken", name, err)
		}
		if err := l.s.Fail(ctx, tok, "Forged", "no"); !errors.Is(err, idem.ErrInvalidToken) {
			t.Errorf("Fail with an %s token: %v, want idem.ErrInvalidToken", name, err)
		}
		if n := l.fs.Total() - calls; n != 0 {
			t.Errorf("an %s token made %d store calls, want none", name, n)
		}
	}
	l.succeed(t, tk, `{"receipt":"r-s"}`)
	if st := l.status(t, "o-signed"); st.Status != idem.StatusCompleted {
		t.Fatalf("after the worker: %s", st.Status)
	}
}
