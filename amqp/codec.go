package amqp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// decoder reads AMQP primitive types from a byte slice. The first failure is
// sticky: later reads return zero values and finish reports it.
type decoder struct {
	b   []byte
	off int
	err error
}

// fail records that a field runs past the end of the data.
func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%s truncated at offset %d: %w", what, d.off, errFraming)
	}
}

// take returns the next n bytes, or nil after recording an error.
func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b)-d.off < n {
		d.fail(what)
		return nil
	}
	p := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return p
}

func (d *decoder) octet() uint8 {
	p := d.take(1, "octet")
	if p == nil {
		return 0
	}
	return p[0]
}

func (d *decoder) short() uint16 {
	p := d.take(2, "short")
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint16(p)
}

func (d *decoder) long() uint32 {
	p := d.take(4, "long")
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint32(p)
}

func (d *decoder) longlong() uint64 {
	p := d.take(8, "longlong")
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint64(p)
}

func (d *decoder) shortstr() string {
	n := d.octet()
	return string(d.take(int(n), "shortstr"))
}

func (d *decoder) longstr() string {
	n := d.long()
	if d.err != nil {
		return ""
	}
	if uint64(n) > uint64(len(d.b)-d.off) {
		d.fail("longstr")
		return ""
	}
	return string(d.take(int(n), "longstr"))
}

func (d *decoder) timestamp() time.Time {
	p := d.take(8, "timestamp")
	if p == nil {
		return time.Time{}
	}
	return time.Unix(int64(binary.BigEndian.Uint64(p)), 0).UTC()
}

func (d *decoder) table() Table {
	if d.err != nil {
		return nil
	}
	// A table longer than what is left is a framing error, as a truncated field is; malformed
	// data inside a table of the right length is not.
	rest := len(d.b) - d.off
	if rest < 4 {
		d.fail("table length")
		return nil
	}
	if n := binary.BigEndian.Uint32(d.b[d.off:]); uint64(n) > uint64(rest-4) {
		d.err = fmt.Errorf("table at offset %d of %d bytes exceeds the %d left: %w", d.off, n, rest-4, errFraming)
		return nil
	}
	t, n, err := DecodeTable(d.b[d.off:])
	if err != nil {
		d.err = fmt.Errorf("table at offset %d: %w", d.off, err)
		return nil
	}
	d.off += n
	return t
}

// finish ends the decoding of a method's arguments: it returns the first error, wrapped with the
// method name, and refuses bytes left over after the last field. Framing errors (a field past the
// end, bytes left over) are a *FramingError.
func (d *decoder) finish(classID, methodID uint16, name string) error {
	if d.err == nil && d.off != len(d.b) {
		d.err = fmt.Errorf("%d bytes left over at offset %d: %w", len(d.b)-d.off, d.off, errFraming)
	}
	if d.err == nil {
		return nil
	}
	err := fmt.Errorf("amqp: decoding %s arguments: %w", name, d.err)
	if errors.Is(d.err, errFraming) {
		return newFramingError(classID, methodID, d.b, err)
	}
	return err
}

func appendShort(b []byte, v uint16) []byte { return binary.BigEndian.AppendUint16(b, v) }

func appendLong(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }

func appendLonglong(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }

// appendShortstr appends s as a shortstr, truncated to 255 bytes.
func appendShortstr(b []byte, s string) []byte {
	if len(s) > maxShortstr {
		s = s[:maxShortstr]
	}
	b = append(b, byte(len(s)))
	return append(b, s...)
}

func appendLongstr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// appendTimestamp appends t as seconds since the Unix epoch. Presence is
// decided by the caller, so the zero time is encoded as its own instant.
func appendTimestamp(b []byte, t time.Time) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(t.Unix()))
}

// appendTable appends t for method arguments, which cannot fail: values of
// unsupported Go types are encoded as void ('V').
func appendTable(b []byte, t Table) []byte {
	out, _ := appendTableMode(b, t, true, 0)
	return out
}
