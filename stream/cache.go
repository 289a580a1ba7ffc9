package stream

import (
	"container/list"
	"sync"
	"unsafe"
)

// entrySize is the in-memory size of one decoded Entry, counted against the cache budget.
const entrySize = int64(unsafe.Sizeof(Entry{}))

// cachedChunk is a decoded chunk; the entries alias the chunk bytes and are never modified.
type cachedChunk struct {
	first   uint64
	entries []Entry
	size    int64
}

// chunkCache is a byte-bounded LRU of decoded chunks, so that tailing consumers read the chunks just
// written from memory and replaying consumers decode each chunk once. Safe for concurrent use.
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

func (c *chunkCache) get(first uint64) []Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[first]
	if !ok {
		return nil
	}
	c.order.MoveToFront(el)
	return el.Value.(*cachedChunk).entries
}

// put caches a decoded chunk of blobSize stored bytes. A chunk larger than the whole budget is not kept.
func (c *chunkCache) put(first uint64, entries []Entry, blobSize int) {
	size := int64(blobSize) + int64(len(entries))*entrySize
	if size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[first]; ok {
		c.order.MoveToFront(el)
		return
	}
	c.byKey[first] = c.order.PushFront(&cachedChunk{first: first, entries: entries, size: size})
	c.size += size
	for c.size > c.max {
		el := c.order.Back()
		cc := el.Value.(*cachedChunk)
		c.order.Remove(el)
		delete(c.byKey, cc.first)
		c.size -= cc.size
	}
}

// drop removes the chunks whose first offset is below first (retention).
func (c *chunkCache) drop(first uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, el := range c.byKey {
		if k < first {
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
