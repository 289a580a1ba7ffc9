package stream

import (
	"errors"
	"fmt"
	"maps"
	"sort"

	"warren/storage"
)

// The replica side of replication: what stream/replica needs of a Log to make it a copy of the
// leader's (fencing, the epoch history, truncation of a divergent end, appending the leader's
// chunks as they are, a reset when the leader no longer has what the replica misses) and what a
// leader serves to its followers (raw chunks).

// ErrNotChunkBoundary is returned by ReadChunks for an offset inside a chunk.
var ErrNotChunkBoundary = errors.New("stream: offset is not a chunk boundary")

// ErrBelowFirst is returned by ReadChunks for an offset below the first retained one.
var ErrBelowFirst = errors.New("stream: offset below the first retained offset")

// Tail is where a replica's log ends, as a new leader compares replicas: by LastEpoch first, then
// by Written.
type Tail struct {
	LastEpoch uint64 // the last epoch of the history (0: none)
	Written   uint64
	First     uint64
}

// Less orders tails: the one with the later epoch, then the longer log, is ahead.
func (t Tail) Less(o Tail) bool {
	if t.LastEpoch != o.LastEpoch {
		return t.LastEpoch < o.LastEpoch
	}
	return t.Written < o.Written
}

func (l *Log) tailLocked() Tail {
	t := Tail{Written: l.written, First: l.first}
	if n := len(l.history); n > 0 {
		t.LastEpoch = l.history[n-1].Epoch
	}
	return t
}

// Tail returns where the log ends.
func (l *Log) Tail() Tail {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.tailLocked()
}

// Fence promises (durably) to follow no leader of an epoch below epoch: a replica writing with an
// older epoch stops. It returns the log's tail and the fence now in force (above epoch if the
// replica already promised a later leader).
func (l *Log) Fence(epoch uint64) (Tail, uint64, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return Tail{}, 0, ErrClosed
	}
	raise := epoch > l.fence
	stop := l.writing && l.epoch < epoch
	if raise {
		l.fence = epoch
	}
	l.mu.Unlock()
	if stop {
		l.StopWriting()
	}
	if raise {
		if err := l.writeMetaSync(); err != nil {
			return Tail{}, 0, err
		}
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.tailLocked(), l.fence, nil
}

// Fenced is the highest epoch this replica promised to follow.
func (l *Log) Fenced() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.fence
}

// History returns the epoch history.
func (l *Log) History() []EpochStart {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return append([]EpochStart(nil), l.history...)
}

// EpochEnd returns the largest epoch e' <= epoch of the history and the offset where this log's
// records of e' end (the start of the next epoch, or Written()); epoch 0 stands for records older
// than any history.
func (l *Log) EpochEnd(epoch uint64) (uint64, uint64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	i := sort.Search(len(l.history), func(i int) bool { return l.history[i].Epoch > epoch })
	// history[:i] have Epoch <= epoch.
	var e uint64
	if i > 0 {
		e = l.history[i-1].Epoch
	}
	if i < len(l.history) {
		return e, l.history[i].Start
	}
	return e, l.written
}

// AddEpoch records that epoch e.Epoch starts at e.Start, which must be where the log ends: the
// marker a follower writes when it reaches the start of an epoch in the history of its leader,
// the leader of epoch leader (refused with ErrFenced if this replica promised a later one). It is
// durable on return.
func (l *Log) AddEpoch(leader uint64, e EpochStart) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	if l.writing {
		l.mu.Unlock()
		return fmt.Errorf("stream %d: add epoch %d: this replica is writing", l.id, e.Epoch)
	}
	if e.Start != l.written {
		w := l.written
		l.mu.Unlock()
		return fmt.Errorf("stream %d: epoch %d starts at %d, the log ends at %d", l.id, e.Epoch, e.Start, w)
	}
	if leader < l.fence {
		l.mu.Unlock()
		return ErrFenced
	}
	if n := len(l.history); n > 0 && l.history[n-1].Epoch >= e.Epoch {
		last := l.history[n-1]
		l.mu.Unlock()
		if last == e {
			return nil
		}
		return fmt.Errorf("stream %d: epoch %d at %d is not after epoch %d at %d", l.id, e.Epoch, e.Start, last.Epoch, last.Start)
	}
	l.history = append(l.history, e)
	l.mu.Unlock()
	return l.writeMetaSync()
}

// ErrFenced refuses chunks from a leader of an epoch older than the one this replica promised.
var ErrFenced = errors.New("stream: this replica follows a later epoch")

