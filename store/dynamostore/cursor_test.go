package dynamostore

import (
	"errors"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"reflect"
	"testing"

	"github.com/seed-a1b882c0/idem"
)

// FuzzDecodeCursor: any string is either a cursor that re-encodes to the
// same key, or an ErrInvalidKey; never a panic.
func FuzzDecodeCursor(f *testing.F) {
	f.Add(encodeCursor(map[string]types.AttributeValue{"id": str("k")}))
	f.Add(encodeCursor(map[string]types.AttributeValue{"pk": str("idem"), "sk": str("a#b"), "in_progress_expiration": num(12)}))
	f.Add("")
	f.Add("e30")
	f.Add("!!")
	f.Fuzz(func(t *testing.T, c string) {
		k, err := decodeCursor(c)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("decodeCursor(%q): %v, want ErrInvalidKey", c, err)
			}
			return
		}
		k2, err := decodeCursor(encodeCursor(k))
		if c != "" && (err != nil || !reflect.DeepEqual(k, k2)) {
			t.Fatalf("cursor %q did not round-trip: %v, %v vs %v", c, err, k, k2)
		}
	})
}
