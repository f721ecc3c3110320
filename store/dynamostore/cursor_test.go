package dynamostore

import (
	"errors"
	"reflect"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem/store"
)

// FuzzDecodeCursor: any string is either a cursor (an ExclusiveStartKey,
// or an open-index listing's positions per shard) that re-encodes to the
// same cursor, or an ErrInvalidCursor; never a panic.
func FuzzDecodeCursor(f *testing.F) {
	for _, c := range []cursor{
		{start: map[string]types.AttributeValue{"id": str("k")}},
		{start: map[string]types.AttributeValue{"pk": str("idem"), "sk": str("a#b"), "in_progress_expiration": num(12)}},
		{open: &openCursor{status: store.StatusInProgress, shards: []shardPos{
			{done: true}, {}, {after: map[string]types.AttributeValue{"id": str("k"), "open_status": str("IN_PROGRESS#2"), "in_progress_expiration": num(7)}},
		}}},
		{open: &openCursor{status: store.StatusFailed, shards: make([]shardPos, DefaultStatusShards)}},
	} {
		f.Add(c.encode())
	}
	f.Add("")
	f.Add("e30")
	f.Add("!!")
	f.Add("o.")
	f.Add("o.e30")
	f.Add("o.eyJzdCI6IkNPTVBMRVRFRCIsInNoIjpbe31dfQ") // {"st":"COMPLETED","sh":[{}]}
	f.Add("o.eyJzdCI6IkZBSUxFRCIsInNoIjpbeyJkIjp0cnVlLCJrIjp7fX1dfQ")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := decodeCursor(s)
		if err != nil {
			if !errors.Is(err, store.ErrInvalidCursor) {
				t.Fatalf("decodeCursor(%q): %v, want ErrInvalidCursor", s, err)
			}
			return
		}
		c2, err := decodeCursor(c.encode())
		if err != nil || !reflect.DeepEqual(c, c2) {
			t.Fatalf("cursor %q did not round-trip: %v, %+v vs %+v", s, err, c, c2)
		}
	})
}

// Each cursor form decodes to what was encoded, and the open-index form is
// never read as a key.
func TestCursorForms(t *testing.T) {
	t.Parallel()
	open := cursor{open: &openCursor{status: store.StatusInProgress, shards: []shardPos{
		{done: true}, {after: map[string]types.AttributeValue{"id": str("k"), "open_status": str("IN_PROGRESS#1"), "in_progress_expiration": num(7)}}, {},
	}}}
	start := cursor{start: map[string]types.AttributeValue{"id": str("k")}}
	for name, c := range map[string]cursor{"open": open, "start": start, "none": {}} {
		got, err := decodeCursor(c.encode())
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Errorf("%s: %q decoded to %+v, %v", name, c.encode(), got, err)
		}
	}
	if (cursor{}).encode() != "" {
		t.Errorf("zero cursor encodes to %q, want \"\"", cursor{}.encode())
	}
	for name, s := range map[string]string{
		"completed status": "o.eyJzdCI6IkNPTVBMRVRFRCIsInNoIjpbe31dfQ",
		"done at a key":    "o.eyJzdCI6IkZBSUxFRCIsInNoIjpbeyJkIjp0cnVlLCJrIjp7ImlkIjp7IlMiOiJrIn19fV19",
		"no shards":        "o.eyJzdCI6IkZBSUxFRCIsInNoIjpbXX0",
	} {
		if _, err := decodeCursor(s); !errors.Is(err, store.ErrInvalidCursor) {
			t.Errorf("%s: %v, want ErrInvalidCursor", name, err)
		}
	}
}
