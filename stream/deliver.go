package stream

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"

	"warren/amqp"
	"warren/amqp/amqp10"
	"warren/storage"
	"warren/stream/osiris"
)

// What the stream-protocol front-end reads: whole committed chunks in osiris's format, so that a
// chunk goes to the socket as stored (header and data entries, the CRC unchanged). A chunk that
// holds Warren's AMQP 0-9-1 records (flagNative) or is in Warren's first format is converted
// once per read into the chunk RabbitMQ 4.x would have stored: the same first offset, timestamp
// and epoch, each record as the AMQP 1.0 message amqp10.FromAMQP091 makes of it, with its
// filter value in the bloom filter.

// DeliveryChunk is one committed chunk as a stream-protocol consumer receives it.
type DeliveryChunk struct {
	First, Next uint64 // the chunk's first offset and the offset after it
	// Chunk is the osiris chunk (header, bloom filter, data, trailer). It is shared with the
	// log's cache (or owned by the caller when Converted): read only.
	Chunk     []byte
	Header    osiris.Header
	Converted bool // Chunk was rebuilt from Warren records
	// File, when set, holds the chunk's data entries (Header.DataLength bytes at FileOffset) and
	// Chunk only its header and bloom filter: the data goes to the socket from the file
	// (sendfile). Release closes it.
	File       *os.File
	FileOffset int64

	pool *sync.Pool // where Release puts Chunk's buffer: it was read for this delivery alone
}

// fileMinBytes is the least size of a chunk sent from its file rather than read: below it the
// open, the small read and the extra system call cost more than the copy they save.
const fileMinBytes = 64 << 10

// Release gives the chunk's buffer back for a later read when it was read from storage for this
// delivery alone; neither the chunk nor a slice of it may be used after. Not calling it only
// costs an allocation.
func (d *DeliveryChunk) Release() {
	if d.File != nil {
		_ = d.File.Close()
		d.File = nil
	}
	if d.pool != nil {
		b := d.Chunk[:0]
		d.pool.Put(&b)
		d.pool, d.Chunk = nil, nil
	}
}

// Data returns the chunk's data entries (what follows the header in a deliver frame); nil when
// they are in File.
func (d *DeliveryChunk) Data() []byte {
	if d.File != nil {
		return nil
	}
	off := osiris.HeaderSize + int(d.Header.BloomSize)
	return d.Chunk[off : off+int(d.Header.DataLength)]
}

// Bloom returns the chunk's bloom filter of filter values (empty when no record had one).
func (d *DeliveryChunk) Bloom() []byte {
	return d.Chunk[osiris.HeaderSize : osiris.HeaderSize+int(d.Header.BloomSize)]
}

// ReadDeliveryChunk returns the committed chunk holding offset from or, when from is below the
// first retained offset or in a gap, the next one. ok is false when no committed chunk ends
// after from (wait with Wait(from)). With fromFile, a large chunk that is not in memory may
// come with its data in File (the caller can send it with sendfile).
func (l *Log) ReadDeliveryChunk(from uint64, fromFile bool) (dc DeliveryChunk, ok bool, err error) {
	for {
		l.mu.RLock()
		if l.closed {
			l.mu.RUnlock()
			return dc, false, ErrClosed
		}
		if from < l.first {
			from = l.first
		}
		end := l.readableLocked()
		if from >= end {
			l.mu.RUnlock()
			return dc, false, nil
		}
		i := sort.Search(len(l.chunks), func(i int) bool { return l.chunks[i].end() > from })
		if i == len(l.chunks) || l.chunks[i].end() > end {
			l.mu.RUnlock()
			return dc, false, nil
		}
		ci := l.chunks[i]
		l.mu.RUnlock()
		if fromFile && ci.size >= fileMinBytes {
			if dc, ok := l.deliveryFromFile(&ci); ok {
				return dc, true, nil
			}
		}
		var dst []byte
		if p, _ := l.readBufs.Get().(*[]byte); p != nil {
			dst = *p
		}
		b, read, err := l.blobInto(&ci, dst)
		if err != nil {
			if errors.Is(err, storage.ErrNotFound) && l.First() > ci.first {
				continue // removed by retention meanwhile
			}
			return dc, false, err
		}
		dc = DeliveryChunk{First: ci.first, Next: ci.end(), Chunk: b}
		if read {
			dc.pool = &l.readBufs
		} else if dst != nil {
			l.readBufs.Put(&dst) // served from memory: the buffer waits for the next read
		}
		if len(b) > 0 && b[0] == chunkVersion || len(b) > flagByte && b[flagByte]&flagNative != 0 {
			entries := l.cache.entries(ci.first)
			if entries == nil {
				eb := b
				if read {
					eb = bytes.Clone(b) // the entries alias their bytes: not a pooled buffer
				}
				entries, err = l.decodeAndCache(&ci, eb)
			}
			dc.Release()
			if err != nil {
				return dc, false, err
			}
			b, err = convertChunk(entries, ci.first, ci.firstTs, ci.epoch)
			if err != nil {
				return dc, false, fmt.Errorf("stream %d: convert chunk %d: %w", l.id, ci.first, err)
			}
			dc.Converted = true
		}
		h, err := osiris.ParseHeader(b)
		if err != nil || len(b) < h.StoredSize() {
			dc.Release()
			return dc, false, fmt.Errorf("stream %d: chunk %d: %w", l.id, ci.first, errCorrupt)
		}
		dc.Chunk, dc.Header = b, h
		return dc, true, nil
	}
}

