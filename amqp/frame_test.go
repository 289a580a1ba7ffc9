package amqp

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// chunkReader returns at most n bytes per Read.
type chunkReader struct {
	data []byte
	n    int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	k := min(len(p), c.n, len(c.data))
	copy(p, c.data[:k])
	c.data = c.data[k:]
	return k, nil
}

func sampleStream() ([]byte, []Frame) {
	var b []byte
	var frames []Frame
	add := func(f []byte) {
		b = append(b, f...)
		frames = append(frames, Frame{Type: f[0], Channel: uint16(f[1])<<8 | uint16(f[2]), Payload: f[7 : len(f)-1]})
	}
	add(AppendMethodFrame(nil, 1, &QueueDeclare{Queue: "q", Durable: true}))
	add(AppendHeartbeat(nil))
	add(AppendContentHeaderFrame(nil, 3, ClassBasic, 100000, (&Properties{DeliveryMode: 2}).Append(nil)))
	body := bytes.Repeat([]byte("0123456789"), 10000)
	for rest := AppendBodyFrames(nil, 3, body, 131072); len(rest) > 0; {
		n := 8 + int(uint32(rest[3])<<24|uint32(rest[4])<<16|uint32(rest[5])<<8|uint32(rest[6]))
		add(rest[:n])
		rest = rest[n:]
	}
	add(AppendBasicAck(nil, 65535, 1<<40, true))
	return b, frames
}

func TestFrameReaderChunked(t *testing.T) {
	stream, want := sampleStream()
	for _, chunk := range []int{1, 3, 7, 8, 100, 4096, 1 << 20} {
		fr := NewFrameReader(&chunkReader{data: stream, n: chunk}, 0)
		for i, w := range want {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("chunk %d frame %d: %v", chunk, i, err)
			}
			if f.Type != w.Type || f.Channel != w.Channel || !bytes.Equal(f.Payload, w.Payload) {
				t.Fatalf("chunk %d frame %d: got type %d ch %d len %d", chunk, i, f.Type, f.Channel, len(f.Payload))
			}
		}
		if fr.Buffered() != 0 {
			t.Fatalf("chunk %d: %d bytes still buffered", chunk, fr.Buffered())
		}
		if _, err := fr.ReadFrame(); err != io.EOF {
			t.Fatalf("chunk %d: end of stream: %v", chunk, err)
		}
	}
}

func TestFrameReaderBuffered(t *testing.T) {
	a := AppendBasicAck(nil, 1, 1, false)
	stream := append(append([]byte{}, a...), a...)
	fr := NewFrameReader(bytes.NewReader(stream), 0)
	if _, err := fr.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	if fr.Buffered() != len(a) {
		t.Fatalf("Buffered = %d, want %d", fr.Buffered(), len(a))
	}
	if _, err := fr.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	if fr.Buffered() != 0 {
		t.Fatalf("Buffered = %d, want 0", fr.Buffered())
	}
}

func TestFrameReaderTooLargeBeforeReading(t *testing.T) {
	// Header announces 140000 bytes; nothing else follows. The reader must
	// fail at once, without waiting for or buffering the payload.
	hdr := []byte{1, 0, 1, 0, 0x02, 0x22, 0xe0}
	fr := NewFrameReader(io.MultiReader(bytes.NewReader(hdr), blockingReader{t}), 0)
	_, err := fr.ReadFrame()
	var ae *Error
	if !errors.As(err, &ae) || ae.Code != FrameError || !ae.Hard() {
		t.Fatalf("err = %v, want *Error 501", err)
	}
	if want := "FRAME_ERROR - type 1, all octets = <<>>: {frame_too_large,140000,131064}"; ae.Text != want {
		t.Fatalf("text %q, want %q", ae.Text, want)
	}
	if len(fr.buf) != readBufferSize {
		t.Fatalf("buffer grew to %d", len(fr.buf))
	}

	// With a small negotiated frame-max, RabbitMQ's 8-byte tolerance
	// applies: payload up to frame-max passes, one more byte fails.
	for _, tc := range []struct {
		size uint32
		ok   bool
	}{{4088, true}, {4096, true}, {4097, false}} {
		f := append([]byte{3, 0, 1, byte(tc.size >> 24), byte(tc.size >> 16), byte(tc.size >> 8), byte(tc.size)}, make([]byte, tc.size)...)
		f = append(f, FrameEnd)
		fr := NewFrameReader(bytes.NewReader(f), 4096)
		_, err := fr.ReadFrame()
		if (err == nil) != tc.ok {
			t.Errorf("payload %d with frame-max 4096: err %v", tc.size, err)
		}
	}
	// SetMaxFrameSize raises the limit, and the buffer grows for it.
	big := bytes.Repeat([]byte{7}, 200000)
	stream := AppendBodyFrames(nil, 1, big, 300000)
	fr = NewFrameReader(bytes.NewReader(stream), 0)
	fr.SetMaxFrameSize(300000)
	f, err := fr.ReadFrame()
	if err != nil || !bytes.Equal(f.Payload, big) {
		t.Fatalf("large frame: %v", err)
	}
}

// blockingReader fails the test if read.
type blockingReader struct{ t *testing.T }

func (b blockingReader) Read([]byte) (int, error) {
	b.t.Error("payload was read")
	return 0, io.EOF
}

