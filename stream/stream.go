// Package stream is Warren's stream log: an append-only, offset-addressed log of records stored as
// chunks in the node's badger DB (through warren/storage), with retention by size and age at segment
// granularity, an in-memory chunk index, a cache of decoded chunks for tailing readers, and named
// consumer offsets.
//
// Storage keys of stream s (all integers big-endian, fixed width):
//
//	0x20|s|first         chunk: header + records (see chunk.go), first = offset of its first record
//	0x22|s               stream meta: version, retention watermark (first retained offset)
//	0x22|s|first         chunk index record: count, size, first/newest timestamp, segment number
//	0x21|s|name          named consumer offset (u64)
//
// A chunk and its index record are written in the same storage batch (chunk first). Open rebuilds the
// in-memory index from the index records alone (small values that stay in the LSM tree) plus a keys-only
// scan of the chunk keys to drop chunks a crash left without an index record.
//
// Durability: an Append's done callback runs after the storage commit of its chunk (fsynced unless the
// DB was opened with NoSync); records become visible to readers at the same moment.
package stream

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sort"
	"sync"
	"time"

	"warren/storage"
)

// ErrClosed is returned (and passed to Append callbacks) once the Log is closed.
var ErrClosed = errors.New("stream: log closed")

// Defaults of Options.
const (
	DefaultMaxSegmentBytes = 500_000_000
	DefaultChunkMaxRecords = 4096
	DefaultChunkMaxBytes   = 1 << 20
	DefaultCacheBytes      = 8 << 20
	defaultQueueBytes      = 16 << 20
	maxChunksPerBatch      = 16
)

// Record is one message in a stream.
type Record struct {
	Timestamp   int64 // Unix ms when appended (set by Append if 0)
	Exchange    string
	RoutingKey  string
	Props       []byte // raw AMQP properties
	Body        []byte
	FilterValue string // x-stream-filter-value header of the publish ("" = none)
}

// Entry is a record read back with its offset. Its Props and Body share memory with the log's chunk
// cache: treat them as read-only.
type Entry struct {
	Offset uint64
	Record
}

// Options configure a Log. Zero values mean the defaults.
type Options struct {
	MaxLengthBytes  int64         // x-max-length-bytes; 0 = unlimited
	MaxAge          time.Duration // x-max-age; 0 = unlimited
	MaxSegmentBytes int64         // x-stream-max-segment-size-bytes; default 500000000
	Logger          *slog.Logger  // nil = slog.Default()
	// ChunkMaxRecords and ChunkMaxBytes bound one chunk (defaults 4096 records, 1 MiB encoded). A
	// single record larger than ChunkMaxBytes gets a chunk of its own.
	ChunkMaxRecords int
	ChunkMaxBytes   int
	// CacheBytes bounds the cache of decoded chunks (default 8 MiB).
	CacheBytes int64
	// QueueBytes bounds the appends waiting for the writer; Append blocks beyond it (default 16 MiB).
	QueueBytes int64
}

// chunkInfo is the in-memory index entry of one chunk.
type chunkInfo struct {
	first   uint64
	count   uint32
	size    int64 // stored chunk bytes
	firstTs int64
	lastTs  int64  // newest timestamp in the chunk
	maxTs   int64  // newest timestamp in this chunk and every earlier one (for OffsetAt's binary search)
	seg     uint64 // segment number
}

func (c *chunkInfo) end() uint64 { return c.first + uint64(c.count) }

// segInfo summarises one segment: a run of consecutive chunks with the same segment number.
type segInfo struct {
	num    uint64
	chunks int
	bytes  int64
	maxTs  int64
}

// appendReq is one queued Append call.
type appendReq struct {
	recs  []Record
	done  func(uint64, error)
	ts    int64 // Unix ms at Append, for records without a timestamp
	bytes int64
}

