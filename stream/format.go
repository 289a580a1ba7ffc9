package stream

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"hash/crc32"

	"warren/amqp/amqp10"
	"warren/stream/osiris"
)

// Chunks are stored in osiris's format (stream/osiris): the 48-byte header (with the chunk's
// epoch and first offset), a bloom filter of the filter values, the data entries and a trailer
// of tracking entries, so a chunk can go to a stream-protocol consumer as stored. Warren adds:
//
//   - header byte 45 (reserved in osiris) is a flag byte: flagNative says that some records are
//     Warren's AMQP 0-9-1 records (below) rather than AMQP 1.0 messages, so the stream-protocol
//     front-end converts that chunk instead of sending it as stored (clients ignore the byte);
//   - a record is either an AMQP 1.0 message (first byte 0x00: a described section, as a
//     stream-protocol publisher sends it) or Warren's AMQP 0-9-1 record: 'W', version 1, then
//     exchange, routing key, properties, body and filter value, each a uvarint length and bytes.
//     AMQP 0-9-1 publishers and consumers, the common case, pay no conversion;
//   - the trailer holds one tracking entry per deduplicating writer of the chunk (osiris's
//     TrackingSequence: the writer's highest publishing id in the chunk); a writer id longer
//     than osiris's 255 bytes uses trackingSequenceLong (a uint16 id length). The trailer is
//     never sent to consumers.
const (
	nativeRecordMagic   = 'W'
	nativeRecordVersion = 1
	flagNative          = 0x01
	flagByte            = 45
	// trackingSequenceLong is Warren's trailer entry for writer ids of 256 bytes or more: type,
	// uint16 id length, id, uint64 value.
	trackingSequenceLong = 0x80
)

// nativeRecordSize is the encoded size of r as a Warren record.
func nativeRecordSize(r *Record) int {
	return 2 + uvarintLen(len(r.Exchange)) + len(r.Exchange) + uvarintLen(len(r.RoutingKey)) + len(r.RoutingKey) +
		uvarintLen(len(r.Props)) + len(r.Props) + uvarintLen(len(r.Body)) + len(r.Body) +
		uvarintLen(len(r.FilterValue)) + len(r.FilterValue)
}

func uvarintLen(n int) int {
	l := 1
	for n >= 0x80 {
		n >>= 7
		l++
	}
	return l
}

// appendNativeRecord appends r's Warren record encoding.
func appendNativeRecord(b []byte, r *Record) []byte {
	b = append(b, nativeRecordMagic, nativeRecordVersion)
	b = appendField(b, r.Exchange)
	b = appendField(b, r.RoutingKey)
	b = appendBytes(b, r.Props)
	b = appendBytes(b, r.Body)
	return appendField(b, r.FilterValue)
}

// chunkBuilder assembles osiris chunks from records, reusing its buffers.
type chunkBuilder struct {
	b       osiris.Builder
	scratch []byte
	native  bool
	writers map[string]uint64 // highest sequence per writer in the chunk, but for the last one:
	lastW   string            // the writer of the last record with one ("" for none), whose
	lastSeq uint64            // highest sequence is kept here until another writer comes
}

// noteWriter records writer id's sequence seq in the chunk.
func (cb *chunkBuilder) noteWriter(id string, seq uint64) {
	if id == cb.lastW {
		cb.lastSeq = max(cb.lastSeq, seq)
		return
	}
	cb.spillWriter()
	cb.lastW, cb.lastSeq = id, max(cb.writers[id], seq)
}

func (cb *chunkBuilder) spillWriter() {
	if cb.lastW != "" {
		cb.writers[cb.lastW] = cb.lastSeq
		cb.lastW = ""
	}
}

func (cb *chunkBuilder) reset(first uint64, ts int64, epoch uint64) {
	cb.b.Reset(osiris.ChunkUser, first, ts, epoch, 0)
	cb.native = false
	if cb.writers == nil {
		cb.writers = make(map[string]uint64)
	}
	clear(cb.writers)
	cb.lastW = ""
}

