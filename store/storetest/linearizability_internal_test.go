package storetest

import (
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/seed-a1b882c0/idem/store"
)

// The record model judged on small hand-made histories of one key.
func TestLinModel(t *testing.T) {
	const now = 1000
	claim := linInput{kind: linClaim, key: "k", now: now, owner: "a", fp: "f", leaseUntil: now + 12, expiresAt: now + 60}
	held := linRecord{exists: true, status: store.StatusInProgress, fence: 1, owner: "a", fp: "f", leaseUntil: now + 12, expiresAt: now + 60}
	get := linInput{kind: linGet, key: "k", now: now + 1}
	release := linInput{kind: linRelease, key: "k", now: now + 2, fence: 1, owner: "a"}
	complete := linInput{kind: linComplete, key: "k", now: now + 2, fence: 1, owner: "a", expiresAt: now + 60, result: "r"}
	op := func(client int, call, ret int64, in linInput, out linOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: in, Output: out}
	}
	acquired := op(0, 1, 2, claim, linOutput{acquired: true, rec: held})
	failed := linOutput{err: "other: timeout", unknown: true}
	for _, c := range []struct {
		name    string
		history []porcupine.Operation
		ok      bool
	}{
		// A call that failed with a store error returns after everything:
		// it took effect, or it did not, but nothing else.
		{"failed claim that took effect", []porcupine.Operation{op(0, 1, 100, claim, failed), op(1, 2, 3, get, linOutput{rec: held})}, true},
		{"failed claim that did not", []porcupine.Operation{op(0, 1, 100, claim, failed), op(1, 2, 3, get, linOutput{err: "notfound"})}, true},
		{"failed claim and a record neither explains", []porcupine.Operation{op(0, 1, 100, claim, failed), op(1, 2, 3, get, linOutput{rec: linRecord{exists: true, status: store.StatusInProgress, fence: 2, owner: "a", fp: "f", leaseUntil: now + 12, expiresAt: now + 60}})}, false},
		{"failed release that took effect", []porcupine.Operation{acquired, op(1, 3, 100, release, failed), op(2, 4, 5, get, linOutput{err: "notfound"})}, true},
		{"failed complete cannot take effect under another fence", []porcupine.Operation{acquired, op(1, 3, 100, linInput{kind: linComplete, key: "k", now: now + 2, fence: 2, owner: "a", expiresAt: now + 60, result: "r"}, failed),
			op(2, 4, 5, get, linOutput{rec: linRecord{exists: true, status: store.StatusCompleted, fence: 1, owner: "a", fp: "f", leaseUntil: now + 12, expiresAt: now + 60, result: "r"}})}, false},
		// A write refused as fenced out while a Release under the same
		// fence ran: before the Release it succeeds, after it the record
		// is not found; "fenced" fits neither.
		{"refusal racing a release: not found", []porcupine.Operation{acquired, op(1, 3, 6, release, linOutput{}), op(2, 4, 7, complete, linOutput{err: "notfound"}), op(3, 8, 9, get, linOutput{err: "notfound"})}, true},
		{"refusal racing a release: fenced", []porcupine.Operation{acquired, op(1, 3, 6, release, linOutput{}), op(2, 4, 7, complete, linOutput{err: "fenced"}), op(3, 8, 9, get, linOutput{err: "notfound"})}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if ok := porcupine.CheckOperations(linModel, c.history); ok != c.ok {
				t.Errorf("linearizable = %v, want %v", ok, c.ok)
			}
		})
	}
}
