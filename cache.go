package idem

import (
	"container/list"
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

// CacheConfig bounds the engine's local cache of COMPLETED records. A hit
// replays with no store call. IN_PROGRESS and FAILED records are never
// cached, and an entry is dropped once its record's ExpiresAt passes.
type CacheConfig struct {
	// MaxEntries bounds the number of records. Default 10,000.
	MaxEntries int
	// MaxBytes bounds the summed result sizes. Default 64 MiB. A result
	// larger than a quarter of MaxBytes is not cached.
	MaxBytes int
}

func (c CacheConfig) withDefaults() CacheConfig {
	if c.MaxEntries <= 0 {
		c.MaxEntries = 10_000
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = 64 << 20
	}
	return c
}

// lru is a mutex-guarded LRU of COMPLETED records, bounded by count and
// bytes.
type lru struct {
	mu       sync.Mutex
	max      int
	maxBytes int
	bytes    int
	ll       *list.List
	items    map[string]*list.Element
}

type lruEntry struct {
	key         string
	fingerprint string
	result      []byte
	value       any // the decoded value, for cacheable types; else nil
	expiresAt   int64
}

func newLRU(c CacheConfig) *lru {
	return &lru{max: c.MaxEntries, maxBytes: c.MaxBytes, ll: list.New(), items: make(map[string]*list.Element)}
}

// get returns the entry under key if present and not expired at now.
func (c *lru) get(key string, now int64) (lruEntry, bool) {
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

// put caches a COMPLETED record, with its decoded value when the caller
// has it and the type is cacheable; anything else is ignored.
func (c *lru) put(r *store.Record, value any) {
	if r.Status != store.StatusCompleted || len(r.Result) > c.maxBytes/4 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[r.Key]; ok {
		c.removeLocked(el)
	}
	e := &lruEntry{key: r.Key, fingerprint: r.Fingerprint, result: r.Result, value: value, expiresAt: r.ExpiresAt}
	c.items[r.Key] = c.ll.PushFront(e)
	c.bytes += len(e.result)
	for c.ll.Len() > c.max || c.bytes > c.maxBytes {
		c.removeLocked(c.ll.Back())
	}
}

// forget drops key, if cached: its record was changed through a token.
func (c *lru) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.removeLocked(el)
	}
}

func (c *lru) removeLocked(el *list.Element) {
	e := el.Value.(*lruEntry)
	c.ll.Remove(el)
	delete(c.items, e.key)
	c.bytes -= len(e.result)
}