// Log is one stream. All methods are safe for concurrent use.
type Log struct {
	db   *storage.DB
	id   uint64
	opts Options
	log  *slog.Logger

	// Append queue, guarded by qmu.
	qmu        sync.Mutex
	qspace     *sync.Cond
	queue      []appendReq
	queueBytes int64
	qclosed    bool

	// Committed index, guarded by mu; only the writer goroutine and retention change it.
	mu      sync.RWMutex
	chunks  []chunkInfo
	segs    []segInfo
	first   uint64
	next    uint64
	bytes   int64
	waiters map[uint64]chan struct{} // Wait channels by offset
	closed  bool                     // Close finished the writer: Wait returns a closed channel
	ready   chan struct{}            // always closed: returned by Wait when nothing needs waiting for

	cache *chunkCache

	wake       chan struct{} // capacity 1: pokes the writer
	stop       chan struct{} // closed by Close
	writerDone chan struct{}

	// retMu serialises ApplyRetention (so watermarks are committed in order); retClosed stops it after Close.
	retMu     sync.Mutex
	retClosed bool

	// Named offsets, guarded by offMu.
	offMu       sync.Mutex
	offsets     map[string]uint64
	offDirty    map[string]struct{} // changed since the last offset write was sent
	offInflight bool                // an offset write is being committed
	offClosed   bool

	// async counts storage commits still in flight (retention, offsets); Close waits for them.
	async sync.WaitGroup

	closeOnce sync.Once
}

