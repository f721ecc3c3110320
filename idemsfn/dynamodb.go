package idemsfn

import (
	"encoding/json"
)

// DynamoDBTable describes the table of a dynamostore.Store for
// [DynamoDBCompleteStates]. Name is required; the attribute names default
// to dynamostore's, and must be the same as its Config's.
type DynamoDBTable struct {
	Name string
	// KeyAttr is the partition key attribute. Default "id".
	KeyAttr string
	// SortKeyAttr, when set, holds the store key under the static
	// partition key value PartitionValue (default "idem").
	SortKeyAttr, PartitionValue string
	// StatusAttr default "status"; DataAttr (the result) default "data".
	StatusAttr, DataAttr string
	// OpenAttr is the attribute of dynamostore's open index
	// (Config.OpenAttr), which a completed record must not keep. Default
	// "open_status"; removing it is harmless on a table without the index.
	OpenAttr string
}

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
// What the state cannot do, because ASL has no clock in milliseconds: it
// leaves completed_ms unset (State.CompletedAt reads zero) and leaves the
// expiry the claim set (expiration, expiration_ms: claim time + the
// engine's Expiry), so the result is replayed until then rather than for
// Expiry after the completion. It does not check the record's expiry
// either: a record past its expiry still counts as absent after the write.
// Results are limited to what States.Base64Encode takes (AWS documents
// 10,000 characters of JSON text) and to dynamostore's MaxResultBytes;
// there is no Spiller. The engine must use the default JSONCodec.
func DynamoDBCompleteStates(t DynamoDBTable) json.RawMessage {
	def := func(v, d string) string {
		if v == "" {
			return d
		}
		return v
	}
	str := func(typ, v string) obj { return obj{{typ, v}} }
	key := obj{{def(t.KeyAttr, "id"), str("S.$", "$.idem.key")}}
	if t.SortKeyAttr != "" {
		key = obj{{def(t.KeyAttr, "id"), str("S", def(t.PartitionValue, "idem"))}, {t.SortKeyAttr, str("S.$", "$.idem.key")}}
	}
	states := obj{
		{DynamoDBCompleteStateName, obj{
			{"Type", "Task"},
			{"Resource", "arn:aws:states:::dynamodb:updateItem"},
			{"Parameters", obj{
				{"TableName", t.Name},
				{"Key", key},
				{"UpdateExpression", "SET #st = :done, #data = :data REMOVE #ecode, #emsg, #ebody, #dref, #open"},
				{"ConditionExpression", "#st = :ip AND #fence = :fence AND #owner = :owner"},
				{"ExpressionAttributeNames", obj{
					{"#st", def(t.StatusAttr, "status")}, {"#data", def(t.DataAttr, "data")},
					{"#fence", "fence"}, {"#owner", "owner"},
					{"#ecode", "error_code"}, {"#emsg", "error_message"}, {"#ebody", "error_body"}, {"#dref", "data_ref"},
					{"#open", def(t.OpenAttr, "open_status")},
				}},
				{"ExpressionAttributeValues", obj{
					{":done", str("S", "COMPLETED")},
					{":ip", str("S", "IN_PROGRESS")},
					{":fence", str("N.$", "$.idem.fence")},
					{":owner", str("S.$", "$.idem.owner")},
					{":data", str("B.$", "States.Base64Encode(States.JsonToString($.output))")},
				}},
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
	return b
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
