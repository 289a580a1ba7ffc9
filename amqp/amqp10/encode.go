package amqp10

import (
	"encoding/binary"
	"fmt"
	"math"
)

// AppendValue appends the encoding of v, with the smallest constructors RabbitMQ's generator
// (amqp10_binary_generator) picks: uint0/smalluint/uint, smallint/int, str8/str32, list0 for
// an empty list, list8/map8 when the count is under 255 and the size under 256, and so on, so
// that messages Warren converts are byte for byte the ones RabbitMQ writes.
func AppendValue(b []byte, v any) ([]byte, error) {
	e := encoder{b: b}
	e.value(v, 0)
	if e.err != nil {
		return b, e.err
	}
	return e.b, nil
}

type encoder struct {
	b   []byte
	err error
}

func (e *encoder) fail(format string, args ...any) {
	if e.err == nil {
		e.err = fmt.Errorf("amqp10: "+format+": %w", append(args, ErrUnsupported)...)
	}
}

func (e *encoder) u8(v byte)    { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }

// variable writes a vbin/str/sym with the 8-bit form up to 255 bytes.
func (e *encoder) variable(code8, code32 byte, s []byte) {
	if len(s) <= math.MaxUint8 {
		e.b = append(e.b, code8, byte(len(s)))
	} else {
		if uint64(len(s)) > math.MaxUint32 {
			e.fail("value of %d bytes", len(s))
			return
		}
		e.b = append(e.b, code32)
		e.u32(uint32(len(s)))
	}
	e.b = append(e.b, s...)
}

func (e *encoder) value(v any, depth int) {
	if depth > maxDepth {
		e.fail("values nested deeper than %d", maxDepth)
		return
	}
	switch x := v.(type) {
	case nil:
		e.u8(codeNull)
	case bool:
		if x {
			e.u8(codeTrue)
		} else {
			e.u8(codeFalse)
		}
	case Boolean:
		if x {
			e.b = append(e.b, codeBoolean, 1)
		} else {
			e.b = append(e.b, codeBoolean, 0)
		}
	case uint8:
		e.b = append(e.b, codeUbyte, x)
	case uint16:
		e.u8(codeUshort)
		e.u16(x)
	case uint32:
		switch {
		case x == 0:
			e.u8(codeUint0)
		case x < 256:
			e.b = append(e.b, codeSmallUint, byte(x))
		default:
			e.u8(codeUint)
			e.u32(x)
		}
	case uint64:
		switch {
		case x == 0:
			e.u8(codeUlong0)
		case x < 256:
			e.b = append(e.b, codeSmallUlong, byte(x))
		default:
			e.u8(codeUlong)
			e.u64(x)
		}
	case int8:
		e.b = append(e.b, codeByte, byte(x))
	case int16:
		e.u8(codeShort)
		e.u16(uint16(x))
	case int32:
		if x >= -128 && x <= 127 {
			e.b = append(e.b, codeSmallInt, byte(int8(x)))
		} else {
			e.u8(codeInt)
			e.u32(uint32(x))
		}
	case int64:
		if x >= -128 && x <= 127 {
			e.b = append(e.b, codeSmallLong, byte(int8(x)))
		} else {
			e.u8(codeLong)
			e.u64(uint64(x))
		}
	case float32:
		e.u8(codeFloat)
		e.u32(math.Float32bits(x))
	case float64:
		e.u8(codeDouble)
		e.u64(math.Float64bits(x))
	case Decimal32:
		e.u8(codeDecimal32)
		e.b = append(e.b, x[:]...)
	case Decimal64:
		e.u8(codeDecimal64)
		e.b = append(e.b, x[:]...)
	case Decimal128:
		e.u8(codeDecimal128)
		e.b = append(e.b, x[:]...)
	case Char:
		if x < 0 || x > 0x10ffff {
			e.fail("char 0x%x out of range", int32(x))
			return
		}
		e.u8(codeChar)
		e.u32(uint32(x))
	case Timestamp:
		e.u8(codeTimestamp)
		e.u64(uint64(x))
	case UUID:
		e.u8(codeUUID)
		e.b = append(e.b, x[:]...)
	case []byte:
		e.variable(codeVbin8, codeVbin32, x)
	case string:
		e.variable(codeStr8, codeStr32, []byte(x))
	case Symbol:
		e.variable(codeSym8, codeSym32, []byte(x))
	case List:
		if len(x) == 0 {
			e.u8(codeList0)
			return
		}
		e.compound(codeList8, codeList32, len(x), func() {
			for _, el := range x {
				e.value(el, depth+1)
			}
		})
	case Map:
		e.compound(codeMap8, codeMap32, 2*len(x), func() {
			for _, kv := range x {
				e.value(kv.Key, depth+1)
				e.value(kv.Value, depth+1)
			}
		})
	case Array:
		e.array(x, depth)
	case *Described:
		e.u8(codeDescribed)
		e.value(x.Descriptor, depth+1)
		e.value(x.Value, depth+1)
	case Described:
		e.value(&x, depth)
	default:
		e.fail("Go type %T", v)
	}
}

