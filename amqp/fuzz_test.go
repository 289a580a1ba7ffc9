package amqp

import (
	"bytes"
	"errors"
	"io"
	"math"
	"reflect"
	"testing"
	"time"
)

// seedMethods returns encoded method payloads (class id, method id, args)
// for every method, filled with sample values.
func seedMethods() [][]byte {
	var out [][]byte
	for _, proto := range contractMethods() {
		for seed := 0; seed < 2; seed++ {
			m := NewMethod(proto.ClassID(), proto.MethodID())
			fill(m, seed)
			f := AppendMethodFrame(nil, 1, m)
			out = append(out, f[7:len(f)-1])
		}
	}
	return out
}

func seedTables() [][]byte {
	tables := []Table{
		{},
		{"x-queue-type": "quorum", "x-max-length": int32(10), "x-message-ttl": int64(60000)},
		{"t": true, "b": int8(-1), "B": uint8(1), "s": int16(-2), "u": uint16(2), "I": int32(-3),
			"i": uint32(3), "l": int64(-4), "f": float32(1.5), "d": math.Inf(-1), "D": Decimal{2, 314},
			"S": "str", "x": []byte{0, 1}, "A": []any{"a", int32(1), []any{}, Table{"n": nil}},
			"T": time.Unix(1700000000, 0), "F": Table{"deep": Table{"deeper": true}}, "V": nil},
		{"capabilities": Table{"publisher_confirms": true, "basic.nack": true}, "product": "Warren"},
		{"x-death": []Table{{"count": int64(1), "reason": "expired", "queue": "q", "time": time.Unix(5, 0)}}},
	}
	var out [][]byte
	for _, t := range tables {
		b, err := AppendTable(nil, t)
		if err != nil {
			panic(err)
		}
		out = append(out, b)
	}
	return out
}

func FuzzReadFrame(f *testing.F) {
	stream, _ := sampleStream()
	f.Add(stream[:2000], uint16(4096), uint8(3))
	f.Add(AppendMethodFrame(nil, 1, &ConnectionTuneOk{}), uint16(0), uint8(1))
	for _, m := range seedMethods()[:20] {
		frame := append([]byte{1, 0, 1, 0, 0, 0, byte(len(m))}, m...)
		f.Add(append(frame, FrameEnd), uint16(4096), uint8(64))
	}
	f.Add(AppendHeartbeat(AppendHeartbeat(nil)), uint16(0), uint8(0))
	f.Add([]byte{1, 0, 0, 0xff, 0xff, 0xff, 0xff}, uint16(0), uint8(0))
	f.Add([]byte("AMQP\x00\x00\x09\x01"), uint16(0), uint8(2))

	f.Fuzz(func(t *testing.T, data []byte, maxSize uint16, chunk uint8) {
		max := uint32(maxSize)
		if max != 0 && max < 16 {
			max = 16
		}
		fr := NewFrameReader(&chunkReader{data: data, n: int(chunk) + 1}, max)
		if max == 0 {
			max = DefaultFrameMax
		}
		off := 0
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				var ae *Error
				if !errors.As(err, &ae) && err != io.EOF && err != io.ErrUnexpectedEOF {
					t.Fatalf("unexpected error type %T: %v", err, err)
				}
				if ae != nil && ae.Code != FrameError {
					t.Fatalf("error code %d", ae.Code)
				}
				return
			}
			if uint32(len(f.Payload)) > max {
				t.Fatalf("payload of %d bytes accepted with frame-max %d", len(f.Payload), max)
			}
			// The frame is exactly the next bytes of the input.
			n := 8 + len(f.Payload)
			if off+n > len(data) {
				t.Fatalf("frame runs past the input")
			}
			re := append([]byte{f.Type, byte(f.Channel >> 8), byte(f.Channel)}, byte(len(f.Payload)>>24),
				byte(len(f.Payload)>>16), byte(len(f.Payload)>>8), byte(len(f.Payload)))
			re = append(append(re, f.Payload...), FrameEnd)
			if !bytes.Equal(re, data[off:off+n]) {
				t.Fatalf("frame at %d does not match the input", off)
			}
			off += n
		}
	})
}

