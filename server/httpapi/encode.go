package httpapi

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// This file is the API's JSON encoder. The handlers build their answers from map[string]any,
// slices and basic values; encoding/json walks those by reflection and sorts every map's keys
// through reflect.Values, which made a list of 10,000 queues cost most of a second of CPU. The
// encoder writes those shapes directly with a type switch and hands anything else to
// encoding/json, so its output is byte for byte what json.Marshal writes (sorted keys, HTML
// escaping, the same float format); encode_test.go checks that.

// marshalJSON is json.Marshal for the API's answers.
func marshalJSON(v any) ([]byte, error) {
	e, err := encodeJSON(v)
	if err != nil {
		return nil, err
	}
	if len(e.chunks) == 0 {
		return e.buf, nil
	}
	return slices.Concat(append(e.chunks, e.buf)...), nil
}

// encodeJSON encodes v; the answer is the encoder's chunks then its buf.
func encodeJSON(v any) (*jsonEncoder, error) {
	e := &jsonEncoder{buf: make([]byte, 0, 512)}
	if err := e.value(v); err != nil {
		return nil, err
	}
	return e, nil
}

// jsonEncoder appends JSON to buf. A long list's output is kept in chunks of about chunkSize
// bytes (see spill): growing one buffer to megabytes copied and cleared it again at each
// doubling, which cost more than the encoding. keys is scratch space for sorting maps' keys,
// shared by nested maps as a stack.
type jsonEncoder struct {
	chunks [][]byte
	buf    []byte
	keys   []string
}

// chunkSize is the size of an encoder's chunks: the largest of Go's small allocation classes.
const chunkSize = 32 << 10

// spill moves buf to chunks once it is nearly full; lists call it between elements.
func (e *jsonEncoder) spill() {
	if len(e.buf) >= chunkSize-2<<10 {
		e.chunks = append(e.chunks, e.buf)
		e.buf = make([]byte, 0, chunkSize)
	}
}

// size is the length of the output.
func (e *jsonEncoder) size() int {
	n := len(e.buf)
	for _, c := range e.chunks {
		n += len(c)
	}
	return n
}

func (e *jsonEncoder) value(v any) error {
	switch v := v.(type) {
	case nil:
		e.buf = append(e.buf, "null"...)
	case string:
		e.str(v)
	case bool:
		e.buf = strconv.AppendBool(e.buf, v)
	case int:
		e.buf = strconv.AppendInt(e.buf, int64(v), 10)
	case int64:
		e.buf = strconv.AppendInt(e.buf, v, 10)
	case int32:
		e.buf = strconv.AppendInt(e.buf, int64(v), 10)
	case int16:
		e.buf = strconv.AppendInt(e.buf, int64(v), 10)
	case int8:
		e.buf = strconv.AppendInt(e.buf, int64(v), 10)
	case uint:
		e.buf = strconv.AppendUint(e.buf, uint64(v), 10)
	case uint64:
		e.buf = strconv.AppendUint(e.buf, v, 10)
	case uint32:
		e.buf = strconv.AppendUint(e.buf, uint64(v), 10)
	case uint16:
		e.buf = strconv.AppendUint(e.buf, uint64(v), 10)
	case float64:
		return e.float(v)
	case map[string]any:
		return e.object(v)
	case object:
		return e.fields(v)
	case []object:
		if v == nil {
			e.buf = append(e.buf, "null"...)
			return nil
		}
		e.buf = append(e.buf, '[')
		for i, o := range v {
			if i > 0 {
				e.buf = append(e.buf, ',')
				e.spill()
			}
			if err := e.fields(o); err != nil {
				return err
			}
		}
		e.buf = append(e.buf, ']')
	case rateDetail:
		e.buf = append(e.buf, `{"rate":`...)
		if err := e.float(float64(v)); err != nil {
			return err
		}
		e.buf = append(e.buf, '}')
	case map[string]string:
		if v == nil {
			e.buf = append(e.buf, "null"...)
			return nil
		}
		start := len(e.keys)
		for k := range v {
			e.keys = append(e.keys, k)
		}
		keys := e.keys[start:]
		slices.Sort(keys)
		e.buf = append(e.buf, '{')
		for i, k := range keys {
			if i > 0 {
				e.buf = append(e.buf, ',')
			}
			e.str(k)
			e.buf = append(e.buf, ':')
			e.str(v[k])
		}
		e.buf = append(e.buf, '}')
		e.keys = e.keys[:start]
	case []map[string]any:
		return encodeArray(e, v, true, e.object)
	case []any:
		return encodeArray(e, v, true, e.value)
	case []string:
		return encodeArray(e, v, false, func(s string) error { e.str(s); return nil })
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		e.buf = append(e.buf, b...)
	}
	return nil
}

// encodeArray writes v as a JSON array (null when nil, as encoding/json does), each element with
// each; spill lets long arrays of objects go out in chunks between elements.
func encodeArray[T any](e *jsonEncoder, v []T, spill bool, each func(T) error) error {
	if v == nil {
		e.buf = append(e.buf, "null"...)
		return nil
	}
	e.buf = append(e.buf, '[')
	for i, x := range v {
		if i > 0 {
			e.buf = append(e.buf, ',')
			if spill {
				e.spill()
			}
		}
		if err := each(x); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, ']')
	return nil
}

// object writes m with its keys sorted, as encoding/json does.
func (e *jsonEncoder) object(m map[string]any) error {
	if m == nil {
		e.buf = append(e.buf, "null"...)
		return nil
	}
	start := len(e.keys)
	for k := range m {
		e.keys = append(e.keys, k)
	}
	keys := e.keys[start:]
	slices.Sort(keys)
	e.buf = append(e.buf, '{')
	for i, k := range keys {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		e.str(k)
		e.buf = append(e.buf, ':')
		if err := e.value(m[k]); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, '}')
	// Nested maps pushed their keys after ours and popped them; appending may have moved the
	// array, but keys still names our own copy.
	e.keys = e.keys[:start]
	return nil
}

// fields writes o's fields in their order (see object).
func (e *jsonEncoder) fields(o object) error {
	if o == nil {
		e.buf = append(e.buf, "null"...)
		return nil
	}
	e.buf = append(e.buf, '{')
	for i, f := range o {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		e.str(f.key)
		e.buf = append(e.buf, ':')
		if err := e.value(f.val); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, '}')
	return nil
}

// str writes s quoted. Printable ASCII other than the characters encoding/json escapes is
// copied; any other string goes through encoding/json (control characters, HTML's <, > and &,
// invalid UTF-8, U+2028 and U+2029 have its own rules).
func (e *jsonEncoder) str(s string) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always encodes
			e.buf = append(e.buf, b...)
			return
		}
	}
	e.buf = append(e.buf, '"')
	e.buf = append(e.buf, s...)
	e.buf = append(e.buf, '"')
}

// float writes f in encoding/json's format: the shortest representation, in exponent form
// below 1e-6 and from 1e21, with a one-digit negative exponent written without its zero.
func (e *jsonEncoder) float(f float64) error {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return fmt.Errorf("json: unsupported value: %s", strconv.FormatFloat(f, 'g', -1, 64))
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	e.buf = strconv.AppendFloat(e.buf, f, format, -1, 64)
	if format == 'e' {
		if n := len(e.buf); n >= 4 && e.buf[n-4] == 'e' && e.buf[n-3] == '-' && e.buf[n-2] == '0' {
			e.buf[n-2] = e.buf[n-1]
			e.buf = e.buf[:n-1]
		}
	}
	return nil
}
