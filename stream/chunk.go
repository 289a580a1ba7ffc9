package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The first chunk format (read only: streams written before the osiris format). Chunk value layout (stored under storage.StreamChunkKey(stream, first)):
//
//	header (chunkHeaderSize bytes, big-endian):
//	  0      version (chunkVersion)
//	  1      flags (0)
//	  2..5   record count u32
//	  6..13  first offset u64 (repeats the key, checked on read)
//	  14..21 timestamp of the first record, Unix ms
//	  22..29 newest timestamp in the chunk, Unix ms (max over the records)
//	  30..33 payload length u32
//	  34..37 CRC32C (Castagnoli) of the payload
//	payload: count records, each
//	  varint  timestamp minus the first record's timestamp (zig-zag)
//	  uvarint len + bytes, five times: exchange, routing key, props, body, filter value
const (
	chunkVersion    = 1
	chunkHeaderSize = 38
)

// crcTable is the CRC32C table; it is never written after initialisation.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errCorrupt marks a chunk whose bytes do not decode (bad CRC, bad lengths, unknown version).
var errCorrupt = errors.New("stream: corrupt chunk")

// maxRecordOverhead bounds the varint bytes added to a record's fields when encoded.
const maxRecordOverhead = binary.MaxVarintLen64 + 5*binary.MaxVarintLen32

// recordSize is an upper bound of the encoded size of r.
func recordSize(r *Record) int {
	return maxRecordOverhead + len(r.Exchange) + len(r.RoutingKey) + len(r.Props) + len(r.Body) + len(r.FilterValue)
}

// chunkMeta is what a chunk header says about its records.
type chunkMeta struct {
	first   uint64
	count   uint32
	firstTs int64
	lastTs  int64 // newest timestamp in the chunk
	epoch   uint64
}

// decodeChunk decodes a stored chunk of either format: osiris (written by this version) or
// Warren's first format (version byte 1, read for streams written before).
func decodeChunk(b []byte, name string) ([]Entry, chunkMeta, error) {
	if len(b) > 0 && b[0] == chunkVersion {
		return decodeLegacyChunk(b)
	}
	return decodeOsirisChunk(b, name)
}

// encodeChunk (tests: data of the first format) encodes recs (timestamps already set) as one chunk starting at offset first. sizeHint is
// an upper bound of the encoded size (header included).
func encodeChunk(first uint64, recs []Record, sizeHint int) ([]byte, chunkMeta) {
	b := make([]byte, chunkHeaderSize, sizeHint)
	m := chunkMeta{first: first, count: uint32(len(recs))}
	if len(recs) > 0 {
		m.firstTs = recs[0].Timestamp
		m.lastTs = recs[0].Timestamp
	}
	for i := range recs {
		r := &recs[i]
		m.lastTs = max(m.lastTs, r.Timestamp)
		b = binary.AppendVarint(b, r.Timestamp-m.firstTs)
		b = appendField(b, r.Exchange)
		b = appendField(b, r.RoutingKey)
		b = appendBytes(b, r.Props)
		b = appendBytes(b, r.Body)
		b = appendField(b, r.FilterValue)
	}
	payload := b[chunkHeaderSize:]
	b[0] = chunkVersion
	b[1] = 0
	binary.BigEndian.PutUint32(b[2:], m.count)
	binary.BigEndian.PutUint64(b[6:], first)
	binary.BigEndian.PutUint64(b[14:], uint64(m.firstTs))
	binary.BigEndian.PutUint64(b[22:], uint64(m.lastTs))
	binary.BigEndian.PutUint32(b[30:], uint32(len(payload)))
	binary.BigEndian.PutUint32(b[34:], crc32.Checksum(payload, crcTable))
	return b, m
}

