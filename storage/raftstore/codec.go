package raftstore

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"warren/storage"
)

// logFormatV1 is the first byte of every stored log entry. Layout of version 1:
//
//	version u8 | flags u8 | index uvarint | term uvarint | type u8
//	| [appendedAt: unix seconds varint, nanoseconds uvarint]   (when flags has flagAppendedAt)
//	| extensions length uvarint | extensions | data (the rest of the value)
const logFormatV1 byte = 1

const flagAppendedAt byte = 1 << 0

// MaxEncodedLen is an upper bound of the encoded size of l.
func MaxEncodedLen(l *raft.Log) int {
	return 2 + 2*binary.MaxVarintLen64 + 1 + binary.MaxVarintLen64 + binary.MaxVarintLen32 +
		binary.MaxVarintLen64 + len(l.Extensions) + len(l.Data)
}

// AppendLog appends the encoding of l to dst. The cluster transport sends log entries in the same
// encoding as they are stored, so one codec serves both.
func AppendLog(dst []byte, l *raft.Log) []byte {
	var flags byte
	if !l.AppendedAt.IsZero() {
		flags |= flagAppendedAt
	}
	dst = append(dst, logFormatV1, flags)
	dst = binary.AppendUvarint(dst, l.Index)
	dst = binary.AppendUvarint(dst, l.Term)
	dst = append(dst, byte(l.Type))
	if flags&flagAppendedAt != 0 {
		dst = binary.AppendVarint(dst, l.AppendedAt.Unix())
		dst = binary.AppendUvarint(dst, uint64(l.AppendedAt.Nanosecond()))
	}
	dst = binary.AppendUvarint(dst, uint64(len(l.Extensions)))
	dst = append(dst, l.Extensions...)
	return append(dst, l.Data...)
}

// DecodeLog decodes b into l. l.Data and l.Extensions alias b (nil when empty). A malformed entry gives
// an error wrapping storage.ErrCorrupt.
func DecodeLog(b []byte, l *raft.Log) error {
	d := decoder{b: b}
	if v := d.byte(); d.err == nil && v != logFormatV1 {
		return fmt.Errorf("%w: unknown log entry format version %d", storage.ErrCorrupt, v)
	}
	flags := d.byte()
	var out raft.Log
	out.Index = d.uvarint()
	out.Term = d.uvarint()
	out.Type = raft.LogType(d.byte())
	if flags&flagAppendedAt != 0 {
		sec := d.varint()
		nsec := d.uvarint()
		if d.err == nil && nsec >= uint64(time.Second) {
			d.fail("nanoseconds out of range")
		}
		out.AppendedAt = time.Unix(sec, int64(nsec))
	}
	out.Extensions = d.bytes(d.uvarint())
	if d.err != nil {
		return d.err
	}
	if len(d.b) > 0 {
		out.Data = d.b
	}
	*l = out
	return nil
}

// decoder reads a stored entry front to back; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: damaged log entry: %s", storage.ErrCorrupt, what)
	}
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.fail("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("length beyond the end")
		return nil
	}
	if n == 0 {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}
