package idemsfn_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// Start an order's workflow once per idempotency key, whatever retries and
// crashes happen, and finish it from the activity worker that does the
// workflow's last step.
func Example() {
	var awsCfg aws.Config // from config.LoadDefaultConfig(ctx)
	ctx := context.Background()

	// Any idem store; the Reconciler needs one that can list (memstore,
	// dynamostore, redisstore, pgstore, boltstore all do).
	engine, err := idem.New(memstore.New(nil), &idem.Config{Expiry: 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	starter, err := idemsfn.New(engine, sfn.NewFromConfig(awsCfg), idemsfn.Config{
		StateMachineArn:    "arn:aws:states:eu-west-1:123456789012:stateMachine:orders",
		Operation:          "create-order",
		ExpectedCompletion: 10 * time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}

	// In the HTTP handler: the client's Idempotency-Key names the order.
	started, err := starter.Start(ctx, idem.Request{Key: "client-key-123", Payload: []byte(`{"sku":"A1","qty":2}`)}, nil)
	switch {
	case err != nil:
		log.Print(err) // a stored failure (*idem.TerminalError), or a fault
	case started.State.Status == idem.StatusCompleted:
		fmt.Printf("done: %s\n", started.Output) // a replay
	default:
		fmt.Printf("202 Accepted: %s\n", started.ExecutionArn) // running (maybe started by an earlier call)
	}

	// In the activity worker, with the task's input (the envelope):
	var task struct {
		Idem  idemsfn.Claim   `json:"idem"`
		Input json.RawMessage `json:"input"`
	}
	// ... json.Unmarshal(taskInput, &task), do the work, SendTaskSuccess ...
	if err := starter.Complete(ctx, task.Idem.Token, json.RawMessage(`{"orderId":"o-42"}`)); err != nil {
		log.Print(err)
	}

	// In one process (or a few): events may be lost, the reconciler is not.
	rec, err := idemsfn.NewReconciler(starter, &idemsfn.ReconcilerConfig{Interval: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = rec.Run(ctx) }()
	defer rec.Close()
}

func ExampleExecutionName() {
	key, _ := idem.NewStoreKey("create-order", "acme", []byte("client-key-123"))
	fmt.Println(idemsfn.ExecutionName(key))
	// Output: create-order-842b0e5c6fdce5e36230394968c10a52f849cd1776ca77266e494ee5510ab15a
}

// The states to add to a state machine whose idem store is dynamostore
// with its default attribute names, on table "idem".
func ExampleDynamoDBCompleteStates() {
	states, err := idemsfn.DynamoDBCompleteStates(dynamostore.Config{Table: "idem"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s\n", states)
	// Output:
	// {
	//   "IdemComplete": {
	//     "Type": "Task",
	//     "Resource": "arn:aws:states:::dynamodb:updateItem",
	//     "Parameters": {
	//       "TableName": "idem",
	//       "Key": {
	//         "id": {
	//           "S.$": "$.idem.key"
	//         }
	//       },
	//       "UpdateExpression": "SET #st = :done, #data = :data REMOVE #ecode, #emsg, #ebody, #dref, #open",
	//       "ConditionExpression": "#st = :ip AND #fence = :fence AND #owner = :owner",
	//       "ExpressionAttributeNames": {
	//         "#st": "status",
	//         "#data": "data",
	//         "#fence": "fence",
	//         "#owner": "owner",
	//         "#ecode": "error_code",
	//         "#emsg": "error_message",
	//         "#ebody": "error_body",
	//         "#dref": "data_ref",
	//         "#open": "open_status"
	//       },
	//       "ExpressionAttributeValues": {
	//         ":done": {
	//           "S": "COMPLETED"
	//         },
	//         ":ip": {
	//           "S": "IN_PROGRESS"
	//         },
	//         ":fence": {
	//           "N.$": "$.idem.fence"
	//         },
	//         ":owner": {
	//           "S.$": "$.idem.owner"
	//         },
	//         ":data": {
	//           "B.$": "States.Base64Encode(States.JsonToString($.output))"
	//         }
	//       }
	//     },
	//     "ResultPath": "$.idemComplete",
	//     "Catch": [
	//       {
	//         "ErrorEquals": [
	//           "States.ALL"
	//         ],
	//         "ResultPath": "$.idemComplete",
	//         "Next": "IdemDone"
	//       }
	//     ],
	//     "Next": "IdemDone"
	//   },
	//   "IdemDone": {
	//     "Type": "Pass",
	//     "OutputPath": "$.output",
	//     "End": true
	//   }
	// }
}
