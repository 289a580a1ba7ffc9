package stream

import (
	"encoding/binary"
	"fmt"
	"maps"
)

// Deduplication: a record may name its writer (a publisher id with its publishing ids, as
// x-publisher-id/x-publishing-id or the stream protocol's publisher reference, or a node's
// internal writer that retries a publish after a leader change) and a sequence number that
// grows per writer. The log stores a record only when its sequence is above the highest stored
// for that writer; every chunk's trailer carries the highest sequence of each writer in it, and
// the first chunk of every segment also has a snapshot of the whole table in its index record, so
// the table is rebuilt at open from the index records alone and survives retention. Replicas
// derive the same table from the same chunks.

// trackEntry is a writer's highest stored sequence and the first offset of the chunk holding it.
type trackEntry struct {
	seq, chunk uint64
}

// tracking is the deduplication table: writer id -> highest sequence.
type tracking map[string]trackEntry

func (t tracking) note(id string, seq, chunk uint64) {
	if e, ok := t[id]; !ok || seq > e.seq {
		t[id] = trackEntry{seq: seq, chunk: chunk}
	}
}

// buildTable is the writer's view of the table while it builds a batch: the committed table with
// the chunks being built over it. A publish frame's records all come from one writer, so the last
// writer looked up is kept out of the maps (found once, noted in place) and written to the overlay
// only when another writer is looked up or the batch is done.
type buildTable struct {
	table   tracking // committed; read only here
	overlay tracking // the chunks being built

	hotID    string // "" until a writer was looked up
	hot      trackEntry
	hotOK    bool // hot holds an entry (the writer is in table or overlay)
	hotDirty bool // hot is newer than overlay[hotID]
}

// use points b at the committed table, which the caller holds locked while it looks entries up;
// the cached writer is dropped, since the table may have changed while it was unlocked.
func (b *buildTable) use(table tracking) {
	b.spill()
	if b.overlay == nil {
		b.overlay = make(tracking)
	}
	b.table, b.hotID = table, ""
}

// entry returns id's highest sequence in the table or the chunks being built.
func (b *buildTable) entry(id string) (trackEntry, bool) {
	if b.hotID != "" && id == b.hotID {
		return b.hot, b.hotOK
	}
	b.spill()
	e, ok := b.overlay[id]
	if t, tok := b.table[id]; tok && (!ok || t.seq > e.seq) {
		e, ok = t, true
	}
	b.hotID, b.hot, b.hotOK = id, e, ok
	return e, ok
}

// seen returns id's entry and whether seq is at or below it (a duplicate).
func (b *buildTable) seen(id string, seq uint64) (trackEntry, bool) {
	e, ok := b.entry(id)
	return e, ok && seq <= e.seq
}

// note records that a chunk starting at chunk holds id's sequence seq.
func (b *buildTable) note(id string, seq, chunk uint64) {
	if e, ok := b.entry(id); !ok || seq > e.seq {
		b.hot, b.hotOK, b.hotDirty = trackEntry{seq: seq, chunk: chunk}, true, true
	}
}

// spill writes the cached writer back to the overlay.
func (b *buildTable) spill() {
	if b.hotDirty {
		b.overlay[b.hotID] = b.hot
		b.hotDirty = false
	}
}

// applyTrailer notes a chunk's trailer entries.
func (t tracking) applyTrailer(trailer []byte, chunk uint64) error {
	return walkTracking(trailer, func(id string, seq uint64) { t.note(id, seq, chunk) })
}

// encodeSnapshot encodes the table: u32 count, then per writer u16 id length, id, u64 sequence,
// u64 chunk offset.
func (t tracking) encodeSnapshot() []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(t)))
	for id, e := range t {
		b = binary.BigEndian.AppendUint16(b, uint16(len(id)))
		b = append(b, id...)
		b = binary.BigEndian.AppendUint64(b, e.seq)
		b = binary.BigEndian.AppendUint64(b, e.chunk)
	}
	return b
}

func decodeSnapshot(b []byte) (tracking, error) {
	t := make(tracking)
	if len(b) == 0 {
		return t, nil
	}
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: tracking snapshot of %d bytes", errCorrupt, len(b))
	}
	n := binary.BigEndian.Uint32(b)
	b = b[4:]
	for range n {
		if len(b) < 2 {
			return nil, fmt.Errorf("%w: truncated tracking snapshot", errCorrupt)
		}
		l := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+l+16 {
			return nil, fmt.Errorf("%w: truncated tracking snapshot", errCorrupt)
		}
		t[string(b[2:2+l])] = trackEntry{seq: binary.BigEndian.Uint64(b[2+l:]), chunk: binary.BigEndian.Uint64(b[2+l+8:])}
		b = b[2+l+16:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the tracking snapshot", errCorrupt, len(b))
	}
	return t, nil
}

func (t tracking) clone() tracking { return maps.Clone(t) }
