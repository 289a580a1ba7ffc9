// Package osiris implements the chunk format of osiris, RabbitMQ's stream log, which the stream
// protocol's Deliver command carries: a 48-byte header, a bloom filter of the chunk's filter
// values, the data entries and a trailer of tracking entries.
//
// A stream that stores its chunks in this format can send them to stream-protocol consumers as
// stored: the deliver frame is the deliver header (wire.AppendDeliverHeader) followed by the
// chunk's header and data, without the bloom filter and the trailer, exactly as RabbitMQ sends
// user chunks (the header still states the bloom and trailer sizes; clients read data-length
// bytes after it). Chunk.DeliverParts returns those two slices.
//
// Layout (big-endian; osiris_log.erl):
//
//	0      magic (5) << 4 | format version (0)          = 0x50
//	1      chunk type: 0 user, 1 tracking delta, 2 tracking snapshot
//	2..3   number of entries (uint16)
//	4..7   number of records (uint32; a sub-batch entry holds several)
//	8..15  timestamp, ms since the epoch (int64)
//	16..23 epoch (uint64)
//	24..31 chunk id = offset of the first record (uint64)
//	32..35 CRC32 (IEEE) of the data entries
//	36..39 data length (uint32)
//	40..43 trailer length (uint32)
//	44     bloom filter size in bytes (0, or 16..255)
//	45..47 reserved (0)
//	then bloom filter, data entries, trailer
//
// A data entry is simple (top bit 0: a 31-bit length and the record) or a sub-batch (top bit 1,
// 3 bits of compression type, 4 reserved bits, uint16 record count, uint32 uncompressed length,
// uint32 length, the body: records each a uint32 length and the record, compressed as a whole).
// A trailer entry is a tracking type (0 sequence, 1 offset, 2 timestamp), an id (uint8 length
// and bytes) and a uint64 value.
package osiris

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// HeaderSize is the size of a chunk header.
const HeaderSize = 48

// Magic and FormatVersion make the first header byte (Magic<<4 | FormatVersion).
const (
	Magic         = 5
	FormatVersion = 0
)

// ChunkType says what a chunk's entries are.
type ChunkType uint8

// Chunk types.
const (
	ChunkUser             ChunkType = 0
	ChunkTrackingDelta    ChunkType = 1
	ChunkTrackingSnapshot ChunkType = 2
)

// Compression types of sub-batch entries (as the stream clients number them).
const (
	CompressionNone   uint8 = 0
	CompressionGzip   uint8 = 1
	CompressionSnappy uint8 = 2
	CompressionLZ4    uint8 = 3
	CompressionZstd   uint8 = 4
)

// Tracking entry types of a chunk's trailer.
const (
	TrackingSequence  uint8 = 0 // a publisher reference and its last publishing id
	TrackingOffset    uint8 = 1 // a consumer reference and its stored offset
	TrackingTimestamp uint8 = 2
)

// Bloom filter sizes osiris accepts (x-stream-filter-size-bytes).
const (
	MinBloomSize     = 16
	MaxBloomSize     = 255
	DefaultBloomSize = 16
)

// ErrCorrupt marks bytes that are not a well-formed chunk (or entry); errors wrap it.
var ErrCorrupt = errors.New("osiris: corrupt chunk")

func corrupt(format string, args ...any) error {
	return fmt.Errorf("osiris: "+format+": %w", append(args, ErrCorrupt)...)
}

// Header is a parsed chunk header.
type Header struct {
	Type          ChunkType
	NumEntries    uint16
	NumRecords    uint32
	Timestamp     int64 // ms since the epoch
	Epoch         uint64
	ChunkID       uint64 // offset of the first record
	CRC           uint32 // CRC32 (IEEE) of the data entries
	DataLength    uint32
	TrailerLength uint32
	BloomSize     uint8
}

// NextChunkID is the chunk id (offset) that follows this chunk.
func (h *Header) NextChunkID() uint64 { return h.ChunkID + uint64(h.NumRecords) }

// StoredSize is the size of the whole chunk as stored: header, bloom, data and trailer.
func (h *Header) StoredSize() int {
	return HeaderSize + int(h.BloomSize) + int(h.DataLength) + int(h.TrailerLength)
}

// DeliveredSize is the size of what a deliver frame carries: header and data.
func (h *Header) DeliveredSize() int { return HeaderSize + int(h.DataLength) }