func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeLegacyChunk checks and decodes a chunk of the first format. The entries' Props and Body alias b; Exchange, RoutingKey and
// FilterValue are copied (repeated values within the chunk share one string).
func decodeLegacyChunk(b []byte) ([]Entry, chunkMeta, error) {
	var m chunkMeta
	if len(b) < chunkHeaderSize {
		return nil, m, fmt.Errorf("%w: %d bytes, shorter than the header", errCorrupt, len(b))
	}
	if b[0] != chunkVersion {
		return nil, m, fmt.Errorf("%w: unknown version %d", errCorrupt, b[0])
	}
	m.count = binary.BigEndian.Uint32(b[2:])
	m.first = binary.BigEndian.Uint64(b[6:])
	m.firstTs = int64(binary.BigEndian.Uint64(b[14:]))
	m.lastTs = int64(binary.BigEndian.Uint64(b[22:]))
	plen := binary.BigEndian.Uint32(b[30:])
	payload := b[chunkHeaderSize:]
	if uint64(plen) != uint64(len(payload)) {
		return nil, m, fmt.Errorf("%w: payload is %d bytes, header says %d", errCorrupt, len(payload), plen)
	}
	if got, want := crc32.Checksum(payload, crcTable), binary.BigEndian.Uint32(b[34:]); got != want {
		return nil, m, fmt.Errorf("%w: CRC32C %08x, header says %08x", errCorrupt, got, want)
	}
	// Each record takes at least 6 bytes: a bound before allocating.
	if uint64(m.count)*6 > uint64(len(payload)) {
		return nil, m, fmt.Errorf("%w: %d records cannot fit in %d bytes", errCorrupt, m.count, len(payload))
	}
	entries := make([]Entry, m.count)
	d := decoder{b: payload}
	var lastEx, lastRK string
	for i := range entries {
		e := &entries[i]
		e.Offset = m.first + uint64(i)
		e.Timestamp = m.firstTs + d.varint()
		lastEx = d.str(lastEx)
		e.Exchange = lastEx
		lastRK = d.str(lastRK)
		e.RoutingKey = lastRK
		e.Props = d.bytes()
		e.Body = d.bytes()
		e.FilterValue = d.str("")
		if d.err {
			return nil, m, fmt.Errorf("%w: record %d of %d is truncated", errCorrupt, i, m.count)
		}
	}
	if len(d.b) != 0 {
		return nil, m, fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(d.b))
	}
	return entries, m, nil
}

// decoder reads varint-framed fields; err is set (and stays set) on truncation.
type decoder struct {
	b   []byte
	err bool
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = true
		d.b = nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	l, n := binary.Uvarint(d.b)
	if n <= 0 || l > uint64(len(d.b)-n) {
		d.err = true
		d.b = nil
		return nil
	}
	v := d.b[n : n+int(l) : n+int(l)]
	d.b = d.b[n+int(l):]
	if l == 0 {
		return nil
	}
	return v
}

// str returns the next field as a string, reusing prev when the bytes are equal.
func (d *decoder) str(prev string) string {
	v := d.bytes()
	if string(v) == prev { // no allocation for the comparison
		return prev
	}
	return string(v)
}

// Index record layout (stored under storage.StreamMetaKey(stream) + first offset u64, value kept
// small so it lives in the LSM tree and is read without touching chunk bodies). Version 1 (the
// first format) stops after the segment number.
//
//	0      version (indexVersion)
//	1..4   record count u32
//	5..8   chunk size in bytes u32 (the stored chunk value)
//	9..16  first timestamp, Unix ms
//	17..24 newest timestamp, Unix ms
//	25..32 segment number u64
//	33..40 epoch of the leader that wrote the chunk
//	41..44 tracking bytes u32, then the chunk's trailer (deduplicating writers' sequences)
//	       u32 snapshot bytes, then a tracking snapshot (every writer's sequence before this
//	       chunk; only in the first chunk of a segment, so retention never forgets a writer)
const (
	indexVersionLegacy = 1
	indexVersion       = 2
	indexLegacySize    = 33
	indexFixedSize     = 41
)

func encodeIndex(ci *chunkInfo, trailer, snapshot []byte) []byte {
	b := make([]byte, indexFixedSize, indexFixedSize+8+len(trailer)+len(snapshot))
	b[0] = indexVersion
	binary.BigEndian.PutUint32(b[1:], ci.count)
	binary.BigEndian.PutUint32(b[5:], uint32(ci.size))
	binary.BigEndian.PutUint64(b[9:], uint64(ci.firstTs))
	binary.BigEndian.PutUint64(b[17:], uint64(ci.lastTs))
	binary.BigEndian.PutUint64(b[25:], ci.seg)
	binary.BigEndian.PutUint64(b[33:], ci.epoch)
	b = binary.BigEndian.AppendUint32(b, uint32(len(trailer)))
	b = append(b, trailer...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(snapshot)))
	return append(b, snapshot...)
}

