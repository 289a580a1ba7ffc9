package amqp10

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestValueEncodings checks the constructors the encoder picks against RabbitMQ's generator
// (amqp10_binary_generator.erl) and that each decodes back to the same value.
func TestValueEncodings(t *testing.T) {
	long := strings.Repeat("s", 256)
	cases := []struct {
		v    any
		want string
	}{
		{nil, "40"},
		{true, "41"},
		{false, "42"},
		{uint8(7), "5007"},
		{uint16(0x1234), "601234"},
		{uint32(0), "43"},
		{uint32(255), "52ff"},
		{uint32(256), "7000000100"},
		{uint64(0), "44"},
		{uint64(0x75), "5375"},
		{uint64(1 << 40), "800000010000000000"},
		{int8(-1), "51ff"},
		{int16(-300), "61fed4"},
		{int32(-7), "54f9"},
		{int32(127), "547f"},
		{int32(128), "7100000080"},
		{int32(-129), "71ffffff7f"},
		{int64(-128), "5580"},
		{int64(1 << 40), "810000010000000000"},
		{float32(2.5), "7240200000"},
		{float64(1.5), "823ff8000000000000"},
		{Char('é'), "73000000e9"},
		{Timestamp(1700000000000), "830000018bcfe56800"},
		{UUID{0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78}, "9812345678123456781234567812345678"},
		{Decimal32{1, 2, 3, 4}, "7401020304"},
		{Decimal64{1, 2, 3, 4, 5, 6, 7, 8}, "840102030405060708"},
		{Decimal128{15: 1}, "9400000000000000000000000000000001"},
		{[]byte{1, 2}, "a0020102"},
		{[]byte{}, "a000"},
		{"hi", "a1026869"},
		{long, "b100000100" + hex.EncodeToString([]byte(long))},
		{Symbol("x-a"), "a303782d61"},
		{List{}, "45"},
		{List{uint32(1), "a"}, "c006025201a10161"},
		{Map{}, "c10100"},
		{Map{{Symbol("k"), "v"}}, "c10702a3016ba10176"},
		{Array{"a", "bc"}, "e00d02b1 00000001 61 00000002 6263"},
		{Array{uint64(1)}, "e00a0180 0000000000000001"},
		{Array{}, "e0020040"},
		{Array{Map{{Symbol("k"), true}}}, "e00e01d1 0000000800000002 a3016b41"},
		{&Described{Descriptor: uint64(0x75), Value: []byte("x")}, "005375a00178"},
	}
	for _, tc := range cases {
		want := unhex(t, strings.ReplaceAll(tc.want, " ", ""))
		got, err := AppendValue(nil, tc.v)
		if err != nil {
			t.Errorf("%#v: %v", tc.v, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%#v: encoded %x, want %x", tc.v, got, want)
			continue
		}
		back, n, err := ReadValue(got)
		if err != nil || n != len(got) {
			t.Errorf("%x: decode %v (%d of %d bytes)", got, err, n, len(got))
			continue
		}
		if !reflect.DeepEqual(back, tc.v) {
			t.Errorf("%x decoded to %#v, want %#v", got, back, tc.v)
		}
	}
}

// TestLargeCompounds checks the switch to list32/map32/array32 at RabbitMQ's thresholds.
func TestLargeCompounds(t *testing.T) {
	l := make(List, 255)
	b, _ := AppendValue(nil, l)
	if b[0] != codeList32 {
		t.Fatalf("255 nulls: constructor 0x%02x", b[0])
	}
	l = make(List, 254)
	b, _ = AppendValue(nil, l)
	if b[0] != codeList8 {
		t.Fatalf("254 nulls: constructor 0x%02x", b[0])
	}
	big := List{strings.Repeat("x", 252)} // a1 fc + 252 = 254 bytes, +1 count byte = 255
	b, _ = AppendValue(nil, big)
	if b[0] != codeList8 {
		t.Fatalf("254-byte body: constructor 0x%02x", b[0])
	}
	big = List{strings.Repeat("x", 253)}
	b, _ = AppendValue(nil, big)
	if b[0] != codeList32 {
		t.Fatalf("255-byte body: constructor 0x%02x", b[0])
	}
	for _, v := range []any{l, big, Map{{"k", strings.Repeat("v", 300)}}, Array{strings.Repeat("v", 300)}} {
		enc, _ := AppendValue(nil, v)
		back, _, err := ReadValue(enc)
		if err != nil || !reflect.DeepEqual(back, v) {
			t.Fatalf("round trip of %T: %v", v, err)
		}
	}
}

func TestDecodeLongForms(t *testing.T) {
	// Forms the encoder never picks but peers send: vbin32, str32, sym32, list32, map32,
	// boolean 0x56, described with a symbol descriptor.
	cases := map[string]any{
		"b00000000161":               []byte("a"),
		"b10000000161":               "a",
		"b30000000161":               Symbol("a"),
		"d0000000050000000141":       List{true},
		"d1000000080000000241a10161": Map{{true, "a"}},
		"5601":                       Boolean(true),
		"5600":                       Boolean(false),
		"00a3026162a10161":           &Described{Descriptor: Symbol("ab"), Value: "a"},
		"f00000000700000002500102":   Array{uint8(1), uint8(2)},
		"e006010053015001":           Array{&Described{Descriptor: uint64(1), Value: uint8(1)}},
	}
	for h, want := range cases {
		got, n, err := ReadValue(unhex(t, h))
		if err != nil || n != len(h)/2 || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %#v (%d bytes) %v, want %#v", h, got, n, err, want)
		}
	}
}

