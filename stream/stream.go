// Package stream is Warren's stream log: an append-only, offset-addressed log of records stored as
// chunks in the node's badger DB (through warren/storage), in osiris's chunk format (format.go),
// with retention by size and age at segment granularity, an in-memory chunk index, a cache of
// chunks for tailing readers, deduplication of writers (tracking.go) and named consumer offsets.
//
// A Log is one replica of a stream. It is written either by its own writer (Append: the leader,
// or a stream served by one node) or by a follower copying the leader's chunks byte for byte
// (AppendChunks); replication itself lives in stream/replica. Every replica keeps three
// watermarks: written (chunks in the index), durable (chunks fsynced) and committed (chunks on a
// majority of replicas, told by the leader; equal to durable for a single replica). Readers see
// records below min(committed, durable); Append's callbacks run once their records are committed.
//
// Storage keys of stream s (all integers big-endian, fixed width):
//
//	0x20|s|first         chunk: an osiris chunk (or the first format, see chunk.go)
//	0x22|s               stream meta: retention watermark, fence, committed hint, epoch history
//	0x22|s|first         chunk index record: count, size, timestamps, segment, epoch, tracking
//	0x21|s|name          named consumer offset (u64)
//
// A chunk and its index record are written in the same storage batch (chunk first). Open rebuilds
// the in-memory index and the deduplication table from the index records alone (small values that
// stay in the LSM tree) plus a keys-only scan of the chunk keys to drop chunks a crash left without
// an index record.
//
// Lock order: wmu (index mutations: the writer, follower appends, truncation, retention) -> mu
// (the index and watermarks) -> the cache's lock; qmu (the append queue), offMu and metaMu are
// leaves. Callbacks (Append's done, the durable hook) run with no lock held.
package stream

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"warren/storage"
)

// Errors of the log.
var (
	// ErrClosed is returned (and passed to Append callbacks) once the Log is closed.
	ErrClosed = errors.New("stream: log closed")
	// ErrNotLeader is passed to Append callbacks when this replica is not writing (it is a
	// follower, or it stopped leading before the records were committed).
	ErrNotLeader = errors.New("stream: this replica is not the stream's leader")
	// ErrGap refuses an Append whose writer sequence skips numbers: an earlier record of that
	// writer is not stored (yet); the writer sends it and everything after it again.
	ErrGap = errors.New("stream: the writer's previous records are missing")
)

// Defaults of Options.
const (
	DefaultMaxSegmentBytes = 500_000_000
	DefaultChunkMaxRecords = 4096
	DefaultChunkMaxBytes   = 1 << 20
	DefaultCacheBytes      = 8 << 20
	defaultQueueBytes      = 16 << 20
	maxChunksPerBatch      = 16
	writerInflight         = 1
	lateTakeBytes          = 1 << 20 // see writeSome
)

// Record is one message in a stream.
type Record struct {
	Timestamp   int64 // Unix ms of its chunk (set by the writer)
	Exchange    string
	RoutingKey  string
	Props       []byte // raw AMQP 0-9-1 properties
	Body        []byte
	FilterValue string // x-stream-filter-value of the publish ("" = none)
	// Raw, when set on Append, is stored instead of Warren's record: an AMQP 1.0 message as a
	// stream-protocol publisher sent it. On read it is the stored AMQP 1.0 message, and the fields
	// above are its AMQP 0-9-1 mapping. A Raw whose first byte has the top bit set is an osiris
	// sub-batch entry as a stream-protocol publisher framed it (flag and compression, record
	// count, uncompressed and stored sizes, body): it is stored as one entry holding that many
	// records (offsets), and deduplicated as one (SubBatchRecords).
	Raw []byte
	// Deduplication (not read back): a record whose PublishingID is not above the highest stored
	// for PublisherID, or whose WriterSeq is not above the highest stored for WriterID, is dropped
	// (and its Append still succeeds once the original is committed). A WriterID's sequence must
	// grow by one per record: an Append that would skip numbers fails with ErrGap.
	PublisherID  string
	PublishingID uint64
	WriterID     string
	WriterSeq    uint64
	// WriterResync, on a request's first record, lifts the gap check: the writer knows that
	// every earlier record of its own is resolved (stored, or dropped as a duplicate).
	WriterResync bool
}

