package dynamostore

import (
	"strconv"

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
