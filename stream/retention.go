package stream

import (
	"time"

	"warren/storage"
)

// ApplyRetention applies x-max-length-bytes and x-max-age on the writer: it finds the whole old
// segments (oldest first, all committed, never the newest) whose removal the limits call for, and
// either removes them (DropBefore) or, with Options.OnRetention, hands the new first offset to the
// caller, which replicates the decision so that every replica removes the same segments. The
// writer goroutine runs it after each write and periodically when MaxAge is set; it does nothing on
// a replica that is not writing.
func (l *Log) ApplyRetention(now time.Time) {
	l.mu.Lock()
	maxBytes, maxAge := l.opts.MaxLengthBytes, l.opts.MaxAge
	if maxBytes <= 0 && maxAge <= 0 || !l.writing || l.closed {
		l.mu.Unlock()
		return
	}
	cutoff := now.UnixMilli() - maxAge.Milliseconds()
	drop, nchunks, bytes := 0, 0, l.bytes
	for len(l.segs)-drop > 1 {
		s := &l.segs[drop]
		byBytes := maxBytes > 0 && bytes > maxBytes
		byAge := maxAge > 0 && s.maxTs < cutoff
		if !byBytes && !byAge || l.chunks[nchunks+s.chunks].first > l.committed {
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
	point := l.chunks[nchunks].first
	hook := l.opts.OnRetention
	if hook != nil {
		if point <= l.retainAsk {
			l.mu.Unlock()
			return
		}
		l.retainAsk = point
	}
	l.mu.Unlock()
	if hook != nil {
		hook(point)
		return
	}
	l.DropBefore(point)
}

// SetRetention changes the x-max-length-bytes and x-max-age limits while the log runs (a policy
// was set, changed or removed; 0 = no limit). The writer applies them at once and after each write
// from then on. Only a writing replica decides retention, so every replica of a stream is given the
// same limits: the one that writes next uses them.
func (l *Log) SetRetention(maxLengthBytes int64, maxAge time.Duration) {
	l.mu.Lock()
	l.opts.MaxLengthBytes, l.opts.MaxAge = max(maxLengthBytes, 0), max(maxAge, 0)
	l.mu.Unlock()
	select {
	case l.retune <- struct{}{}:
	default:
	}
}

// retentionLimits returns the retention limits now.
func (l *Log) retentionLimits() (maxLengthBytes int64, maxAge time.Duration) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.opts.MaxLengthBytes, l.opts.MaxAge
}

// DropBefore removes the whole segments whose chunks all end at or below first (a retention
// decision, taken on the leader). First() moves forward at once; the new watermark and the deletion
// of the chunks and their index records go to storage without waiting.
func (l *Log) DropBefore(first uint64) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	drop, nchunks := 0, 0
	var dropped int64
	for drop < len(l.segs) {
		s := &l.segs[drop]
		if l.chunks[nchunks+s.chunks-1].end() > first {
			break
		}
		dropped += s.bytes
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
	newFirst := l.written
	if nchunks < len(l.chunks) {
		newFirst = l.chunks[nchunks].first
	}
	l.chunks = compact(l.chunks, nchunks)
	l.segs = compact(l.segs, drop)
	l.bytes -= dropped
	l.first = newFirst
	l.mu.Unlock()
	l.cache.drop(newFirst)
	l.writeMetaAsync()

	var b storage.Batch
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
