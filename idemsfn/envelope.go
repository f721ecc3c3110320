package idemsfn

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/seed-a1b882c0/idem"
)

// Envelope is the input of every execution [Starter.Start] starts: the
// claim the execution works for, and the caller's input.
//
//	{"idem": {"token": "...", "key": "orders#3f2a...", "fence": "1", "owner": "host/42/9a0c/7"},
//	 "input": {...the caller's input...}}
//
// The workflow reads its own input at $.input and carries $.idem through to
// its last step (states with a ResultPath keep it), which completes the
// key: an activity worker or a Lambda function hands $.idem.token to
// [Starter.Complete] or [Starter.Fail], or the Task state of
// [DynamoDBCompleteStates] writes the record itself from $.idem.key,
// $.idem.fence and $.idem.owner. The fence is a string of decimal digits,
// as DynamoDB's "N" values are, so it needs no conversion and keeps all 64
// bits.
type Envelope struct {
	Idem  Claim           `json:"idem"`
	Input json.RawMessage `json:"input"`
}

// Claim names the claim an execution works for.
type Claim struct {
	// Token is the claim's token ([idem.Token.String]).
	Token string `json:"token"`
	// Key is the store key; Fence and Owner name the claim, as the token
	// does, for steps that cannot decode it.
	Key   string `json:"key"`
	Fence string `json:"fence"`
	Owner string `json:"owner"`
}

// newEnvelope is the input of an execution for the claim t.
func newEnvelope(t idem.Token, input json.RawMessage) ([]byte, error) {
	return json.Marshal(Envelope{
		Idem:  Claim{Token: t.String(), Key: t.Key.String(), Fence: strconv.FormatUint(t.Fence, 10), Owner: t.Owner},
		Input: input,
	})
}

// workToken is the token of the envelope in an execution's input, for its
// trace context; zero when the input is no envelope or its token does not
// parse.
func workToken(input *string) idem.Token {
	if input == nil {
		return idem.Token{}
	}
	env, _, err := ParseEnvelope([]byte(*input))
	if err != nil {
		return idem.Token{}
	}
	t, err := idem.ParseToken(env.Idem.Token, "")
	if err != nil {
		return idem.Token{}
	}
	return t
}

// ParseEnvelope reads an execution's input as [Starter.Start] wrote it
// and checks that its claim names a valid store key and fence. Any other
// input fails with a *[EnvelopeError].
func ParseEnvelope(input []byte) (Envelope, idem.StoreKey, error) {
	var env Envelope
	if err := json.Unmarshal(input, &env); err != nil {
		return Envelope{}, idem.StoreKey{}, &EnvelopeError{Reason: "not a JSON object with an idem member: " + err.Error()}
	}
	if env.Idem.Key == "" {
		return Envelope{}, idem.StoreKey{}, &EnvelopeError{Reason: "no idem.key"}
	}
	key, err := idem.ParseStoreKey(env.Idem.Key)
	if err != nil {
		return Envelope{}, idem.StoreKey{}, &EnvelopeError{Reason: "idem.key: " + err.Error()}
	}
	if f, err := strconv.ParseUint(env.Idem.Fence, 10, 64); err != nil || f == 0 {
		return Envelope{}, idem.StoreKey{}, &EnvelopeError{Reason: fmt.Sprintf("idem.fence %q is not a fence", env.Idem.Fence)}
	}
	return env, key, nil
}
