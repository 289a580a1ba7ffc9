package amqp

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"slices"
	"time"
)

// Table is an AMQP field table. Values have the Go types listed under
// DecodeFieldValue.
type Table map[string]any

// Decimal is the AMQP decimal-value: Value / 10^Scale.
type Decimal struct {
	Scale uint8
	Value int32
}

// maxTableDepth bounds the nesting of tables and arrays, when decoding and
// when encoding.
const maxTableDepth = 64

// DecodeTable decodes a field table. b starts at the table's 4-byte length;
// the result reports how many bytes were consumed. Decoded values never
// alias b. Errors wrap ErrMalformed.
func DecodeTable(b []byte) (Table, int, error) {
	t, n, err := decodeTable(b, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("amqp: decoding field table: %w", err)
	}
	return t, n, nil
}

// DecodeFieldValue decodes one field value; b starts at the type tag.
// Wire types map to Go types as follows (RabbitMQ's errata of 0-9-1):
//
//	't' bool     'b' int8     'B' uint8    's' int16    'u' uint16
//	'I' int32    'i' uint32   'l' int64    'f' float32  'd' float64
//	'D' Decimal  'S' string   'x' []byte   'A' []any    'T' time.Time (UTC)
//	'F' Table    'V' nil
//
// It returns the number of bytes consumed. Errors wrap ErrMalformed.
func DecodeFieldValue(b []byte) (any, int, error) {
	v, n, err := decodeValue(b, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("amqp: decoding field value: %w", err)
	}
	return v, n, nil
}

func malformed(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, ErrMalformed)...)
}

// sizedBlock reads a 4-byte length and returns the block it announces.
func sizedBlock(b []byte, what string) ([]byte, error) {
	if len(b) < 4 {
		return nil, malformed("%s length truncated", what)
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return nil, malformed("%s of %d bytes exceeds the %d available", what, n, len(b)-4)
	}
	return b[4 : 4+int(n)], nil
}

func decodeTable(b []byte, depth int) (Table, int, error) {
	if depth > maxTableDepth {
		return nil, 0, malformed("field tables nested deeper than %d", maxTableDepth)
	}
	body, err := sizedBlock(b, "table")
	if err != nil {
		return nil, 0, err
	}
	t := make(Table)
	for off := 0; off < len(body); {
		kl := int(body[off])
		off++
		if len(body)-off < kl {
			return nil, 0, malformed("table key truncated")
		}
		key := string(body[off : off+kl])
		off += kl
		v, n, err := decodeValue(body[off:], depth)
		if err != nil {
			return nil, 0, fmt.Errorf("key %q: %w", key, err)
		}
		off += n
		t[key] = v
	}
	return t, 4 + len(body), nil
}

func decodeArray(b []byte, depth int) ([]any, int, error) {
	if depth > maxTableDepth {
		return nil, 0, malformed("field arrays nested deeper than %d", maxTableDepth)
	}
	body, err := sizedBlock(b, "array")
	if err != nil {
		return nil, 0, err
	}
	a := []any{}
	for off := 0; off < len(body); {
		v, n, err := decodeValue(body[off:], depth)
		if err != nil {
			return nil, 0, fmt.Errorf("array element %d: %w", len(a), err)
		}
		off += n
		a = append(a, v)
	}
	return a, 4 + len(body), nil
}

// fixedSize is the payload size of the fixed-width field types.
func fixedSize(tag byte) int {
	switch tag {
	case 't', 'b', 'B':
		return 1
	case 's', 'u':
		return 2
	case 'I', 'i', 'f':
		return 4
	case 'D':
		return 5
	case 'l', 'd', 'T':
		return 8
	}
	return 0
}

func decodeValue(b []byte, depth int) (any, int, error) {
	if len(b) < 1 {
		return nil, 0, malformed("field value type truncated")
	}
	tag, p := b[0], b[1:]
	if n := fixedSize(tag); n > 0 && len(p) < n {
		return nil, 0, malformed("field value %q truncated", tag)
	}
	switch tag {
	case 't':
		return p[0] != 0, 2, nil
	case 'b':
		return int8(p[0]), 2, nil
	case 'B':
		return p[0], 2, nil
	case 's':
		return int16(binary.BigEndian.Uint16(p)), 3, nil
	case 'u':
		return binary.BigEndian.Uint16(p), 3, nil
	case 'I':
		return int32(binary.BigEndian.Uint32(p)), 5, nil
	case 'i':
		return binary.BigEndian.Uint32(p), 5, nil
	case 'l':
		return int64(binary.BigEndian.Uint64(p)), 9, nil
	case 'f':
		return math.Float32frombits(binary.BigEndian.Uint32(p)), 5, nil
	case 'd':
		return math.Float64frombits(binary.BigEndian.Uint64(p)), 9, nil
	case 'D':
		return Decimal{Scale: p[0], Value: int32(binary.BigEndian.Uint32(p[1:]))}, 6, nil
	case 'T':
		return time.Unix(int64(binary.BigEndian.Uint64(p)), 0).UTC(), 9, nil
	case 'S':
		s, err := sizedBlock(p, "longstr")
		if err != nil {
			return nil, 0, err
		}
		return string(s), 5 + len(s), nil
	case 'x':
		s, err := sizedBlock(p, "byte array")
		if err != nil {
			return nil, 0, err
		}
		return slices.Clone(s[:len(s):len(s)]), 5 + len(s), nil
	case 'A':
		a, n, err := decodeArray(p, depth+1)
		if err != nil {
			return nil, 0, err
		}
		return a, 1 + n, nil
	case 'F':
		t, n, err := decodeTable(p, depth+1)
		if err != nil {
			return nil, 0, err
		}
		return t, 1 + n, nil
	case 'V':
		return nil, 1, nil
	}
	return nil, 0, malformed("unknown field value type %q", tag)
}