// AppendHeader appends the 48 header bytes.
func (h *Header) AppendHeader(b []byte) []byte {
	b = append(b, Magic<<4|FormatVersion, byte(h.Type))
	b = binary.BigEndian.AppendUint16(b, h.NumEntries)
	b = binary.BigEndian.AppendUint32(b, h.NumRecords)
	b = binary.BigEndian.AppendUint64(b, uint64(h.Timestamp))
	b = binary.BigEndian.AppendUint64(b, h.Epoch)
	b = binary.BigEndian.AppendUint64(b, h.ChunkID)
	b = binary.BigEndian.AppendUint32(b, h.CRC)
	b = binary.BigEndian.AppendUint32(b, h.DataLength)
	b = binary.BigEndian.AppendUint32(b, h.TrailerLength)
	return append(b, h.BloomSize, 0, 0, 0)
}

// ParseHeader parses the first 48 bytes of b.
func ParseHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
		return h, corrupt("header of %d bytes, want %d", len(b), HeaderSize)
	}
	if b[0] != Magic<<4|FormatVersion {
		return h, corrupt("magic/version byte 0x%02x, want 0x%02x", b[0], Magic<<4|FormatVersion)
	}
	h.Type = ChunkType(b[1])
	if h.Type > ChunkTrackingSnapshot {
		return h, corrupt("unknown chunk type %d", h.Type)
	}
	h.NumEntries = binary.BigEndian.Uint16(b[2:])
	h.NumRecords = binary.BigEndian.Uint32(b[4:])
	h.Timestamp = int64(binary.BigEndian.Uint64(b[8:]))
	h.Epoch = binary.BigEndian.Uint64(b[16:])
	h.ChunkID = binary.BigEndian.Uint64(b[24:])
	h.CRC = binary.BigEndian.Uint32(b[32:])
	h.DataLength = binary.BigEndian.Uint32(b[36:])
	h.TrailerLength = binary.BigEndian.Uint32(b[40:])
	h.BloomSize = b[44]
	if h.BloomSize != 0 && h.BloomSize < MinBloomSize {
		return h, corrupt("bloom filter of %d bytes (0 or %d..%d)", h.BloomSize, MinBloomSize, MaxBloomSize)
	}
	if h.NumRecords < uint32(h.NumEntries) {
		return h, corrupt("%d records in %d entries", h.NumRecords, h.NumEntries)
	}
	if h.ChunkID > math.MaxUint64-uint64(h.NumRecords) {
		return h, corrupt("chunk id %d + %d records overflows", h.ChunkID, h.NumRecords)
	}
	return h, nil
}

// Chunk is a parsed chunk; its slices alias the bytes parsed.
type Chunk struct {
	Header
	// Raw is the header and everything after it that was parsed (the stored chunk for Parse,
	// header + data for ParseDelivered).
	Raw     []byte
	Bloom   []byte // nil in a delivered chunk
	Data    []byte
	Trailer []byte // nil in a delivered chunk
}

// Parse parses a stored chunk at the start of b (header, bloom, data, trailer), checks the CRC
// and every entry, and returns the bytes after it.
func Parse(b []byte) (Chunk, []byte, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return Chunk{}, nil, err
	}
	if uint64(len(b)) < uint64(h.StoredSize()) {
		return Chunk{}, nil, corrupt("chunk of %d bytes, only %d available", h.StoredSize(), len(b))
	}
	c := Chunk{Header: h}
	off := HeaderSize
	c.Bloom = b[off : off+int(h.BloomSize) : off+int(h.BloomSize)]
	off += int(h.BloomSize)
	c.Data = b[off : off+int(h.DataLength) : off+int(h.DataLength)]
	off += int(h.DataLength)
	c.Trailer = b[off : off+int(h.TrailerLength) : off+int(h.TrailerLength)]
	off += int(h.TrailerLength)
	c.Raw = b[:off:off]
	if err := c.check(); err != nil {
		return Chunk{}, nil, err
	}
	if err := checkTrailer(c.Trailer); err != nil {
		return Chunk{}, nil, err
	}
	return c, b[off:], nil
}

// ParseDelivered parses a chunk as a deliver frame carries it: the header followed by the data
// entries only (no bloom filter, no trailer, whatever sizes the header states for them). It
// checks the CRC and every entry. Bytes after the data are an error.
func ParseDelivered(b []byte) (Chunk, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return Chunk{}, err
	}
	if uint64(len(b)) != uint64(h.DeliveredSize()) {
		return Chunk{}, corrupt("delivered chunk of %d bytes, header says %d", len(b), h.DeliveredSize())
	}
	c := Chunk{Header: h, Raw: b, Data: b[HeaderSize:]}
	return c, c.check()
}

// check verifies the data CRC and that the entries add up to the header's counts.
func (c *Chunk) check() error {
	if crc := crc32.ChecksumIEEE(c.Data); crc != c.CRC {
		return corrupt("data CRC 0x%08x, header says 0x%08x", crc, c.CRC)
	}
	var entries, records uint64
	for rest := c.Data; len(rest) > 0; {
		e, next, err := NextEntry(rest)
		if err != nil {
			return err
		}
		entries++
		records += uint64(e.Records)
		rest = next
	}
	if entries != uint64(c.NumEntries) || records != uint64(c.NumRecords) {
		return corrupt("data holds %d entries and %d records, header says %d and %d", entries, records, c.NumEntries, c.NumRecords)
	}
	return nil
}