// add appends one record (Raw records are stored as they are).
func (cb *chunkBuilder) add(r *Record) error {
	var fv []byte
	if r.FilterValue != "" {
		fv = []byte(r.FilterValue)
	}
	rec := r.Raw
	if n, ok := SubBatchRecords(rec); ok {
		e, _, err := osiris.NextEntry(rec)
		if err != nil {
			return err
		}
		if err := cb.b.AddSubBatch(e.Compression, n, e.UncompressedSize, e.Data, fv); err != nil {
			return err
		}
		rec = nil
	} else if rec == nil {
		cb.scratch = appendNativeRecord(cb.scratch[:0], r)
		rec = cb.scratch
		cb.native = true
	}
	if rec != nil {
		if err := cb.b.Add(rec, fv); err != nil {
			return err
		}
	}
	if r.PublisherID != "" {
		cb.noteWriter(r.PublisherID, r.PublishingID)
	}
	if r.WriterID != "" {
		cb.noteWriter(r.WriterID, r.WriterSeq)
	}
	return nil
}

// SubBatchRecords reports whether a Raw record is a sub-batch entry (see Record.Raw) and how
// many records it holds.
func SubBatchRecords(raw []byte) (uint16, bool) {
	if len(raw) < 11 || raw[0]&0x80 == 0 {
		return 0, false
	}
	n := binary.BigEndian.Uint16(raw[1:])
	return n, n > 0
}

// recordCount is how many offsets r takes.
func recordCount(r *Record) int {
	if n, ok := SubBatchRecords(r.Raw); ok {
		return int(n)
	}
	return 1
}

// finish returns the chunk, a slice the caller owns: the builder's buffer is handed over (no
// copy) and the next chunk is built in a new one.
func (cb *chunkBuilder) finish() ([]byte, error) {
	cb.spillWriter()
	for id, seq := range cb.writers {
		if len(id) <= 255 {
			if err := cb.b.AddTracking(osiris.TrackingSequence, []byte(id), seq); err != nil {
				return nil, err
			}
		}
	}
	blob, err := cb.b.Finish()
	if err != nil {
		return nil, err
	}
	cb.b.Detach()
	extra := 0
	for id := range cb.writers {
		if len(id) > 255 {
			extra += 3 + len(id) + 8
		}
	}
	if extra > 0 {
		for id, seq := range cb.writers {
			if len(id) > 255 {
				blob = append(blob, trackingSequenceLong)
				blob = binary.BigEndian.AppendUint16(blob, uint16(len(id)))
				blob = append(blob, id...)
				blob = binary.BigEndian.AppendUint64(blob, seq)
			}
		}
		binary.BigEndian.PutUint32(blob[40:], binary.BigEndian.Uint32(blob[40:])+uint32(extra))
	}
	if cb.native {
		blob[flagByte] |= flagNative
	}
	if cap(blob)-len(blob) > len(blob)/4+4096 {
		// Much smaller than the chunk before it, whose size the buffer was made for: the cache
		// and the storage batch count lengths, so a mostly empty buffer is not kept.
		blob = bytes.Clone(blob)
	}
	return blob, nil
}

// parsedChunk is what the log needs from a stored chunk's bytes.
type parsedChunk struct {
	hdr     osiris.Header
	data    []byte
	trailer []byte
}

// parseChunk checks an osiris chunk (header, sizes, data CRC) and returns its parts. It does not
// walk the entries (decodeEntries does).
func parseChunk(b []byte) (parsedChunk, error) {
	pc, err := splitChunk(b)
	if err != nil {
		return parsedChunk{}, err
	}
	if crc := crc32.ChecksumIEEE(pc.data); crc != pc.hdr.CRC {
		return parsedChunk{}, fmt.Errorf("%w: data CRC %08x, header says %08x", errCorrupt, crc, pc.hdr.CRC)
	}
	return pc, nil
}

