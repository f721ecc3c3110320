package idemsfn_test

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

// stepFunctionsParameters is a stand-in for Step Functions' processing of
// a Task state's Parameters, which stepfunctions-local does not do (it
// ignores Parameters and has no service integrations): every field whose
// name ends in ".$" is replaced by the value of its expression over the
// state's input. It knows what DynamoDBCompleteStates uses and nothing
// more — reference paths "$.a.b" and the intrinsics States.JsonToString
// and States.Base64Encode — and fails on anything else, so a change to the
// states that it cannot follow fails the test instead of passing
// untested.
func stepFunctionsParameters(params, input any) (any, error) {
	switch p := params.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, v := range p {
			if name, ok := strings.CutSuffix(k, ".$"); ok {
				expr, ok := v.(string)
				if !ok {
					return nil, fmt.Errorf("%s: not a string", k)
				}
				x, err := evalExpr(expr, input)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", k, err)
				}
				out[name] = x
				continue
			}
			x, err := stepFunctionsParameters(v, input)
			if err != nil {
				return nil, err
			}
			out[k] = x
		}
		return out, nil
	case []any:
		out := make([]any, len(p))
		for i, v := range p {
			x, err := stepFunctionsParameters(v, input)
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		return out, nil
	}
	return params, nil
}

func evalExpr(expr string, input any) (any, error) {
	if expr == "$" || strings.HasPrefix(expr, "$.") {
		v := input
		for _, f := range strings.Split(expr, ".")[1:] {
			m, ok := v.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%s: %q of a non-object", expr, f)
			}
			if v, ok = m[f]; !ok {
				return nil, fmt.Errorf("%s: no field %q (States.Runtime)", expr, f)
			}
		}
		return v, nil
	}
	fn, rest, ok := strings.Cut(expr, "(")
	if !ok || !strings.HasSuffix(rest, ")") {
		return nil, fmt.Errorf("%q is neither a path nor an intrinsic the stand-in knows", expr)
	}
	arg, err := evalExpr(strings.TrimSuffix(rest, ")"), input)
	if err != nil {
		return nil, err
	}
	switch fn {
	case "States.JsonToString":
		b, err := json.Marshal(arg)
		return string(b), err
	case "States.Base64Encode":
		s, ok := arg.(string)
		if !ok {
			return nil, fmt.Errorf("%s of a %T", fn, arg)
		}
		if len(s) > 10000 {
			return nil, fmt.Errorf("%s of %d characters: over its limit of 10,000", fn, len(s))
		}
		return base64.StdEncoding.EncodeToString([]byte(s)), nil
	}
	return nil, fmt.Errorf("intrinsic %s is not known to the stand-in", fn)
}

// decodeJSON decodes b with numbers kept as written.
func decodeJSON(t testing.TB, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return v
}

// runCompleteState runs the "IdemComplete" state of states on input the
// way Step Functions' DynamoDB integration does: the Parameters, resolved,
// are the UpdateItem request, sent as DynamoDB JSON to DynamoDB Local. It
// returns the HTTP status and DynamoDB's error type ("" on success).
func runCompleteState(t testing.TB, states json.RawMessage, input any) (int, string) {
	t.Helper()
	var all map[string]map[string]any
	if err := json.Unmarshal(states, &all); err != nil {
		t.Fatal(err)
	}
	st := all[idemsfn.DynamoDBCompleteStateName]
	if st["Resource"] != "arn:aws:states:::dynamodb:updateItem" {
		t.Fatalf("resource %v", st["Resource"])
	}
	params, err := stepFunctionsParameters(st["Parameters"], input)
	if err != nil {
		t.Fatal(err)
	}
	code, body := dynamoRaw(t, "UpdateItem", params)
	if code == http.StatusOK {
		return code, ""
	}
	var e struct {
		Type string `json:"__type"`
	}
	_ = json.Unmarshal(body, &e)
	_, typ, _ := strings.Cut(e.Type, "#")
	return code, typ
}