// DeliverParts returns what a deliver frame carries after its own header: the chunk header and
// the data entries (two slices, for one writev or two writes).
func (c *Chunk) DeliverParts() (header, data []byte) {
	return c.Raw[:HeaderSize], c.Data
}

// Entry is one data entry. For a simple entry Records is 1 and Data the record; for a sub-batch
// Data is the (possibly compressed) body.
type Entry struct {
	SubBatch         bool
	Compression      uint8
	Records          uint16
	UncompressedSize uint32
	Data             []byte
}

// NextEntry parses the data entry at the start of b and returns the rest.
func NextEntry(b []byte) (Entry, []byte, error) {
	if len(b) < 4 {
		return Entry{}, nil, corrupt("entry header truncated (%d bytes)", len(b))
	}
	if b[0]&0x80 == 0 {
		n := binary.BigEndian.Uint32(b) & 0x7fffffff
		if uint64(n) > uint64(len(b)-4) {
			return Entry{}, nil, corrupt("entry of %d bytes, %d left", n, len(b)-4)
		}
		return Entry{Records: 1, UncompressedSize: n, Data: b[4 : 4+n : 4+n]}, b[4+n:], nil
	}
	if len(b) < 11 {
		return Entry{}, nil, corrupt("sub-batch header truncated (%d bytes)", len(b))
	}
	e := Entry{
		SubBatch:         true,
		Compression:      b[0] >> 4 & 0x7,
		Records:          binary.BigEndian.Uint16(b[1:]),
		UncompressedSize: binary.BigEndian.Uint32(b[3:]),
	}
	n := binary.BigEndian.Uint32(b[7:])
	if uint64(n) > uint64(len(b)-11) {
		return Entry{}, nil, corrupt("sub-batch of %d bytes, %d left", n, len(b)-11)
	}
	if e.Records == 0 {
		return Entry{}, nil, corrupt("sub-batch with no records")
	}
	if e.Compression == CompressionNone && n != e.UncompressedSize {
		return Entry{}, nil, corrupt("uncompressed sub-batch of %d bytes says %d", n, e.UncompressedSize)
	}
	e.Data = b[11 : 11+n : 11+n]
	return e, b[11+n:], nil
}

// NextRecord returns the record at the start of an uncompressed sub-batch body (a uint32 length
// and the record) and the rest.
func NextRecord(body []byte) (record, rest []byte, err error) {
	if len(body) < 4 {
		return nil, nil, corrupt("sub-batch record length truncated")
	}
	n := binary.BigEndian.Uint32(body)
	if uint64(n) > uint64(len(body)-4) {
		return nil, nil, corrupt("sub-batch record of %d bytes, %d left", n, len(body)-4)
	}
	return body[4 : 4+n : 4+n], body[4+n:], nil
}

// TrackingEntry is one trailer entry (or one block of a tracking chunk's entry).
type TrackingEntry struct {
	Type  uint8
	ID    []byte
	Value uint64
}

// NextTracking parses the tracking entry at the start of b and returns the rest.
func NextTracking(b []byte) (TrackingEntry, []byte, error) {
	if len(b) < 2 {
		return TrackingEntry{}, nil, corrupt("tracking entry truncated")
	}
	n := int(b[1])
	if len(b) < 2+n+8 {
		return TrackingEntry{}, nil, corrupt("tracking entry of id length %d truncated", n)
	}
	t := TrackingEntry{Type: b[0], ID: b[2 : 2+n : 2+n], Value: binary.BigEndian.Uint64(b[2+n:])}
	if t.Type > TrackingTimestamp {
		return TrackingEntry{}, nil, corrupt("unknown tracking type %d", t.Type)
	}
	return t, b[2+n+8:], nil
}

// AppendTracking appends a tracking entry (ids longer than 255 bytes are an error).
func AppendTracking(b []byte, typ uint8, id []byte, value uint64) ([]byte, error) {
	if len(id) > 255 {
		return b, fmt.Errorf("osiris: tracking id of %d bytes is longer than 255", len(id))
	}
	b = append(b, typ, byte(len(id)))
	b = append(b, id...)
	return binary.BigEndian.AppendUint64(b, value), nil
}

func checkTrailer(b []byte) error {
	for len(b) > 0 {
		_, rest, err := NextTracking(b)
		if err != nil {
			return err
		}
		b = rest
	}
	return nil
}
