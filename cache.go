// The local cache: a bounded LRU of COMPLETED records, which answers a
// replay with no store call.

package idem

import (
	"container/list"
	"crypto/sha256"
	"reflect"
	"sync"

	"github.com/seed-a1b882c0/idem/store"
)

// cacheable reports whether values of T may be handed to several callers
// from the local cache without decoding: T holds no pointers, slices, maps,
// interfaces, channels or functions, so a copy shares no memory with the
// cached one. Other types are decoded from the cached bytes on every hit.
func cacheable[T any]() bool {
	t := reflect.TypeFor[T]()
	if v, ok := cacheableTypes.Load(t); ok {
		return v.(bool)
	}
	ok := aliasFree(t)
	cacheableTypes.Store(t, ok)
	return ok
}

var cacheableTypes sync.Map // reflect.Type -> bool

func aliasFree(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128, reflect.String:
		return true
	case reflect.Array:
		return aliasFree(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if !aliasFree(t.Field(i).Type) {
				return false
			}
		}
		return true
	}
	return false
}

// lru is a mutex-guarded LRU of COMPLETED records, bounded by count and
// bytes.
type lru struct {
	mu       sync.Mutex
	max      int
	maxBytes int
	bytes    int
	ll       *list.List
	items    map[cacheKey]*list.Element
}

// cacheKey is a store key in parts, so that a call can look itself up
// without building the store key's string.
type cacheKey struct {
	name, tenant string
	sum          [sha256.Size]byte
}

// cacheKeyOf splits a store key; ok is false for a string that is not one.
func cacheKeyOf(key string) (ck cacheKey, ok bool) {
	k, err := ParseStoreKey(key)
	if err != nil {
		return cacheKey{}, false
	}
	ck.name, ck.tenant = k.Operation, k.Tenant
	for i := range ck.sum {
		ck.sum[i] = unhex(k.Digest[2*i])<<4 | unhex(k.Digest[2*i+1])
	}
	return ck, true
}

// unhex is the value of a lowercase hex digit.
func unhex(c byte) byte {
	if c >= 'a' {
		return c - 'a' + 10
	}
	return c - '0'
}

type lruEntry struct {
	ck          cacheKey
	key         string // the store key
	fingerprint string
	result      []byte
	value       any // the decoded value, for cacheable types; else nil
	expiresAt   int64
}

// newLRU returns a cache of at most entries records and bytes of results
// (0: 64 MiB).
func newLRU(entries, bytes int) *lru {
	if bytes <= 0 {
		bytes = 64 << 20
	}
	return &lru{max: entries, maxBytes: bytes, ll: list.New(), items: make(map[cacheKey]*list.Element)}
}

// get returns the entry under the store key if present and not expired
// at now.
func (c *lru) get(key string, now int64) (lruEntry, bool) {
	ck, ok := cacheKeyOf(key)
	if !ok {
		return lruEntry{}, false
	}
	return c.lookup(ck, now)
}

// lookup returns the entry under ck if present and not expired at now.
func (c *lru) lookup(key cacheKey, now int64) (lruEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		return lruEntry{}, false
	}
	e := el.Value.(*lruEntry)
	if now >= e.expiresAt {
		c.removeLocked(el)
		return lruEntry{}, false
	}
	c.ll.MoveToFront(el)
	return *e, true
}

// put caches a COMPLETED record (status), with its decoded value when the
// caller has it and the type is cacheable; anything else is ignored.
func (c *lru) put(key, fingerprint string, result []byte, value any, status store.Status, expiresAt int64) {
	if status != store.StatusCompleted || len(result) > c.maxBytes/4 {
		return
	}
	ck, ok := cacheKeyOf(key)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked(ck)
	e := &lruEntry{ck: ck, key: key, fingerprint: fingerprint, result: result, value: value, expiresAt: expiresAt}
	c.items[ck] = c.ll.PushFront(e)
	c.bytes += len(e.result)
	for c.ll.Len() > c.max || c.bytes > c.maxBytes {
		c.removeLocked(c.ll.Back())
	}
}

// forget drops key, if cached: its record was changed through a token.
func (c *lru) forget(key string) {
	ck, ok := cacheKeyOf(key)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked(ck)
}

// dropLocked removes the entry under ck, if any.
func (c *lru) dropLocked(ck cacheKey) {
	if el, ok := c.items[ck]; ok {
		c.removeLocked(el)
	}
}

func (c *lru) removeLocked(el *list.Element) {
	e := el.Value.(*lruEntry)
	c.ll.Remove(el)
	delete(c.items, e.ck)
	c.bytes -= len(e.result)
}
