package amqp

import (
	"encoding/binary"
	"fmt"
)

// Method is an AMQP method. The generated method structs implement it with
// pointer receivers (*QueueDeclare is a Method).
type Method interface {
	// ClassID returns the class id, e.g. 60 for basic.
	ClassID() uint16
	// MethodID returns the method id within the class.
	MethodID() uint16
	// Name returns "class.method", e.g. "basic.publish".
	Name() string
	// HasContent reports whether a content header and body follow.
	HasContent() bool
	// Synchronous reports whether the method expects a reply.
	Synchronous() bool
	// Decode sets the fields from the argument bytes (after the 4-byte
	// class/method id); consecutive bit fields are packed into octets.
	Decode(args []byte) error
	// AppendArgs appends the argument bytes (not the class/method id).
	AppendArgs(b []byte) []byte
}

// DecodeMethod decodes a whole method frame payload (class id, method id,
// arguments). An unknown class/method pair yields *UnknownMethodError;
// truncated or invalid data an error wrapping ErrMalformed, a *FramingError
// when the arguments do not fill the payload exactly.
func DecodeMethod(payload []byte) (Method, error) {
	if len(payload) < 4 {
		return nil, fmt.Errorf("amqp: method payload of %d bytes is shorter than 4: %w", len(payload), ErrMalformed)
	}
	classID := binary.BigEndian.Uint16(payload)
	methodID := binary.BigEndian.Uint16(payload[2:])
	m := NewMethod(classID, methodID)
	if m == nil {
		return nil, &UnknownMethodError{ClassID: classID, MethodID: methodID}
	}
	if err := m.Decode(payload[4:]); err != nil {
		return nil, err
	}
	return m, nil
}

// MethodName returns "class.method" for a known class/method id pair, or
// "" if it is unknown.
func MethodName(classID, methodID uint16) string { return methodName(classID, methodID) }

// AppendMethodFrame appends a complete method frame carrying m on channel.
func AppendMethodFrame(b []byte, channel uint16, m Method) []byte {
	start := len(b)
	b = appendFrameHeader(b, FrameMethod, channel, 0)
	b = binary.BigEndian.AppendUint16(b, m.ClassID())
	b = binary.BigEndian.AppendUint16(b, m.MethodID())
	b = m.AppendArgs(b)
	binary.BigEndian.PutUint32(b[start+3:], uint32(len(b)-start-frameHeaderSize))
	return append(b, FrameEnd)
}
