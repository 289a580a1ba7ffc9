package osiris

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// Builder turns a batch of records into one chunk. It keeps its buffers between chunks, so a
// writer that reuses one Builder allocates nothing per record once the buffers have grown.
//
//	b.Reset(ChunkUser, firstOffset, nowMillis, epoch)
//	b.Add(msg, nil)            // a simple entry
//	b.Add(msg, []byte("eu"))   // with a filter value
//	chunk, err := b.Finish()   // header + bloom + data + trailer, a slice of the Builder's buffer
//	b.Detach()                 // optional: chunk is the caller's, the Builder starts a new buffer
//
// Records are copied once, into the buffer the chunk is returned in: the buffer starts with room
// for the header and the bloom filter, which Finish fills in front of the data.
//
// A Builder is not safe for concurrent use.
type Builder struct {
	hdr       Header
	buf       []byte // room for header and bloom (pre bytes), then the data; the trailer after Finish
	pre       int    // HeaderSize + bloomSize
	dataEnd   int    // len(buf) before Finish appended the trailer
	hint      int    // capacity for the next buffer after Detach
	trailer   []byte
	bloomSize int
	bloom     []byte
	filtered  bool // some entry had a filter value
	err       error
}

// SizeHint says how many bytes (header, bloom filter, entries and trailer) the next chunk is
// expected to take: the next Reset that needs a new buffer makes it that large at once, instead of
// growing it, copy after copy, as entries are added.
func (b *Builder) SizeHint(n int) { b.hint = n }

// ErrChunkFull is returned by Add when another entry would overflow a header count.
var ErrChunkFull = errors.New("osiris: chunk full")

// Reset starts a new chunk of the given type whose first record has offset chunkID.
// bloomSize is the bloom filter size in bytes for filter values (16..255; 0 = DefaultBloomSize).
func (b *Builder) Reset(typ ChunkType, chunkID uint64, timestamp int64, epoch uint64, bloomSize int) {
	if bloomSize == 0 {
		bloomSize = DefaultBloomSize
	}
	b.hdr = Header{Type: typ, ChunkID: chunkID, Timestamp: timestamp, Epoch: epoch}
	b.dataEnd = -1
	b.trailer = b.trailer[:0]
	b.bloomSize = bloomSize
	b.filtered = false
	b.err = nil
	if bloomSize < MinBloomSize || bloomSize > MaxBloomSize {
		b.err = fmt.Errorf("osiris: bloom filter size %d outside %d..%d", bloomSize, MinBloomSize, MaxBloomSize)
		return
	}
	b.pre = HeaderSize + bloomSize
	if cap(b.buf) < b.pre {
		b.buf = make([]byte, 0, max(b.hint, b.pre))
	}
	b.buf = b.buf[:b.pre] // the bytes in front of the data are written by Finish
	if cap(b.bloom) < bloomSize {
		b.bloom = make([]byte, bloomSize)
	}
	b.bloom = b.bloom[:bloomSize]
	clear(b.bloom)
}

// SetTimestamp sets the chunk's timestamp (ms since the epoch), for a writer that learns it while
// adding records (the newest record's time).
func (b *Builder) SetTimestamp(ts int64) { b.hdr.Timestamp = ts }

// Len returns the number of entries and records added so far, and the data bytes.
func (b *Builder) Len() (entries, records, dataBytes int) {
	return int(b.hdr.NumEntries), int(b.hdr.NumRecords), b.dataLen()
}

// dataLen is the number of data bytes added so far.
func (b *Builder) dataLen() int {
	if b.dataEnd >= 0 {
		return b.dataEnd - b.pre
	}
	return len(b.buf) - b.pre
}

// reopen undoes a Finish before more entries are added: the trailer goes again.
func (b *Builder) reopen() {
	if b.dataEnd >= 0 {
		b.buf = b.buf[:b.dataEnd]
		b.dataEnd = -1
	}
}

func (b *Builder) room(records int, size int) error {
	if b.err != nil {
		return b.err
	}
	if b.pre == 0 {
		return errors.New("osiris: entry added before Reset")
	}
	if b.hdr.NumEntries == math.MaxUint16 || uint64(b.hdr.NumRecords)+uint64(records) > math.MaxUint32 ||
		uint64(b.dataLen())+uint64(size) > math.MaxUint32 {
		return ErrChunkFull
	}
	b.reopen()
	return nil
}

