package amqp10

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"testing"
	"time"

	"warren/amqp"
)

// rabbitmq310 are the stream entries RabbitMQ 3.10.8 stored for the three messages of
// published310 (published over AMQP 0-9-1 with amqp091-go to a stream "cap-091-stream" through
// the default exchange, read back over the stream protocol).
var rabbitmq310 = []string{
	"005372c12e04a30d782d726f7574696e672d6b6579a10e6361702d3039312d73747265616da30a782d65786368616e6765a100005375a005706c61696e",
	"005372c1760aa30d782d726f7574696e672d6b6579a10e6361702d3039312d73747265616da30a782d65786368616e6765a100a310782d62617369632d7072696f726974795005a315782d62617369632d64656c69766572792d6d6f64655002a312782d62617369632d65787069726174696f6ea1053630303030005373c0410da1056d73672d31a00567756573744040a1077265706c792d71a106636f72722d31a30a746578742f706c61696ea304677a697040830000018bcfe56800404040005374c1a61ca10c782d62617369632d74797065a10d6f726465722e63726561746564a10e782d62617369632d6170702d6964a10473686f70a103693634810000010000000000a10166823ff8000000000000a108782d637573746f6da1027876a1056279746573a0020102a102753850c8a104766f696440a10173a103737472a10369333254f9a101625601a10174830000018bcfe56800a10369313661fed4a1036633327240200000005375a00466756c6c",
	"005372c14706a30d782d726f7574696e672d6b6579a10e6361702d3039312d73747265616da30a782d65786368616e6765a100a315782d62617369632d64656c69766572792d6d6f64655001005373c0400da12d75726e3a757569643a31323334353637382d313233342d353637382d313233342d35363738313233343536373840404040a10331323340404040404040005375a000",
}

var ts1700 = time.Unix(1700000000, 0).UTC()

// published310 are the messages as published (the header table in Go map form).
var published310 = []Message091{
	{RoutingKey: "cap-091-stream", Body: []byte("plain")},
	{RoutingKey: "cap-091-stream", Body: []byte("full"), Properties: amqp.Properties{
		ContentType: "text/plain", ContentEncoding: "gzip", DeliveryMode: 2, Priority: 5,
		CorrelationID: "corr-1", ReplyTo: "reply-q", Expiration: "60000", MessageID: "msg-1",
		Timestamp: ts1700, Type: "order.created", UserID: "guest", AppID: "shop",
		Headers: amqp.Table{
			"s": "str", "i32": int32(-7), "i64": int64(1 << 40), "b": true, "f": 1.5,
			"x-custom": "xv", "bytes": []byte{1, 2}, "t": ts1700, "arr": []any{"a"}, "tbl": amqp.Table{"k": "v"},
			"u8": uint8(200), "i16": int16(-300), "f32": float32(2.5), "void": nil,
		},
	}},
	{RoutingKey: "cap-091-stream", Body: []byte{}, Properties: amqp.Properties{
		MessageID: "urn:uuid:12345678-1234-5678-1234-567812345678", CorrelationID: "123", DeliveryMode: 1,
	}},
}

// TestRabbitMQ310Encoding: decoding what 3.10.8 stored and encoding it again (all header and
// properties fields, as 3.x writes them) gives back its bytes: the encoder picks the
// constructors RabbitMQ picks.
func TestRabbitMQ310Encoding(t *testing.T) {
	for i, h := range rabbitmq310 {
		raw := unhex(t, h)
		m, err := Decode(raw)
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		e := encoder{}
		m.encode(&e, true)
		if e.err != nil || !bytes.Equal(e.b, raw) {
			t.Fatalf("%d: re-encoded\n %x\nwant %x", i, e.b, raw)
		}
	}
}

// TestFromAMQP091V3 compares the 3.x mapping with what RabbitMQ 3.10.8 stored.
func TestFromAMQP091V3(t *testing.T) {
	for i := range published310 {
		got, err := FromAMQP091V3(&published310[i])
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		want := unhex(t, rabbitmq310[i])
		if bytes.Equal(got, want) {
			continue
		}
		// Header order: RabbitMQ keeps the publisher's (amqp091-go's map order), Warren sorts.
		gm, err1 := Decode(got)
		wm, err2 := Decode(want)
		if err1 != nil || err2 != nil {
			t.Fatalf("%d: %v %v", i, err1, err2)
		}
		if !sameEntries(gm.ApplicationProperties, wm.ApplicationProperties) {
			t.Fatalf("%d: application properties\n got %#v\nwant %#v", i, gm.ApplicationProperties, wm.ApplicationProperties)
		}
		gm.ApplicationProperties, wm.ApplicationProperties = nil, nil
		if !reflect.DeepEqual(gm, wm) {
			t.Fatalf("%d: mapped\n got %#v\nwant %#v", i, gm, wm)
		}
		if i != 1 {
			t.Fatalf("%d: bytes differ without headers:\n %x\nwant %x", i, got, want)
		}
	}
}