// Entry is a record read back with its offset. Its Props and Body share memory with the log's chunk
// cache: treat them as read-only.
type Entry struct {
	Offset uint64
	Record
}

// RawChunk is a stored chunk as replicas exchange it: the osiris bytes and the segment the
// leader put it in.
type RawChunk struct {
	Blob []byte
	Seg  uint64
}

// Options configure a Log. Zero values mean the defaults.
type Options struct {
	Name            string        // the stream's name (the routing key of AMQP 1.0 records without one)
	MaxLengthBytes  int64         // x-max-length-bytes; 0 = unlimited
	MaxAge          time.Duration // x-max-age; 0 = unlimited
	MaxSegmentBytes int64         // x-stream-max-segment-size-bytes; default 500000000
	Logger          *slog.Logger  // nil = slog.Default()
	// ChunkMaxRecords and ChunkMaxBytes bound one chunk (defaults 4096 records, 1 MiB encoded). A
	// single record larger than ChunkMaxBytes gets a chunk of its own.
	ChunkMaxRecords int
	ChunkMaxBytes   int
	// CacheBytes bounds the cache of chunks (default 8 MiB).
	CacheBytes int64
	// QueueBytes bounds the appends waiting for the writer; Append blocks beyond it (default 16 MiB).
	QueueBytes int64
	// Replicated opens the log as a replica that neither writes nor commits until told
	// (StartWriting, SetCommitted). Without it the log is a stream of one replica: it writes at
	// once (epoch 1) and its durable records are committed.
	Replicated bool
	// OnRetention, if set, is called by the writer (instead of deleting) with the first offset to
	// keep when the retention limits call for removing segments: a replicated stream decides
	// retention once and every replica applies it with DropBefore. It must not block.
	OnRetention func(first uint64)
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
	epoch   uint64 // the leader's epoch when written (0 for the first format)
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
	ts    int64 // Unix ms at Append
	bytes int64
}

// pendingDone is an Append waiting for its records to be committed.
type pendingDone struct {
	end   uint64 // committed must reach it
	first uint64
	done  func(uint64, error)
}

// Log is one replica of a stream. All methods are safe for concurrent use.
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

	// wmu serialises the changes of the index (see the lock order).
	wmu     sync.Mutex
	builder chunkBuilder // writer only, under wmu

	// The index, watermarks and replica state, guarded by mu.
	mu         sync.RWMutex
	chunks     []chunkInfo
	segs       []segInfo
	first      uint64 // first retained offset
	written    uint64 // end of the chunks in the index
	durable    uint64 // end of the fsynced chunks
	committed  uint64 // end of the chunks on a majority (may exceed durable on a leader)
	bytes      int64
	writing    bool   // this replica is the writer
	epoch      uint64 // the epoch written with, while writing
	autoCommit bool   // committed follows durable (a single replica)
	fence      uint64
	history    []EpochStart
	table      tracking
	pend       []pendingDone
	unstored   map[uint64][]byte // chunks in the index not yet stored (the cache may drop them)
	onDurable  func(durable uint64)
	readCh     chan struct{} // closed and replaced when the readable end advances
	writeCh    chan struct{} // closed and replaced when written advances
	closed     bool
	failed     error  // a storage write failed: the replica stopped
	retainAsk  uint64 // the last first offset passed to OnRetention

	cache *chunkCache
	// readBufs holds the buffers of chunks read from storage for a delivery, given back by
	// DeliveryChunk.Release once written: a consumer catching up reads a chunk per credit, and
	// a new buffer each time was most of the broker's allocations (and collections) then.
	readBufs sync.Pool

	wake       chan struct{} // capacity 1: pokes the writer
	retune     chan struct{} // capacity 1: the retention limits changed (SetRetention)
	writeSem   chan struct{} // the writer's storage batches in flight (capacity writerInflight)
	stop       chan struct{} // closed by Close
	writerDone chan struct{}

	// Meta record writes, guarded by metaMu: at most one asynchronous write in flight.
	metaMu       sync.Mutex
	metaInflight bool
	metaDirty    bool
	metaClosed   bool

	// Named offsets, guarded by offMu.
	offMu       sync.Mutex
	offsets     map[string]uint64
	offDirty    map[string]struct{} // changed since the last offset write was sent
	offInflight bool                // an offset write is being committed
	offClosed   bool

	// async counts storage commits still in flight (chunks, retention, offsets, meta); Close waits.
	async sync.WaitGroup
	// chunkWrites counts chunk batches in flight: truncation and reset wait for them (under wmu,
	// so no new one starts).
	chunkWrites sync.WaitGroup

	closeOnce sync.Once
}

