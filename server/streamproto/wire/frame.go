package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// minReadBuffer is the buffer a Reader starts with; small frames (most control frames and
// publishes of small messages) are served from it, several per read call.
const minReadBuffer = 4096

// Reader reads frames from a byte stream. It keeps one buffer, grown to the largest frame seen
// (never beyond the maximum, and only as the frame's bytes arrive), and reads ahead so that
// many small frames cost one read call.
//
// A Reader is not safe for concurrent use; it belongs to the connection's read goroutine.
type Reader struct {
	r        io.Reader
	max      uint32
	buf      []byte
	start    int // first unconsumed byte in buf
	end      int // one past the last byte read into buf
	frameLen int // length of the frame returned last, consumed at the next ReadFrame
}

// NewReader returns a Reader that refuses frames over maxFrame bytes (the size prefix not
// counted, as the protocol counts frame_max). 0 means no limit, as in tune; a server should
// start with DefaultInitialFrameMax and raise it with SetMaxFrameSize once open succeeds.
func NewReader(r io.Reader, maxFrame uint32) *Reader {
	return &Reader{r: r, max: maxFrame}
}

// SetMaxFrameSize changes the limit for the frames read from now on (0 = none).
func (r *Reader) SetMaxFrameSize(maxFrame uint32) { r.max = maxFrame }

// MaxFrameSize returns the current limit (0 = none).
func (r *Reader) MaxFrameSize() uint32 { return r.max }

// Buffered returns how many bytes have been read ahead beyond the last frame returned.
func (r *Reader) Buffered() int { return r.end - r.start - r.frameLen }

// ReadFrame returns the next frame without its size prefix: key, version and fields, ready for
// Decode or PeekHeader. The slice aliases the Reader's buffer and is valid until the next call.
//
// A frame whose declared size is over the maximum returns a *FrameTooLargeError before any of
// its bytes are read or any buffer is grown for it. A frame shorter than the 4 bytes of key and
// version returns an error wrapping ErrMalformed. A stream that ends between frames returns
// io.EOF; one that ends inside a frame returns io.ErrUnexpectedEOF.
func (r *Reader) ReadFrame() ([]byte, error) {
	r.start += r.frameLen
	r.frameLen = 0
	if err := r.fill(4); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) && r.end == r.start {
			return nil, io.EOF
		}
		return nil, err
	}
	size := binary.BigEndian.Uint32(r.buf[r.start:])
	if r.max != 0 && size > r.max {
		return nil, &FrameTooLargeError{Size: size, Max: r.max}
	}
	if uint64(size) > uint64(maxInt-4) { // only on 32-bit platforms
		return nil, &FrameTooLargeError{Size: size, Max: uint32(min(uint64(maxInt-4), math.MaxUint32))}
	}
	if err := r.fill(4 + int(size)); err != nil {
		return nil, err
	}
	r.start += 4
	r.frameLen = int(size)
	frame := r.buf[r.start : r.start+int(size) : r.start+int(size)]
	if size < 4 {
		return frame, &DecodeError{Reason: fmt.Sprintf("frame of %d bytes has no key and version", size), Err: ErrMalformed}
	}
	return frame, nil
}

const maxInt = int(^uint(0) >> 1)

// fill makes sure at least n unconsumed bytes are buffered. The buffer grows (doubling, never
// beyond n) only as bytes arrive, so a peer that declares a large frame and sends nothing costs
// no memory, and one that sends it costs at most its size.
func (r *Reader) fill(n int) error {
	for r.end-r.start < n {
		if r.end == len(r.buf) {
			r.makeRoom(n)
		}
		m, err := r.r.Read(r.buf[r.end:])
		r.end += m
		if r.end-r.start >= n {
			return nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		if m == 0 {
			return io.ErrNoProgress
		}
	}
	return nil
}

// makeRoom frees space after end: it moves the unconsumed bytes to the front, or, when they
// already fill the buffer, grows it towards n.
func (r *Reader) makeRoom(n int) {
	if r.start > 0 {
		copy(r.buf, r.buf[r.start:r.end])
		r.end -= r.start
		r.start = 0
		if r.end < len(r.buf) {
			return
		}
	}
	size := max(minReadBuffer, min(n, 2*len(r.buf)))
	if size <= len(r.buf) {
		size = len(r.buf) + 1
	}
	buf := make([]byte, size)
	copy(buf, r.buf[:r.end])
	r.buf = buf
}

// Header is the part every frame starts with.
type Header struct {
	Key     Key
	Version uint16
}

// PeekHeader returns the key and version of a frame (as ReadFrame returns it).
func PeekHeader(frame []byte) (Header, error) {
	if len(frame) < 4 {
		return Header{}, &DecodeError{Reason: fmt.Sprintf("frame of %d bytes has no key and version", len(frame)), Err: ErrMalformed}
	}
	return Header{Key: Key(binary.BigEndian.Uint16(frame)), Version: binary.BigEndian.Uint16(frame[2:])}, nil
}

// CorrelationID returns the correlation id of a request or response frame that carries one (the
// 4 bytes after key and version), so that a server can answer a request it could not decode with
// the right correlation id. ok is false for commands without one.
func CorrelationID(frame []byte) (id uint32, ok bool) {
	h, err := PeekHeader(frame)
	if err != nil || len(frame) < 8 || !hasCorrelationID(h.Key) {
		return 0, false
	}
	return binary.BigEndian.Uint32(frame[4:]), true
}

// hasCorrelationID reports whether frames with this key carry a correlation id.
func hasCorrelationID(k Key) bool {
	switch k.Command() {
	case CommandPublish, CommandPublishConfirm, CommandPublishError, CommandDeliver,
		CommandCredit, CommandStoreOffset, CommandMetadataUpdate, CommandHeartbeat, CommandTune:
		return false
	}
	return k.Known()
}
