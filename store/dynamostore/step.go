package dynamostore

import (
	"context"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem/store"
)

var _ store.Stepper = (*Store)(nil)

// The attributes of one step, a map in the item's steps list: its name,
// when it was recorded (ms), and its result or its terminal error, under
// the names the item gives a record's own.
const (
	stepName    = "name"
	stepAt      = "at"
	stepData    = "data"
	stepErrCode = attrErrCode
	stepErrMsg  = attrErrMsg
	stepErrBody = attrErrBody
)

// RecordStep implements [store.Stepper] in one conditional UpdateItem,
// fenced as Complete is: it appends the step to the item's steps list
// and adds its size to steps_bytes, on condition that the item holds the
// claim, is IN_PROGRESS and not expired, holds p.Index steps, and has room
// for the step under Config.MaxResultBytes. When the condition fails the
// item DynamoDB returns with the failure decides the answer, without
// another request: ErrNotFound, a *store.FencedError, nil for a step
// recorded already (a retry), ErrInvalidParams for another index or name,
// a *store.TooLargeError for a step over the limit. Steps are never
// spilled: a step over MaxResultBytes is refused before any request, and
// an item DynamoDB finds over 400 KB is a *store.TooLargeError too.
func (s *Store) RecordStep(ctx context.Context, p store.StepParams) error {
	if err := p.Check(); err != nil {
		return err
	}
	size, limit := p.Step.Size(), s.cfg.MaxResultBytes
	if size > limit {
		return &store.TooLargeError{Key: p.Key, Size: size, Limit: limit}
	}
	vals := fencedValues(map[string]types.AttributeValue{
		":step": &types.AttributeValueMemberL{Value: []types.AttributeValue{encodeStep(p.Step)}},
		":size": num(int64(size)), ":room": num(int64(limit - size)),
	}, p.ClaimRef)
	cond := fencedCond + " AND (attribute_not_exists(#sbytes) OR #sbytes <= :room)"
	set := "SET #steps = list_append(#steps, :step) ADD #sbytes :size"
	if p.Index == 0 {
		cond += " AND attribute_not_exists(#steps)"
		set = "SET #steps = :step ADD #sbytes :size"
	} else {
		cond += " AND size(#steps) = :index"
		vals[":index"] = num(int64(p.Index))
	}
	_, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.cfg.Table),
		Key:                                 s.itemKey(p.Key),
		UpdateExpression:                    aws.String(set),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            s.pick("#steps", "#sbytes", "#st", "#fence", "#owner", "#expms"),
		ExpressionAttributeValues:           vals,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		return nil
	}
	old, failed := conditionFailed(err)
	if !failed {
		return s.translate("record step", p.Key, err)
	}
	rec, _, err := s.decodeMeta(p.Key, old)
	if err != nil {
		return err
	}
	if err := store.CheckFence(rec, p.ClaimRef); err != nil {
		return err
	}
	changed, err := store.ApplyStep(rec, p, limit)
	if err != nil || !changed {
		return err
	}
	return &store.CorruptError{Key: p.Key, Reason: "record step condition failed on an item that satisfies it"}
}

// encodeStep is the map that holds st in the item's steps list.
func encodeStep(st store.Step) types.AttributeValue {
	m := map[string]types.AttributeValue{stepName: str(st.Name), stepAt: num(st.At)}
	if st.Result != nil {
		m[stepData] = bin(st.Result)
	}
	if e := st.Err; e != nil {
		m[stepErrCode], m[stepErrMsg] = str(e.Code), str(e.Message)
		if len(e.Body) > 0 {
			m[stepErrBody] = bin(e.Body)
		}
	}
	return &types.AttributeValueMemberM{Value: m}
}

// decodeSteps reads an item's steps list (nil when there is none); bad
// makes the error of a damaged one.
func decodeSteps(v types.AttributeValue, bad func(string) error) ([]store.Step, error) {
	if v == nil {
		return nil, nil
	}
	l, ok := v.(*types.AttributeValueMemberL)
	if !ok {
		return nil, bad(attrSteps + " is not a list")
	}
	if len(l.Value) == 0 {
		return nil, nil
	}
	steps := make([]store.Step, len(l.Value))
	for i, v := range l.Value {
		what := attrSteps + "[" + strconv.Itoa(i) + "]"
		m, ok := v.(*types.AttributeValueMemberM)
		if !ok {
			return nil, bad(what + " is not a map")
		}
		st := &steps[i]
		if st.Name, ok = strAttr(m.Value[stepName]); !ok || st.Name == "" {
			return nil, bad(what + " has no name")
		}
		if st.At, ok = numAttr(m.Value[stepAt]); !ok {
			return nil, bad(what + " has no numeric " + stepAt)
		}
		if d, present := m.Value[stepData]; present {
			if st.Result, ok = binAttr(d); !ok {
				return nil, bad(what + " " + stepData + " is not binary")
			}
		}
		if c, present := m.Value[stepErrCode]; present {
			e := &store.ErrorRecord{}
			if e.Code, ok = strAttr(c); !ok {
				return nil, bad(what + " " + stepErrCode + " is not a string")
			}
			e.Message, _ = strAttr(m.Value[stepErrMsg])
			if b, ok := binAttr(m.Value[stepErrBody]); ok && len(b) > 0 {
				e.Body = b
			}
			st.Err = e
		}
		if st.Result != nil && st.Err != nil {
			return nil, bad(what + " holds a result and an error")
		}
	}
	return steps, nil
}