// The states of DynamoDBCompleteStates complete the key in the item
// dynamostore reads back (COMPLETED, the workflow's output replayed), and
// change nothing once another claim holds the key.
func TestDynamoDBCompleteStates(t *testing.T) {
	t.Parallel()
	for name, layout := range map[string]dynamostore.Config{
		"default":    {},
		"composite":  {KeyAttr: "pk", SortKeyAttr: "sk", PartitionValue: "idempotency#orders", StatusAttr: "state", DataAttr: "result", StatusIndex: "status-lease"},
		"open-index": {OpenIndex: "open", StatusShards: 4},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ds := newDynamoStore(t, layout)
			cfg := ds.Config()
			states, err := idemsfn.DynamoDBCompleteStates(cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := newRig(t, ds)
			api := newFakeSFN()
			s := r.starter(t, api, machineArn, idemsfn.Config{ExpectedCompletion: time.Minute})
			output := json.RawMessage(`{"receipt":"r-1","amount":12.50,"lines":[1,2,3],"note":"ünïcode \"quoted\""}`)

			// lastInput is the input of the state, as the workflow's last
			// step leaves it: the execution's input with the result at
			// $.output.
			lastInput := func(arn string) any {
				in := decodeJSON(t, []byte(api.byArn(arn).input)).(map[string]any)
				in["output"] = decodeJSON(t, output)
				return in
			}

			got, err := s.Start(ctx, req("o-1"), map[string]int{"amount": 1250})
			if err != nil {
				t.Fatal(err)
			}
			if code, typ := runCompleteState(t, states, lastInput(got.ExecutionArn)); code != http.StatusOK {
				t.Fatalf("UpdateItem: %d %s", code, typ)
			}
			st := r.status(t, "o-1")
			var out json.RawMessage
			if st.Status != idem.StatusCompleted || st.Decode(&out) != nil || !jsonEqual(t, out, output) || st.Ref != got.ExecutionArn {
				t.Fatalf("record %+v, result %s", st, st.Result)
			}
			// The completed record leaves the open index (only open records
			// carry its attribute).
			openAttr := cmp.Or(layout.OpenAttr, "open_status")
			if item := rawItem(t, cfg, storeKey(t, "o-1")).(map[string]any); item[openAttr] != nil {
				t.Errorf("the completed item keeps %s = %v", openAttr, item[openAttr])
			}
			replay, err := s.Start(ctx, req("o-1"), nil)
			if err != nil || replay.State.Status != idem.StatusCompleted || !jsonEqual(t, replay.Output, output) {
				t.Fatalf("replay = %+v, %v", replay, err)
			}
			// A second run (a retried state) meets a settled record.
			if code, typ := runCompleteState(t, states, lastInput(got.ExecutionArn)); typ != "ConditionalCheckFailedException" {
				t.Errorf("again: %d %s", code, typ)
			}

			// Another key: its claim is taken over before the state runs.
			first, err := s.Start(ctx, req("o-2"), nil)
			if err != nil {
				t.Fatal(err)
			}
			r.clock.Advance(time.Minute)
			second, err := s.Start(ctx, req("o-2"), nil)
			if err != nil || second.State.Fence != 2 || second.ExecutionArn != first.ExecutionArn {
				t.Fatalf("takeover = %+v, %v", second, err)
			}
			before := rawItem(t, cfg, storeKey(t, "o-2"))
			if code, typ := runCompleteState(t, states, lastInput(first.ExecutionArn)); code != http.StatusBadRequest || typ != "ConditionalCheckFailedException" {
				t.Fatalf("stale claim: %d %q, want ConditionalCheckFailedException", code, typ)
			}
			if after := rawItem(t, cfg, storeKey(t, "o-2")); !reflect.DeepEqual(before, after) {
				t.Errorf("item changed:\n%v\n%v", before, after)
			}
			if st := r.status(t, "o-2"); st.Status != idem.StatusInProgress || st.Fence != 2 {
				t.Errorf("record %+v", st)
			}
		})
	}
}

// rawItem reads the item of key as stored, in DynamoDB JSON.
func rawItem(t testing.TB, cfg dynamostore.Config, key idem.StoreKey) any {
	t.Helper()
	k := map[string]any{cfg.KeyAttr: map[string]string{"S": key.String()}}
	if cfg.SortKeyAttr != "" {
		k = map[string]any{cfg.KeyAttr: map[string]string{"S": cfg.PartitionValue}, cfg.SortKeyAttr: map[string]string{"S": key.String()}}
	}
	code, body := dynamoRaw(t, "GetItem", map[string]any{"TableName": cfg.Table, "Key": k, "ConsistentRead": true})
	if code != http.StatusOK {
		t.Fatalf("GetItem: %d %s", code, body)
	}
	item := decodeJSON(t, body).(map[string]any)["Item"]
	if item == nil {
		t.Fatalf("no item for %s", key)
	}
	return item
}

// dynamoRaw sends one request to DynamoDB Local as raw DynamoDB JSON, the
// way any client (Step Functions' integration among them) does.
func dynamoRaw(t testing.TB, action string, request any) (int, []byte) {
	t.Helper()
	body, err := json.Marshal(request)
	if err != nil {
		t.Fatal(err)
	}
	hreq, _ := http.NewRequest(http.MethodPost, testenv.DynamoDB(t), bytes.NewReader(body))
	hreq.Header.Set("X-Amz-Target", "DynamoDB_20120810."+action)
	hreq.Header.Set("Content-Type", "application/x-amz-json-1.0")
	// DynamoDB Local checks that a request is signed, not the signature.
	hreq.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=local/20200101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=x")
	resp, err := (&http.Client{Transport: transport}).Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}