// Open loads (or creates) stream id. One writer goroutine per Log batches concurrent Appends:
// everything appended while the previous batch was being built becomes the next chunk(s), one
// storage batch; batches are committed in order by the storage's group committer.
func Open(db *storage.DB, id uint64, opts Options) (*Log, error) {
	if opts.MaxSegmentBytes <= 0 {
		opts.MaxSegmentBytes = DefaultMaxSegmentBytes
	}
	if opts.ChunkMaxRecords <= 0 {
		opts.ChunkMaxRecords = DefaultChunkMaxRecords
	}
	if opts.ChunkMaxRecords > 65535 {
		opts.ChunkMaxRecords = 65535 // an osiris chunk counts its entries in 16 bits
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
		table:      make(tracking),
		unstored:   make(map[uint64][]byte),
		readCh:     make(chan struct{}),
		writeCh:    make(chan struct{}),
		cache:      newChunkCache(opts.CacheBytes),
		wake:       make(chan struct{}, 1),
		retune:     make(chan struct{}, 1),
		writeSem:   make(chan struct{}, writerInflight),
		stop:       make(chan struct{}),
		writerDone: make(chan struct{}),
		offsets:    make(map[string]uint64),
		offDirty:   make(map[string]struct{}),
	}
	l.qspace = sync.NewCond(&l.qmu)
	meta, err := l.load()
	if err != nil {
		return nil, err
	}
	l.durable = l.written
	if opts.Replicated {
		l.committed = min(meta.committed, l.written)
	} else {
		l.autoCommit = true
		l.committed = l.written
	}
	go l.run()
	if !opts.Replicated {
		if err := l.StartWriting(1); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// load rebuilds the index, the tracking table and the named offsets from storage.
func (l *Log) load() (logMeta, error) {
	metaKey := storage.StreamMetaKey(l.id)
	var meta logMeta
	switch v, err := l.db.Get(metaKey); {
	case err == nil:
		if meta, err = decodeMeta(v); err != nil {
			return meta, fmt.Errorf("stream %d: open: %w", l.id, err)
		}
	case errors.Is(err, storage.ErrNotFound):
	default:
		return meta, fmt.Errorf("stream %d: open: read meta: %w", l.id, err)
	}
	l.fence, l.history = meta.fence, meta.history
	watermark := meta.first

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
		ci, trailer, snap, err := decodeIndex(first, v)
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
		if len(l.chunks) == 0 && len(snap) > 0 {
			t, err := decodeSnapshot(snap)
			if err != nil {
				return err
			}
			l.table = t
		}
		if err := l.table.applyTrailer(trailer, first); err != nil {
			return err
		}
		l.chunks = append(l.chunks, ci)
		return nil
	})
	if err != nil {
		return meta, fmt.Errorf("stream %d: open: scan index: %w", l.id, err)
	}

	l.first, l.written = watermark, watermark
	if n := len(l.chunks); n > 0 {
		l.first = l.chunks[0].first
		l.written = l.chunks[n-1].end()
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
		return meta, fmt.Errorf("stream %d: open: scan chunks: %w", l.id, err)
	}
	if cleanup.Len() > 0 {
		if err := l.db.CommitSync(&cleanup); err != nil {
			return meta, fmt.Errorf("stream %d: open: clean up: %w", l.id, err)
		}
	}
	// Epoch history entries past the end of the log (a crash after a marker's write) still hold:
	// the marker says where the epoch started, and nothing later was written.

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
		return meta, fmt.Errorf("stream %d: open: scan offsets: %w", l.id, err)
	}
	return meta, nil
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