// Open loads (or creates) stream id. One writer goroutine per Log batches concurrent Appends: everything
// appended while the previous write was being committed becomes the next chunk(s), written as one
// storage batch and one commit.
func Open(db *storage.DB, id uint64, opts Options) (*Log, error) {
	if opts.MaxSegmentBytes <= 0 {
		opts.MaxSegmentBytes = DefaultMaxSegmentBytes
	}
	if opts.ChunkMaxRecords <= 0 {
		opts.ChunkMaxRecords = DefaultChunkMaxRecords
	}
	if opts.ChunkMaxBytes <= 0 {
		opts.ChunkMaxBytes = DefaultChunkMaxBytes
	}
	if opts.CacheBytes <= 0 {
		opts.CacheBytes = DefaultCacheBytes
	}
	if opts.QueueBytes <= 0 {
		opts.QueueBytes = defaultQueueBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	l := &Log{
		db:         db,
		id:         id,
		opts:       opts,
		log:        opts.Logger,
		waiters:    make(map[uint64]chan struct{}),
		ready:      make(chan struct{}),
		cache:      newChunkCache(opts.CacheBytes),
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		writerDone: make(chan struct{}),
		offsets:    make(map[string]uint64),
		offDirty:   make(map[string]struct{}),
	}
	l.qspace = sync.NewCond(&l.qmu)
	close(l.ready)
	if err := l.load(); err != nil {
		return nil, err
	}
	go l.run()
	return l, nil
}

// load rebuilds the index and the named offsets from storage.
func (l *Log) load() error {
	metaKey := storage.StreamMetaKey(l.id)
	var watermark uint64
	switch v, err := l.db.Get(metaKey); {
	case err == nil:
		if watermark, err = decodeMeta(v); err != nil {
			return fmt.Errorf("stream %d: open: %w", l.id, err)
		}
	case errors.Is(err, storage.ErrNotFound):
	default:
		return fmt.Errorf("stream %d: open: read meta: %w", l.id, err)
	}

	var cleanup storage.Batch
	err := l.db.Scan(metaKey, false, func(k, v []byte) error {
		if len(k) == len(metaKey) {
			return nil // the meta record itself
		}
		if len(k) != len(metaKey)+8 {
			l.log.Warn("ignoring an unknown stream meta key", "stream_id", l.id, "key", fmt.Sprintf("%x", k))
			return nil
		}
		first := beUint64(k[len(metaKey):])
		if first < watermark {
			// Retention persisted the watermark but crashed before its deletes applied.
			cleanup.Delete(storage.StreamChunkKey(l.id, first))
			cleanup.Delete(append([]byte(nil), k...))
			return nil
		}
		ci, err := decodeIndex(first, v)
		if err != nil {
			return err
		}
		if n := len(l.chunks); n > 0 && l.chunks[n-1].end() != first {
			l.log.Error("stream index has a gap or overlap; offsets in between are lost",
				"stream_id", l.id, "prev_end", l.chunks[n-1].end(), "next_first", first)
			if l.chunks[n-1].end() > first {
				return fmt.Errorf("stream %d: open: %w: chunk %d overlaps the previous chunk ending at %d",
					l.id, errCorrupt, first, l.chunks[n-1].end())
			}
		}
		l.chunks = append(l.chunks, ci)
		return nil
	})
	if err != nil {
		return fmt.Errorf("stream %d: open: scan index: %w", l.id, err)
	}

	l.first, l.next = watermark, watermark
	if n := len(l.chunks); n > 0 {
		l.first = l.chunks[0].first
		l.next = l.chunks[n-1].end()
	}
	var maxTs int64
	for i := range l.chunks {
		c := &l.chunks[i]
		if i == 0 {
			maxTs = c.lastTs
		}
		maxTs = max(maxTs, c.lastTs)
		c.maxTs = maxTs
		l.bytes += c.size
		l.addToSegs(c)
	}

	// Chunks without an index record (a crash between the transactions of a split batch: never
	// confirmed) or below the watermark are removed.
	j := 0
	err = l.db.Scan(storage.StreamChunkPrefix(l.id), true, func(k, _ []byte) error {
		_, first, ok := storage.ParseStreamChunkKey(k)
		if !ok {
			return nil
		}
		for j < len(l.chunks) && l.chunks[j].first < first {
			j++
		}
		if j < len(l.chunks) && l.chunks[j].first == first {
			return nil
		}
		if first >= watermark {
			l.log.Warn("removing a stream chunk without an index record", "stream_id", l.id, "first", first)
		}
		cleanup.Delete(append([]byte(nil), k...))
		return nil
	})
	if err != nil {
		return fmt.Errorf("stream %d: open: scan chunks: %w", l.id, err)
	}
	if cleanup.Len() > 0 {
		if err := l.db.CommitSync(&cleanup); err != nil {
			return fmt.Errorf("stream %d: open: clean up: %w", l.id, err)
		}
	}

	err = l.db.Scan(storage.StreamOffsetPrefix(l.id), false, func(k, v []byte) error {
		_, name, ok := storage.ParseStreamOffsetKey(k)
		if !ok || len(v) != 8 {
			l.log.Warn("ignoring a malformed stored offset", "stream_id", l.id, "key", fmt.Sprintf("%x", k))
			return nil
		}
		l.offsets[name] = beUint64(v)
		return nil
	})
	if err != nil {
		return fmt.Errorf("stream %d: open: scan offsets: %w", l.id, err)
	}
	return nil
}

// addToSegs accounts chunk c (appended at the end of the index) in the segment summaries.
func (l *Log) addToSegs(c *chunkInfo) {
	if n := len(l.segs); n > 0 && l.segs[n-1].num == c.seg {
		s := &l.segs[n-1]
		s.chunks++
		s.bytes += c.size
		s.maxTs = max(s.maxTs, c.lastTs)
		return
	}
	l.segs = append(l.segs, segInfo{num: c.seg, chunks: 1, bytes: c.size, maxTs: c.lastTs})
}

// Append queues records; done (may be nil) is called once they are durable with the offset of the first
// record, or with an error. Records of one call stay contiguous and in order. The Log keeps recs and
// their slices until done runs: do not modify them. Append returns at once unless the queue is full
// (Options.QueueBytes), then it blocks until the writer catches up. done runs on the writer goroutine: it
// must be quick and must not call Append (which could wait for that very goroutine); after Close it
// gets ErrClosed on the calling goroutine.
func (l *Log) Append(recs []Record, done func(first uint64, err error)) {
	var size int64
	for i := range recs {
		size += int64(recordSize(&recs[i]))
	}
	l.qmu.Lock()
	for !l.qclosed && len(l.queue) > 0 && l.queueBytes+size > l.opts.QueueBytes {
		l.qspace.Wait()
	}
	if l.qclosed {
		l.qmu.Unlock()
		if done != nil {
			done(0, ErrClosed)
		}
		return
	}
	l.queue = append(l.queue, appendReq{recs: recs, done: done, ts: time.Now().UnixMilli(), bytes: size})
	l.queueBytes += size
	l.qmu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run is the writer goroutine.
func (l *Log) run() {
	defer close(l.writerDone)
	var tick <-chan time.Time
	if l.opts.MaxAge > 0 {
		t := time.NewTicker(min(5*time.Second, max(l.opts.MaxAge/10, 250*time.Millisecond)))
		defer t.Stop()
		tick = t.C
	}
	stopping := false
	var reqs []appendReq
	for {
		if !stopping {
			select {
			case <-l.wake:
			case <-tick:
				l.ApplyRetention(time.Now())
				continue
			case <-l.stop:
				stopping = true
			}
		}
		l.qmu.Lock()
		reqs, l.queue = l.queue, reqs[:0]
		l.queueBytes = 0
		l.qspace.Broadcast()
		l.qmu.Unlock()
		if len(reqs) == 0 {
			if stopping {
				return
			}
			continue
		}
		l.write(reqs)
		clear(reqs)
	}
}

// pendingChunk is a chunk built by write, not yet committed.
type pendingChunk struct {
	info chunkInfo
	blob []byte
}

// write turns queued appends into chunks, commits them as one storage batch, and publishes them.
func (l *Log) write(reqs []appendReq) {
	for len(reqs) > 0 {
		n := l.writeSome(reqs)
		reqs = reqs[n:]
	}
}

// writeSome writes the appends of reqs that fit in maxChunksPerBatch chunks (at least one request) and
// returns how many requests it handled.
func (l *Log) writeSome(reqs []appendReq) int {
	l.mu.RLock()
	base := l.next
	var lastSeg segInfo
	if n := len(l.segs); n > 0 {
		lastSeg = l.segs[n-1]
	}
	l.mu.RUnlock()

	var (
		chunks  []pendingChunk
		cur     []Record // records of the chunk being built
		curSize = chunkHeaderSize
		off     = base
		nreq    int
		b       storage.Batch
	)
	flush := func() {
		if len(cur) == 0 {
			return
		}
		blob, m := encodeChunk(off, cur, curSize)
		ci := chunkInfo{first: off, count: m.count, size: int64(len(blob)), firstTs: m.firstTs, lastTs: m.lastTs}
		if lastSeg.bytes > 0 && lastSeg.bytes+ci.size > l.opts.MaxSegmentBytes {
			lastSeg = segInfo{num: lastSeg.num + 1}
		}
		ci.seg = lastSeg.num
		lastSeg.bytes += ci.size
		chunks = append(chunks, pendingChunk{info: ci, blob: blob})
		b.Set(storage.StreamChunkKey(l.id, off), blob)
		b.Set(indexKey(l.id, off), encodeIndex(&ci))
		off += uint64(len(cur))
		cur = cur[:0]
		curSize = chunkHeaderSize
	}
	for nreq < len(reqs) && len(chunks) < maxChunksPerBatch {
		r := &reqs[nreq]
		for i := range r.recs {
			rec := r.recs[i]
			if rec.Timestamp == 0 {
				rec.Timestamp = r.ts
			}
			sz := recordSize(&rec)
			if len(cur) > 0 && (len(cur) >= l.opts.ChunkMaxRecords || curSize+sz > l.opts.ChunkMaxBytes) {
				flush()
			}
			cur = append(cur, rec)
			curSize += sz
		}
		nreq++
	}
	flush()
	if len(chunks) == 0 { // only empty appends
		for i := range reqs[:nreq] {
			if reqs[i].done != nil {
				reqs[i].done(base, nil)
			}
		}
		return nreq
	}

	errc := make(chan error, 1)
	l.db.Commit(&b, func(err error) { errc <- err })
	if err := <-errc; err != nil {
		err = fmt.Errorf("stream %d: append at offset %d: %w", l.id, base, err)
		l.log.Error("stream write failed", "stream_id", l.id, "err", err)
		for i := range reqs[:nreq] {
			if reqs[i].done != nil {
				reqs[i].done(0, err)
			}
		}
		return nreq
	}

	// Cache the new chunks (decoded from their own bytes) before readers can see them.
	for i := range chunks {
		if entries, _, err := decodeChunk(chunks[i].blob); err == nil {
			l.cache.put(chunks[i].info.first, entries, len(chunks[i].blob))
		}
	}
	l.mu.Lock()
	for i := range chunks {
		ci := chunks[i].info
		ci.maxTs = ci.lastTs
		if n := len(l.chunks); n > 0 {
			ci.maxTs = max(ci.maxTs, l.chunks[n-1].maxTs)
		}
		l.chunks = append(l.chunks, ci)
		l.addToSegs(&ci)
		l.bytes += ci.size
	}
	l.next = off
	for o, ch := range l.waiters {
		if o < l.next {
			close(ch)
			delete(l.waiters, o)
		}
	}
	l.mu.Unlock()
	// Retention before the callbacks: once an append is confirmed, the limits hold again.
	l.ApplyRetention(time.Now())

	first := base
	for i := range reqs[:nreq] {
		if reqs[i].done != nil {
			reqs[i].done(first, nil)
		}
		first += uint64(len(reqs[i].recs))
	}
	return nreq
}

// indexKey is the key of a chunk's index record: StreamMetaKey(stream) | first u64.
func indexKey(stream, first uint64) []byte {
	return storage.U64Key(storage.PrefixStreamMeta, stream, be64(first))
}

func be64(v uint64) []byte {
	b := make([]byte, 8)
	for i := 7; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
	return b
}

func beUint64(b []byte) uint64 {
	var v uint64
	for _, c := range b[:8] {
		v = v<<8 | uint64(c)
	}
	return v
}

// First is the first retained offset.
func (l *Log) First() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.first
}

// Next is the offset the next record will get (the number of records ever written).
func (l *Log) Next() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.next
}

