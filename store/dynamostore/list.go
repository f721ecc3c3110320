package dynamostore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// List implements [idem.Lister] for operators. The access path, cheapest
// first:
//
//   - with Config.StatusIndex and a status or stuck filter: a Query on the
//     index (status = S, and lease <= now for stuck records). Global
//     secondary indexes are eventually consistent: a record written a
//     moment ago may be missing or show its previous status.
//   - with a composite key: a strongly consistent Query on the static
//     partition.
//   - otherwise: a Scan of the table, filtered here. Fine for development
//     and small tables; create the status index for large ones.
//
// Items idem did not write are skipped; spilled results are not loaded
// (Result is nil). A damaged idem item fails the listing with
// idem.ErrCorrupt naming its key.
func (s *Store) List(ctx context.Context, p store.ListParams) (store.ListResult, error) {
	var out store.ListResult
	start, err := decodeCursor(p.Cursor)
	if err != nil {
		return out, err
	}
	limit := p.PageSize()
	var lastItem map[string]types.AttributeValue
	for {
		items, next, err := s.page(ctx, p, start)
		if err != nil {
			return store.ListResult{}, err
		}
		for _, it := range items {
			if _, ours := it[attrVersion]; !ours {
				continue
			}
			if pv, _ := strAttr(it[s.cfg.KeyAttr]); s.cfg.SortKeyAttr != "" && pv != s.cfg.PartitionValue {
				continue // another partition value's item, which the table's index also holds
			}
			key := s.keyOfItem(it)
			r, _, err := s.decodeMeta(key, it)
			if err != nil {
				return store.ListResult{}, err
			}
			if !p.Matches(r) {
				continue
			}
			if len(out.Records) == limit {
				out.Next = encodeCursor(s.cursorOf(lastItem, s.useIndex(p)))
				return out, nil
			}
			out.Records = append(out.Records, r)
			lastItem = it
		}
		if len(next) == 0 {
			return out, nil
		}
		start = next
	}
}

// useIndex reports whether a listing goes through the status index.
func (s *Store) useIndex(p store.ListParams) bool {
	return s.cfg.StatusIndex != "" && (p.Status.Valid() || p.Stuck)
}

// page reads one page of candidate items.
func (s *Store) page(ctx context.Context, p store.ListParams, start map[string]types.AttributeValue) ([]map[string]types.AttributeValue, map[string]types.AttributeValue, error) {
	limit := aws.Int32(int32(min(max(p.PageSize()*2, 100), 1000)))
	switch {
	case s.useIndex(p):
		st := p.Status
		if p.Stuck {
			st = store.StatusInProgress
		}
		cond := "#st = :st"
		vals := map[string]types.AttributeValue{":st": str(st.String())}
		names := s.pick("#st")
		if p.Stuck {
			cond += " AND #lease <= :now"
			vals[":now"] = num(p.Now)
			names = s.pick("#st", "#lease")
		}
		out, err := s.api.Query(ctx, &dynamodb.QueryInput{
			TableName: aws.String(s.cfg.Table), IndexName: aws.String(s.cfg.StatusIndex),
			KeyConditionExpression: aws.String(cond), ExpressionAttributeNames: names,
			ExpressionAttributeValues: vals, ExclusiveStartKey: start, Limit: limit,
		})
		if err != nil {
			return nil, nil, s.translate("list", "", err)
		}
		return out.Items, out.LastEvaluatedKey, nil
	case s.cfg.SortKeyAttr != "":
		out, err := s.api.Query(ctx, &dynamodb.QueryInput{
			TableName: aws.String(s.cfg.Table), ConsistentRead: aws.Bool(true),
			KeyConditionExpression:    aws.String("#pk = :pk"),
			ExpressionAttributeNames:  s.pick("#pk"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":pk": str(s.cfg.PartitionValue)},
			ExclusiveStartKey:         start, Limit: limit,
		})
		if err != nil {
			return nil, nil, s.translate("list", "", err)
		}
		return out.Items, out.LastEvaluatedKey, nil
	default:
		out, err := s.api.Scan(ctx, &dynamodb.ScanInput{
			TableName: aws.String(s.cfg.Table), ConsistentRead: aws.Bool(true),
			ExclusiveStartKey: start, Limit: limit,
		})
		if err != nil {
			return nil, nil, s.translate("list", "", err)
		}
		return out.Items, out.LastEvaluatedKey, nil
	}
}

// keyOfItem is the idempotency key an item holds.
func (s *Store) keyOfItem(it map[string]types.AttributeValue) string {
	attr := s.cfg.KeyAttr
	if s.cfg.SortKeyAttr != "" {
		attr = s.cfg.SortKeyAttr
	}
	k, _ := strAttr(it[attr])
	return k
}

// cursorOf is the ExclusiveStartKey continuing after item: the table's key
// attributes, plus the index's when the listing goes through it.
func (s *Store) cursorOf(it map[string]types.AttributeValue, index bool) map[string]types.AttributeValue {
	c := map[string]types.AttributeValue{s.cfg.KeyAttr: it[s.cfg.KeyAttr]}
	if s.cfg.SortKeyAttr != "" {
		c[s.cfg.SortKeyAttr] = it[s.cfg.SortKeyAttr]
	}
	if index {
		c[s.cfg.StatusAttr], c[s.cfg.LeaseAttr] = it[s.cfg.StatusAttr], it[s.cfg.LeaseAttr]
	}
	return c
}

// A cursor is the ExclusiveStartKey as base64url JSON: name → {"S": v} or
// {"N": v}.
type cursorValue struct {
	S *string `json:"S,omitempty"`
	N *string `json:"N,omitempty"`
}

func encodeCursor(k map[string]types.AttributeValue) string {
	m := make(map[string]cursorValue, len(k))
	for name, v := range k {
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			m[name] = cursorValue{S: aws.String(v.Value)}
		case *types.AttributeValueMemberN:
			m[name] = cursorValue{N: aws.String(v.Value)}
		}
	}
	b, _ := json.Marshal(m) // strings only: cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(c string) (map[string]types.AttributeValue, error) {
	if c == "" {
		return nil, nil
	}
	bad := func(why string) error {
		return fmt.Errorf("dynamostore: invalid list cursor (%s): %w", why, idem.ErrInvalidKey)
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return nil, bad("not base64url")
	}
	var m map[string]cursorValue
	if err := json.Unmarshal(b, &m); err != nil || len(m) == 0 {
		return nil, bad("not a cursor")
	}
	k := make(map[string]types.AttributeValue, len(m))
	for name, v := range m {
		switch {
		case v.S != nil && v.N == nil:
			k[name] = str(*v.S)
		case v.N != nil && v.S == nil:
			k[name] = &types.AttributeValueMemberN{Value: *v.N}
		default:
			return nil, bad("attribute " + name + " is neither S nor N")
		}
	}
	return k, nil
}
