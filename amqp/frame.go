package amqp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ProtocolHeader is what an AMQP 0-9-1 client sends first.
const ProtocolHeader = "AMQP\x00\x00\x09\x01"

const (
	// frameHeaderSize is type (1) + channel (2) + payload size (4).
	frameHeaderSize = 7
	// frameOverhead is the header plus the frame-end octet.
	frameOverhead = frameHeaderSize + 1
	// frameSizeFudge is the slack RabbitMQ grants over frame-max - 8
	// (rabbit_reader's FRAME_SIZE_FUDGE), since some clients count the
	// frame overhead wrongly.
	frameSizeFudge = frameOverhead
	// DefaultFrameMax is the frame-max a FrameReader uses when given 0.
	DefaultFrameMax = 131072
	// readBufferSize is the initial FrameReader buffer: small, because most connections are idle
	// most of the time. A busy connection grows it up to busyBufferSize.
	readBufferSize = 1 << 10
	// busyBufferSize is how far the buffer grows when reads keep filling it.
	busyBufferSize = 128 << 10
	// shrinkAfter is how many consecutive small reads (under 1/8 of the buffer) on an empty buffer
	// bring a grown buffer back to readBufferSize.
	shrinkAfter = 64
)

// Frame is one AMQP frame. Payload aliases the reader's buffer and is valid
// until the next ReadFrame.
type Frame struct {
	Type    uint8
	Channel uint16
	Payload []byte
}

// FrameReader reads frames from an io.Reader through one reused buffer,
// reading in large chunks and slicing frames out of it.
type FrameReader struct {
	r        io.Reader
	buf      []byte
	start    int // first unconsumed byte
	end      int // end of buffered data
	maxFrame uint32
	err      error // sticky read error, returned once the buffer runs dry
	small    int   // consecutive small reads, for shrinking an idle buffer
}

// NewFrameReader returns a reader of frames from r. maxFrameSize is the
// negotiated frame-max including the 8 bytes of header and frame end; 0
// means DefaultFrameMax (131072).
func NewFrameReader(r io.Reader, maxFrameSize uint32) *FrameReader {
	fr := &FrameReader{r: r, buf: make([]byte, readBufferSize)}
	fr.SetMaxFrameSize(maxFrameSize)
	return fr
}

// SetMaxFrameSize changes the largest accepted frame (frame-max, including
// the 8 bytes of overhead); 0 means DefaultFrameMax.
func (fr *FrameReader) SetMaxFrameSize(n uint32) {
	if n == 0 {
		n = DefaultFrameMax
	}
	fr.maxFrame = n
}

// Buffered returns the number of bytes already read from the underlying
// reader and not yet returned as frames.
func (fr *FrameReader) Buffered() int { return fr.end - fr.start }

// ReadFrame returns the next frame. Errors of the underlying reader pass
// through (io.EOF at a frame boundary, io.ErrUnexpectedEOF inside a frame).
// Protocol violations are *Error with code FrameError: a declared payload
// larger than frame-max - 8 (with RabbitMQ's 8-byte tolerance; checked
// before the payload is read or buffer space is allocated), an unknown frame
// type, a bad frame-end octet, or a method (content header) frame shorter
// than 4 (12) bytes.
func (fr *FrameReader) ReadFrame() (Frame, error) {
	if err := fr.fill(frameHeaderSize); err != nil {
		return Frame{}, err
	}
	h := fr.buf[fr.start : fr.start+frameHeaderSize]
	typ := h[0]
	channel := binary.BigEndian.Uint16(h[1:])
	size := binary.BigEndian.Uint32(h[3:])

	limit := uint64(fr.maxFrame) - frameOverhead
	if fr.maxFrame < frameOverhead {
		limit = 0
	}
	if uint64(size) > limit+frameSizeFudge {
		return Frame{}, Errorf(FrameError, "type %d, all octets = <<>>: {frame_too_large,%d,%d}", typ, size, limit)
	}
	switch typ {
	case FrameMethod, FrameHeader, FrameBody, FrameHeartbeat:
	default:
		return Frame{}, Errorf(FrameError, "type %d, all octets = <<>>: unknown_frame_type", typ)
	}

	total := frameOverhead + int(size)
	if err := fr.fill(total); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	f := Frame{
		Type:    typ,
		Channel: channel,
		Payload: fr.buf[fr.start+frameHeaderSize : fr.start+frameHeaderSize+int(size) : fr.start+frameHeaderSize+int(size)],
	}
	if marker := fr.buf[fr.start+total-1]; marker != FrameEnd {
		return Frame{}, Errorf(FrameError, "type %d, %s: {invalid_frame_end_marker,%d}", typ, octetsForError(f.Payload), marker)
	}
	// As RabbitMQ's frame analysis: a method frame too short for its class and method ids, or a
	// content header too short for class, weight and body size, is not a frame at all.
	if (typ == FrameMethod && size < 4) || (typ == FrameHeader && size < 12) {
		return Frame{}, Errorf(FrameError, "type %d, %s: unknown_frame", typ, octetsForError(f.Payload))
	}
	fr.start += total
	if fr.start == fr.end {
		fr.start, fr.end = 0, 0
	}
	return f, nil
}

// maxEmptyReads bounds consecutive (0, nil) reads, as bufio does.
const maxEmptyReads = 100