func TestFrameReaderProtocolErrors(t *testing.T) {
	bad := AppendBasicAck(nil, 1, 1, false)
	bad[len(bad)-1] = 0x00
	_, err := NewFrameReader(bytes.NewReader(bad), 0).ReadFrame()
	var ae *Error
	if !errors.As(err, &ae) || ae.Code != FrameError || !strings.Contains(ae.Text, "{invalid_frame_end_marker,0}") ||
		!strings.Contains(ae.Text, "all octets = <<0,60,0,80,0,0,0,0,0,0,0,1,0>>") {
		t.Fatalf("bad end marker: %v", err)
	}

	_, err = NewFrameReader(bytes.NewReader([]byte{5, 0, 0, 0, 0, 0, 0, FrameEnd}), 0).ReadFrame()
	if !errors.As(err, &ae) || ae.Code != FrameError || !strings.Contains(ae.Text, "type 5") {
		t.Fatalf("unknown type: %v", err)
	}

	// Truncated frame: io.ErrUnexpectedEOF; clean end: io.EOF.
	good := AppendBasicAck(nil, 1, 1, false)
	for cut := 1; cut < len(good); cut++ {
		_, err := NewFrameReader(bytes.NewReader(good[:cut]), 0).ReadFrame()
		if err != io.ErrUnexpectedEOF {
			t.Fatalf("cut at %d: %v", cut, err)
		}
	}
	if _, err := NewFrameReader(bytes.NewReader(nil), 0).ReadFrame(); err != io.EOF {
		t.Fatalf("empty: %v", err)
	}
	// Other errors pass through.
	boom := errors.New("boom")
	if _, err := NewFrameReader(errReader{boom}, 0).ReadFrame(); err != boom {
		t.Fatalf("reader error: %v", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestAppendBodyFrames(t *testing.T) {
	if got := AppendBodyFrames([]byte{9}, 1, nil, 4096); !bytes.Equal(got, []byte{9}) {
		t.Fatalf("empty body appended % x", got)
	}
	body := bytes.Repeat([]byte{'z'}, 10000)
	stream := AppendBodyFrames(nil, 2, body, 4096)
	fr := NewFrameReader(bytes.NewReader(stream), 4096)
	var got []byte
	var sizes []int
	for {
		f, err := fr.ReadFrame()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if f.Type != FrameBody || f.Channel != 2 {
			t.Fatalf("frame %+v", f)
		}
		sizes = append(sizes, len(f.Payload))
		got = append(got, f.Payload...)
	}
	if !bytes.Equal(got, body) || len(sizes) != 3 || sizes[0] != 4088 || sizes[2] != 10000-2*4088 {
		t.Fatalf("sizes %v", sizes)
	}
	// frame-max 0: no limit, one frame.
	if got := AppendBodyFrames(nil, 1, body, 0); len(got) != len(body)+8 {
		t.Fatalf("frame-max 0 gave %d bytes", len(got))
	}
}

func TestContentHeader(t *testing.T) {
	props := (&Properties{ContentType: "a", Headers: Table{"k": "v"}}).Append(nil)
	frame := AppendContentHeaderFrame(nil, 5, ClassBasic, 1<<33, props)
	f, err := NewFrameReader(bytes.NewReader(frame), 0).ReadFrame()
	if err != nil || f.Type != FrameHeader || f.Channel != 5 {
		t.Fatalf("%+v, %v", f, err)
	}
	class, size, raw, err := ParseContentHeader(f.Payload)
	if err != nil || class != ClassBasic || size != 1<<33 || !bytes.Equal(raw, props) {
		t.Fatalf("ParseContentHeader = %d %d % x %v", class, size, raw, err)
	}
	if f.Payload[2] != 0 || f.Payload[3] != 0 {
		t.Fatal("weight is not zero")
	}
	if _, _, _, err := ParseContentHeader(f.Payload[:13]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("short header: %v", err)
	}
}

func TestHeartbeatFrame(t *testing.T) {
	want := []byte{8, 0, 0, 0, 0, 0, 0, 0xce}
	if got := AppendHeartbeat(nil); !bytes.Equal(got, want) {
		t.Fatalf("% x", got)
	}
}

func TestErrorf(t *testing.T) {
	e := Errorf(NotFound, "no queue '%s' in vhost '%s'", "q", "/")
	if e.Code != 404 || e.Text != "NOT_FOUND - no queue 'q' in vhost '/'" || e.Hard() {
		t.Fatalf("%+v", e)
	}
	if !Errorf(NotAllowed, "x").Hard() || Errorf(PreconditionFailed, "x").Hard() {
		t.Fatal("Hard")
	}
	long := Errorf(PreconditionFailed, "%s", strings.Repeat("é", 200))
	if len(long.Text) > 255 || !strings.HasPrefix(long.Text, "PRECONDITION_FAILED - é") || strings.ContainsRune(long.Text, '\uFFFD') {
		t.Fatalf("truncated to %d bytes: %q", len(long.Text), long.Text)
	}
	if ReplyName(ReplySuccess) != "REPLY_SUCCESS" || ReplyName(NoRoute) != "NO_ROUTE" || ReplyName(1) != "" {
		t.Fatal("ReplyName")
	}
	if !strings.Contains(e.Error(), "NOT_FOUND") {
		t.Fatal(e.Error())
	}
	u := &UnknownMethodError{ClassID: 1, MethodID: 2}
	if !strings.Contains(u.Error(), "class 1, method 2") {
		t.Fatal(u.Error())
	}
}

func TestFrameErrorLongPayloadText(t *testing.T) {
	bad := AppendBasicDeliver(nil, 1, "ctag", 1, false, "ex", "rk")
	bad[len(bad)-1] = 7
	_, err := NewFrameReader(bytes.NewReader(bad), 0).ReadFrame()
	var ae *Error
	if !errors.As(err, &ae) || !strings.Contains(ae.Text, "first 16 octets = <<0,60,0,60,4,99,116,97,103,") ||
		!strings.HasSuffix(ae.Text, "{invalid_frame_end_marker,7}") {
		t.Fatalf("%v", err)
	}
}
