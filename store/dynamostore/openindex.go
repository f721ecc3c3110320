package dynamostore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/seed-a1b882c0/idem/store"
)

// The open index (Config.OpenIndex) holds the records an operator looks
// for: IN_PROGRESS (stuck ones among them) and FAILED. An item is in it
// while it carries Config.OpenAttr, whose value is its status and its
// key's shard, "IN_PROGRESS#3": a new claim and a takeover set it, Fail
// sets it to FAILED, Complete removes it, and Release, Delete and TTL
// delete the item with it. Each in the request the write makes anyway.

// shardOf is the shard of key among n: FNV-1a (32 bits) of the key,
// modulo n. It depends on the key and n alone, so every process and every
// release puts a key's entry in the same shard.
func shardOf(key string, n int) int {
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= prime
	}
	return int(h % uint32(n))
}

// openValue is the open-index partition key value of key's record in
// status st.
func (s *Store) openValue(st store.Status, key string) string {
	return openShardValue(st, shardOf(key, s.cfg.StatusShards))
}

// openShardValue is the open-index partition key value of shard i of
// status st.
func openShardValue(st store.Status, i int) string {
	return st.String() + "#" + strconv.Itoa(i)
}

// openSet is the clause that puts key's item in the open index under st,
// for the end of an update's SET part, with its value added to vals and
// its name placeholder; "" and none without an open index.
func (s *Store) openSet(vals map[string]types.AttributeValue, st store.Status, key string) (string, []string) {
	if s.cfg.OpenIndex == "" {
		return "", nil
	}
	vals[":open"] = str(s.openValue(st, key))
	return ", #open = :open", []string{"#open"}
}

// openRemove is the clause that takes an item out of the open index, for
// the end of an update's REMOVE part, with its name placeholder; "" and
// none without an open index.
func (s *Store) openRemove() (string, []string) {
	if s.cfg.OpenIndex == "" {
		return "", nil
	}
	return ", #open", []string{"#open"}
}

// MigrateParams are the arguments of [Store.MigrateStatusIndex].
type MigrateParams struct {
	// Now (ms), when not zero, leaves alone the records expired at Now,
	// which listings skip and the table's TTL removes.
	Now int64
	// Segment and TotalSegments split the Scan between processes run at
	// the same time (DynamoDB's parallel Scan), each with its Segment in
	// 0..TotalSegments-1. Zero TotalSegments scans the whole table.
	Segment, TotalSegments int32
}

// MigrateResult counts what [Store.MigrateStatusIndex] did.
type MigrateResult struct {
	// Scanned is the number of idem items read with an entry to check:
	// the open ones, and the completed ones that carry an entry.
	Scanned int
	// Updated is the number of items whose entry was set, moved to
	// another shard or removed.
	Updated int
	// Raced is the number of items left as they were because their
	// status changed after the Scan read them: the write that changed it
	// set their entry (or deleted the item).
	Raced int
}

// MigrateStatusIndex brings every item's open-index entry
// (Config.OpenAttr) in line with its status, for a table that gains the
// open index: it sets the entry of the IN_PROGRESS and FAILED items that
// lack it (written before Config.OpenIndex was set, or by a process
// without it), removes it from COMPLETED items that still carry it, and
// moves it to the key's shard after Config.StatusShards changed. The
// store must have Config.OpenIndex; the index itself need not be ACTIVE
// yet.
//
// It Scans the table (with a composite key, only the store's partition
// value's items) and sends one UpdateItem per item to change, conditioned
// on the status it read: an entry depends on the key and the status
// alone, so it runs beside live traffic, and a second run finds nothing
// to change. Run it once every process writes with Config.OpenIndex set: a
// process without it completes a record without removing its entry (which
// listings skip, but which stays in the index). Its cost is a Scan of the
// table and one write per item changed; the SDK's retryer meets
// throttling.
func (s *Store) MigrateStatusIndex(ctx context.Context, p MigrateParams) (MigrateResult, error) {
	var res MigrateResult
	if s.cfg.OpenIndex == "" {
		return res, fmt.Errorf("dynamostore: MigrateStatusIndex needs Config.OpenIndex: %w", store.ErrInvalidConfig)
	}
	filter := "attribute_exists(#v) AND (#st IN (:ip, :failed) OR attribute_exists(#open))"
	vals := map[string]types.AttributeValue{":ip": str(store.StatusInProgress.String()), ":failed": str(store.StatusFailed.String())}
	ph := []string{"#v", "#st", "#open", "#pk", "#expms"}
	proj := "#pk, #st, #open, #expms"
	if s.cfg.SortKeyAttr != "" {
		filter += " AND #pk = :pk"
		vals[":pk"] = str(s.cfg.PartitionValue)
		ph, proj = append(ph, "#sk"), proj+", #sk"
	}
	in := &dynamodb.ScanInput{
		TableName: aws.String(s.cfg.Table), FilterExpression: aws.String(filter), ProjectionExpression: aws.String(proj),
		ExpressionAttributeNames: s.pick(ph...), ExpressionAttributeValues: vals,
	}
	if p.TotalSegments > 0 {
		in.Segment, in.TotalSegments = aws.Int32(p.Segment), aws.Int32(p.TotalSegments)
	}
	for {
		out, err := s.api.Scan(ctx, in)
		if err != nil {
			return res, s.translate("migrate status index", "", err)
		}
		for _, it := range out.Items {
			res.Scanned++
			outcome, err := s.migrateItem(ctx, p, it)
			if err != nil {
				return res, err
			}
			switch outcome {
			case migrateUpdated:
				res.Updated++
			case migrateRaced:
				res.Raced++
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return res, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// What migrateItem did with an item.
const (
	migrateNothing = iota // its entry was right (or it is expired)
	migrateUpdated        // its entry was set, moved or removed
	migrateRaced          // its status changed since the Scan read it
)

// migrateItem sets item's open-index entry from its status, if it is not
// already so.
func (s *Store) migrateItem(ctx context.Context, p MigrateParams, it map[string]types.AttributeValue) (int, error) {
	key := s.keyOfItem(it)
	stText, _ := strAttr(it[s.cfg.StatusAttr])
	st, err := store.ParseStatus(stText)
	if err != nil {
		return 0, &store.CorruptError{Key: key, Reason: "item attribute " + s.cfg.StatusAttr + ": " + err.Error()}
	}
	if exp, ok := numAttr(it[attrExpMs]); ok && p.Now != 0 && exp <= p.Now {
		return migrateNothing, nil
	}
	have, hasEntry := strAttr(it[s.cfg.OpenAttr])
	vals := map[string]types.AttributeValue{":st": str(st.String())}
	update := "REMOVE #open"
	if st != store.StatusCompleted {
		want := s.openValue(st, key)
		if hasEntry && have == want {
			return migrateNothing, nil
		}
		update, vals[":open"] = "SET #open = :open", str(want)
	} else if !hasEntry {
		return migrateNothing, nil
	}
	_, err = s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.cfg.Table), Key: s.itemKey(key),
		UpdateExpression: aws.String(update), ConditionExpression: aws.String("#st = :st"),
		ExpressionAttributeNames: s.pick("#open", "#st"), ExpressionAttributeValues: vals,
	})
	if err == nil {
		return migrateUpdated, nil
	}
	if _, failed := conditionFailed(err); failed {
		return migrateRaced, nil
	}
	return 0, s.translate("migrate status index", key, err)
}