// fill makes at least n bytes available at fr.start, growing or compacting
// the buffer as needed.
func (fr *FrameReader) fill(n int) error {
	if fr.end-fr.start >= n {
		return nil
	}
	if n > len(fr.buf) {
		size := 2 * len(fr.buf)
		if size < n {
			size = n
		}
		if max := int(fr.maxFrame) + frameSizeFudge; size > max && n <= max {
			size = max
		}
		nb := make([]byte, size)
		fr.end = copy(nb, fr.buf[fr.start:fr.end])
		fr.start = 0
		fr.buf = nb
	} else if fr.start+n > len(fr.buf) {
		fr.end = copy(fr.buf, fr.buf[fr.start:fr.end])
		fr.start = 0
	}
	if fr.start == fr.end && len(fr.buf) > readBufferSize && fr.small >= shrinkAfter && n <= readBufferSize {
		fr.buf = make([]byte, readBufferSize)
		fr.start, fr.end, fr.small = 0, 0, 0
	}
	empty := 0
	for fr.end-fr.start < n {
		if fr.err != nil {
			err := fr.err
			if fr.end > fr.start && err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		m, err := fr.r.Read(fr.buf[fr.end:])
		if m < 0 || m > len(fr.buf)-fr.end {
			fr.err = errors.New("amqp: reader returned an invalid count")
			continue
		}
		if m == len(fr.buf)-fr.end && len(fr.buf) < busyBufferSize {
			// The read filled the buffer: more is waiting. Grow so the next read takes more per syscall.
			nb := make([]byte, 2*len(fr.buf))
			copy(nb, fr.buf[fr.start:fr.end+m])
			fr.end = fr.end + m - fr.start
			fr.start = 0
			fr.buf = nb
			fr.small = 0
		} else {
			fr.end += m
			if m < len(fr.buf)/8 {
				fr.small++
			} else {
				fr.small = 0
			}
		}
		if err != nil {
			fr.err = err
			continue
		}
		if m == 0 {
			empty++
			if empty >= maxEmptyReads {
				fr.err = io.ErrNoProgress
			}
		} else {
			empty = 0
		}
	}
	return nil
}

// octetsForError renders a payload the way RabbitMQ's frame errors do:
// "all octets = <<1,2>>" or "first 16 octets = <<...>>".
func octetsForError(p []byte) string {
	if len(p) > 16 {
		return "first 16 octets = " + erlangBinary(p[:16])
	}
	return "all octets = " + erlangBinary(p)
}

// erlangBinary renders bytes as Erlang's ~w prints a binary: <<0,20,0,10>>.
func erlangBinary(p []byte) string {
	var b strings.Builder
	b.WriteString("<<")
	for i, c := range p {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(int(c)))
	}
	b.WriteString(">>")
	return b.String()
}

// UnexpectedFrameError is the connection.close RabbitMQ sends for a frame that is well formed but not
// allowed where it arrived (one on a channel other than 0 before connection.open, a heartbeat on
// a channel): 505 "type 1, all octets = <<...>>".
func UnexpectedFrameError(f Frame) *Error {
	return Errorf(UnexpectedFrame, "type %d, %s", f.Type, octetsForError(f.Payload))
}

// appendFrameHeader appends type, channel and payload size.
func appendFrameHeader(b []byte, typ uint8, channel uint16, size uint32) []byte {
	b = append(b, typ)
	b = binary.BigEndian.AppendUint16(b, channel)
	return binary.BigEndian.AppendUint32(b, size)
}

// AppendHeartbeat appends a heartbeat frame (channel 0).
func AppendHeartbeat(b []byte) []byte {
	return append(b, FrameHeartbeat, 0, 0, 0, 0, 0, 0, FrameEnd)
}

// AppendContentHeaderFrame appends a content header frame: class id, weight
// 0, body size and the raw property bytes (flags and fields, e.g. from
// ParseContentHeader or Properties.Append).
func AppendContentHeaderFrame(b []byte, channel uint16, classID uint16, bodySize uint64, rawProps []byte) []byte {
	b = appendFrameHeader(b, FrameHeader, channel, uint32(12+len(rawProps)))
	b = binary.BigEndian.AppendUint16(b, classID)
	b = append(b, 0, 0)
	b = binary.BigEndian.AppendUint64(b, bodySize)
	b = append(b, rawProps...)
	return append(b, FrameEnd)
}

// AppendBodyFrames appends body as content body frames whose payloads are at
// most frameMax-8 bytes. An empty body appends nothing. frameMax 0 means no
// limit (one frame); a frameMax below FrameMinSize is treated as
// FrameMinSize.
func AppendBodyFrames(b []byte, channel uint16, body []byte, frameMax uint32) []byte {
	chunk := len(body)
	if frameMax != 0 {
		if frameMax < FrameMinSize {
			frameMax = FrameMinSize
		}
		chunk = int(frameMax - frameOverhead)
	}
	if chunk > 1<<31 {
		chunk = 1 << 31
	}
	for len(body) > 0 {
		n := min(chunk, len(body))
		b = appendFrameHeader(b, FrameBody, channel, uint32(n))
		b = append(b, body[:n]...)
		b = append(b, FrameEnd)
		body = body[n:]
	}
	return b
}

// ParseContentHeader splits a content header frame payload. rawProps
// (property flags and fields) aliases payload. Errors wrap ErrMalformed.
func ParseContentHeader(payload []byte) (classID uint16, bodySize uint64, rawProps []byte, err error) {
	if len(payload) < 14 {
		return 0, 0, nil, fmt.Errorf("amqp: content header of %d bytes is shorter than 14: %w", len(payload), ErrMalformed)
	}
	classID = binary.BigEndian.Uint16(payload)
	bodySize = binary.BigEndian.Uint64(payload[4:])
	return classID, bodySize, payload[12:], nil
}