// LastChunk returns the first offset of the last written chunk ("last" in x-stream-offset), or Next()
// if the log holds no chunk.
func (l *Log) LastChunk() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if n := len(l.chunks); n > 0 {
		return l.chunks[n-1].first
	}
	return l.next
}

// OffsetAt returns the first offset of the first chunk holding a record with a timestamp >= ts (Unix
// ms), or Next() if none: timestamp offsets have chunk granularity, as in RabbitMQ.
func (l *Log) OffsetAt(ts int64) uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	i := sort.Search(len(l.chunks), func(i int) bool { return l.chunks[i].maxTs >= ts })
	if i < len(l.chunks) {
		return l.chunks[i].first
	}
	return l.next
}

// Read appends to dst up to max entries with offset >= from (clamped up to First()), in offset order, and
// returns the extended slice. It reads whole chunks through a cache, so tailing readers are served from
// memory. It returns dst unchanged if from >= Next() or max <= 0. The entries' Props and Body are shared
// with the cache: read-only.
func (l *Log) Read(dst []Entry, from uint64, max int) ([]Entry, error) {
	taken := 0
	for taken < max {
		l.mu.RLock()
		if l.closed {
			l.mu.RUnlock()
			return dst, ErrClosed
		}
		if from < l.first {
			from = l.first
		}
		if from >= l.next || len(l.chunks) == 0 {
			l.mu.RUnlock()
			break
		}
		i := sort.Search(len(l.chunks), func(i int) bool { return l.chunks[i].end() > from })
		if i == len(l.chunks) {
			l.mu.RUnlock()
			break
		}
		ci := l.chunks[i]
		l.mu.RUnlock()
		if from < ci.first {
			from = ci.first // a gap in a damaged log
		}
		entries, err := l.chunk(&ci)
		if err != nil {
			if errors.Is(err, storage.ErrNotFound) && l.First() > ci.first {
				continue // removed by retention meanwhile: clamp again
			}
			return dst, err
		}
		k := int(from - ci.first)
		n := min(len(entries)-k, max-taken)
		dst = append(dst, entries[k:k+n]...)
		taken += n
		from += uint64(n)
	}
	return dst, nil
}

