package amqp10

import (
	"encoding/binary"
	"math"
	"unicode/utf8"
)

// maxDepth bounds the nesting of lists, maps, arrays and described values.
const maxDepth = 64

// ReadValue decodes one value at the start of b and returns it with the number of bytes it
// took. Binary values alias b; strings and symbols are copies. Strings must be valid UTF-8.
func ReadValue(b []byte) (any, int, error) {
	d := decoder{b: b}
	v := d.value(0)
	if d.err != nil {
		return nil, 0, d.err
	}
	return v, d.off, nil
}

type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = malformed(format, args...)
	}
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b)-d.off {
		d.fail("value of %d bytes at offset %d, %d left", n, d.off, len(d.b)-d.off)
		return nil
	}
	s := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return s
}

func (d *decoder) u8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if b := d.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) value(depth int) any {
	code := d.u8()
	if d.err != nil {
		return nil
	}
	if code == codeDescribed {
		if depth >= maxDepth {
			d.fail("described values nested deeper than %d", maxDepth)
			return nil
		}
		desc := d.value(depth + 1)
		val := d.value(depth + 1)
		if d.err != nil {
			return nil
		}
		return &Described{Descriptor: desc, Value: val}
	}
	return d.body(code, depth)
}

// body decodes the data that follows constructor code.
func (d *decoder) body(code byte, depth int) any {
	switch code {
	case codeNull:
		return nil
	case codeTrue:
		return true
	case codeFalse:
		return false
	case codeUint0:
		return uint32(0)
	case codeUlong0:
		return uint64(0)
	case codeList0:
		return List{}
	case codeUbyte:
		return d.u8()
	case codeByte:
		return int8(d.u8())
	case codeSmallUint:
		return uint32(d.u8())
	case codeSmallUlong:
		return uint64(d.u8())
	case codeSmallInt:
		return int32(int8(d.u8()))
	case codeSmallLong:
		return int64(int8(d.u8()))
	case codeBoolean:
		switch v := d.u8(); v {
		case 0:
			return Boolean(false)
		case 1:
			return Boolean(true)
		default:
			d.fail("boolean byte %d", v)
			return nil
		}
	case codeUshort:
		return d.u16()
	case codeShort:
		return int16(d.u16())
	case codeUint:
		return d.u32()
	case codeInt:
		return int32(d.u32())
	case codeFloat:
		return math.Float32frombits(d.u32())
	case codeChar:
		c := d.u32()
		if c > utf8.MaxRune {
			d.fail("char 0x%x out of range", c)
			return nil
		}
		return Char(c)
	case codeDecimal32:
		var v Decimal32
		copy(v[:], d.take(4))
		return v
	case codeUlong:
		return d.u64()
	case codeLong:
		return int64(d.u64())
	case codeDouble:
		return math.Float64frombits(d.u64())
	case codeTimestamp:
		return Timestamp(int64(d.u64()))
	case codeDecimal64:
		var v Decimal64
		copy(v[:], d.take(8))
		return v
	case codeDecimal128:
		var v Decimal128
		copy(v[:], d.take(16))
		return v
	case codeUUID:
		var v UUID
		copy(v[:], d.take(16))
		return v
	case codeVbin8:
		return d.take(int(d.u8()))
	case codeVbin32:
		return d.take(d.len32())
	case codeStr8, codeStr32, codeSym8, codeSym32:
		var s []byte
		if code == codeStr8 || code == codeSym8 {
			s = d.take(int(d.u8()))
		} else {
			s = d.take(d.len32())
		}
		if d.err != nil {
			return nil
		}
		if code == codeSym8 || code == codeSym32 {
			return Symbol(s)
		}
		if !utf8.Valid(s) {
			d.fail("string is not valid UTF-8")
			return nil
		}
		return string(s)
	case codeList8, codeList32, codeMap8, codeMap32:
		return d.compound(code, depth)
	case codeArray8, codeArray32:
		return d.array(code, depth)
	}
	d.fail("unknown constructor 0x%02x", code)
	return nil
}