func sameEntries(a, b Map) bool {
	if len(a) != len(b) {
		return false
	}
	for _, kv := range a {
		v, ok := b.Get(kv.Key)
		if !ok || !reflect.DeepEqual(v, kv.Value) {
			return false
		}
	}
	return true
}

// TestFromAMQP091 checks the 4.x mapping of a message with every property and header type.
func TestFromAMQP091(t *testing.T) {
	in := published310[1]
	in.Exchange = "orders"
	in.RoutingKey = "eu.created"
	in.Properties.Headers = amqp.Table{
		"s": "str", "bin-str": "a\x00b", "bytes": []byte{1, 2}, "i32": int32(-7), "i64": int64(1 << 40),
		"u8": uint8(200), "i16": int16(-300), "f32": float32(2.5), "f": 1.5, "b": true, "t": ts1700,
		"void": nil, "arr": []any{"a"}, "tbl": amqp.Table{"k": "v"}, "dec": amqp.Decimal{Scale: 1, Value: 5},
		"x-custom": "xv", "x-arr": []any{int32(1), "b"}, "x-tbl": amqp.Table{"k": int64(1)},
		"CC": []any{"other-key"}, "BCC": []any{"secret"}, "x-exchange": "ignored",
	}
	in.Properties.ReplyTo = "reply q/1"
	got, err := FromAMQP091(&in)
	if err != nil {
		t.Fatal(err)
	}
	want := &Message{
		Header: &Header{Durable: Ptr(true), Priority: Ptr(uint8(5)), TTL: Ptr(uint32(60000)), FirstAcquirer: Ptr(true), DeliveryCount: Ptr(uint32(0))},
		MessageAnnotations: Map{
			{Symbol("x-exchange"), "orders"},
			{Symbol("x-routing-key"), "eu.created"},
			{Symbol("x-basic-type"), "order.created"},
			{Symbol("x-cc"), List{"other-key"}},
			{Symbol("x-arr"), List{int32(1), "b"}},
			{Symbol("x-custom"), "xv"},
			{Symbol("x-tbl"), Map{{Symbol("k"), int64(1)}}},
		},
		Properties: &Properties{
			MessageID: "msg-1", UserID: []byte("guest"), ReplyTo: Ptr("/queues/reply%20q%2F1"), CorrelationID: "corr-1",
			ContentType: Ptr(Symbol("text/plain")), ContentEncoding: Ptr(Symbol("gzip")),
			CreationTime: Ptr(Timestamp(1700000000000)), GroupID: Ptr("shop"),
		},
		ApplicationProperties: Map{
			{"b", Boolean(true)}, {"bin-str", []byte("a\x00b")}, {"bytes", []byte{1, 2}}, {"f", 1.5}, {"f32", float32(2.5)},
			{"i16", int16(-300)}, {"i32", int32(-7)}, {"i64", int64(1 << 40)}, {"s", "str"},
			{"t", Timestamp(1700000000000)}, {"u8", uint8(200)}, {"void", nil},
		},
		Body: BodyData,
		Data: [][]byte{[]byte("full")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("mapped\n got %#v\nwant %#v", got, want)
	}
	// A non-persistent message without properties: header durable false, no properties
	// section, no application properties.
	got, err = FromAMQP091(&Message091{Exchange: "", RoutingKey: "q", Body: []byte("b"), Properties: amqp.Properties{DeliveryMode: 1}})
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := got.Encode(nil)
	// header [false, null, null, true, 0]; annotations x-exchange "", x-routing-key "q"; data
	wantHex := "005370c00605424040414300" + "5372c12104a30a782d65786368616e6765a100a30d782d726f7574696e672d6b6579a10171" + "005375a00162"
	if hex.EncodeToString(enc) != wantHex {
		t.Fatalf("encoded %x\nwant    %s", enc, wantHex)
	}
	// urn:uuid ids become uuids.
	got, _ = FromAMQP091(&published310[2])
	if got.Properties.MessageID != (UUID{0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78}) || got.Properties.CorrelationID != "123" {
		t.Fatalf("ids %#v %#v", got.Properties.MessageID, got.Properties.CorrelationID)
	}
	if _, err := FromAMQP091(&Message091{Properties: amqp.Properties{Expiration: "soon"}}); err == nil {
		t.Fatal("expiration that is not a number")
	}
}

// TestRoundTrip091 publishes over 0-9-1 (FromAMQP091) and consumes over 0-9-1 (ToAMQP091), as
// a message going through a stream does on RabbitMQ 4.x.
func TestRoundTrip091(t *testing.T) {
	in := published310[1]
	in.Exchange = "orders"
	in.Properties.Headers = amqp.Table{"s": "str", "x-custom": "xv", "i32": int32(-7), "t": ts1700, "CC": []any{"k2"}, "arr": []any{"dropped"}}
	m, err := FromAMQP091(&in)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := m.Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ToAMQP091(stored, "cap-091-stream", 42)
	if err != nil {
		t.Fatal(err)
	}
	want := in.Properties
	want.Headers = amqp.Table{"s": "str", "x-custom": "xv", "i32": int32(-7), "t": ts1700, "CC": []any{"k2"}, "x-stream-offset": int64(42)}
	want.Timestamp = ts1700
	got := out.Properties
	got.Flags = 0
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("properties\n got %#v\nwant %#v", got, want)
	}
	if out.Exchange != "orders" || out.RoutingKey != "cap-091-stream" || string(out.Body) != "full" {
		t.Fatalf("exchange %q routing key %q body %q", out.Exchange, out.RoutingKey, out.Body)
	}
}

