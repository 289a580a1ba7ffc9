package amqp

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"
	"time"
)

// checkWithHeader checks WithHeader(raw, name, v) against decoding: raw is unchanged, and the
// result decodes to raw's properties with the header name set to v (removed when v is nil).
func checkWithHeader(t *testing.T, raw []byte, name string, v any) {
	t.Helper()
	want, err := DecodeProperties(raw)
	if err != nil {
		if got := WithHeader(raw, name, v); !bytes.Equal(got, raw) {
			t.Fatalf("undecodable properties %x changed to %x", raw, got)
		}
		return
	}
	orig := bytes.Clone(raw)
	out := WithHeader(raw, name, v)
	if !bytes.Equal(raw, orig) {
		t.Fatalf("WithHeader modified its input: %x -> %x", orig, raw)
	}
	got, err := DecodeProperties(out)
	if err != nil {
		t.Fatalf("WithHeader(%x, %q, %v) = %x, which does not decode: %v", raw, name, v, out, err)
	}
	wantHeaders := Table{}
	for k, x := range want.Headers {
		wantHeaders[k] = x
	}
	if v == nil {
		delete(wantHeaders, name)
	} else {
		wantHeaders[name] = v
	}
	if len(wantHeaders) > 0 || got.Headers != nil {
		if !TablesEqual(got.Headers, wantHeaders) {
			t.Fatalf("WithHeader(%x, %q, %v): headers %#v, want %#v", raw, name, v, got.Headers, wantHeaders)
		}
	}
	got.Headers, want.Headers, got.Flags, want.Flags = nil, nil, 0, 0
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("WithHeader(%x, %q, %v) changed other properties:\n%#v\nwant\n%#v", raw, name, v, got, want)
	}
}

func TestWithHeader(t *testing.T) {
	full := fullProperties()
	props := []Properties{
		{},
		{DeliveryMode: 2},
		{ContentType: "application/json", DeliveryMode: 2},
		{ContentType: "text/plain", ContentEncoding: "gzip", Priority: 3, AppID: "app"},
		{Headers: Table{"k": "v", "n": int32(1)}},
		{ContentType: "a", ContentEncoding: "b", Headers: Table{"x-stream-offset": int64(3), "k": Table{"deep": []any{"x", int8(1)}}},
			CorrelationID: "c", ReplyTo: "r", Expiration: "60000", MessageID: "m", Timestamp: time.Unix(1700000000, 0).UTC(),
			Type: "t", UserID: "guest", ClusterID: "cl"},
		{Headers: Table{}},
		full,
	}
	values := []any{int64(42), "partition-1", int64(-1), nil}
	for _, p := range props {
		raw := p.Append(nil)
		for _, name := range []string{"x-stream-offset", "k", "x-delivery-count"} {
			for _, v := range values {
				checkWithHeader(t, raw, name, v)
			}
		}
	}
	// The common case does not encode the properties again: raw's bytes stay as they were around
	// the new entry, which ends the headers table.
	raw := (&Properties{ContentType: "text/plain", Headers: Table{"b": "2", "a": "1"}, DeliveryMode: 2}).Append(nil)
	tbl, err := AppendTable(nil, Table{"b": "2", "a": "1"})
	if err != nil {
		t.Fatal(err)
	}
	entry := append([]byte("\x0fx-stream-offsetl"), 0, 0, 0, 0, 0, 0, 0, 7)
	at := 2 + 1 + len("text/plain")
	want := append([]byte{}, raw[:at]...)
	want = binary.BigEndian.AppendUint32(want, uint32(len(tbl)-4+len(entry)))
	want = append(want, tbl[4:]...)
	want = append(want, entry...)
	want = append(want, raw[at+len(tbl):]...)
	if out := WithHeader(raw, "x-stream-offset", int64(7)); !bytes.Equal(out, want) {
		t.Fatalf("WithHeader(%x) = %x, want %x", raw, out, want)
	}
	// Removing a header that is not there returns raw itself.
	if got := WithHeader(raw, "absent", nil); &got[0] != &raw[0] {
		t.Fatalf("removing an absent header copied the properties")
	}
}

// FuzzWithHeader checks WithHeader on arbitrary property bytes: undecodable ones come back
// unchanged, decodable ones decode to the same properties with the header set.
func FuzzWithHeader(f *testing.F) {
	f.Add(fullPropertiesBytes(), "x-stream-offset")
	f.Add([]byte{0, 0}, "x-delivery-count")
	f.Add((&Properties{ContentType: "text/plain", ContentEncoding: "gzip"}).Append(nil), "k")
	f.Add((&Properties{Headers: Table{"k": "v"}, Priority: 5}).Append(nil), "k")
	f.Add([]byte{0x20, 0x00, 0, 0, 0, 3, 1, 'k', 'V'}, "k2")
	f.Add([]byte{0x20, 0x01, 0x00, 0x00, 0, 0, 0, 0}, "k")
	f.Fuzz(func(t *testing.T, raw []byte, name string) {
		if len(name) > 255 {
			name = name[:255] // a table key is a shortstr; callers pass constant names
		}
		checkWithHeader(t, raw, name, int64(len(raw)))
		checkWithHeader(t, raw, name, "s")
		checkWithHeader(t, raw, name, nil)
	})
}

// BenchmarkWithHeader is a stream delivery's x-stream-offset header added to properties without
// headers, and to properties with two.
func BenchmarkWithHeader(b *testing.B) {
	for _, c := range []struct {
		name  string
		props Properties
	}{
		{"no-headers", Properties{ContentType: "application/octet-stream", DeliveryMode: 2}},
		{"two-headers", Properties{DeliveryMode: 2, Headers: Table{"x-app": "orders", "n": int32(7)}}},
	} {
		raw := c.props.Append(nil)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				_ = WithHeader(raw, "x-stream-offset", int64(i))
			}
		})
	}
}