func FuzzDecodeMethod(f *testing.F) {
	for _, m := range seedMethods() {
		f.Add(m)
	}
	f.Add([]byte{0, 60, 0, 40, 0, 0, 0, 0, 3})
	f.Add([]byte{0, 60, 0, 41})
	f.Fuzz(func(t *testing.T, payload []byte) {
		m, err := DecodeMethod(payload)
		if err != nil {
			var ume *UnknownMethodError
			if !errors.Is(err, ErrMalformed) && !errors.As(err, &ume) {
				t.Fatalf("error %v neither malformed nor unknown method", err)
			}
			return
		}
		// Decoded methods re-encode stably.
		enc1 := AppendMethodFrame(nil, 0, m)
		m2, err := DecodeMethod(enc1[7 : len(enc1)-1])
		if err != nil {
			t.Fatalf("re-decoding %s: %v", m.Name(), err)
		}
		enc2 := AppendMethodFrame(nil, 0, m2)
		if !bytes.Equal(enc1, enc2) {
			t.Fatalf("%s does not re-encode stably:\n% x\n% x", m.Name(), enc1, enc2)
		}
		// The hand-written parsers agree with the generated decoders.
		args := payload[4:]
		switch m := m.(type) {
		case *BasicPublish:
			pa, err := ParseBasicPublish(args)
			if err != nil || string(pa.Exchange) != m.Exchange || string(pa.RoutingKey) != m.RoutingKey ||
				pa.Mandatory != m.Mandatory || pa.Immediate != m.Immediate {
				t.Fatalf("ParseBasicPublish disagrees: %+v %v vs %+v", pa, err, m)
			}
		case *BasicAck:
			tag, mult, err := ParseBasicAck(args)
			if err != nil || tag != m.DeliveryTag || mult != m.Multiple {
				t.Fatalf("ParseBasicAck disagrees")
			}
		case *BasicNack:
			tag, mult, rq, err := ParseBasicNack(args)
			if err != nil || tag != m.DeliveryTag || mult != m.Multiple || rq != m.Requeue {
				t.Fatalf("ParseBasicNack disagrees")
			}
		case *BasicReject:
			tag, rq, err := ParseBasicReject(args)
			if err != nil || tag != m.DeliveryTag || rq != m.Requeue {
				t.Fatalf("ParseBasicReject disagrees")
			}
		}
	})
}

func FuzzDecodeTable(f *testing.F) {
	for _, s := range seedTables() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tb, n, err := DecodeTable(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if n < 4 || n > len(data) {
			t.Fatalf("consumed %d of %d", n, len(data))
		}
		enc, err := AppendTable(nil, tb)
		if err != nil {
			t.Fatalf("decoded table does not encode: %v", err)
		}
		tb2, n2, err := DecodeTable(enc)
		if err != nil || n2 != len(enc) {
			t.Fatalf("re-decoding: %d of %d, %v", n2, len(enc), err)
		}
		if !TablesEqual(tb, tb2) {
			t.Fatalf("round trip changed the table:\n%#v\n%#v", tb, tb2)
		}
		enc2, err := AppendTable(nil, tb2)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable: %v", err)
		}
	})
}

func FuzzDecodeProperties(f *testing.F) {
	f.Add(fullPropertiesBytes())
	f.Add([]byte{0, 0})
	f.Add((&Properties{DeliveryMode: 2, ContentType: "text/plain"}).Append(nil))
	f.Add((&Properties{Headers: Table{"x-match": "all", "k": int32(1)}, Priority: 5}).Append(nil))
	f.Add([]byte{0x10, 0x01, 0x00, 0x00, 2})
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err := DecodeProperties(raw)
		mode, hasHeaders := PropsDeliveryMode(raw), PropsHasHeaders(raw)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if mode != p.DeliveryMode {
			t.Fatalf("PropsDeliveryMode = %d, decoded %d", mode, p.DeliveryMode)
		}
		if hasHeaders != (p.Flags&FlagHeaders != 0) {
			t.Fatalf("PropsHasHeaders = %v, flags %#x", hasHeaders, p.Flags)
		}
		enc := p.Append(nil)
		p2, err := DecodeProperties(enc)
		if err != nil {
			t.Fatalf("re-decoding: %v", err)
		}
		if !TablesEqual(p.Headers, p2.Headers) {
			t.Fatalf("headers changed: %#v vs %#v", p.Headers, p2.Headers)
		}
		p.Headers, p2.Headers = nil, nil
		if !reflect.DeepEqual(p, p2) {
			t.Fatalf("properties changed:\n%#v\n%#v", p, p2)
		}
		if enc2 := (&p2).Append(nil); p2.Flags&FlagHeaders == 0 && !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable")
		}
	})
}

func fullPropertiesBytes() []byte {
	p := fullProperties()
	return p.Append(nil)
}
