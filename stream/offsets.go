package stream

import (
	"maps"

	"warren/storage"
)

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

// SetOffsets replaces every stored offset by those of m (a replicated stream's offsets restored
// from its group's snapshot) and writes them.
func (l *Log) SetOffsets(m map[string]uint64) {
	l.offMu.Lock()
	if l.offClosed {
		l.offMu.Unlock()
		return
	}
	var b storage.Batch
	for name := range l.offsets {
		if _, ok := m[name]; !ok {
			b.Delete(storage.StreamOffsetKey(l.id, name))
			delete(l.offsets, name)
		}
	}
	for name, off := range m {
		l.offsets[name] = off
		l.offDirty[name] = struct{}{}
	}
	next := l.takeDirtyOffsetsLocked()
	l.offMu.Unlock()
	if b.Len() > 0 {
		l.async.Add(1)
		l.db.Commit(&b, func(error) { l.async.Done() })
	}
	l.commitOffsets(next)
}