func TestDecodeMalformed(t *testing.T) {
	cases := []string{
		"",            // nothing
		"ff",          // unknown constructor
		"a105616263",  // str8 longer than the input
		"a102ff fe",   // invalid UTF-8
		"b1ffffffff",  // str32 length over int32
		"c0",          // list8 without size
		"c00102",      // list8: count 2 in 1 byte
		"c1020141",    // map8 with an odd count
		"c0030141 41", // list8 size 3: count 1, one element, one byte left over
		"d000000002",  // list32 of size under 4
		"e0020155",    // array8 of smalllong with no element bytes
		"e0037fffff",  // array count larger than its bytes
		"5602",        // boolean byte 2
		"73ffffffff",  // char out of range
		"00",          // described without descriptor
		"0053",        // descriptor truncated
		"005375",      // described without value
		"e00100",      // array of size 1: count only, no constructor
	}
	for _, h := range cases {
		_, _, err := ReadValue(unhex(t, strings.ReplaceAll(h, " ", "")))
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%q: %v, want ErrMalformed", h, err)
		}
	}
	// Deep nesting is refused, not a stack overflow.
	deep := bytes.Repeat([]byte{codeList8, 0xff, 1}, 100)
	if _, _, err := ReadValue(deep); !errors.Is(err, ErrMalformed) {
		t.Errorf("deep nesting: %v", err)
	}
	deepD := bytes.Repeat([]byte{codeDescribed, codeNull}, 100)
	if _, _, err := ReadValue(deepD); !errors.Is(err, ErrMalformed) {
		t.Errorf("deep described: %v", err)
	}
}

func TestEncodeUnsupported(t *testing.T) {
	for _, v := range []any{struct{}{}, int(1), Array{uint8(1), "mixed"}, Char(-1), List{map[string]int{}}} {
		if _, err := AppendValue(nil, v); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%#v: %v", v, err)
		}
	}
}

// Messages as rabbitmq-stream-go-client 1.8.3 encodes them (recorded from its publish frames).
const (
	goClientHello = "005375a00568656c6c6f"
	goClientFull  = "005373d0000000320000000ca10469642d31a005677565737440a1047375626aa1027274a103632d31a30a746578742f706c61696e4040404043005374d10000000f00000004a1016ba10176a1016e5407005375a005776f726c64"
	goClientAnn   = "005372d10000000e00000002a305782d616e6ea10161005375a003000102"
)

func TestDecodeGoClientMessages(t *testing.T) {
	m, err := Decode(unhex(t, goClientHello))
	if err != nil || m.Body != BodyData || len(m.Data) != 1 || string(m.Data[0]) != "hello" || m.Properties != nil {
		t.Fatalf("hello: %+v %v", m, err)
	}
	m, err = Decode(unhex(t, goClientFull))
	if err != nil {
		t.Fatal(err)
	}
	p := m.Properties
	want := &Properties{MessageID: "id-1", UserID: []byte("guest"), Subject: Ptr("subj"), ReplyTo: Ptr("rt"),
		CorrelationID: "c-1", ContentType: Ptr(Symbol("text/plain")), GroupSequence: Ptr(uint32(0))}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("properties %+v\nwant %+v", p, want)
	}
	if !reflect.DeepEqual(m.ApplicationProperties, Map{{"k", "v"}, {"n", int32(7)}}) {
		t.Fatalf("application properties %#v", m.ApplicationProperties)
	}
	if string(m.Data[0]) != "world" {
		t.Fatal("body")
	}
	m, err = Decode(unhex(t, goClientAnn))
	if err != nil || !reflect.DeepEqual(m.MessageAnnotations, Map{{Symbol("x-ann"), "a"}}) || !bytes.Equal(m.Data[0], []byte{0, 1, 2}) {
		t.Fatalf("annotations: %+v %v", m, err)
	}
}