// TestToAMQP091 maps what stream-protocol clients publish.
func TestToAMQP091(t *testing.T) {
	m, _ := Decode(unhex(t, goClientFull))
	out, err := ToAMQP091(m, "orders-stream", 7)
	if err != nil {
		t.Fatal(err)
	}
	p := out.Properties
	if p.MessageID != "id-1" || p.CorrelationID != "c-1" || p.UserID != "guest" || p.ReplyTo != "rt" ||
		p.ContentType != "text/plain" || p.DeliveryMode != 0 || p.Flags&amqp.FlagDeliveryMode != 0 || p.Type != "" {
		t.Fatalf("properties %+v", p)
	}
	if !reflect.DeepEqual(p.Headers, amqp.Table{"k": "v", "n": int32(7), "x-stream-offset": int64(7)}) {
		t.Fatalf("headers %#v", p.Headers)
	}
	if out.Exchange != "" || out.RoutingKey != "orders-stream" || string(out.Body) != "world" {
		t.Fatalf("%q %q %q", out.Exchange, out.RoutingKey, out.Body)
	}

	// What 3.x stored (x-basic-* annotations and application properties) maps back too.
	m, _ = Decode(unhex(t, rabbitmq310[1]))
	out, _ = ToAMQP091(m, "cap-091-stream", 1)
	if out.Properties.DeliveryMode != 2 || out.Properties.Priority != 5 || out.Properties.Expiration != "60000" {
		t.Fatalf("3.x annotations: %+v", out.Properties)
	}

	// ids that do not fit a short string, uuids, ulongs; a non-data body; annotations.
	long := string(bytes.Repeat([]byte("i"), 300))
	m = &Message{
		Header:             &Header{Durable: Ptr(false), Priority: Ptr(uint8(1))},
		MessageAnnotations: Map{{Symbol("x-opt-rabbitmq-received-time"), Timestamp(1500)}, {Symbol("x-cc"), List{"a"}}, {Symbol("x-basic-type"), "ignored-for-value-bodies"}, {Symbol("x-foo"), UUID{}}},
		Properties:         &Properties{MessageID: long, CorrelationID: UUID{0xab, 15: 1}, ReplyTo: Ptr("/queues/a%2Fb"), GroupID: Ptr("app"), CreationTime: Ptr(Timestamp(-1500))},
		Body:               BodyValue,
		Value:              "v",
		Footer:             Map{{Symbol("x-f"), true}},
	}
	out, err = ToAMQP091(m, "s", 0)
	if err != nil {
		t.Fatal(err)
	}
	p = out.Properties
	if p.DeliveryMode != 1 || p.Priority != 1 || p.MessageID != "" || p.CorrelationID != "urn:uuid:ab000000-0000-0000-0000-000000000001" ||
		p.ReplyTo != "a/b" || p.AppID != "app" || p.Type != "amqp-1.0" || !p.Timestamp.Equal(time.Unix(-1, 0)) {
		t.Fatalf("properties %+v", p)
	}
	wantH := amqp.Table{"x-message-id": long, "timestamp_in_ms": int64(1500), "CC": []any{"a"}, "x-stream-offset": int64(0)}
	if !reflect.DeepEqual(p.Headers, wantH) {
		t.Fatalf("headers %#v", p.Headers)
	}
	body, err := Decode(out.Body)
	if err != nil || body.Body != BodyValue || body.Value != "v" || !reflect.DeepEqual(body.Footer, m.Footer) {
		t.Fatalf("amqp-1.0 body %+v %v", body, err)
	}
}

func TestURNUUID(t *testing.T) {
	for s, ok := range map[string]bool{
		"urn:uuid:12345678-1234-5678-1234-567812345678": true,
		"urn:uuid:12345678-1234-5678-1234-56781234567":  false,
		"urn:uuid:1234567g-1234-5678-1234-567812345678": false,
		"urn:uuid:123456781234567812345678123456781234": false,
		"uuid:12345678-1234-5678-1234-567812345678xxxx": false,
	} {
		u, got := parseURNUUID(s)
		if got != ok {
			t.Errorf("%s: %v", s, got)
		}
		if ok && urnString(u) != s {
			t.Errorf("%s: back to %s", s, urnString(u))
		}
	}
}
