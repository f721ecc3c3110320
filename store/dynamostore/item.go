package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/seed-a1b882c0/idem/store"
)

// isItemTooLarge reports DynamoDB's refusal of an item over 400 KB.
func isItemTooLarge(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == "ValidationException" &&
		containsFold(ae.ErrorMessage(), "item size")
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

func numAttr(v types.AttributeValue) (int64, bool) {
	n, ok := v.(*types.AttributeValueMemberN)
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(n.Value, 10, 64)
	return i, err == nil
}

func strAttr(v types.AttributeValue) (string, bool) {
	s, ok := v.(*types.AttributeValueMemberS)
	if !ok {
		return "", false
	}
	return s.Value, true
}

func binAttr(v types.AttributeValue) ([]byte, bool) {
	b, ok := v.(*types.AttributeValueMemberB)
	if !ok {
		return nil, false
	}
	return b.Value, true
}

// fenceOf reads the fence of an item.
func (s *Store) fenceOf(key string, item map[string]types.AttributeValue) (uint64, error) {
	n, ok := item[attrFence].(*types.AttributeValueMemberN)
	if !ok {
		return 0, &store.CorruptError{Key: key, Reason: "item has no numeric fence"}
	}
	f, err := strconv.ParseUint(n.Value, 10, 64)
	if err != nil {
		return 0, &store.CorruptError{Key: key, Reason: "fence " + strconv.Quote(n.Value) + " is not a fence"}
	}
	return f, nil
}

// decode turns an item into a record (nil for no item), loading a spilled
// result. A damaged item fails closed with *idem.CorruptError.
func (s *Store) decode(ctx context.Context, key string, item map[string]types.AttributeValue) (*store.Record, error) {
	r, ref, err := s.decodeMeta(key, item)
	if err != nil || r == nil {
		return r, err
	}
	return r, s.loadSpilled(ctx, r, ref)
}

// loadSpilled sets the result of r from the spill reference ref, if any.
func (s *Store) loadSpilled(ctx context.Context, r *store.Record, ref string) error {
	if ref == "" {
		return nil
	}
	if s.cfg.Spiller == nil {
		return &store.CorruptError{Key: r.Key, Reason: "result was spilled but no Spiller is configured"}
	}
	data, err := s.cfg.Spiller.Load(ctx, ref)
	if errors.Is(err, store.ErrCorrupt) || errors.Is(err, store.ErrMisconfigured) {
		// The spiller vouches the result is gone or altered (corrupt), or
		// the bucket refuses the store (misconfigured): not a fault that
		// a retry could mend.
		return fmt.Errorf("dynamostore: load spilled result %s of %s: %w", ref, r.Key, err)
	}
	if err != nil {
		return fmt.Errorf("dynamostore: load spilled result %s of %s: %w", ref, r.Key, errors.Join(store.ErrUnavailable, err))
	}
	r.Result = data
	return nil
}

// decodeMeta decodes an item without loading a spilled result; ref is the
// spill reference of a spilled result, else "".
func (s *Store) decodeMeta(key string, item map[string]types.AttributeValue) (r *store.Record, ref string, err error) {
	if len(item) == 0 {
		return nil, "", nil
	}
	bad := func(what string) error {
		return &store.CorruptError{Key: key, Reason: "item attribute " + what}
	}
	r = &store.Record{Key: key}
	if stored := s.keyOfItem(item); stored != key {
		return nil, "", bad(fmt.Sprintf("key holds %q, not the key asked for", stored))
	}
	v, ok := numAttr(item[attrVersion])
	if !ok {
		return nil, "", bad(attrVersion + " (record version) missing: not an idem item")
	}
	if v != store.RecordVersion {
		return nil, "", bad(fmt.Sprintf("%s = %d, a record version this release does not read", attrVersion, v))
	}
	r.Version = int(v)
	st, _ := strAttr(item[s.cfg.StatusAttr])
	status, err := store.ParseStatus(st)
	if err != nil {
		return nil, "", bad(s.cfg.StatusAttr + ": " + err.Error())
	}
	r.Status = status
	if r.Fence, err = s.fenceOf(key, item); err != nil {
		return nil, "", err
	}
	if r.LeaseUntil, ok = numAttr(item[s.cfg.LeaseAttr]); !ok {
		return nil, "", bad(s.cfg.LeaseAttr + " missing or not a number")
	}
	if r.ExpiresAt, ok = numAttr(item[attrExpMs]); !ok {
		return nil, "", bad(attrExpMs + " missing or not a number")
	}
	if r.CreatedAt, ok = numAttr(item[attrCreated]); !ok {
		return nil, "", bad(attrCreated + " missing or not a number")
	}
	r.Owner, _ = strAttr(item[attrOwner])
	r.Fingerprint, _ = strAttr(item[s.cfg.ValidationAttr])
	r.Ref, _ = strAttr(item[attrRef])
	if h, ok := item[attrHold].(*types.AttributeValueMemberBOOL); ok {
		r.Hold = h.Value
	}
	r.CompletedAt, _ = numAttr(item[attrCompleted])
	if r.Steps, err = decodeSteps(item[attrSteps], bad); err != nil {
		return nil, "", err
	}
	switch r.Status {
	case store.StatusCompleted:
		if data, ok := binAttr(item[s.cfg.DataAttr]); ok {
			r.Result = data
		} else if ref, _ = strAttr(item[attrDataRef]); ref == "" {
			return nil, "", bad(s.cfg.DataAttr + " (result) missing or not binary")
		}
	case store.StatusFailed:
		e := &store.ErrorRecord{}
		e.Code, _ = strAttr(item[attrErrCode])
		e.Message, _ = strAttr(item[attrErrMsg])
		if b, ok := binAttr(item[attrErrBody]); ok && len(b) > 0 {
			e.Body = b
		}
		r.Err = e
	}
	return r, ref, nil
}
