package amqp

import (
	"bytes"
	"testing"
)

// loopReader serves data over and over without allocating.
type loopReader struct {
	data []byte
	off  int
}

func (l *loopReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k := copy(p[n:], l.data[l.off:])
		n += k
		l.off = (l.off + k) % len(l.data)
	}
	return n, nil
}

// publishStream is one small published message: method, header, body.
func publishStream() []byte {
	b := AppendMethodFrame(nil, 1, &BasicPublish{Exchange: "amq.direct", RoutingKey: "bench.key"})
	props := (&Properties{ContentType: "application/json", DeliveryMode: 2}).Append(nil)
	b = AppendContentHeaderFrame(b, 1, ClassBasic, 256, props)
	return AppendBodyFrames(b, 1, bytes.Repeat([]byte{'x'}, 256), 131072)
}

func BenchmarkReadFrame(b *testing.B) {
	stream := publishStream()
	// Repeat so that frames straddle reads at varying offsets.
	var data []byte
	for len(data) < 1<<20 {
		data = append(data, stream...)
	}
	fr := NewFrameReader(&loopReader{data: data}, 0)
	b.SetBytes(int64(len(stream)) / 3)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := fr.ReadFrame(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseBasicPublish(b *testing.B) {
	args := (&BasicPublish{Exchange: "amq.direct", RoutingKey: "bench.key", Mandatory: true}).AppendArgs(nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseBasicPublish(args); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseContentHeader(b *testing.B) {
	frame := AppendContentHeaderFrame(nil, 1, ClassBasic, 256, (&Properties{DeliveryMode: 2}).Append(nil))
	payload := frame[7 : len(frame)-1]
	b.ReportAllocs()
	for b.Loop() {
		if _, _, raw, err := ParseContentHeader(payload); err != nil || PropsDeliveryMode(raw) != 2 {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseBasicAck(b *testing.B) {
	args := (&BasicAck{DeliveryTag: 12345, Multiple: true}).AppendArgs(nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ParseBasicAck(args); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendBasicDeliver(b *testing.B) {
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendBasicDeliver(buf[:0], 1, "amq.ctag-abcdefghijklmnop", 123456, false, "amq.direct", "bench.key")
	}
}

func BenchmarkAppendContentHeaderFrame(b *testing.B) {
	buf := make([]byte, 0, 4096)
	props := (&Properties{ContentType: "application/json", DeliveryMode: 2}).Append(nil)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendContentHeaderFrame(buf[:0], 1, ClassBasic, 256, props)
	}
}

func BenchmarkAppendBodyFrames(b *testing.B) {
	body := bytes.Repeat([]byte{'x'}, 300000)
	buf := make([]byte, 0, 400000)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendBodyFrames(buf[:0], 1, body, 131072)
	}
}

func BenchmarkAppendBasicAck(b *testing.B) {
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendBasicAck(buf[:0], 1, 99, true)
	}
}

func BenchmarkAppendMethodFrame(b *testing.B) {
	buf := make([]byte, 0, 256)
	m := &QueueDeclareOk{Queue: "q", MessageCount: 1, ConsumerCount: 2}
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendMethodFrame(buf[:0], 1, m)
	}
}

func BenchmarkDecodeMethodQueueDeclare(b *testing.B) {
	frame := AppendMethodFrame(nil, 1, &QueueDeclare{Queue: "orders", Durable: true,
		Arguments: Table{"x-queue-type": "quorum", "x-max-length": int32(1000)}})
	payload := frame[7 : len(frame)-1]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeMethod(payload); err != nil {
			b.Fatal(err)
		}
	}
}

// TestHotPathsDoNotAllocate pins the zero-allocation promise in the normal
// test run, not only in benchmark output.
func TestHotPathsDoNotAllocate(t *testing.T) {
	stream := publishStream()
	fr := NewFrameReader(&loopReader{data: stream}, 0)
	pub := (&BasicPublish{Exchange: "e", RoutingKey: "k"}).AppendArgs(nil)
	ack := (&BasicAck{DeliveryTag: 1}).AppendArgs(nil)
	hdr := AppendContentHeaderFrame(nil, 1, ClassBasic, 1, (&Properties{DeliveryMode: 2}).Append(nil))[7:]
	body := make([]byte, 10000)
	buf := make([]byte, 0, 20000)
	checks := map[string]func(){
		"ReadFrame":          func() { _, _ = fr.ReadFrame() },
		"ParseBasicPublish":  func() { _, _ = ParseBasicPublish(pub) },
		"ParseBasicAck":      func() { _, _, _ = ParseBasicAck(ack) },
		"ParseContentHeader": func() { _, _, _, _ = ParseContentHeader(hdr) },
		"PropsDeliveryMode":  func() { _ = PropsDeliveryMode(hdr[12:]) },
		"AppendBasicDeliver": func() { buf = AppendBasicDeliver(buf[:0], 1, "ctag", 1, true, "e", "k") },
		"AppendContentHeaderFrame": func() {
			buf = AppendContentHeaderFrame(buf[:0], 1, ClassBasic, 1, hdr[12:len(hdr)-1])
		},
		"AppendBodyFrames": func() { buf = AppendBodyFrames(buf[:0], 1, body, 4096) },
		"AppendBasicAck":   func() { buf = AppendBasicAck(buf[:0], 1, 1, false) },
		"AppendBasicNack":  func() { buf = AppendBasicNack(buf[:0], 1, 1, false, true) },
		"AppendBasicReturn": func() {
			buf = AppendBasicReturn(buf[:0], 1, NoRoute, "NO_ROUTE", "e", "k")
		},
		"AppendBasicGetOk": func() { buf = AppendBasicGetOk(buf[:0], 1, 1, false, "e", "k", 3) },
	}
	for name, f := range checks {
		if n := testing.AllocsPerRun(200, f); n != 0 {
			t.Errorf("%s: %.1f allocs/op, want 0", name, n)
		}
	}
}