// deliveryFromFile returns chunk ci with its data in its storage file, when it is stored in one,
// is not in memory and needs no conversion.
func (l *Log) deliveryFromFile(ci *chunkInfo) (DeliveryChunk, bool) {
	if l.memBlob(ci) != nil {
		return DeliveryChunk{}, false
	}
	vf, err := l.db.GetFile(storage.StreamChunkKey(l.id, ci.first), osiris.HeaderSize+osiris.MaxBloomSize)
	if err != nil {
		return DeliveryChunk{}, false // read it instead
	}
	h, err := osiris.ParseHeader(vf.Head)
	pre := osiris.HeaderSize + int(h.BloomSize)
	if err != nil || int64(vf.Len) != ci.size || h.StoredSize() != vf.Len || pre > len(vf.Head) ||
		h.ChunkID != ci.first || vf.Head[flagByte]&flagNative != 0 {
		// Not a chunk as this version stores it, or one that needs converting: read it.
		_ = vf.File.Close()
		return DeliveryChunk{}, false
	}
	return DeliveryChunk{First: ci.first, Next: ci.end(), Chunk: vf.Head[:pre], Header: h,
		File: vf.File, FileOffset: vf.Offset + int64(pre)}, true
}

// convertChunk rebuilds a chunk of Warren records as RabbitMQ would have stored it.
func convertChunk(entries []Entry, first uint64, ts int64, epoch uint64) ([]byte, error) {
	var b osiris.Builder
	b.Reset(osiris.ChunkUser, first, ts, epoch, 0)
	var scratch []byte
	for i := range entries {
		e := &entries[i]
		rec := e.Raw
		if rec == nil {
			var err error
			scratch, err = AMQP10Record(scratch[:0], &e.Record)
			if err != nil {
				return nil, fmt.Errorf("record at offset %d: %w", e.Offset, err)
			}
			rec = scratch
		}
		var fv []byte
		if e.FilterValue != "" {
			fv = []byte(e.FilterValue)
		}
		if err := b.Add(rec, fv); err != nil {
			return nil, err
		}
	}
	return b.Finish() // b is this call's: the chunk is the caller's without a copy
}

// AMQP10Record appends the AMQP 1.0 message RabbitMQ 4.x stores for an AMQP 0-9-1 publish (r's
// exchange, routing key, properties and body).
func AMQP10Record(dst []byte, r *Record) ([]byte, error) {
	props, err := amqp.DecodeProperties(r.Props)
	if err != nil {
		return dst, fmt.Errorf("decode properties: %w", err)
	}
	m, err := amqp10.FromAMQP091(&amqp10.Message091{Exchange: r.Exchange, RoutingKey: r.RoutingKey, Properties: props, Body: r.Body})
	if err != nil {
		return dst, err
	}
	return m.Encode(dst)
}