// AppendChunks appends chunks of the leader of epoch as they are (each must start where the log
// ends, in the osiris format, with an intact data CRC), unless this replica promised a later
// epoch (ErrFenced: checked atomically with the append, so nothing lands after a promise). They
// are written as one storage batch; the durable hook tells when they are on disk. The Log keeps
// the blobs.
func (l *Log) AppendChunks(epoch uint64, chunks []RawChunk) error {
	if len(chunks) == 0 {
		return nil
	}
	st := make([]staged, 0, len(chunks))
	for _, c := range chunks {
		pc, err := parseChunk(c.Blob)
		if err != nil {
			return fmt.Errorf("stream %d: append replicated chunk: %w", l.id, err)
		}
		ts := pc.hdr.Timestamp
		st = append(st, staged{info: chunkInfo{first: pc.hdr.ChunkID, count: pc.hdr.NumRecords, size: int64(len(c.Blob)),
			firstTs: ts, lastTs: ts, seg: c.Seg, epoch: pc.hdr.Epoch}, blob: c.Blob, trailer: pc.trailer})
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.RLock()
	writing := l.writing
	l.mu.RUnlock()
	if writing {
		return fmt.Errorf("stream %d: append replicated chunks: this replica is writing", l.id)
	}
	return l.commitStagedFenced(st, epoch)
}

// ReadChunks returns the stored chunks from offset from (a chunk boundary) up to about maxBytes
// (at least one chunk), committed or not. It returns nothing when from is Written().
func (l *Log) ReadChunks(from uint64, maxBytes int) ([]RawChunk, error) {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return nil, ErrClosed
	}
	if from < l.first {
		l.mu.RUnlock()
		return nil, ErrBelowFirst
	}
	if from >= l.written {
		l.mu.RUnlock()
		return nil, nil
	}
	i := sort.Search(len(l.chunks), func(i int) bool { return l.chunks[i].first >= from })
	if i == len(l.chunks) || l.chunks[i].first != from {
		l.mu.RUnlock()
		return nil, ErrNotChunkBoundary
	}
	var infos []chunkInfo
	size := 0
	for ; i < len(l.chunks) && (len(infos) == 0 || size+int(l.chunks[i].size) <= maxBytes); i++ {
		infos = append(infos, l.chunks[i])
		size += int(l.chunks[i].size)
	}
	l.mu.RUnlock()
	out := make([]RawChunk, 0, len(infos))
	for i := range infos {
		b, err := l.blob(&infos[i])
		if err != nil {
			if len(out) > 0 {
				return out, nil
			}
			if errors.Is(err, storage.ErrNotFound) && l.First() > infos[i].first {
				return nil, ErrBelowFirst
			}
			return nil, err
		}
		out = append(out, RawChunk{Blob: b, Seg: infos[i].seg})
	}
	return out, nil
}

// Truncate removes the chunks at or after offset to (a chunk boundary: where this log and the
// leader's diverge) and the epochs of the history above maxEpoch or starting after to. It is
// durable on return.
func (l *Log) Truncate(to, maxEpoch uint64) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.RLock()
	writing := l.writing
	l.mu.RUnlock()
	if writing {
		return fmt.Errorf("stream %d: truncate: this replica is writing", l.id)
	}
	l.chunkWrites.Wait()
	table, err := l.trackingBefore(to)
	if err != nil {
		return err
	}
	l.mu.Lock()
	i := sort.Search(len(l.chunks), func(i int) bool { return l.chunks[i].first >= to })
	if i > 0 && l.chunks[i-1].end() > to {
		l.mu.Unlock()
		return fmt.Errorf("stream %d: truncate at %d: %w", l.id, to, ErrNotChunkBoundary)
	}
	var b storage.Batch
	for _, c := range l.chunks[i:] {
		b.Delete(storage.StreamChunkKey(l.id, c.first))
		b.Delete(indexKey(l.id, c.first))
	}
	removed := len(l.chunks) - i
	l.chunks = l.chunks[:i]
	l.segs = l.segs[:0]
	l.bytes = 0
	for j := range l.chunks {
		l.addToSegs(&l.chunks[j])
		l.bytes += l.chunks[j].size
	}
	if to < l.written {
		if l.committed > to {
			l.log.Error("stream truncation below the committed offset: a bug; committed records are lost on this replica",
				"stream_id", l.id, "committed", l.committed, "to", to)
			l.committed = to
		}
		l.written = max(to, l.first)
		l.durable = min(l.durable, l.written)
		if l.first > l.written {
			l.first = l.written
		}
	}
	keep := l.history[:0]
	for _, h := range l.history {
		if h.Epoch <= maxEpoch && h.Start <= l.written {
			keep = append(keep, h)
		}
	}
	l.history = keep
	l.table = table
	for first := range l.unstored {
		if first >= to {
			delete(l.unstored, first)
		}
	}
	close(l.writeCh)
	l.writeCh = make(chan struct{})
	l.mu.Unlock()
	l.cache.dropFrom(to)
	if removed > 0 {
		l.log.Info("stream replica truncated to the leader's log", "stream_id", l.id, "offset", to, "chunks", removed)
		if err := l.db.CommitSync(&b); err != nil {
			return fmt.Errorf("stream %d: truncate: %w", l.id, err)
		}
	}
	return l.writeMetaSync()
}

