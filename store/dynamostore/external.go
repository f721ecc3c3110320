package dynamostore

import (
	"fmt"

	"github.com/seed-a1b882c0/idem/store"
)

// ExternalRefs say how the sender of an [ExternalUpdate] supplies each
// value that comes from its input rather than from the store: a JSONPath,
// an intrinsic function call, whatever the sender evaluates. The store
// copies them into the request without reading them.
type ExternalRefs struct {
	// Key is the store key (a string).
	Key string
	// Fence and Owner are the claim's (a number and a string).
	Fence, Owner string
	// Result is the result's bytes as the store keeps them (binary): the
	// encoded value, the JSON text with idem's default JSONCodec.
	Result string
}

// ExternalUpdate is an UpdateItem laid out by the store's Config, for a
// writer other than the store that completes a claim — a Step Functions
// workflow completing its own key through the service's DynamoDB
// integration. It sets the record COMPLETED with the result, removes what
// a completed record must not keep (a stored error, a spilled result's
// reference, the open-index entry: removing an absent attribute is
// harmless), and holds the same claim condition as the store's fenced
// writes: status IN_PROGRESS, and the claim's fence and owner.
//
// What such a writer cannot do, with no clock in milliseconds: the
// condition does not check the record's expiry (a record past it still
// counts as absent after the write), completed_ms is left unset (the
// record's CompletedAt reads zero), and the expiry stays the one the
// claim set, so the result is replayed until then. There is no Spiller:
// the result must fit MaxResultBytes.
type ExternalUpdate struct {
	TableName string
	// Key is the item's primary key: the partition key, then the sort key
	// of a composite key.
	Key                                   []ExternalValue
	UpdateExpression, ConditionExpression string
	// Names are the expressions' name placeholders and the attribute
	// names they stand for, in the order the expressions use them.
	Names []ExternalName
	// Values are the expressions' value placeholders (Name) and values.
	Values []ExternalValue
}

// ExternalName is one name placeholder of an [ExternalUpdate].
type ExternalName struct {
	Placeholder, Attr string
}

// ExternalValue is one attribute value of an [ExternalUpdate]: a key
// attribute (Name is its attribute name) or a value placeholder (Name is
// the placeholder). Type is DynamoDB's type ("S", "N", "B"). When Ref is
// false Value is the value itself; when true it is one of the
// [ExternalRefs], for the sender to evaluate.
type ExternalValue struct {
	Name, Type, Value string
	Ref               bool
}

// externalUpdate and externalCond are the expressions of [ExternalUpdate]:
// Complete's update without the times an external writer cannot know, and
// fencedCond for IN_PROGRESS without the expiry check.
const (
	externalUpdate = "SET #st = :done, #data = :data REMOVE #ecode, #emsg, #ebody, #dref, #open"
	externalCond   = "#st = :ip AND #fence = :fence AND #owner = :owner"
)

// ExternalComplete returns the UpdateItem that completes a claim from
// outside the store, with c's attribute names and defaults applied (an
// open-index attribute is removed whether c has the index or not, under
// its default name unless c names it), and refs for the values the sender
// supplies. An invalid c (no Table) yields an error wrapping
// [store.ErrInvalidConfig]; an empty ref, one wrapping
// [store.ErrInvalidParams].
func (c Config) ExternalComplete(refs ExternalRefs) (ExternalUpdate, error) {
	c, err := c.withDefaults()
	if err != nil {
		return ExternalUpdate{}, err
	}
	for name, r := range map[string]string{"Key": refs.Key, "Fence": refs.Fence, "Owner": refs.Owner, "Result": refs.Result} {
		if r == "" {
			return ExternalUpdate{}, fmt.Errorf("dynamostore: ExternalRefs.%s is empty: say how the sender supplies it: %w", name, store.ErrInvalidParams)
		}
	}
	if c.OpenAttr == "" {
		c.OpenAttr = defaultOpenAttr
	}
	names := c.placeholders()
	u := ExternalUpdate{
		TableName:           c.Table,
		Key:                 []ExternalValue{{Name: c.KeyAttr, Type: "S", Value: refs.Key, Ref: true}},
		UpdateExpression:    externalUpdate,
		ConditionExpression: externalCond,
		Values: []ExternalValue{
			{Name: ":done", Type: "S", Value: store.StatusCompleted.String()},
			{Name: ":ip", Type: "S", Value: store.StatusInProgress.String()},
			{Name: ":fence", Type: "N", Value: refs.Fence, Ref: true},
			{Name: ":owner", Type: "S", Value: refs.Owner, Ref: true},
			{Name: ":data", Type: "B", Value: refs.Result, Ref: true},
		},
	}
	if c.SortKeyAttr != "" {
		u.Key = []ExternalValue{{Name: c.KeyAttr, Type: "S", Value: c.PartitionValue}, {Name: c.SortKeyAttr, Type: "S", Value: refs.Key, Ref: true}}
	}
	for _, ph := range []string{"#st", "#data", "#fence", "#owner", "#ecode", "#emsg", "#ebody", "#dref", "#open"} {
		u.Names = append(u.Names, ExternalName{Placeholder: ph, Attr: names[ph]})
	}
	return u, nil
}
