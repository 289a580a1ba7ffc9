package replica

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"warren/stream"
)

// Connection kinds: the byte that follows the stream id when a node dials another's replica.
const (
	// KindFetch: a follower (or a recovering leader) fetches chunks: hello, then a stream of
	// chunks, epoch markers and commit offsets one way and acknowledgements the other.
	KindFetch byte = 'F'
	// KindFence: one fence request (a new leader's promise round) and its answer.
	KindFence byte = 'Q'
	// KindPublish: pipelined publishes forwarded to the leader and their results.
	KindPublish byte = 'P'
)

// Frame types.
const (
	frHello    byte = 1 // C->S fetch: the follower's position
	frAccept   byte = 2 // S->C: streaming starts at the follower's end
	frTruncate byte = 3 // S->C: truncate to an offset and say hello again
	frReset    byte = 4 // S->C: the server no longer has what the follower misses: start over at its first offset
	frRefuse   byte = 5 // S->C: not now (not the leader, a later epoch is known): reason follows
	frChunks   byte = 6 // S->C: chunks as stored
	frEpoch    byte = 7 // S->C: an epoch starts at the follower's end
	frCommit   byte = 8 // S->C: the committed offset (also a heartbeat)
	frAck      byte = 9 // C->S: durable end and last epoch
	frFence    byte = 10
	frTail     byte = 11
	frPublish  byte = 12
	frResult   byte = 13
)

// maxFrame bounds one frame (a batch of chunks, a publish).
const maxFrame = 64 << 20

var errFrame = errors.New("replica: malformed frame")

// writeFrame writes a frame: uvarint length of type+body, type, body.
func appendFrame(dst []byte, typ byte, body []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(1+len(body)))
	dst = append(dst, typ)
	return append(dst, body...)
}

// readFrame reads one frame into a new buffer (slices of it stay valid).
func readFrame(r *bufio.Reader) (byte, []byte, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return 0, nil, err
	}
	if n == 0 || n > maxFrame {
		return 0, nil, fmt.Errorf("%w: frame of %d bytes", errFrame, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, nil, err
	}
	return b[0], b[1:], nil
}

// enc and dec build and read frame bodies.
type enc struct{ b []byte }

func (e *enc) u64(v uint64)   { e.b = binary.BigEndian.AppendUint64(e.b, v) }
func (e *enc) u32(v uint32)   { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *enc) byte(v byte)    { e.b = append(e.b, v) }
func (e *enc) bytes(v []byte) { e.u32(uint32(len(v))); e.b = append(e.b, v...) }
func (e *enc) str(v string)   { e.u32(uint32(len(v))); e.b = append(e.b, v...) }

type dec struct {
	b   []byte
	err bool
}

func (d *dec) need(n int) bool {
	if d.err || len(d.b) < n {
		d.err = true
		return false
	}
	return true
}

func (d *dec) u64() uint64 {
	if !d.need(8) {
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *dec) u32() uint32 {
	if !d.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *dec) byte() byte {
	if !d.need(1) {
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) bytes() []byte {
	n := int(d.u32())
	if !d.need(n) {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) str() string { return string(d.bytes()) }

func (d *dec) done() error {
	if d.err || len(d.b) != 0 {
		return errFrame
	}
	return nil
}

// hello is a fetching replica's position.
type hello struct {
	node      string
	voter     bool
	fence     uint64 // the highest epoch the follower promised
	recovery  uint64 // non-zero: a recovering leader of this epoch fetches (the server need not lead)
	tail      stream.Tail
	needsSnap bool
}

func (h *hello) encode() []byte {
	var e enc
	e.str(h.node)
	e.byte(b2u(h.voter))
	e.u64(h.fence)
	e.u64(h.recovery)
	e.u64(h.tail.LastEpoch)
	e.u64(h.tail.Written)
	e.u64(h.tail.First)
	return e.b
}

func decodeHello(b []byte) (hello, error) {
	d := dec{b: b}
	h := hello{node: d.str(), voter: d.byte() == 1, fence: d.u64(), recovery: d.u64()}
	h.tail = stream.Tail{LastEpoch: d.u64(), Written: d.u64(), First: d.u64()}
	return h, d.done()
}

func b2u(b bool) byte {
	if b {
		return 1
	}
	return 0
}

func encodeHistory(e *enc, h []stream.EpochStart) {
	e.u32(uint32(len(h)))
	for _, x := range h {
		e.u64(x.Epoch)
		e.u64(x.Start)
	}
}

func decodeHistory(d *dec) []stream.EpochStart {
	n := d.u32()
	if n > 1<<20 {
		d.err = true
		return nil
	}
	out := make([]stream.EpochStart, 0, n)
	for range n {
		out = append(out, stream.EpochStart{Epoch: d.u64(), Start: d.u64()})
	}
	return out
}

func encodeChunks(chunks []stream.RawChunk) []byte {
	size := 4
	for _, c := range chunks {
		size += 12 + len(c.Blob)
	}
	e := enc{b: make([]byte, 0, size)}
	e.u32(uint32(len(chunks)))
	for _, c := range chunks {
		e.u64(c.Seg)
		e.bytes(c.Blob)
	}
	return e.b
}

func decodeChunks(b []byte) ([]stream.RawChunk, error) {
	d := dec{b: b}
	n := d.u32()
	if n > 1<<16 {
		return nil, errFrame
	}
	out := make([]stream.RawChunk, 0, n)
	for range n {
		out = append(out, stream.RawChunk{Seg: d.u64(), Blob: d.bytes()})
	}
	return out, d.done()
}

// encodeRecords and decodeRecords carry forwarded publishes.
func encodeRecords(e *enc, recs []stream.Record) {
	e.u32(uint32(len(recs)))
	for i := range recs {
		r := &recs[i]
		e.str(r.Exchange)
		e.str(r.RoutingKey)
		e.bytes(r.Props)
		e.bytes(r.Body)
		e.str(r.FilterValue)
		e.bytes(r.Raw)
		e.str(r.PublisherID)
		e.u64(r.PublishingID)
		e.str(r.WriterID)
		e.u64(r.WriterSeq)
		e.byte(b2u(r.WriterResync))
	}
}

func decodeRecords(d *dec) []stream.Record {
	n := d.u32()
	if uint64(n) > uint64(len(d.b))/40+1 {
		d.err = true
		return nil
	}
	out := make([]stream.Record, 0, n)
	for range n {
		r := stream.Record{Exchange: d.str(), RoutingKey: d.str(), Props: d.bytes(), Body: d.bytes(), FilterValue: d.str()}
		if raw := d.bytes(); len(raw) > 0 {
			r.Raw = raw
		}
		r.PublisherID, r.PublishingID = d.str(), d.u64()
		r.WriterID, r.WriterSeq = d.str(), d.u64()
		r.WriterResync = d.byte() == 1
		out = append(out, r)
	}
	return out
}
