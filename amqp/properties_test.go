package amqp

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"
)

func fullProperties() Properties {
	return Properties{
		ContentType: "text/plain", ContentEncoding: "gzip",
		Headers:      Table{"x-retry": int32(3), "trace": []byte{1, 2}},
		DeliveryMode: 2, Priority: 9,
		CorrelationID: "corr", ReplyTo: "amq.rabbitmq.reply-to", Expiration: "60000", MessageID: "m-1",
		Timestamp: time.Unix(1700000000, 0).UTC(),
		Type:      "event", UserID: "guest", AppID: "app", ClusterID: "c1",
	}
}

func TestPropertiesRoundTrip(t *testing.T) {
	p := fullProperties()
	raw := p.Append(nil)
	if got := raw[0:2]; !bytes.Equal(got, []byte{0xff, 0xfc}) {
		t.Fatalf("flags % x, want ff fc", got)
	}
	got, err := DecodeProperties(raw)
	if err != nil {
		t.Fatal(err)
	}
	p.Flags = 0xfffc
	if !reflect.DeepEqual(got, p) {
		t.Fatalf("got %#v\nwant %#v", got, p)
	}
	if PropsDeliveryMode(raw) != 2 || !PropsHasHeaders(raw) {
		t.Fatalf("fast paths: mode %d, headers %v", PropsDeliveryMode(raw), PropsHasHeaders(raw))
	}
	// Every truncation is an error.
	for cut := 0; cut < len(raw); cut++ {
		if _, err := DecodeProperties(raw[:cut]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("truncated to %d: %v", cut, err)
		}
	}
}

func TestPropertiesVectors(t *testing.T) {
	// delivery-mode 2 and content-type "a": flags 0x9000.
	p := Properties{ContentType: "a", DeliveryMode: 2}
	raw := p.Append(nil)
	want := []byte{0x90, 0x00, 1, 'a', 2}
	if !bytes.Equal(raw, want) {
		t.Fatalf("Append = % x, want % x", raw, want)
	}
	if PropsDeliveryMode(raw) != 2 || PropsHasHeaders(raw) {
		t.Fatal("fast paths on minimal properties")
	}
	// Explicit flags win: a present-but-empty content type and an empty
	// headers table.
	p = Properties{Flags: FlagContentType | FlagHeaders | FlagDeliveryMode, DeliveryMode: 1}
	raw = p.Append(nil)
	want = []byte{0xb0, 0x00, 0, 0, 0, 0, 0, 1}
	if !bytes.Equal(raw, want) {
		t.Fatalf("Append = % x, want % x", raw, want)
	}
	if PropsDeliveryMode(raw) != 1 || !PropsHasHeaders(raw) {
		t.Fatal("fast paths with headers")
	}
	got, err := DecodeProperties(raw)
	if err != nil || got.Flags != p.Flags || got.Headers == nil || got.DeliveryMode != 1 {
		t.Fatalf("decoded %#v, %v", got, err)
	}
	// No properties at all.
	if raw := (&Properties{}).Append(nil); !bytes.Equal(raw, []byte{0, 0}) {
		t.Fatalf("empty = % x", raw)
	}
	// A continuation flag word is skipped.
	got, err = DecodeProperties([]byte{0x10, 0x01, 0x00, 0x00, 2})
	if err != nil || got.DeliveryMode != 2 || got.Flags != FlagDeliveryMode {
		t.Fatalf("continuation: %#v, %v", got, err)
	}
	if PropsDeliveryMode([]byte{0x10, 0x01, 0x00, 0x00, 2}) != 2 {
		t.Fatal("continuation fast path")
	}
}

func TestPropsFastPathsMalformed(t *testing.T) {
	for _, raw := range [][]byte{nil, {0x10}, {0x10, 0}, {0x90, 0, 5, 'a'}, {0x30, 0, 0, 0, 0, 9, 2}, {0x30, 0, 0, 0}} {
		if m := PropsDeliveryMode(raw); m != 0 {
			t.Errorf("PropsDeliveryMode(% x) = %d", raw, m)
		}
	}
	if PropsHasHeaders(nil) || PropsHasHeaders([]byte{0x20}) {
		t.Error("PropsHasHeaders on truncated flags")
	}
}