// trackingBefore rebuilds the deduplication table of the chunks below to from the index records.
func (l *Log) trackingBefore(to uint64) (tracking, error) {
	metaKey := storage.StreamMetaKey(l.id)
	t := make(tracking)
	firstSeen := false
	err := l.db.Scan(metaKey, false, func(k, v []byte) error {
		if len(k) != len(metaKey)+8 {
			return nil
		}
		first := beUint64(k[len(metaKey):])
		if first >= to || first < l.First() {
			return nil
		}
		_, trailer, snap, err := decodeIndex(first, v)
		if err != nil {
			return err
		}
		if !firstSeen && len(snap) > 0 {
			st, err := decodeSnapshot(snap)
			if err != nil {
				return err
			}
			t = st
		}
		firstSeen = true
		return t.applyTrailer(trailer, first)
	})
	if err != nil {
		return nil, fmt.Errorf("stream %d: rebuild the deduplication table: %w", l.id, err)
	}
	return t, nil
}

// ResetTo empties the log and makes it start at first with the leader's epoch history and
// deduplication table (a replica that missed records the leader no longer has). It is durable on
// return.
func (l *Log) ResetTo(first uint64, history []EpochStart, trackingSnapshot []byte) error {
	t, err := decodeSnapshot(trackingSnapshot)
	if err != nil {
		return err
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	if l.writing {
		l.mu.Unlock()
		return fmt.Errorf("stream %d: reset: this replica is writing", l.id)
	}
	l.mu.Unlock()
	l.chunkWrites.Wait()
	l.mu.Lock()
	l.chunks, l.segs, l.bytes = nil, nil, 0
	l.first, l.written, l.durable = first, first, first
	l.committed = max(l.committed, first)
	var h []EpochStart
	for _, e := range history {
		if e.Start <= first {
			h = append(h, e)
		}
	}
	l.history = h
	l.table = t
	clear(l.unstored)
	close(l.writeCh)
	l.writeCh = make(chan struct{})
	close(l.readCh)
	l.readCh = make(chan struct{})
	l.mu.Unlock()
	l.cache.clear()
	if err := l.writeMetaSync(); err != nil {
		return err
	}
	// Chunks and index records, the meta record excepted.
	if _, err := l.db.DeleteRange(storage.StreamChunkPrefix(l.id)); err != nil {
		return fmt.Errorf("stream %d: reset: %w", l.id, err)
	}
	var b storage.Batch
	metaKey := storage.StreamMetaKey(l.id)
	err = l.db.Scan(metaKey, true, func(k, _ []byte) error {
		if len(k) == len(metaKey)+8 {
			b.Delete(append([]byte(nil), k...))
		}
		return nil
	})
	if err == nil && b.Len() > 0 {
		err = l.db.CommitSync(&b)
	}
	if err != nil {
		return fmt.Errorf("stream %d: reset: %w", l.id, err)
	}
	l.log.Info("stream replica reset to the leader's first offset", "stream_id", l.id, "first", first)
	return nil
}

// TrackingSnapshot encodes the deduplication table (for ResetTo on a follower).
func (l *Log) TrackingSnapshot() []byte {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.table.encodeSnapshot()
}

// Writers returns every deduplicating writer's highest stored sequence (publisher ids and
// internal writers).
func (l *Log) Writers() map[string]uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make(map[string]uint64, len(l.table))
	for id, e := range maps.All(l.table) {
		out[id] = e.seq
	}
	return out
}

// WriterSequence returns a writer's highest stored sequence (the stream protocol's
// query_publisher_sequence), 0 if it stored none.
func (l *Log) WriterSequence(id string) uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.table[id].seq
}
