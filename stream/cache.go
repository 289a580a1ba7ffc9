package stream

import (
	"container/list"
	"sync"
	"unsafe"
)

// entrySize is the in-memory size of one decoded Entry, counted against the cache budget.
const entrySize = int64(unsafe.Sizeof(Entry{}))

// cachedChunk is a chunk's stored bytes and, once a reader decoded them, its entries (which alias
// the bytes and are never modified).
type cachedChunk struct {
	first   uint64
	blob    []byte
	entries []Entry
	size    int64
}

// chunkCache is a byte-bounded LRU of chunks, so that tailing consumers and followers read the
// chunks just written from memory and replaying consumers decode each chunk once. Safe for
// concurrent use.
type chunkCache struct {
	mu    sync.Mutex
	max   int64
	size  int64
	order *list.List // of *cachedChunk, most recently used at the front
	byKey map[uint64]*list.Element
}

func newChunkCache(max int64) *chunkCache {
	return &chunkCache{max: max, order: list.New(), byKey: make(map[uint64]*list.Element)}
}

func (c *chunkCache) get(first uint64) *cachedChunk {
	el, ok := c.byKey[first]
	if !ok {
		return nil
	}
	c.order.MoveToFront(el)
	return el.Value.(*cachedChunk)
}

// blob returns a cached chunk's bytes, or nil.
func (c *chunkCache) blob(first uint64) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.get(first); cc != nil {
		return cc.blob
	}
	return nil
}

// entries returns a cached chunk's decoded entries, or nil.
func (c *chunkCache) entries(first uint64) []Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.get(first); cc != nil {
		return cc.entries
	}
	return nil
}

// put caches a chunk (entries may be nil: not decoded yet). A chunk larger than the whole budget is
// not kept.
func (c *chunkCache) put(first uint64, blob []byte, entries []Entry) {
	size := int64(len(blob)) + int64(len(entries))*entrySize
	if size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[first]; ok {
		cc := el.Value.(*cachedChunk)
		if cc.entries == nil && entries != nil {
			cc.entries = entries
			c.size += size - cc.size
			cc.size = size
		}
		c.order.MoveToFront(el)
	} else {
		c.byKey[first] = c.order.PushFront(&cachedChunk{first: first, blob: blob, entries: entries, size: size})
		c.size += size
	}
	for c.size > c.max {
		el := c.order.Back()
		cc := el.Value.(*cachedChunk)
		c.order.Remove(el)
		delete(c.byKey, cc.first)
		c.size -= cc.size
	}
}

// drop removes the chunks whose first offset is below first (retention); dropFrom those at or
// above from (truncation).
func (c *chunkCache) drop(first uint64) { c.remove(func(k uint64) bool { return k < first }) }

func (c *chunkCache) dropFrom(from uint64) { c.remove(func(k uint64) bool { return k >= from }) }

func (c *chunkCache) remove(match func(uint64) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, el := range c.byKey {
		if match(k) {
			c.size -= el.Value.(*cachedChunk).size
			c.order.Remove(el)
			delete(c.byKey, k)
		}
	}
}

// clear empties the cache.
func (c *chunkCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.order.Init()
	clear(c.byKey)
	c.size = 0
}