// splitChunk is parseChunk without the CRC check, for a chunk this process just built.
func splitChunk(b []byte) (parsedChunk, error) {
	h, err := osiris.ParseHeader(b)
	if err != nil {
		return parsedChunk{}, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	if uint64(len(b)) != uint64(h.StoredSize()) {
		return parsedChunk{}, fmt.Errorf("%w: chunk of %d bytes, header says %d", errCorrupt, len(b), h.StoredSize())
	}
	off := osiris.HeaderSize + int(h.BloomSize)
	return parsedChunk{hdr: h, data: b[off : off+int(h.DataLength)], trailer: b[off+int(h.DataLength):]}, nil
}

// walkTracking calls fn for every sequence entry of a trailer.
func walkTracking(trailer []byte, fn func(id string, seq uint64)) error {
	for len(trailer) > 0 {
		if trailer[0] == trackingSequenceLong {
			if len(trailer) < 3 {
				return fmt.Errorf("%w: truncated tracking entry", errCorrupt)
			}
			n := int(binary.BigEndian.Uint16(trailer[1:]))
			if len(trailer) < 3+n+8 {
				return fmt.Errorf("%w: truncated tracking entry", errCorrupt)
			}
			fn(string(trailer[3:3+n]), binary.BigEndian.Uint64(trailer[3+n:]))
			trailer = trailer[3+n+8:]
			continue
		}
		t, rest, err := osiris.NextTracking(trailer)
		if err != nil {
			return fmt.Errorf("%w: %v", errCorrupt, err)
		}
		if t.Type == osiris.TrackingSequence {
			fn(string(t.ID), t.Value)
		}
		trailer = rest
	}
	return nil
}

// decodeOsirisChunk decodes a stored osiris chunk into entries; Props and Body alias b.
func decodeOsirisChunk(b []byte, name string) ([]Entry, chunkMeta, error) {
	pc, err := parseChunk(b)
	if err != nil {
		return nil, chunkMeta{}, err
	}
	m := chunkMeta{first: pc.hdr.ChunkID, count: pc.hdr.NumRecords, firstTs: pc.hdr.Timestamp, lastTs: pc.hdr.Timestamp, epoch: pc.hdr.Epoch}
	if uint64(m.count)*5 > uint64(len(pc.data)) {
		return nil, m, fmt.Errorf("%w: %d records cannot fit in %d bytes", errCorrupt, m.count, len(pc.data))
	}
	entries := make([]Entry, 0, m.count)
	var lastEx, lastRK string
	off := m.first
	rest := pc.data
	add := func(rec []byte) error {
		e := Entry{Offset: off}
		e.Timestamp = m.firstTs
		if err := decodeRecord(rec, &e, &lastEx, &lastRK, name); err != nil {
			return fmt.Errorf("record at offset %d: %w", off, err)
		}
		entries = append(entries, e)
		off++
		return nil
	}
	for len(rest) > 0 {
		ent, next, err := osiris.NextEntry(rest)
		if err != nil {
			return nil, m, fmt.Errorf("%w: %v", errCorrupt, err)
		}
		rest = next
		if !ent.SubBatch {
			if err := add(ent.Data); err != nil {
				return nil, m, err
			}
			continue
		}
		if ent.Compression != osiris.CompressionNone {
			// Compressed sub-batches (stream-protocol publishers) are delivered to AMQP 0-9-1
			// consumers as one opaque message each record would need decompressing for.
			for range ent.Records {
				e := Entry{Offset: off}
				e.Timestamp = m.firstTs
				e.Body = ent.Data
				entries = append(entries, e)
				off++
			}
			continue
		}
		body := ent.Data
		for range ent.Records {
			rec, more, err := osiris.NextRecord(body)
			if err != nil {
				return nil, m, fmt.Errorf("%w: %v", errCorrupt, err)
			}
			body = more
			if err := add(rec); err != nil {
				return nil, m, err
			}
		}
	}
	if uint32(len(entries)) != m.count {
		return nil, m, fmt.Errorf("%w: %d records, header says %d", errCorrupt, len(entries), m.count)
	}
	return entries, m, nil
}

// decodeRecord fills e from a stored record: a Warren record, or an AMQP 1.0 message mapped to
// AMQP 0-9-1 as RabbitMQ 4.x delivers it to a 0-9-1 consumer.
func decodeRecord(rec []byte, e *Entry, lastEx, lastRK *string, streamName string) error {
	if len(rec) >= 2 && rec[0] == nativeRecordMagic {
		if rec[1] != nativeRecordVersion {
			return fmt.Errorf("%w: record version %d", errCorrupt, rec[1])
		}
		d := decoder{b: rec[2:]}
		*lastEx = d.str(*lastEx)
		e.Exchange = *lastEx
		*lastRK = d.str(*lastRK)
		e.RoutingKey = *lastRK
		e.Props = d.bytes()
		e.Body = d.bytes()
		e.FilterValue = d.str("")
		if d.err || len(d.b) != 0 {
			return fmt.Errorf("%w: malformed record", errCorrupt)
		}
		return nil
	}
	m, err := amqp10.Decode(rec)
	if err != nil {
		// Not a message Warren can map: deliver the bytes as the body.
		e.Body = rec
		return nil
	}
	m091, err := amqp10.ToAMQP091(m, streamName, e.Offset)
	if err != nil {
		e.Body = rec
		return nil
	}
	e.Exchange, e.RoutingKey, e.Body = m091.Exchange, m091.RoutingKey, m091.Body
	props := m091.Properties
	if props.Headers != nil {
		delete(props.Headers, "x-stream-offset") // added again at delivery
	}
	e.Props = props.Append(nil)
	e.Raw = rec
	return nil
}