// readableLocked is the end of what readers may see (mu held).
func (l *Log) readableLocked() uint64 { return min(l.committed, l.durable, l.written) }

// First is the first retained offset.
func (l *Log) First() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.first
}

// Next is the offset after the last committed record readers can see: the offset the next
// record readers will see gets ("next" in x-stream-offset).
func (l *Log) Next() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return max(l.readableLocked(), l.first)
}

// Written is the end of the chunks this replica has (committed or not).
func (l *Log) Written() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.written
}

// Durable is the end of the chunks this replica has fsynced.
func (l *Log) Durable() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.durable
}

// Committed is the end of the records known to be on a majority of the replicas.
func (l *Log) Committed() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.committed
}

// LastChunk returns the first offset of the last readable chunk ("last" in x-stream-offset), or
// Next() if the log holds no readable chunk.
func (l *Log) LastChunk() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	end := l.readableLocked()
	i := sort.Search(len(l.chunks), func(i int) bool { return l.chunks[i].end() > end }) - 1
	if i >= 0 {
		return l.chunks[i].first
	}
	return max(end, l.first)
}

// OffsetAt returns the first offset of the first chunk holding a record with a timestamp >= ts (Unix
// ms), or Next() if none: timestamp offsets have chunk granularity, as in RabbitMQ.
func (l *Log) OffsetAt(ts int64) uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	end := l.readableLocked()
	i := sort.Search(len(l.chunks), func(i int) bool { return l.chunks[i].maxTs >= ts })
	if i < len(l.chunks) && l.chunks[i].first < end {
		return l.chunks[i].first
	}
	return max(end, l.first)
}

