package amqp

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// tableBytes builds an encoded table from already encoded fields.
func tableBytes(fields ...[]byte) []byte {
	body := bytes.Join(fields, nil)
	n := len(body)
	return append([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, body...)
}

// field builds one encoded key/value pair.
func field(key string, tagAndValue ...byte) []byte {
	return append(append([]byte{byte(len(key))}, key...), tagAndValue...)
}

func TestDecodeTableWireTypes(t *testing.T) {
	ts := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	tsec := uint64(ts.Unix())
	u64 := func(v uint64) []byte {
		return []byte{byte(v >> 56), byte(v >> 48), byte(v >> 40), byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
	}
	raw := tableBytes(
		field("t", 't', 1),
		field("b", 'b', 0xfe),
		field("B", 'B', 0xfe),
		field("s", 's', 0xff, 0xfe), // RabbitMQ errata: 's' is a signed 16-bit int
		field("u", 'u', 0xff, 0xfe),
		field("I", 'I', 0xff, 0xff, 0xff, 0xfd),
		field("i", 'i', 0xff, 0xff, 0xff, 0xfd),
		field("l", append([]byte{'l'}, u64(math.MaxUint64-4)...)...),
		field("f", 'f', 0x3f, 0xc0, 0, 0),
		field("d", 'd', 0x40, 0x09, 0x21, 0xfb, 0x54, 0x44, 0x2d, 0x18),
		field("D", 'D', 2, 0, 0, 0x30, 0x39),
		field("S", 'S', 0, 0, 0, 3, 'a', 'b', 'c'),
		field("x", 'x', 0, 0, 0, 2, 0, 0xff),
		field("A", 'A', 0, 0, 0, 8, 'I', 0, 0, 0, 1, 't', 0, 'V'),
		field("T", append([]byte{'T'}, u64(tsec)...)...),
		field("F", append([]byte{'F'}, tableBytes(field("k", 'S', 0, 0, 0, 1, 'v'))...)...),
		field("V", 'V'),
	)
	got, n, err := DecodeTable(raw)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(raw) {
		t.Fatalf("consumed %d of %d", n, len(raw))
	}
	want := Table{
		"t": true, "b": int8(-2), "B": uint8(0xfe), "s": int16(-2), "u": uint16(0xfffe),
		"I": int32(-3), "i": uint32(0xfffffffd), "l": int64(-5), "f": float32(1.5), "d": math.Pi,
		"D": Decimal{Scale: 2, Value: 12345}, "S": "abc", "x": []byte{0, 0xff},
		"A": []any{int32(1), false, nil}, "T": ts, "F": Table{"k": "v"}, "V": nil,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%#v\nwant\n%#v", got, want)
	}
	// Re-encoding in key order gives a table that decodes to the same.
	enc, err := AppendTable(nil, got)
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := DecodeTable(enc)
	if err != nil || !reflect.DeepEqual(again, want) {
		t.Fatalf("re-decoded %#v, %v", again, err)
	}
	if len(enc) != len(raw) {
		t.Fatalf("re-encoded length %d, want %d", len(enc), len(raw))
	}
}

func TestAppendTableBytes(t *testing.T) {
	cases := []struct {
		v    any
		want []byte
	}{
		{true, []byte{'t', 1}},
		{int8(-1), []byte{'b', 0xff}},
		{uint8(7), []byte{'B', 7}},
		{int16(-2), []byte{'s', 0xff, 0xfe}},
		{uint16(2), []byte{'u', 0, 2}},
		{int32(-1), []byte{'I', 0xff, 0xff, 0xff, 0xff}},
		{uint32(1), []byte{'i', 0, 0, 0, 1}},
		{int64(1), []byte{'l', 0, 0, 0, 0, 0, 0, 0, 1}},
		{int(5), []byte{'I', 0, 0, 0, 5}},
		{int(-5), []byte{'I', 0xff, 0xff, 0xff, 0xfb}},
		{int(1 << 40), []byte{'l', 0, 0, 1, 0, 0, 0, 0, 0}},
		{uint64(3), []byte{'l', 0, 0, 0, 0, 0, 0, 0, 3}},
		{uint(3), []byte{'l', 0, 0, 0, 0, 0, 0, 0, 3}},
		{float32(1.5), []byte{'f', 0x3f, 0xc0, 0, 0}},
		{float64(1.5), []byte{'d', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}},
		{Decimal{Scale: 1, Value: -1}, []byte{'D', 1, 0xff, 0xff, 0xff, 0xff}},
		{"hi", []byte{'S', 0, 0, 0, 2, 'h', 'i'}},
		{[]byte("hi"), []byte{'x', 0, 0, 0, 2, 'h', 'i'}},
		{time.Unix(258, 0), []byte{'T', 0, 0, 0, 0, 0, 0, 1, 2}},
		{nil, []byte{'V'}},
		{[]any{int32(1), "a"}, []byte{'A', 0, 0, 0, 11, 'I', 0, 0, 0, 1, 'S', 0, 0, 0, 1, 'a'}},
		{[]string{"a"}, []byte{'A', 0, 0, 0, 6, 'S', 0, 0, 0, 1, 'a'}},
		{[]Table{{}}, []byte{'A', 0, 0, 0, 5, 'F', 0, 0, 0, 0}},
		{Table{"a": uint8(1)}, []byte{'F', 0, 0, 0, 4, 1, 'a', 'B', 1}},
		{map[string]any{"a": uint8(1)}, []byte{'F', 0, 0, 0, 4, 1, 'a', 'B', 1}},
	}
	for _, c := range cases {
		got, err := AppendFieldValue(nil, c.v)
		if err != nil || !bytes.Equal(got, c.want) {
			t.Errorf("AppendFieldValue(%#v) = % x, %v; want % x", c.v, got, err, c.want)
		}
		v, n, err := DecodeFieldValue(got)
		if err != nil || n != len(got) || !ValuesEqual(v, c.v) {
			t.Errorf("DecodeFieldValue(% x) = %#v, %d, %v", got, v, n, err)
		}
	}
	// Keys are written in sorted order, so encoding is deterministic.
	got, err := AppendTable([]byte{0xaa}, Table{"b": true, "a": false})
	want := append([]byte{0xaa}, tableBytes(field("a", 't', 0), field("b", 't', 1))...)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("AppendTable = % x, %v; want % x", got, err, want)
	}
	if got, err := AppendTable(nil, nil); err != nil || !bytes.Equal(got, []byte{0, 0, 0, 0}) {
		t.Fatalf("nil table = % x, %v", got, err)
	}
}

func TestAppendTableErrors(t *testing.T) {
	bad := []Table{
		{"k": struct{}{}},
		{"k": uint64(math.MaxUint64)},
		{"k": []any{complex(1, 2)}},
		{strings.Repeat("k", 256): true},
	}
	for _, tb := range bad {
		prefix := []byte{1, 2}
		got, err := AppendTable(prefix, tb)
		if err == nil {
			t.Errorf("AppendTable(%v) succeeded", tb)
		}
		if !bytes.Equal(got, prefix) {
			t.Errorf("AppendTable error left % x, want the input back", got)
		}
	}
	// Self-referencing tables hit the depth limit instead of recursing
	// forever.
	cyc := Table{}
	cyc["self"] = cyc
	if _, err := AppendTable(nil, cyc); err == nil {
		t.Error("cyclic table encoded")
	}
	// Method encoding is lenient: unsupported values become void.
	m := &QueueDeclare{Arguments: Table{"k": struct{}{}}}
	args := m.AppendArgs(nil)
	var back QueueDeclare
	if err := back.Decode(args); err != nil || back.Arguments["k"] != nil || len(back.Arguments) != 1 {
		t.Fatalf("lenient encode: %+v, %v", back, err)
	}
}

func TestDecodeTableMalformed(t *testing.T) {
	bad := [][]byte{
		{},
		{0, 0, 0},
		{0, 0, 0, 1},
		{0, 0, 0, 2, 5, 'a'},                  // key longer than table
		{0, 0, 0, 2, 1, 'a'},                  // missing value
		{0, 0, 0, 3, 1, 'a', 'Z'},             // unknown type
		{0, 0, 0, 4, 1, 'a', 'I', 0},          // truncated int
		{0, 0, 0, 7, 1, 'a', 'S', 0, 0, 0, 9}, // longstr beyond table
		{0, 0, 0, 7, 1, 'a', 'S', 0xff, 0xff, 0xff, 0xff},
		{0, 0, 0, 8, 1, 'a', 'A', 0, 0, 0, 1, 'Q'},
		{0xff, 0xff, 0xff, 0xff},
	}
	for _, b := range bad {
		if _, _, err := DecodeTable(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("DecodeTable(% x) = %v, want ErrMalformed", b, err)
		}
	}
}

func TestDecodeTableDepthLimit(t *testing.T) {
	build := func(depth int) []byte {
		inner := []byte{0, 0, 0, 0}
		for i := 0; i < depth; i++ {
			inner = tableBytes(field("n", append([]byte{'F'}, inner...)...))
		}
		return inner
	}
	if _, _, err := DecodeTable(build(maxTableDepth)); err != nil {
		t.Fatalf("depth %d: %v", maxTableDepth, err)
	}
	if _, _, err := DecodeTable(build(maxTableDepth + 1)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("depth %d: %v", maxTableDepth+1, err)
	}
	// Arrays count too.
	inner := []byte{'V'}
	for i := 0; i < 200; i++ {
		n := len(inner)
		inner = append([]byte{'A', byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, inner...)
	}
	if _, _, err := DecodeTable(tableBytes(field("a", inner...))); !errors.Is(err, ErrMalformed) {
		t.Fatalf("deep arrays: %v", err)
	}
}

func TestDecodedValuesDoNotAlias(t *testing.T) {
	raw := tableBytes(field("x", 'x', 0, 0, 0, 1, 'a'), field("S", 'S', 0, 0, 0, 1, 'b'))
	tb, _, err := DecodeTable(raw)
	if err != nil {
		t.Fatal(err)
	}
	for i := range raw {
		raw[i] = 0
	}
	if string(tb["x"].([]byte)) != "a" || tb["S"] != "b" {
		t.Fatalf("decoded values changed with the input: %#v", tb)
	}
}

func TestValuesEqual(t *testing.T) {
	eq := [][2]any{
		{int32(1), int64(1)}, {uint8(1), int(1)}, {int16(-1), int64(-1)}, {uint64(1), int8(1)},
		{uint64(math.MaxUint64), uint(math.MaxUint)},
		{float32(1.5), float64(1.5)}, {math.NaN(), float32(math.NaN())},
		{"abc", []byte("abc")}, {[]byte("abc"), []byte("abc")},
		{nil, nil}, {true, true}, {Decimal{1, 2}, Decimal{1, 2}},
		{time.Unix(5, 0), time.Unix(5, 0).UTC()},
		{Table{"a": int32(1)}, Table{"a": int64(1)}}, {Table{}, Table(nil)},
		{Table{"a": "x"}, map[string]any{"a": []byte("x")}},
		{[]any{"a", int32(1)}, []any{[]byte("a"), uint16(1)}},
		{[]string{"a"}, []any{"a"}}, {[]Table{{"k": true}}, []any{Table{"k": true}}},
	}
	for _, p := range eq {
		if !ValuesEqual(p[0], p[1]) || !ValuesEqual(p[1], p[0]) {
			t.Errorf("ValuesEqual(%#v, %#v) = false", p[0], p[1])
		}
	}
	ne := [][2]any{
		{int32(1), int32(2)}, {int32(1), float64(1)}, {true, int8(1)}, {"a", "b"},
		{nil, int32(0)}, {nil, ""}, {uint64(math.MaxUint64), int64(-1)},
		{Decimal{1, 2}, Decimal{2, 20}}, {Table{"a": int32(1)}, Table{"b": int32(1)}},
		{[]any{int32(1)}, []any{int32(1), int32(2)}}, {"a", []any{"a"}},
		{Table{"a": nil}, Table{}}, {time.Unix(5, 0), time.Unix(6, 0)},
	}
	for _, p := range ne {
		if ValuesEqual(p[0], p[1]) || ValuesEqual(p[1], p[0]) {
			t.Errorf("ValuesEqual(%#v, %#v) = true", p[0], p[1])
		}
	}
	if !TablesEqual(Table{"x-max-length": int32(10)}, Table{"x-max-length": int64(10)}) {
		t.Error("TablesEqual across widths")
	}
}

func TestAsInt64(t *testing.T) {
	for _, v := range []any{int(3), int8(3), int16(3), int32(3), int64(3), uint8(3), uint16(3), uint32(3), uint(3), uint64(3)} {
		if n, ok := AsInt64(v); !ok || n != 3 {
			t.Errorf("AsInt64(%T) = %d, %v", v, n, ok)
		}
	}
	for _, v := range []any{float64(3), "3", uint64(math.MaxUint64), nil, true} {
		if _, ok := AsInt64(v); ok {
			t.Errorf("AsInt64(%#v) ok", v)
		}
	}
}