// decodeIndex decodes an index record; trailer and snapshot alias b (nil for version 1).
func decodeIndex(first uint64, b []byte) (ci chunkInfo, trailer, snapshot []byte, err error) {
	bad := func() (chunkInfo, []byte, []byte, error) {
		return chunkInfo{}, nil, nil, fmt.Errorf("%w: index record of chunk %d: %d bytes, version %d", errCorrupt, first, len(b), firstByte(b))
	}
	switch {
	case len(b) == indexLegacySize && b[0] == indexVersionLegacy:
	case len(b) >= indexFixedSize+8 && b[0] == indexVersion:
	default:
		return bad()
	}
	ci = chunkInfo{
		first:   first,
		count:   binary.BigEndian.Uint32(b[1:]),
		size:    int64(binary.BigEndian.Uint32(b[5:])),
		firstTs: int64(binary.BigEndian.Uint64(b[9:])),
		lastTs:  int64(binary.BigEndian.Uint64(b[17:])),
		seg:     binary.BigEndian.Uint64(b[25:]),
	}
	if b[0] == indexVersionLegacy {
		return ci, nil, nil, nil
	}
	ci.epoch = binary.BigEndian.Uint64(b[33:])
	rest := b[indexFixedSize:]
	n := binary.BigEndian.Uint32(rest)
	if uint64(n)+8 > uint64(len(rest)) {
		return bad()
	}
	trailer = rest[4 : 4+n]
	rest = rest[4+n:]
	m := binary.BigEndian.Uint32(rest)
	if uint64(m)+4 != uint64(len(rest)) {
		return bad()
	}
	return ci, trailer, rest[4:], nil
}

func firstByte(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	return int(b[0])
}

// EpochStart is one entry of a replica's epoch history: the leader of Epoch wrote its first
// chunk at offset Start (everything below came from earlier leaders).
type EpochStart struct {
	Epoch, Start uint64
}

// logMeta is the stream meta record (storage.StreamMetaKey(stream)):
//
//	version 1: u8 1, first retained offset u64 (the retention watermark)
//	version 2: u8 2, watermark u64, fence u64 (the highest epoch this replica promised to follow),
//	           committed u64 (a lower bound of the committed offset), u32 n, n x (epoch, start)
type logMeta struct {
	first, fence, committed uint64
	history                 []EpochStart
}

const (
	metaVersionLegacy = 1
	metaVersion       = 2
)

func encodeMeta(m *logMeta) []byte {
	b := make([]byte, 0, 29+16*len(m.history))
	b = append(b, metaVersion)
	b = binary.BigEndian.AppendUint64(b, m.first)
	b = binary.BigEndian.AppendUint64(b, m.fence)
	b = binary.BigEndian.AppendUint64(b, m.committed)
	b = binary.BigEndian.AppendUint32(b, uint32(len(m.history)))
	for _, h := range m.history {
		b = binary.BigEndian.AppendUint64(b, h.Epoch)
		b = binary.BigEndian.AppendUint64(b, h.Start)
	}
	return b
}

func decodeMeta(b []byte) (logMeta, error) {
	bad := fmt.Errorf("%w: stream meta record: %d bytes, version %d", errCorrupt, len(b), firstByte(b))
	if len(b) == 9 && b[0] == metaVersionLegacy {
		return logMeta{first: binary.BigEndian.Uint64(b[1:])}, nil
	}
	if len(b) < 29 || b[0] != metaVersion {
		return logMeta{}, bad
	}
	m := logMeta{first: binary.BigEndian.Uint64(b[1:]), fence: binary.BigEndian.Uint64(b[9:]), committed: binary.BigEndian.Uint64(b[17:])}
	n := binary.BigEndian.Uint32(b[25:])
	if uint64(len(b)-29) != uint64(n)*16 {
		return logMeta{}, bad
	}
	for i := range int(n) {
		o := 29 + 16*i
		m.history = append(m.history, EpochStart{Epoch: binary.BigEndian.Uint64(b[o:]), Start: binary.BigEndian.Uint64(b[o+8:])})
	}
	return m, nil
}