// Read appends to dst up to max committed entries with offset >= from (clamped up to First()), in
// offset order, and returns the extended slice. It reads whole chunks through a cache, so tailing
// readers are served from memory. It returns dst unchanged if from >= Next() or max <= 0. The
// entries' Props and Body are shared with the cache: read-only.
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
		end := l.readableLocked()
		if from >= end || len(l.chunks) == 0 {
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
		entries, err := l.entries(&ci)
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

// blob returns a chunk's stored bytes, from the cache or from storage.
func (l *Log) blob(ci *chunkInfo) ([]byte, error) {
	b, _, err := l.blobInto(ci, nil)
	return b, err
}

// blobInto is blob reading from storage into dst's storage (when it has the capacity); read
// reports that it did read from storage (b is not shared with the cache).
func (l *Log) blobInto(ci *chunkInfo, dst []byte) (b []byte, read bool, err error) {
	if b := l.memBlob(ci); b != nil {
		return b, false, nil
	}
	b, err = l.db.GetInto(storage.StreamChunkKey(l.id, ci.first), dst)
	if err != nil {
		return nil, false, fmt.Errorf("stream %d: read chunk %d: %w", l.id, ci.first, err)
	}
	return b, true, nil
}

// memBlob returns chunk ci's bytes when they are in memory (the cache, or not stored yet), or nil.
func (l *Log) memBlob(ci *chunkInfo) []byte {
	if b := l.cache.blob(ci.first); b != nil {
		return b
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.unstored[ci.first]
}

// entries returns the decoded entries of a chunk, from the cache or from storage.
func (l *Log) entries(ci *chunkInfo) ([]Entry, error) {
	if e := l.cache.entries(ci.first); e != nil {
		return e, nil
	}
	b, err := l.blob(ci)
	if err != nil {
		return nil, err
	}
	return l.decodeAndCache(ci, b)
}

// decodeAndCache decodes chunk ci's stored bytes b and caches both. The entries alias b, so b
// must not be modified or reused afterwards.
func (l *Log) decodeAndCache(ci *chunkInfo, b []byte) ([]Entry, error) {
	entries, m, err := decodeChunk(b, l.opts.Name)
	if err == nil && (m.first != ci.first || m.count != ci.count) {
		err = fmt.Errorf("%w: header says first %d count %d, index says first %d count %d",
			errCorrupt, m.first, m.count, ci.first, ci.count)
	}
	if err != nil {
		l.log.Error("corrupt stream chunk", "stream_id", l.id, "first", ci.first, "err", err)
		return nil, fmt.Errorf("stream %d: read chunk %d: %w", l.id, ci.first, err)
	}
	l.cache.put(ci.first, b, entries)
	return entries, nil
}

// Wait returns a channel that is closed as soon as Next() > offset, or when the log is closed.
func (l *Log) Wait(offset uint64) <-chan struct{} {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed || l.readableLocked() > offset {
		return closedChan
	}
	return l.readCh
}

// WaitWritten returns a channel that is closed once Written() > offset, the index is cut below
// offset, or the log is closed.
func (l *Log) WaitWritten(offset uint64) <-chan struct{} {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed || l.written > offset {
		return closedChan
	}
	return l.writeCh
}

// closedChan is returned by the waits when nothing needs waiting for; it is never written.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// advanceLocked wakes the readers and writers' waiters after watermarks moved (mu held) and
// returns the Append callbacks now due.
func (l *Log) advanceLocked(readBefore, writtenBefore uint64) []pendingDone {
	if l.readableLocked() != readBefore {
		close(l.readCh)
		l.readCh = make(chan struct{})
	}
	if l.written != writtenBefore {
		close(l.writeCh)
		l.writeCh = make(chan struct{})
	}
	n := 0
	for n < len(l.pend) && l.pend[n].end <= l.committed {
		n++
	}
	if n == 0 {
		return nil
	}
	due := append([]pendingDone(nil), l.pend[:n]...)
	l.pend = compact(l.pend, n)
	return due
}

func runDone(due []pendingDone, err error) {
	for _, p := range due {
		if p.done != nil {
			if err != nil {
				p.done(0, err)
			} else {
				p.done(p.first, nil)
			}
		}
	}
}

// Stats returns the number of retained records, their stored bytes and the number of segments.
func (l *Log) Stats() (records uint64, bytes int64, segments int) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return max(l.readableLocked(), l.first) - l.first, l.bytes, len(l.segs)
}

// compact drops the first n elements of s, copying into a new array when most of it would be wasted.
func compact[T any](s []T, n int) []T {
	clear(s[:n])
	s = s[n:]
	if cap(s) > 64 && len(s) < cap(s)/4 {
		s = append(make([]T, 0, len(s)*2), s...)
	}
	return s
}

// Close stops the writer after it has handled every queued append, waits for the log's pending
// storage writes, fails the appends still waiting for a commit (ErrClosed) and wakes every Wait
// channel. Later Appends get ErrClosed, Reads return ErrClosed. The storage DB stays open. Close is
// idempotent.
func (l *Log) Close() error {
	l.closeOnce.Do(func() {
		l.qmu.Lock()
		l.qclosed = true
		l.qspace.Broadcast()
		l.qmu.Unlock()
		close(l.stop)
		<-l.writerDone

		l.metaMu.Lock()
		l.metaClosed = true
		l.metaMu.Unlock()
		l.offMu.Lock()
		l.offClosed = true
		l.offMu.Unlock()
		l.async.Wait()

		l.mu.Lock()
		l.closed = true
		l.writing = false
		due := l.pend
		l.pend = nil
		close(l.readCh)
		l.readCh = make(chan struct{})
		close(l.writeCh)
		l.writeCh = make(chan struct{})
		l.mu.Unlock()
		runDone(due, ErrClosed)
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