// compound writes a list or map: the 8-bit form when count < 255 and size+1 < 256, as
// RabbitMQ does.
func (e *encoder) compound(code8, code32 byte, count int, elems func()) {
	start := len(e.b)
	e.b = append(e.b, code32, 0, 0, 0, 0, 0, 0, 0, 0) // room for the large form's header
	bodyStart := len(e.b)
	elems()
	if e.err != nil {
		return
	}
	size := len(e.b) - bodyStart
	if count < 255 && size+1 < 256 {
		// Move the elements down 7 bytes and write the short header.
		copy(e.b[start+3:], e.b[bodyStart:])
		e.b = e.b[:start+3+size]
		e.b[start], e.b[start+1], e.b[start+2] = code8, byte(size+1), byte(count)
		return
	}
	if uint64(size)+4 > math.MaxUint32 || uint64(count) > math.MaxUint32 {
		e.fail("compound of %d bytes", size)
		return
	}
	binary.BigEndian.PutUint32(e.b[start+1:], uint32(size+4))
	binary.BigEndian.PutUint32(e.b[start+5:], uint32(count))
}

// array writes an array whose element constructor is taken from the first element (the large
// variable-width and compound constructors, as RabbitMQ writes array elements).
func (e *encoder) array(a Array, depth int) {
	e.compound(codeArray8, codeArray32, len(a), func() {
		if len(a) == 0 {
			e.u8(codeNull)
			return
		}
		ctor, desc, ok := arrayConstructor(a[0])
		if !ok {
			e.fail("array element of Go type %T", a[0])
			return
		}
		if desc != nil {
			e.u8(codeDescribed)
			e.value(desc, depth+1)
		}
		e.u8(ctor)
		for _, el := range a {
			if d, ok := el.(*Described); ok {
				el = d.Value
			}
			c, _, ok := arrayConstructor(el)
			if !ok || c != ctor {
				e.fail("array mixes element types (%T)", el)
				return
			}
			e.element(ctor, el, depth+1)
		}
	})
}

func arrayConstructor(v any) (code byte, desc any, ok bool) {
	if d, isD := v.(*Described); isD {
		c, _, ok := arrayConstructor(d.Value)
		return c, d.Descriptor, ok
	}
	switch v.(type) {
	case nil:
		return codeNull, nil, true
	case bool, Boolean:
		return codeBoolean, nil, true
	case uint8:
		return codeUbyte, nil, true
	case uint16:
		return codeUshort, nil, true
	case uint32:
		return codeUint, nil, true
	case uint64:
		return codeUlong, nil, true
	case int8:
		return codeByte, nil, true
	case int16:
		return codeShort, nil, true
	case int32:
		return codeInt, nil, true
	case int64:
		return codeLong, nil, true
	case float32:
		return codeFloat, nil, true
	case float64:
		return codeDouble, nil, true
	case Char:
		return codeChar, nil, true
	case Timestamp:
		return codeTimestamp, nil, true
	case UUID:
		return codeUUID, nil, true
	case []byte:
		return codeVbin32, nil, true
	case string:
		return codeStr32, nil, true
	case Symbol:
		return codeSym32, nil, true
	case List:
		return codeList32, nil, true
	case Map:
		return codeMap32, nil, true
	case Array:
		return codeArray32, nil, true
	}
	return 0, nil, false
}

// element writes an array element's body (no constructor).
func (e *encoder) element(ctor byte, v any, depth int) {
	switch x := v.(type) {
	case nil:
	case Boolean:
		e.element(ctor, bool(x), depth)
	case bool:
		if x {
			e.u8(1)
		} else {
			e.u8(0)
		}
	case uint8:
		e.u8(x)
	case uint16:
		e.u16(x)
	case uint32:
		e.u32(x)
	case uint64:
		e.u64(x)
	case int8:
		e.u8(byte(x))
	case int16:
		e.u16(uint16(x))
	case int32:
		e.u32(uint32(x))
	case int64:
		e.u64(uint64(x))
	case float32:
		e.u32(math.Float32bits(x))
	case float64:
		e.u64(math.Float64bits(x))
	case Char:
		e.u32(uint32(x))
	case Timestamp:
		e.u64(uint64(x))
	case UUID:
		e.b = append(e.b, x[:]...)
	case []byte:
		e.u32(uint32(len(x)))
		e.b = append(e.b, x...)
	case string:
		e.u32(uint32(len(x)))
		e.b = append(e.b, x...)
	case Symbol:
		e.u32(uint32(len(x)))
		e.b = append(e.b, x...)
	case List, Map, Array:
		// The large compound form without its constructor byte.
		start := len(e.b)
		e.value(v, depth)
		if e.err != nil {
			return
		}
		if e.b[start] != ctor { // re-encode in the large form
			tmp := append([]byte(nil), e.b[start:]...)
			e.b = e.b[:start]
			e.largeBody(ctor, tmp)
			return
		}
		copy(e.b[start:], e.b[start+1:])
		e.b = e.b[:len(e.b)-1]
	}
}

// largeBody rewrites a short-form (or list0) compound encoding as the large form's body.
func (e *encoder) largeBody(ctor byte, enc []byte) {
	var count, size int
	var body []byte
	switch enc[0] {
	case codeList0:
		count, body = 0, nil
	case codeList8, codeMap8, codeArray8:
		size = int(enc[1])
		count = int(enc[2])
		body = enc[3 : 2+size]
	default:
		e.fail("unexpected compound constructor 0x%02x", enc[0])
		return
	}
	e.u32(uint32(len(body) + 4))
	e.u32(uint32(count))
	e.b = append(e.b, body...)
}