// chunk returns the decoded entries of a chunk, from the cache or from storage.
func (l *Log) chunk(ci *chunkInfo) ([]Entry, error) {
	if e := l.cache.get(ci.first); e != nil {
		return e, nil
	}
	blob, err := l.db.Get(storage.StreamChunkKey(l.id, ci.first))
	if err != nil {
		return nil, fmt.Errorf("stream %d: read chunk %d: %w", l.id, ci.first, err)
	}
	entries, m, err := decodeChunk(blob)
	if err == nil && (m.first != ci.first || m.count != ci.count) {
		err = fmt.Errorf("%w: header says first %d count %d, index says first %d count %d",
			errCorrupt, m.first, m.count, ci.first, ci.count)
	}
	if err != nil {
		l.log.Error("corrupt stream chunk", "stream_id", l.id, "first", ci.first, "err", err)
		return nil, fmt.Errorf("stream %d: read chunk %d: %w", l.id, ci.first, err)
	}
	l.cache.put(ci.first, entries, len(blob))
	return entries, nil
}

// Wait returns a channel that is closed as soon as Next() > offset, or when the log is closed.
func (l *Log) Wait(offset uint64) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.next > offset {
		return l.ready
	}
	ch, ok := l.waiters[offset]
	if !ok {
		ch = make(chan struct{})
		l.waiters[offset] = ch
	}
	return ch
}