// AppendTable appends t (4-byte length, then the fields in key order) to b.
// Besides the decoded types it accepts int ('I' if it fits in 32 bits, else
// 'l'), uint and uint64 ('l', if at most MaxInt64), map[string]any ('F'),
// []string ('A' of 'S') and []Table ('A' of 'F'). Any other Go type, a key
// longer than 255 bytes or nesting deeper than 64 levels is an error.
func AppendTable(b []byte, t Table) ([]byte, error) {
	out, err := appendTableMode(b, t, false, 0)
	if err != nil {
		return b, fmt.Errorf("amqp: encoding field table: %w", err)
	}
	return out, nil
}

// AppendFieldValue appends v with its type tag, with the type mapping of
// AppendTable.
func AppendFieldValue(b []byte, v any) ([]byte, error) {
	out, err := appendValue(b, v, false, 0)
	if err != nil {
		return b, fmt.Errorf("amqp: encoding field value: %w", err)
	}
	return out, nil
}

// appendTableMode encodes t. In lenient mode unsupported values become void
// and long keys are truncated, and it never fails.
func appendTableMode(b []byte, t Table, lenient bool, depth int) ([]byte, error) {
	if depth > maxTableDepth {
		if lenient {
			return binary.BigEndian.AppendUint32(b, 0), nil
		}
		return b, fmt.Errorf("field tables nested deeper than %d", maxTableDepth)
	}
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	var kbuf [16]string
	keys := kbuf[:0]
	for k := range t {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if len(k) > maxShortstr && !lenient {
			return b[:start], fmt.Errorf("table key of %d bytes is longer than 255", len(k))
		}
		b = appendShortstr(b, k)
		var err error
		b, err = appendValue(b, t[k], lenient, depth)
		if err != nil {
			return b[:start], fmt.Errorf("key %q: %w", k, err)
		}
	}
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b, nil
}

func appendArray(b []byte, n int, elem func(i int) any, lenient bool, depth int) ([]byte, error) {
	start := len(b)
	b = append(b, 'A', 0, 0, 0, 0)
	if depth > maxTableDepth {
		if lenient {
			return b, nil
		}
		return b[:start], fmt.Errorf("field arrays nested deeper than %d", maxTableDepth)
	}
	for i := 0; i < n; i++ {
		var err error
		b, err = appendValue(b, elem(i), lenient, depth)
		if err != nil {
			return b[:start], fmt.Errorf("array element %d: %w", i, err)
		}
	}
	binary.BigEndian.PutUint32(b[start+1:], uint32(len(b)-start-5))
	return b, nil
}

func appendValue(b []byte, v any, lenient bool, depth int) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, 'V'), nil
	case bool:
		if v {
			return append(b, 't', 1), nil
		}
		return append(b, 't', 0), nil
	case int8:
		return append(b, 'b', byte(v)), nil
	case uint8:
		return append(b, 'B', v), nil
	case int16:
		return binary.BigEndian.AppendUint16(append(b, 's'), uint16(v)), nil
	case uint16:
		return binary.BigEndian.AppendUint16(append(b, 'u'), v), nil
	case int32:
		return binary.BigEndian.AppendUint32(append(b, 'I'), uint32(v)), nil
	case uint32:
		return binary.BigEndian.AppendUint32(append(b, 'i'), v), nil
	case int64:
		return binary.BigEndian.AppendUint64(append(b, 'l'), uint64(v)), nil
	case int:
		if v >= math.MinInt32 && v <= math.MaxInt32 {
			return binary.BigEndian.AppendUint32(append(b, 'I'), uint32(int32(v))), nil
		}
		return binary.BigEndian.AppendUint64(append(b, 'l'), uint64(v)), nil
	case uint:
		if uint64(v) <= math.MaxInt64 {
			return binary.BigEndian.AppendUint64(append(b, 'l'), uint64(v)), nil
		}
	case uint64:
		if v <= math.MaxInt64 {
			return binary.BigEndian.AppendUint64(append(b, 'l'), v), nil
		}
	case float32:
		return binary.BigEndian.AppendUint32(append(b, 'f'), math.Float32bits(v)), nil
	case float64:
		return binary.BigEndian.AppendUint64(append(b, 'd'), math.Float64bits(v)), nil
	case Decimal:
		return binary.BigEndian.AppendUint32(append(b, 'D', v.Scale), uint32(v.Value)), nil
	case string:
		b = binary.BigEndian.AppendUint32(append(b, 'S'), uint32(len(v)))
		return append(b, v...), nil
	case []byte:
		b = binary.BigEndian.AppendUint32(append(b, 'x'), uint32(len(v)))
		return append(b, v...), nil
	case time.Time:
		return binary.BigEndian.AppendUint64(append(b, 'T'), uint64(v.Unix())), nil
	case Table:
		return appendTableMode(append(b, 'F'), v, lenient, depth+1)
	case map[string]any:
		return appendTableMode(append(b, 'F'), Table(v), lenient, depth+1)
	case []any:
		return appendArray(b, len(v), func(i int) any { return v[i] }, lenient, depth+1)
	case []string:
		return appendArray(b, len(v), func(i int) any { return v[i] }, lenient, depth+1)
	case []Table:
		return appendArray(b, len(v), func(i int) any { return v[i] }, lenient, depth+1)
	}
	if lenient {
		return append(b, 'V'), nil
	}
	return b, fmt.Errorf("unsupported field value type %T", v)
}

