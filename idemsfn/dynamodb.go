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
	key := map[string]any{def(t.KeyAttr, "id"): map[string]string{"S.$": "$.idem.key"}}
	if t.SortKeyAttr != "" {
		key = map[string]any{
			def(t.KeyAttr, "id"): map[string]string{"S": def(t.PartitionValue, "idem")},
			t.SortKeyAttr:        map[string]string{"S.$": "$.idem.key"},
		}
	}
	states := map[string]any{
		DynamoDBCompleteStateName: map[string]any{
			"Type":     "Task",
			"Resource": "arn:aws:states:::dynamodb:updateItem",
			"Parameters": map[string]any{
				"TableName":           t.Name,
				"Key":                 key,
				"UpdateExpression":    "SET #st = :done, #data = :data REMOVE #ecode, #emsg, #ebody, #dref",
				"ConditionExpression": "#st = :ip AND #fence = :fence AND #owner = :owner",
				"ExpressionAttributeNames": map[string]string{
					"#st": def(t.StatusAttr, "status"), "#data": def(t.DataAttr, "data"), "#fence": "fence", "#owner": "owner",
					"#ecode": "error_code", "#emsg": "error_message", "#ebody": "error_body", "#dref": "data_ref",
				},
				"ExpressionAttributeValues": map[string]any{
					":done":  map[string]string{"S": "COMPLETED"},
					":ip":    map[string]string{"S": "IN_PROGRESS"},
					":data":  map[string]string{"B.$": "States.Base64Encode(States.JsonToString($.output))"},
					":fence": map[string]string{"N.$": "$.idem.fence"},
					":owner": map[string]string{"S.$": "$.idem.owner"},
				},
			},
			"ResultPath": "$.idemComplete",
			"Catch": []any{map[string]any{
				"ErrorEquals": []string{"States.ALL"},
				"ResultPath":  "$.idemComplete",
				"Next":        DynamoDBDoneStateName,
			}},
			"Next": DynamoDBDoneStateName,
		},
		DynamoDBDoneStateName: map[string]any{
			"Type":       "Pass",
			"OutputPath": "$.output",
			"End":        true,
		},
	}
	b, err := json.MarshalIndent(states, "", "  ")
	if err != nil {
		panic(err) // maps of strings always encode
	}
	return b
}