// Add appends a simple entry. filterValue is the record's filter value (nil = none); it goes
// into the chunk's bloom filter.
func (b *Builder) Add(record, filterValue []byte) error {
	if len(record) > math.MaxInt32 {
		return fmt.Errorf("osiris: record of %d bytes is over the 31-bit limit", len(record))
	}
	if err := b.room(1, 4+len(record)); err != nil {
		return err
	}
	b.buf = binary.BigEndian.AppendUint32(b.buf, uint32(len(record)))
	b.buf = append(b.buf, record...)
	b.hdr.NumEntries++
	b.hdr.NumRecords++
	b.addFilter(filterValue)
	return nil
}

// AddSubBatch appends a sub-batch entry as a publisher sent it (the body possibly compressed):
// one entry holding records records.
func (b *Builder) AddSubBatch(compression uint8, records uint16, uncompressedSize uint32, body []byte, filterValue []byte) error {
	if compression > 7 {
		return fmt.Errorf("osiris: compression %d does not fit 3 bits", compression)
	}
	if records == 0 {
		return fmt.Errorf("osiris: sub-batch with no records")
	}
	if compression == CompressionNone && uint64(len(body)) != uint64(uncompressedSize) {
		return fmt.Errorf("osiris: uncompressed sub-batch of %d bytes says %d", len(body), uncompressedSize)
	}
	if uint64(len(body)) > math.MaxUint32 {
		return fmt.Errorf("osiris: sub-batch of %d bytes", len(body))
	}
	if err := b.room(int(records), 11+len(body)); err != nil {
		return err
	}
	b.buf = append(b.buf, 0x80|compression<<4)
	b.buf = binary.BigEndian.AppendUint16(b.buf, records)
	b.buf = binary.BigEndian.AppendUint32(b.buf, uncompressedSize)
	b.buf = binary.BigEndian.AppendUint32(b.buf, uint32(len(body)))
	b.buf = append(b.buf, body...)
	b.hdr.NumEntries++
	b.hdr.NumRecords += uint32(records)
	b.addFilter(filterValue)
	return nil
}

// AddTracking appends a tracking entry to the trailer (for user chunks: the last publishing id
// of a deduplicating publisher, TrackingSequence).
func (b *Builder) AddTracking(typ uint8, id []byte, value uint64) error {
	t, err := AppendTracking(b.trailer, typ, id, value)
	if err != nil {
		return err
	}
	b.trailer = t
	return nil
}

func (b *Builder) addFilter(v []byte) {
	if len(v) == 0 { // no filter value (osiris inserts <<>>: bit 0)
		setBloomBit(b.bloom, 0) // bit 0: the chunk has records without a filter value
		return
	}
	b.filtered = true
	h1, h2 := bloomHashes(v, len(b.bloom)*8)
	setBloomBit(b.bloom, h1)
	setBloomBit(b.bloom, h2)
}

// Finish completes the chunk and returns it: header, bloom filter (only when some record had a
// filter value, as osiris writes it), data and trailer. The slice is the Builder's and is valid
// until the next Reset, unless Detach hands it over.
func (b *Builder) Finish() ([]byte, error) {
	if b.err != nil {
		return nil, b.err
	}
	if b.hdr.NumEntries == 0 {
		return nil, fmt.Errorf("osiris: empty chunk")
	}
	if uint64(len(b.trailer)) > math.MaxUint32 {
		return nil, fmt.Errorf("osiris: trailer of %d bytes", len(b.trailer))
	}
	b.reopen()
	data := b.buf[b.pre:]
	h := b.hdr
	h.CRC = crc32.ChecksumIEEE(data)
	h.DataLength = uint32(len(data))
	h.TrailerLength = uint32(len(b.trailer))
	start := b.bloomSize // without a filter value the chunk has no bloom: it starts later
	if b.filtered {
		start = 0
		h.BloomSize = uint8(b.bloomSize)
		copy(b.buf[HeaderSize:b.pre], b.bloom)
	}
	h.AppendHeader(b.buf[start:start])
	b.dataEnd = len(b.buf)
	b.buf = append(b.buf, b.trailer...)
	return b.buf[start:], nil
}

// Detach gives the buffer of the chunk the last Finish returned to the caller: the Builder will
// not write to it again, and the next Reset starts a new buffer the size of that chunk. A writer
// that keeps each chunk (to store it) detaches instead of copying the chunk.
func (b *Builder) Detach() {
	b.hint = len(b.buf)
	b.buf, b.pre, b.dataEnd = nil, 0, -1
}
