package wire

import (
	"encoding/binary"
	"fmt"
	"math"
)

// decoder reads fields from one frame. The first failure is kept in err and every later read
// returns zero values, so a decode function reads all its fields and checks once.
type decoder struct {
	b       []byte
	off     int
	key     Key
	version uint16
	err     error
}

func newDecoder(frame []byte) decoder {
	return decoder{b: frame}
}

func (d *decoder) fail(field, format string, args ...any) {
	if d.err == nil {
		d.err = &DecodeError{Key: d.key, Version: d.version, Field: field,
			Reason: fmt.Sprintf(format, args...), Err: ErrMalformed}
	}
}

func (d *decoder) remaining() int { return len(d.b) - d.off }

// take returns the next n bytes as a slice of the frame.
func (d *decoder) take(field string, n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > d.remaining() {
		d.fail(field, "needs %d bytes, %d left", n, d.remaining())
		return nil
	}
	s := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return s
}

func (d *decoder) u8(field string) uint8 {
	b := d.take(field, 1)
	if b == nil {
		return 0
	}
	return b[0]
}

func (d *decoder) u16(field string) uint16 {
	b := d.take(field, 2)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint16(b)
}

func (d *decoder) u32(field string) uint32 {
	b := d.take(field, 4)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

func (d *decoder) u64(field string) uint64 {
	b := d.take(field, 8)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// strBytes reads a string (uint16 length; 0xFFFF, the spec's -1, is an absent string and reads
// as empty) as a slice of the frame.
func (d *decoder) strBytes(field string) []byte {
	n := d.u16(field)
	if d.err != nil {
		return nil
	}
	if n == 0xFFFF {
		return d.b[d.off:d.off:d.off]
	}
	return d.take(field, int(n))
}

func (d *decoder) str(field string) string { return string(d.strBytes(field)) }

// blob reads bytes (int32 length, -1 = absent: nil).
func (d *decoder) blob(field string) []byte {
	n := d.u32(field)
	if d.err != nil {
		return nil
	}
	if int32(n) == -1 {
		return nil
	}
	if n > math.MaxInt32 {
		d.fail(field, "negative length %d", int32(n))
		return nil
	}
	b := d.take(field, int(n))
	if b == nil {
		return nil
	}
	return b
}

// count reads an array count and checks that count elements of at least minSize bytes each fit
// in what is left, so that no caller allocates for elements the frame cannot hold.
func (d *decoder) count(field string, minSize int) int {
	n := d.u32(field)
	if d.err != nil {
		return 0
	}
	if n > math.MaxInt32 || int64(n)*int64(minSize) > int64(d.remaining()) {
		d.fail(field, "count %d does not fit in the %d bytes left", n, d.remaining())
		return 0
	}
	return int(n)
}

// strs reads an array of strings.
func (d *decoder) strs(field string, dst []string) []string {
	n := d.count(field, 2)
	for i := 0; i < n && d.err == nil; i++ {
		dst = append(dst, d.str(field))
	}
	return dst
}

// props reads an array of key/value string pairs.
func (d *decoder) props(field string, dst []Property) []Property {
	n := d.count(field, 4)
	for i := 0; i < n && d.err == nil; i++ {
		k := d.str(field + " key")
		v := d.str(field + " value")
		dst = append(dst, Property{Key: k, Value: v})
	}
	return dst
}

// optProps reads properties that may be left out altogether (subscribe, resolve-offset-spec).
func (d *decoder) optProps(field string, dst []Property) []Property {
	if d.err != nil || d.remaining() == 0 {
		return dst
	}
	return d.props(field, dst)
}

func (d *decoder) offsetSpec(field string, allowNone bool) OffsetSpec {
	t := OffsetType(d.u16(field + " type"))
	if d.err != nil {
		return OffsetSpec{}
	}
	s := OffsetSpec{Type: t}
	switch t {
	case OffsetTypeFirst, OffsetTypeLast, OffsetTypeNext:
	case OffsetTypeOffset, OffsetTypeTimestamp:
		s.Value = d.u64(field + " value")
	case OffsetTypeNone:
		if !allowNone {
			d.fail(field+" type", "offset type none is not allowed here")
		}
	default:
		d.fail(field+" type", "unknown offset type %d", uint16(t))
	}
	return s
}

func (d *decoder) bool8(field string) bool {
	v := d.u8(field)
	if v > 1 {
		d.fail(field, "boolean byte %d is neither 0 nor 1", v)
	}
	return v == 1
}

// finish reports the first error, or trailing bytes.
func (d *decoder) finish() error {
	if d.err == nil && d.remaining() != 0 {
		d.fail("", "%d trailing bytes", d.remaining())
	}
	return d.err
}

// encoder appends fields to b. Encoding problems are kept in err (the frame is then unusable).
type encoder struct {
	b     []byte
	start int // where the size prefix is
	err   error
}

// begin starts a frame: a size placeholder, the key and the version.
func begin(b []byte, key Key, version uint16) encoder {
	e := encoder{b: b, start: len(b)}
	e.b = append(e.b, 0, 0, 0, 0)
	e.u16(uint16(key))
	e.u16(version)
	return e
}

// end patches the size prefix and returns the frame (or b unchanged on error).
func (e *encoder) end() ([]byte, error) {
	if e.err != nil {
		return e.b[:e.start], e.err
	}
	size := len(e.b) - e.start - 4
	if uint64(size) > math.MaxUint32 {
		return e.b[:e.start], fmt.Errorf("stream wire: frame of %d bytes: %w", size, ErrEncode)
	}
	binary.BigEndian.PutUint32(e.b[e.start:], uint32(size))
	return e.b, nil
}

func (e *encoder) fail(format string, args ...any) {
	if e.err == nil {
		e.err = fmt.Errorf("stream wire: "+format+": %w", append(args, ErrEncode)...)
	}
}

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }

func (e *encoder) bool8(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}

func (e *encoder) str(s string) {
	if len(s) > MaxStringLength {
		e.fail("string of %d bytes is longer than %d", len(s), MaxStringLength)
		return
	}
	e.u16(uint16(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) strBytes(s []byte) {
	if len(s) > MaxStringLength {
		e.fail("string of %d bytes is longer than %d", len(s), MaxStringLength)
		return
	}
	e.u16(uint16(len(s)))
	e.b = append(e.b, s...)
}

// blob writes bytes; nil is written as -1 (absent).
func (e *encoder) blob(b []byte) {
	if b == nil {
		e.u32(math.MaxUint32)
		return
	}
	if len(b) > math.MaxInt32 {
		e.fail("bytes of length %d do not fit an int32 length", len(b))
		return
	}
	e.u32(uint32(len(b)))
	e.b = append(e.b, b...)
}

func (e *encoder) count(n int) {
	if n > math.MaxInt32 {
		e.fail("%d elements do not fit an int32 count", n)
		return
	}
	e.u32(uint32(n))
}

func (e *encoder) strs(ss []string) {
	e.count(len(ss))
	for _, s := range ss {
		e.str(s)
	}
}

func (e *encoder) props(ps []Property) {
	e.count(len(ps))
	for _, p := range ps {
		e.str(p.Key)
		e.str(p.Value)
	}
}

func (e *encoder) offsetSpec(s OffsetSpec) {
	e.u16(uint16(s.Type))
	if s.HasValue() {
		e.u64(s.Value)
	}
}
