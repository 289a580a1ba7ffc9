package amqp

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// Method arguments that do not fill their frame exactly are a *FramingError, whose reply is
// RabbitMQ's 501 "cannot decode <<...>>"; malformed data inside a field table of the right length
// is ErrMalformed without being a FramingError.
func TestDecodeFramingErrors(t *testing.T) {
	declare := func(table []byte) []byte {
		p := []byte{0, 50, 0, 10, 0, 0, 1, 'q', 0}
		return append(p, table...)
	}
	for _, tc := range []struct {
		name        string
		payload     []byte
		framing     bool
		wantReply   string // when framing
		wantCls     uint16
		wantMeth    uint16
		wantNoError bool
	}{
		{name: "queue.declare whose name runs past the frame", payload: []byte{0, 50, 0, 10, 0, 0, 10, 'a', 'b', 'c'},
			framing: true, wantReply: "FRAME_ERROR - cannot decode <<0,0,10,97,98,99>>", wantCls: 50, wantMeth: 10},
		{name: "field table longer than its frame", payload: declare([]byte{0, 0, 3, 232, 1, 'a', 't', 1}),
			framing: true, wantReply: "FRAME_ERROR - cannot decode <<0,0,1,113,0,0,0,3,232,1,97,116,1>>", wantCls: 50, wantMeth: 10},
		{name: "table length itself cut", payload: declare([]byte{0, 0}), framing: true,
			wantReply: "FRAME_ERROR - cannot decode <<0,0,1,113,0,0,0>>", wantCls: 50, wantMeth: 10},
		{name: "bytes left over", payload: append(declare([]byte{0, 0, 0, 0}), 1, 2, 3), framing: true,
			wantReply: "FRAME_ERROR - cannot decode <<0,0,1,113,0,0,0,0,0,1,2,3>>", wantCls: 50, wantMeth: 10},
		{name: "channel.open without its reserved shortstr", payload: []byte{0, 20, 0, 10}, framing: true,
			wantReply: "FRAME_ERROR - cannot decode <<>>", wantCls: 20, wantMeth: 10},
		{name: "bad type tag inside a table of the right length", payload: declare([]byte{0, 0, 0, 3, 1, 'a', 'Z'})},
		{name: "value running past its table but not past the frame", payload: declare([]byte{0, 0, 0, 4, 1, 'a', 'S', 0, 0, 0, 0, 9})},
		{name: "well formed", payload: declare([]byte{0, 0, 0, 0}), wantNoError: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeMethod(tc.payload)
			if tc.wantNoError {
				if err != nil {
					t.Fatalf("DecodeMethod: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			var fe *FramingError
			if got := errors.As(err, &fe); got != tc.framing {
				t.Fatalf("FramingError = %v, want %v (error %v)", got, tc.framing, err)
			}
			if !tc.framing {
				return
			}
			r := fe.Reply()
			if r.Code != FrameError || r.Text != tc.wantReply || r.ClassID != tc.wantCls || r.MethodID != tc.wantMeth {
				t.Fatalf("reply %d %q %d.%d, want 501 %q %d.%d", r.Code, r.Text, r.ClassID, r.MethodID, tc.wantReply, tc.wantCls, tc.wantMeth)
			}
		})
	}
}

// Every truncation of every method, and any byte added after it, is a framing error.
func TestEveryMethodFramingError(t *testing.T) {
	for _, proto := range contractMethods() {
		m := NewMethod(proto.ClassID(), proto.MethodID())
		fill(m, 3)
		frame := AppendMethodFrame(nil, 1, m)
		payload := frame[7 : len(frame)-1]
		for cut := 4; cut <= len(payload)+1; cut++ {
			p := payload[:min(cut, len(payload))]
			if cut > len(payload) {
				p = append(append([]byte(nil), payload...), 0)
			} else if cut == len(payload) {
				continue // the whole method
			}
			_, err := DecodeMethod(p)
			var fe *FramingError
			if !errors.As(err, &fe) {
				t.Fatalf("%s cut to %d of %d bytes: %v, want a FramingError", m.Name(), cut, len(payload), err)
			}
			if fe.ClassID != m.ClassID() || fe.MethodID != m.MethodID() {
				t.Fatalf("%s: FramingError names %d.%d", m.Name(), fe.ClassID, fe.MethodID)
			}
		}
	}
}

// The hand-written parsers refuse what the generated decoders refuse, with their own ids.
func TestFastParsersFramingErrors(t *testing.T) {
	pub := (&BasicPublish{Exchange: "e", RoutingKey: "k"}).AppendArgs(nil)
	ack := (&BasicAck{DeliveryTag: 7}).AppendArgs(nil)
	for _, tc := range []struct {
		name   string
		method uint16
		parse  func([]byte) error
		args   []byte
	}{
		{"basic.publish", 40, func(b []byte) error { _, err := ParseBasicPublish(b); return err }, pub},
		{"basic.ack", 80, func(b []byte) error { _, _, err := ParseBasicAck(b); return err }, ack},
		{"basic.reject", 90, func(b []byte) error { _, _, err := ParseBasicReject(b); return err }, ack},
		{"basic.nack", 120, func(b []byte) error { _, _, _, err := ParseBasicNack(b); return err }, ack},
	} {
		for _, bad := range [][]byte{tc.args[:len(tc.args)-1], append(append([]byte(nil), tc.args...), 9)} {
			err := tc.parse(bad)
			var fe *FramingError
			if !errors.As(err, &fe) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("%s of %d bytes: %v, want a FramingError", tc.name, len(bad), err)
			}
			if r := fe.Reply(); r.ClassID != ClassBasic || r.MethodID != tc.method || !strings.HasPrefix(r.Text, "FRAME_ERROR - cannot decode <<") {
				t.Fatalf("%s: reply %+v", tc.name, r)
			}
		}
	}
}

// A long reply text is cut as RabbitMQ cuts it: 252 bytes and "...".
func TestFramingErrorLongText(t *testing.T) {
	args := bytes.Repeat([]byte{200}, 1000)
	r := newFramingError(50, 10, args, errFraming).Reply()
	full := "FRAME_ERROR - cannot decode <<" + strings.Repeat("200,", 100)
	if r.Text != full[:252]+"..." {
		t.Fatalf("%d bytes: %q", len(r.Text), r.Text)
	}
	if short := Errorf(NotFound, "%s", strings.Repeat("q", 255-len("NOT_FOUND - "))); len(short.Text) != 255 || strings.HasSuffix(short.Text, "...") {
		t.Fatalf("a text of exactly 255 bytes was cut: %q", short.Text)
	}
}

// Frames too short to be a method or a content header are refused by the reader, as RabbitMQ's
// frame analysis refuses them, with its text.
func TestFrameReaderShortFrames(t *testing.T) {
	for _, tc := range []struct {
		frame []byte
		want  string
	}{
		{[]byte{1, 0, 1, 0, 0, 0, 2, 0, 50, FrameEnd}, "FRAME_ERROR - type 1, all octets = <<0,50>>: unknown_frame"},
		{[]byte{2, 0, 1, 0, 0, 0, 3, 0, 60, 0, FrameEnd}, "FRAME_ERROR - type 2, all octets = <<0,60,0>>: unknown_frame"},
	} {
		_, err := NewFrameReader(bytes.NewReader(tc.frame), 0).ReadFrame()
		var ae *Error
		if !errors.As(err, &ae) || ae.Code != FrameError || ae.Text != tc.want {
			t.Errorf("% x: %v, want %q", tc.frame, err, tc.want)
		}
	}
	// Exactly 4 (12) bytes is a frame; what it holds is for the decoders to judge.
	for _, ok := range [][]byte{{1, 0, 1, 0, 0, 0, 4, 0, 90, 0, 10, FrameEnd}, append(append([]byte{2, 0, 1, 0, 0, 0, 12}, make([]byte, 12)...), FrameEnd)} {
		if _, err := NewFrameReader(bytes.NewReader(ok), 0).ReadFrame(); err != nil {
			t.Errorf("% x: %v", ok, err)
		}
	}
}

func TestUnexpectedFrameError(t *testing.T) {
	e := UnexpectedFrameError(Frame{Type: FrameMethod, Channel: 1, Payload: []byte{0, 20, 0, 10, 0}})
	if e.Code != UnexpectedFrame || e.Text != "UNEXPECTED_FRAME - type 1, all octets = <<0,20,0,10,0>>" || e.ClassID != 0 || e.MethodID != 0 {
		t.Fatalf("%+v", e)
	}
}
