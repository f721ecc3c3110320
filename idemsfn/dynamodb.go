package idemsfn

import (
	"encoding/json"
	"fmt"

	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

// The names of the two states of [DynamoDBCompleteStates].
const (
	// DynamoDBCompleteStateName is the Task state to go to (Next) from the
	// workflow's last step.
	DynamoDBCompleteStateName = "IdemComplete"
	// DynamoDBDoneStateName ends the workflow with its output.
	DynamoDBDoneStateName = "IdemDone"
)

// DynamoDBCompleteStates returns two ASL states (an object to merge into a
// state machine's "States") that complete the execution's key in a
// dynamostore table from inside the workflow, with Step Functions'
// optimized DynamoDB integration (arn:aws:states:::dynamodb:updateItem)
// and no Lambda function:
//
//   - "IdemComplete", a Task state, sets the record COMPLETED with the
//     workflow's result — the JSON value at $.output of its input, stored
//     as the JSON text in the binary result attribute, as dynamostore and
//     idem's default JSONCodec store it — on the condition that the record
//     still holds the execution's claim: status IN_PROGRESS, and the fence
//     and owner of the envelope ($.idem.fence, $.idem.owner). After a
//     takeover the condition fails and nothing is written.
//   - "IdemDone", a Pass state, ends the execution with $.output as its
//     output, whether the update was made or refused (its Catch): a
//     refusal means another claim of the key holds the record, and the
//     "Execution Status Change" event or the [Reconciler] completes it
//     from this execution's output, which is the same value.
//
// The workflow's last step puts its result at $.output (ResultPath
// "$.output"), keeps $.idem from the input, and goes to "IdemComplete".
//
// cfg is the Config of the table's [dynamostore.Store] (Table and the
// attribute names; its other fields do not matter): dynamostore lays the
// update out ([dynamostore.Config.ExternalComplete]) and these states only
// put it in ASL. A cfg without Table is an error wrapping
// [idem.ErrInvalidConfig].
//
// What the state cannot do, because ASL has no clock in milliseconds: it
// leaves completed_ms unset (State.CompletedAt reads zero) and leaves the
// expiry the claim set (expiration, expiration_ms: claim time + the
// engine's Expiry), so the result is replayed until then rather than for
// Expiry after the completion. It does not check the record's expiry
// either: a record past its expiry still counts as absent after the write.
// Results are limited to what States.Base64Encode takes (AWS documents
// 10,000 characters of JSON text) and to dynamostore's MaxResultBytes;
// there is no Spiller. The engine must use the default JSONCodec.
func DynamoDBCompleteStates(cfg dynamostore.Config) (json.RawMessage, error) {
	u, err := cfg.ExternalComplete(dynamostore.ExternalRefs{
		Key: "$.idem.key", Fence: "$.idem.fence", Owner: "$.idem.owner",
		Result: "States.Base64Encode(States.JsonToString($.output))",
	})
	if err != nil {
		return nil, fmt.Errorf("idemsfn: DynamoDB states: %w", err)
	}
	// value is an attribute value in ASL: a ".$" type takes a path or an
	// intrinsic function that the state evaluates.
	value := func(v dynamostore.ExternalValue) member {
		if v.Ref {
			return member{v.Name, obj{{v.Type + ".$", v.Value}}}
		}
		return member{v.Name, obj{{v.Type, v.Value}}}
	}
	var key, names, values obj
	for _, v := range u.Key {
		key = append(key, value(v))
	}
	for _, n := range u.Names {
		names = append(names, member{n.Placeholder, n.Attr})
	}
	for _, v := range u.Values {
		values = append(values, value(v))
	}
	states := obj{
		{DynamoDBCompleteStateName, obj{
			{"Type", "Task"},
			{"Resource", "arn:aws:states:::dynamodb:updateItem"},
			{"Parameters", obj{
				{"TableName", u.TableName},
				{"Key", key},
				{"UpdateExpression", u.UpdateExpression},
				{"ConditionExpression", u.ConditionExpression},
				{"ExpressionAttributeNames", names},
				{"ExpressionAttributeValues", values},
			}},
			{"ResultPath", "$.idemComplete"},
			{"Catch", []obj{{
				{"ErrorEquals", []string{"States.ALL"}},
				{"ResultPath", "$.idemComplete"},
				{"Next", DynamoDBDoneStateName},
			}}},
			{"Next", DynamoDBDoneStateName},
		}},
		{DynamoDBDoneStateName, obj{
			{"Type", "Pass"},
			{"OutputPath", "$.output"},
			{"End", true},
		}},
	}
	b, err := json.MarshalIndent(states, "", "  ")
	if err != nil {
		panic(err) // strings, bools and objects of them always encode
	}
	return b, nil
}

// obj is a JSON object that keeps its members in order, so the states
// read as ASL is usually written.
type obj []member

type member struct {
	name  string
	value any
}

// MarshalJSON implements json.Marshaler.
func (o obj) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	for i, m := range o {
		if i > 0 {
			b = append(b, ',')
		}
		k, err := json.Marshal(m.name)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(m.value)
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, k...), ':'), v...)
	}
	return append(b, '}'), nil
}