func TestMessageRoundTrip(t *testing.T) {
	full := &Message{
		Header:                &Header{Durable: Ptr(true), Priority: Ptr(uint8(9)), TTL: Ptr(uint32(1000)), FirstAcquirer: Ptr(false), DeliveryCount: Ptr(uint32(3))},
		DeliveryAnnotations:   Map{{Symbol("x-da"), int64(1)}},
		MessageAnnotations:    Map{{Symbol("x-opt-a"), "b"}, {uint64(12), true}},
		Properties:            &Properties{MessageID: uint64(5), CorrelationID: UUID{1}, To: Ptr("/queues/q"), AbsoluteExpiryTime: Ptr(Timestamp(9)), ReplyToGroupID: Ptr("g")},
		ApplicationProperties: Map{{"a", List{int32(1)}}},
		Body:                  BodyData,
		Data:                  [][]byte{[]byte("one"), []byte("two")},
		Footer:                Map{{Symbol("x-f"), []byte{1}}},
	}
	cases := []*Message{
		full,
		{Body: BodyValue, Value: "just a string"},
		{Body: BodyValue, Value: nil},
		{Body: BodySequence, Sequence: []List{{int64(1), "a"}, {}}},
		{Header: &Header{}, Properties: &Properties{}, Body: BodyData, Data: [][]byte{{}}},
		{},
	}
	for i, m := range cases {
		enc, err := m.Encode(nil)
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		back, err := Decode(enc)
		if err != nil {
			t.Fatalf("%d: decode %x: %v", i, enc, err)
		}
		if !reflect.DeepEqual(back, m) {
			t.Fatalf("%d: round trip\n got %#v\nwant %#v", i, back, m)
		}
	}
	// Trailing nulls of header and properties are left out, as RabbitMQ 4.x writes them.
	enc, _ := (&Message{Header: &Header{Durable: Ptr(true)}}).Encode(nil)
	if hex.EncodeToString(enc) != "005370c0020141" {
		t.Fatalf("header with durable only: %x", enc)
	}
}

func TestDecodeMessageMalformed(t *testing.T) {
	cases := map[string]string{
		"not described":           "a1016161",
		"unknown section":         "00537940",
		"two headers":             "005370450053704 5",
		"data and value":          "005375a000005377 40",
		"two values":              "00537740005377 40",
		"data not binary":         "005375a10161",
		"header not a list":       "00537041",
		"header durable not bool": "005370c003015201",
		"properties subject int":  "005373c00604404040 5201",
		"message-id bool":         "005373c0020141",
		"app-properties int key":  "005374c10402 5201 41",
		"annotation string key":   "005372c10702a1016ba10176",
		"truncated section":       "005375a005 6162",
	}
	for name, h := range cases {
		if _, err := Decode(unhex(t, strings.ReplaceAll(h, " ", ""))); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Symbolic descriptors are sections too.
	m, err := Decode(unhex(t, "00a310"+hex.EncodeToString([]byte("amqp:data:binary"))+"a00178"))
	if err != nil || string(m.Data[0]) != "x" {
		t.Fatalf("symbolic data descriptor: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	for _, h := range []string{goClientHello, goClientFull, goClientAnn} {
		f.Add(unhex(f, h))
	}
	for _, h := range rabbitmq310 {
		f.Add(unhex(f, h))
	}
	enc, _ := (&Message{Header: &Header{Durable: Ptr(true)}, Body: BodySequence, Sequence: []List{{Array{"a"}, Map{{Symbol("k"), UUID{}}}}}}).Encode(nil)
	f.Add(enc)
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, _, err := ReadValue(data); err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("ReadValue: %v", err)
		}
		m, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode: %v", err)
			}
			return
		}
		enc, err := m.Encode(nil)
		if err != nil {
			t.Fatalf("re-encode of a decoded message: %v", err)
		}
		m2, err := Decode(enc)
		if err != nil {
			t.Fatalf("decode of re-encoded %x: %v", enc, err)
		}
		enc2, _ := m2.Encode(nil)
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding not stable")
		}
		// The mapping to 0-9-1 must not fail or panic on anything that decodes.
		if _, err := ToAMQP091(m, "s", 1); err != nil {
			t.Fatalf("ToAMQP091: %v", err)
		}
	})
}

var _ = math.MaxInt8

func BenchmarkDecodeAndMapTo091(b *testing.B) {
	raw := unhex(b, goClientFull)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		m, err := Decode(raw)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ToAMQP091(m, "s", uint64(i)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFromAMQP091Encode(b *testing.B) {
	in := published310[1]
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		m, err := FromAMQP091(&in)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.Encode(buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}
