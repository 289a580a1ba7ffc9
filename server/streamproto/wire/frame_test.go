package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

func frameOf(t *testing.T, c Command) []byte {
	t.Helper()
	f, err := c.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestReaderSequenceAndEOF(t *testing.T) {
	var stream []byte
	for _, c := range every() {
		stream = append(stream, frameOf(t, c)...)
	}
	// One byte per Read: frames split anywhere must come out whole.
	for _, name := range []string{"whole", "one byte at a time"} {
		var src io.Reader = bytes.NewReader(stream)
		if name != "whole" {
			src = iotest.OneByteReader(src)
		}
		r := NewReader(src, DefaultFrameMax)
		n := 0
		for {
			f, err := r.ReadFrame()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: frame %d: %v", name, n, err)
			}
			want := frameOf(t, every()[n])[4:]
			if !bytes.Equal(f, want) {
				t.Fatalf("%s: frame %d = %x, want %x", name, n, f, want)
			}
			n++
		}
		if n != len(every()) {
			t.Fatalf("%s: read %d frames, want %d", name, n, len(every()))
		}
	}
}

func TestReaderTruncatedStream(t *testing.T) {
	f := frameOf(t, &Open{CorrelationID: 1, VirtualHost: "/"})
	for n := 1; n < len(f); n++ {
		r := NewReader(bytes.NewReader(f[:n]), 0)
		if _, err := r.ReadFrame(); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("stream cut at %d: %v, want io.ErrUnexpectedEOF", n, err)
		}
	}
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestReaderFrameTooLarge(t *testing.T) {
	// A frame that claims 100 MB: refused before anything is read for it or allocated.
	hdr := binary.BigEndian.AppendUint32(nil, 100<<20)
	src := &countingReader{r: io.MultiReader(bytes.NewReader(hdr), neverEnding{})}
	r := NewReader(src, DefaultInitialFrameMax)
	_, err := r.ReadFrame()
	var tl *FrameTooLargeError
	if !errors.As(err, &tl) || !errors.Is(err, ErrFrameTooLarge) || tl.Size != 100<<20 || tl.Max != DefaultInitialFrameMax {
		t.Fatalf("err = %v", err)
	}
	if cap(r.buf) > minReadBuffer {
		t.Fatalf("buffer grew to %d for a refused frame", cap(r.buf))
	}

	// Exactly the maximum is fine; one more is not.
	body := make([]byte, 100)
	ok := append(binary.BigEndian.AppendUint32(nil, 100), body...)
	r = NewReader(bytes.NewReader(ok), 100)
	if _, err := r.ReadFrame(); !errors.Is(err, ErrMalformed) { // 100 zero bytes: key 0, but a frame
		if err != nil {
			t.Fatalf("frame at the limit: %v", err)
		}
	}
	r = NewReader(bytes.NewReader(append(binary.BigEndian.AppendUint32(nil, 101), make([]byte, 101)...)), 100)
	if _, err := r.ReadFrame(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("frame over the limit: %v", err)
	}
}

// neverEnding yields zeros forever.
type neverEnding struct{}

func (neverEnding) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestReaderGrowsOnlyToTheClaim(t *testing.T) {
	// A frame that claims 1 MB but whose bytes never come: the buffer does not grow for it.
	hdr := binary.BigEndian.AppendUint32(nil, 1<<20)
	r := NewReader(bytes.NewReader(hdr), DefaultFrameMax)
	if _, err := r.ReadFrame(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v", err)
	}
	if len(r.buf) > minReadBuffer {
		t.Fatalf("buffer of %d bytes for a frame whose bytes never came", len(r.buf))
	}
	// When the bytes come, the buffer grows to the frame, no more.
	big := append(hdr, make([]byte, 1<<20)...)
	r = NewReader(bytes.NewReader(big), DefaultFrameMax)
	if f, err := r.ReadFrame(); err != nil || len(f) != 1<<20 {
		t.Fatalf("err = %v, %d bytes", err, len(f))
	}
	if len(r.buf) != 1<<20+4 {
		t.Fatalf("buffer of %d bytes for a frame of %d", len(r.buf), 1<<20+4)
	}
	// A raised limit applies to the frames read after it.
	r = NewReader(bytes.NewReader(frameOf(t, &Heartbeat{})), 4)
	r.SetMaxFrameSize(8)
	if r.MaxFrameSize() != 8 {
		t.Fatal("SetMaxFrameSize")
	}
	if _, err := r.ReadFrame(); err != nil {
		t.Fatal(err)
	}
}

func TestReaderShortFrame(t *testing.T) {
	r := NewReader(bytes.NewReader([]byte{0, 0, 0, 2, 0, 0x17}), 0)
	if _, err := r.ReadFrame(); !errors.Is(err, ErrMalformed) {
		t.Fatalf("err = %v", err)
	}
}

func TestReaderBuffered(t *testing.T) {
	two := append(frameOf(t, &Heartbeat{}), frameOf(t, &Heartbeat{})...)
	r := NewReader(bytes.NewReader(two), 0)
	if _, err := r.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	if r.Buffered() != 8 {
		t.Fatalf("Buffered = %d, want 8", r.Buffered())
	}
}
