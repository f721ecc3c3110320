package consoletest

import (
	"context"
	"errors"
	"testing"

	"github.com/seed-a1b882c0/idem"
)

// LeftWithSteps runs the operation "checkout" with key on app: a step
// "charge" (result "ch_1"), then between (nil: nothing; a test advances
// its clock there), then a step "email" that fails with a terminal error
// (code "bounced", message emailMsg), then an ordinary error. The record is
// left IN_PROGRESS with its two steps, its lease ended, as an operator
// finds a key whose holder gave up after finished steps. It returns the
// record's store key.
func LeftWithSteps(t testing.TB, app *idem.Engine, key string, between func(), emailMsg string) idem.StoreKey {
	t.Helper()
	req := idem.Request{Operation: "checkout", Key: key}
	down := errors.New("ledger down")
	_, err := idem.Do(context.Background(), app, req, func(ctx context.Context) (string, error) {
		if _, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
			return "", err
		}
		if between != nil {
			between()
		}
		if _, err := idem.Step(ctx, "email", func(context.Context) (bool, error) {
			return false, idem.Terminal(errors.New(emailMsg), "bounced")
		}); !errors.Is(err, idem.ErrTerminal) {
			return "", err
		}
		return "", down
	})
	if !errors.Is(err, down) {
		t.Fatalf("the operation: %v, want %v", err, down)
	}
	id, err := req.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id.StoreKey
}
