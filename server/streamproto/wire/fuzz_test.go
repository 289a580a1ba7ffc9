package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// FuzzDecode feeds arbitrary frames to the decoder: it must never panic, every error must wrap
// one of the package's sentinels, and whatever decodes must encode again and decode to the same
// bytes (the encoding of a decoded value is canonical).
func FuzzDecode(f *testing.F) {
	for _, c := range every() {
		fr, err := c.Append(nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(fr[4:])
	}
	for _, fr := range capturedFramesF() {
		f.Add(fr[4:])
	}
	for _, line := range strings.Split(readFiles(clientFile), "\n") {
		if fs := strings.Fields(line); len(fs) == 3 && !strings.HasPrefix(line, "#") {
			if raw, err := hex.DecodeString(fs[2]); err == nil {
				f.Add(raw[4:])
			}
		}
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		c, err := Decode(frame)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrUnknownCommand) && !errors.Is(err, ErrUnsupportedVersion) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		enc, err := c.Append(nil)
		if err != nil {
			// Decoded values are always encodable, except strings over MaxStringLength (the
			// decoder accepts up to 65534 bytes, as RabbitMQ does).
			if errors.Is(err, ErrEncode) {
				return
			}
			t.Fatalf("re-encode: %v", err)
		}
		c2, err := Decode(enc[4:])
		if err != nil {
			t.Fatalf("decode of re-encoded %x: %v", enc, err)
		}
		enc2, _ := c2.Append(nil)
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding not stable:\n%x\n%x", enc, enc2)
		}
	})
}

// FuzzReader feeds an arbitrary byte stream to a Reader with a small limit.
func FuzzReader(f *testing.F) {
	var stream []byte
	for _, c := range every()[:10] {
		fr, _ := c.Append(nil)
		stream = append(stream, fr...)
	}
	f.Add(stream, uint16(512))
	f.Fuzz(func(t *testing.T, stream []byte, limit uint16) {
		r := NewReader(bytes.NewReader(stream), uint32(limit))
		for i := 0; i < 1000; i++ {
			fr, err := r.ReadFrame()
			if err != nil {
				if errors.Is(err, ErrMalformed) {
					continue
				}
				return
			}
			if limit != 0 && len(fr) > int(limit) {
				t.Fatalf("frame of %d bytes over the limit %d", len(fr), limit)
			}
			if len(r.buf) > max(minReadBuffer, int(limit)+4) && limit != 0 {
				t.Fatalf("buffer of %d bytes with limit %d", len(r.buf), limit)
			}
			_, _ = Decode(fr)
		}
	})
}

func capturedFramesF() [][]byte {
	var out [][]byte
	for _, fr := range readCaptured() {
		raw, err := hex.DecodeString(fr)
		if err == nil {
			out = append(out, raw)
		}
	}
	return out
}
