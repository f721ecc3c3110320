package dynamostore_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

var refs = dynamostore.ExternalRefs{Key: "$.k", Fence: "$.f", Owner: "$.o", Result: "$.r"}

// ExternalComplete lays the update out with the Config's attribute names,
// defaults applied: the composite key's static partition value, the
// status and data attributes named by the Config, the open-index
// attribute under its default name even without the index.
func TestExternalCompleteLayout(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg          dynamostore.Config
		key          []dynamostore.ExternalValue
		st, data, op string
	}{
		"default": {
			cfg: dynamostore.Config{Table: "t"},
			key: []dynamostore.ExternalValue{{Name: "id", Type: "S", Value: "$.k", Ref: true}},
			st:  "status", data: "data", op: "open_status",
		},
		"composite": {
			cfg: dynamostore.Config{Table: "t", KeyAttr: "pk", SortKeyAttr: "sk", StatusAttr: "state", DataAttr: "result", OpenIndex: "open", OpenAttr: "open_entry"},
			key: []dynamostore.ExternalValue{{Name: "pk", Type: "S", Value: "idem"}, {Name: "sk", Type: "S", Value: "$.k", Ref: true}},
			st:  "state", data: "result", op: "open_entry",
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			u, err := tc.cfg.ExternalComplete(refs)
			if err != nil {
				t.Fatal(err)
			}
			if u.TableName != "t" || !reflect.DeepEqual(u.Key, tc.key) {
				t.Errorf("table %q, key %+v; want t, %+v", u.TableName, u.Key, tc.key)
			}
			names := map[string]string{}
			for _, n := range u.Names {
				names[n.Placeholder] = n.Attr
			}
			want := map[string]string{"#st": tc.st, "#data": tc.data, "#fence": "fence", "#owner": "owner",
				"#ecode": "error_code", "#emsg": "error_message", "#ebody": "error_body", "#dref": "data_ref", "#open": tc.op}
			if !reflect.DeepEqual(names, want) {
				t.Errorf("names %v, want %v", names, want)
			}
			wantValues := []dynamostore.ExternalValue{
				{Name: ":done", Type: "S", Value: "COMPLETED"}, {Name: ":ip", Type: "S", Value: "IN_PROGRESS"},
				{Name: ":fence", Type: "N", Value: "$.f", Ref: true}, {Name: ":owner", Type: "S", Value: "$.o", Ref: true},
				{Name: ":data", Type: "B", Value: "$.r", Ref: true},
			}
			if !reflect.DeepEqual(u.Values, wantValues) {
				t.Errorf("values %+v, want %+v", u.Values, wantValues)
			}
		})
	}
}

// A Config without Table, or a ref left empty, is refused with a typed
// error.
func TestExternalCompleteRefusesBadInput(t *testing.T) {
	t.Parallel()
	if _, err := (dynamostore.Config{}).ExternalComplete(refs); !errors.Is(err, store.ErrInvalidConfig) {
		t.Errorf("no Table: %v, want ErrInvalidConfig", err)
	}
	r := refs
	r.Owner = ""
	if _, err := (dynamostore.Config{Table: "t"}).ExternalComplete(r); !errors.Is(err, store.ErrInvalidParams) {
		t.Errorf("empty Owner ref: %v, want ErrInvalidParams", err)
	}
}