func (d *decoder) len32() int {
	n := d.u32()
	if n > math.MaxInt32 {
		d.fail("length %d", n)
		return 0
	}
	return int(n)
}

// compound decodes a list or map: size, count, then count values within size bytes.
func (d *decoder) compound(code byte, depth int) any {
	if depth >= maxDepth {
		d.fail("compound values nested deeper than %d", maxDepth)
		return nil
	}
	var size, count int
	if code == codeList8 || code == codeMap8 {
		size = int(d.u8())
		if size < 1 {
			d.fail("compound of size 0")
			return nil
		}
		body := d.take(size)
		if d.err != nil {
			return nil
		}
		count = int(body[0])
		return d.elements(code, body[1:], count, depth)
	}
	size = d.len32()
	if d.err == nil && size < 4 {
		d.fail("compound of size %d", size)
		return nil
	}
	body := d.take(size)
	if d.err != nil {
		return nil
	}
	count = int(binary.BigEndian.Uint32(body))
	return d.elements(code, body[4:], count, depth)
}

func (d *decoder) elements(code byte, body []byte, count, depth int) any {
	if count > len(body) || count < 0 {
		d.fail("%d elements in %d bytes", count, len(body))
		return nil
	}
	sub := decoder{b: body}
	isMap := code == codeMap8 || code == codeMap32
	if isMap {
		if count%2 != 0 {
			d.fail("map with an odd count %d", count)
			return nil
		}
		m := make(Map, 0, count/2)
		for i := 0; i < count/2 && sub.err == nil; i++ {
			k := sub.value(depth + 1)
			v := sub.value(depth + 1)
			m = append(m, KeyValue{k, v})
		}
		d.adopt(&sub)
		return m
	}
	l := make(List, 0, count)
	for i := 0; i < count && sub.err == nil; i++ {
		l = append(l, sub.value(depth+1))
	}
	d.adopt(&sub)
	return l
}

// adopt takes a sub-decoder's error, or reports bytes it left unread.
func (d *decoder) adopt(sub *decoder) {
	if sub.err != nil {
		d.fail("%v", sub.err)
		return
	}
	if sub.off != len(sub.b) {
		d.fail("%d bytes left in a compound value", len(sub.b)-sub.off)
	}
}

// array decodes an array: size, count, one constructor, count element bodies.
func (d *decoder) array(code byte, depth int) any {
	if depth >= maxDepth {
		d.fail("arrays nested deeper than %d", maxDepth)
		return nil
	}
	var body []byte
	var count int
	if code == codeArray8 {
		size := int(d.u8())
		body = d.take(size)
		if d.err == nil && size < 1 {
			d.fail("array of size 0")
		}
		if d.err != nil {
			return nil
		}
		count, body = int(body[0]), body[1:]
	} else {
		size := d.len32()
		if d.err == nil && size < 4 {
			d.fail("array of size %d", size)
		}
		body = d.take(size)
		if d.err != nil {
			return nil
		}
		count, body = int(binary.BigEndian.Uint32(body)), body[4:]
	}
	sub := decoder{b: body}
	ctor := sub.u8()
	var desc any
	if ctor == codeDescribed {
		desc = sub.value(depth + 1)
		ctor = sub.u8()
	}
	if sub.err != nil {
		d.adopt(&sub)
		return nil
	}
	// Every element takes at least one byte, except zero-width ones (null, true, uint0, ...),
	// whose count is bounded by the bytes the array claims so that no count allocates more
	// than the input.
	if count < 0 || count > len(body) {
		d.fail("array of %d elements in %d bytes", count, len(body))
		return nil
	}
	a := make(Array, 0, count)
	for i := 0; i < count && sub.err == nil; i++ {
		v := sub.body(ctor, depth+1)
		if desc != nil {
			v = &Described{Descriptor: desc, Value: v}
		}
		a = append(a, v)
	}
	d.adopt(&sub)
	return a
}