// ApplyRetention removes whole old segments, oldest first, while the retained bytes exceed
// MaxLengthBytes or the segment's newest record is older than now-MaxAge; the newest segment is always
// kept. First() moves forward at once; the new first offset (a watermark that survives a restart) and
// the deletion of the chunks and their index records go to storage in one batch. The writer goroutine
// runs it after each write and periodically when MaxAge is set.
func (l *Log) ApplyRetention(now time.Time) {
	if l.opts.MaxLengthBytes <= 0 && l.opts.MaxAge <= 0 {
		return
	}
	l.retMu.Lock()
	defer l.retMu.Unlock()
	if l.retClosed {
		return
	}
	cutoff := now.UnixMilli() - l.opts.MaxAge.Milliseconds()

	l.mu.Lock()
	drop, nchunks, bytes := 0, 0, l.bytes
	for len(l.segs)-drop > 1 {
		s := &l.segs[drop]
		byBytes := l.opts.MaxLengthBytes > 0 && bytes > l.opts.MaxLengthBytes
		byAge := l.opts.MaxAge > 0 && s.maxTs < cutoff
		if !byBytes && !byAge {
			break
		}
		bytes -= s.bytes
		nchunks += s.chunks
		drop++
	}
	if drop == 0 {
		l.mu.Unlock()
		return
	}
	removed := make([]uint64, nchunks)
	for i := range removed {
		removed[i] = l.chunks[i].first
	}
	newFirst := l.chunks[nchunks].first
	l.chunks = compact(l.chunks, nchunks)
	l.segs = compact(l.segs, drop)
	l.bytes = bytes
	l.first = newFirst
	l.mu.Unlock()
	l.cache.drop(newFirst)

	var b storage.Batch
	b.Set(storage.StreamMetaKey(l.id), encodeMeta(newFirst))
	b.UseReserve() // it frees far more than the one record it sets
	for _, f := range removed {
		b.Delete(storage.StreamChunkKey(l.id, f))
		b.Delete(indexKey(l.id, f))
	}
	l.log.Debug("stream retention", "stream_id", l.id, "segments", drop, "chunks", nchunks, "first", newFirst)
	l.async.Add(1)
	l.db.Commit(&b, func(err error) {
		if err != nil {
			l.log.Error("stream retention: cannot delete old chunks", "stream_id", l.id, "first", newFirst, "err", err)
		}
		l.async.Done()
	})
}

// compact drops the first n elements of s, copying into a new array when most of it would be wasted.
func compact[T any](s []T, n int) []T {
	s = s[n:]
	if cap(s) > 64 && len(s) < cap(s)/4 {
		s = append(make([]T, 0, len(s)*2), s...)
	}
	return s
}