// AsInt64 returns v as an int64 if v is of any Go integer type and its value
// fits. Floats are not converted.
func AsInt64(v any) (int64, bool) {
	switch v := v.(type) {
	case int:
		return int64(v), true
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	case uint:
		if uint64(v) <= math.MaxInt64 {
			return int64(v), true
		}
	case uint64:
		if v <= math.MaxInt64 {
			return int64(v), true
		}
	}
	return 0, false
}

// bigUint returns v if it is an unsigned integer above MaxInt64.
func bigUint(v any) (uint64, bool) {
	switch v := v.(type) {
	case uint:
		if uint64(v) > math.MaxInt64 {
			return uint64(v), true
		}
	case uint64:
		if v > math.MaxInt64 {
			return v, true
		}
	}
	return 0, false
}

func asFloat(v any) (float64, bool) {
	switch v := v.(type) {
	case float32:
		return float64(v), true
	case float64:
		return v, true
	}
	return 0, false
}

func asBytes(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return "", false
}

func asTable(v any) (Table, bool) {
	switch v := v.(type) {
	case Table:
		return v, true
	case map[string]any:
		return Table(v), true
	}
	return nil, false
}

func asArray(v any) (int, func(int) any, bool) {
	switch v := v.(type) {
	case []any:
		return len(v), func(i int) any { return v[i] }, true
	case []string:
		return len(v), func(i int) any { return v[i] }, true
	case []Table:
		return len(v), func(i int) any { return v[i] }, true
	}
	return 0, nil, false
}

// ValuesEqual compares two field values the way equivalence checks need:
// integers of any width compare by value (int32(1), int64(1) and uint8(1)
// are equal), float32 and float64 by value (NaN equals NaN), string and
// []byte by content, time.Time by instant, tables and arrays deeply. Values
// of different kinds (an integer and a float, a bool and an integer) are not
// equal.
func ValuesEqual(a, b any) bool {
	if ai, ok := AsInt64(a); ok {
		bi, ok := AsInt64(b)
		return ok && ai == bi
	}
	if au, ok := bigUint(a); ok {
		bu, ok := bigUint(b)
		return ok && au == bu
	}
	if af, ok := asFloat(a); ok {
		bf, ok := asFloat(b)
		return ok && (af == bf || (math.IsNaN(af) && math.IsNaN(bf)))
	}
	if as, ok := asBytes(a); ok {
		bs, ok := asBytes(b)
		return ok && as == bs
	}
	if at, ok := asTable(a); ok {
		bt, ok := asTable(b)
		return ok && TablesEqual(at, bt)
	}
	if an, ael, ok := asArray(a); ok {
		bn, bel, ok := asArray(b)
		if !ok || an != bn {
			return false
		}
		for i := 0; i < an; i++ {
			if !ValuesEqual(ael(i), bel(i)) {
				return false
			}
		}
		return true
	}
	switch a := a.(type) {
	case nil:
		return b == nil
	case bool:
		bb, ok := b.(bool)
		return ok && a == bb
	case Decimal:
		bd, ok := b.(Decimal)
		return ok && a == bd
	case time.Time:
		bt, ok := b.(time.Time)
		return ok && a.Equal(bt)
	}
	return reflect.DeepEqual(a, b)
}

// TablesEqual reports whether a and b have the same keys with ValuesEqual
// values. A nil table equals an empty one.
func TablesEqual(a, b Table) bool {
	if len(a) != len(b) {
		return false
	}
	for k, av := range a {
		bv, ok := b[k]
		if !ok || !ValuesEqual(av, bv) {
			return false
		}
	}
	return true
}