// Stats returns the number of retained records, their stored bytes and the number of segments.
func (l *Log) Stats() (records uint64, bytes int64, segments int) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.next - l.first, l.bytes, len(l.segs)
}

// StoreOffset records offset under a consumer name (server-side offset tracking). The write is
// asynchronous and coalesced: at most one offset write per stream is in flight, and it carries the
// latest offset of every name changed since the previous one. Close flushes and waits for it. It does
// nothing after Close.
func (l *Log) StoreOffset(name string, offset uint64) {
	l.offMu.Lock()
	if l.offClosed {
		l.offMu.Unlock()
		return
	}
	l.offsets[name] = offset
	l.offDirty[name] = struct{}{}
	b := l.takeDirtyOffsetsLocked()
	l.offMu.Unlock()
	l.commitOffsets(b)
}

// takeDirtyOffsetsLocked returns a batch of the changed offsets when none is in flight (nil otherwise)
// and marks it in flight. offMu must be held.
func (l *Log) takeDirtyOffsetsLocked() *storage.Batch {
	if l.offInflight || len(l.offDirty) == 0 {
		return nil
	}
	b := new(storage.Batch)
	b.UseReserve() // a consumer's progress, like an ack: it must work on a nearly full disk
	for name := range l.offDirty {
		b.Set(storage.StreamOffsetKey(l.id, name), be64(l.offsets[name]))
	}
	clear(l.offDirty)
	l.offInflight = true
	l.async.Add(1)
	return b
}

// commitOffsets commits a batch from takeDirtyOffsetsLocked; its callback sends the next one.
func (l *Log) commitOffsets(b *storage.Batch) {
	if b == nil {
		return
	}
	l.db.Commit(b, func(err error) {
		if err != nil {
			l.log.Error("cannot store stream consumer offsets", "stream_id", l.id, "err", err)
		}
		l.offMu.Lock()
		l.offInflight = false
		next := l.takeDirtyOffsetsLocked()
		l.offMu.Unlock()
		l.commitOffsets(next) // Commit may be called from a done callback
		l.async.Done()
	})
}

// LoadOffset returns the offset stored under name.
func (l *Log) LoadOffset(name string) (uint64, bool) {
	l.offMu.Lock()
	defer l.offMu.Unlock()
	o, ok := l.offsets[name]
	return o, ok
}

// Offsets returns a copy of every stored offset by consumer name.
func (l *Log) Offsets() map[string]uint64 {
	l.offMu.Lock()
	defer l.offMu.Unlock()
	return maps.Clone(l.offsets)
}

// Close stops the writer after it has written every queued append, waits for the log's pending storage
// writes, and wakes every Wait channel. Later Appends get ErrClosed, Reads return ErrClosed. The
// storage DB stays open. Close is idempotent.
func (l *Log) Close() error {
	l.closeOnce.Do(func() {
		l.qmu.Lock()
		l.qclosed = true
		l.qspace.Broadcast()
		l.qmu.Unlock()
		close(l.stop)
		<-l.writerDone

		l.retMu.Lock()
		l.retClosed = true
		l.retMu.Unlock()
		l.offMu.Lock()
		l.offClosed = true
		l.offMu.Unlock()
		l.async.Wait()

		l.mu.Lock()
		l.closed = true
		for o, ch := range l.waiters {
			close(ch)
			delete(l.waiters, o)
		}
		l.mu.Unlock()
		l.cache.clear()
	})
	return nil
}

// Delete closes the log and deletes every key of the stream: chunks, index and meta records, and
// stored offsets.
func (l *Log) Delete() error {
	if err := l.Close(); err != nil {
		return err
	}
	for _, p := range [][]byte{
		storage.StreamChunkPrefix(l.id),
		storage.StreamMetaKey(l.id), // the meta record and every index record
		storage.StreamOffsetPrefix(l.id),
	} {
		if _, err := l.db.DeleteRange(p); err != nil {
			return fmt.Errorf("stream %d: delete: %w", l.id, err)
		}
	}
	return nil
}
