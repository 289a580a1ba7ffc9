package amqp

import (
	"encoding/binary"
	"fmt"
)

// Hand-written codecs for the hot methods. They neither allocate nor go
// through the Method interface.

// Method ids of the hot basic methods.
const (
	methodBasicReturn  = 50
	methodBasicDeliver = 60
	methodBasicGetOk   = 71
	methodBasicAck     = 80
	methodBasicReject  = 90
	methodBasicNack    = 120
)

// PublishArgs are the arguments of basic.publish. The slices alias the
// method arguments.
type PublishArgs struct {
	Exchange, RoutingKey []byte
	Mandatory, Immediate bool
}

// ParseBasicPublish decodes basic.publish arguments (the bytes after the
// class and method ids) without allocating. Arguments that do not fill their
// frame exactly are a *FramingError.
func ParseBasicPublish(args []byte) (PublishArgs, error) {
	var a PublishArgs
	off := 2 // reserved-1 (ticket)
	if len(args) < off+1 {
		return a, publishFramingError(args, "arguments")
	}
	n := int(args[off])
	off++
	if len(args) < off+n+1 {
		return a, publishFramingError(args, "exchange")
	}
	a.Exchange = args[off : off+n : off+n]
	off += n
	n = int(args[off])
	off++
	if len(args) < off+n+1 {
		return a, publishFramingError(args, "routing key")
	}
	a.RoutingKey = args[off : off+n : off+n]
	off += n
	if len(args) != off+1 {
		return a, publishFramingError(args, "arguments")
	}
	bits := args[off]
	a.Mandatory = bits&1 != 0
	a.Immediate = bits&2 != 0
	return a, nil
}

func publishFramingError(args []byte, what string) error {
	return newFramingError(ClassBasic, 40, args, fmt.Errorf("amqp: decoding basic.publish %s: %w", what, errFraming))
}

// parseTagBits decodes a delivery tag followed by a bits octet.
func parseTagBits(args []byte, name string, methodID uint16) (uint64, uint8, error) {
	if len(args) != 9 {
		return 0, 0, newFramingError(ClassBasic, methodID, args,
			fmt.Errorf("amqp: decoding %s arguments: %d bytes, want 9: %w", name, len(args), errFraming))
	}
	return binary.BigEndian.Uint64(args), args[8], nil
}

// ParseBasicAck decodes basic.ack arguments without allocating.
func ParseBasicAck(args []byte) (tag uint64, multiple bool, err error) {
	tag, bits, err := parseTagBits(args, "basic.ack", methodBasicAck)
	return tag, bits&1 != 0, err
}

// ParseBasicNack decodes basic.nack arguments without allocating.
func ParseBasicNack(args []byte) (tag uint64, multiple, requeue bool, err error) {
	tag, bits, err := parseTagBits(args, "basic.nack", methodBasicNack)
	return tag, bits&1 != 0, bits&2 != 0, err
}

// ParseBasicReject decodes basic.reject arguments without allocating.
func ParseBasicReject(args []byte) (tag uint64, requeue bool, err error) {
	tag, bits, err := parseTagBits(args, "basic.reject", methodBasicReject)
	return tag, bits&1 != 0, err
}

// shortLen is the encoded length of s as a (truncated) shortstr.
func shortLen(s string) int { return 1 + min(len(s), maxShortstr) }

// appendMethodHeader appends a method frame header with the class and
// method ids; argsLen is the length of the arguments that follow.
func appendMethodHeader(b []byte, channel uint16, classID, methodID uint16, argsLen int) []byte {
	b = appendFrameHeader(b, FrameMethod, channel, uint32(4+argsLen))
	b = binary.BigEndian.AppendUint16(b, classID)
	return binary.BigEndian.AppendUint16(b, methodID)
}

func bit(v bool, n uint8) uint8 {
	if v {
		return 1 << n
	}
	return 0
}

// AppendBasicDeliver appends a complete basic.deliver method frame.
func AppendBasicDeliver(b []byte, channel uint16, consumerTag string, deliveryTag uint64, redelivered bool, exchange, routingKey string) []byte {
	n := shortLen(consumerTag) + 8 + 1 + shortLen(exchange) + shortLen(routingKey)
	b = appendMethodHeader(b, channel, ClassBasic, methodBasicDeliver, n)
	b = appendShortstr(b, consumerTag)
	b = binary.BigEndian.AppendUint64(b, deliveryTag)
	b = append(b, bit(redelivered, 0))
	b = appendShortstr(b, exchange)
	b = appendShortstr(b, routingKey)
	return append(b, FrameEnd)
}

// AppendBasicAck appends a complete basic.ack method frame.
func AppendBasicAck(b []byte, channel uint16, tag uint64, multiple bool) []byte {
	b = appendMethodHeader(b, channel, ClassBasic, methodBasicAck, 9)
	b = binary.BigEndian.AppendUint64(b, tag)
	return append(b, bit(multiple, 0), FrameEnd)
}

// AppendBasicNack appends a complete basic.nack method frame.
func AppendBasicNack(b []byte, channel uint16, tag uint64, multiple, requeue bool) []byte {
	b = appendMethodHeader(b, channel, ClassBasic, methodBasicNack, 9)
	b = binary.BigEndian.AppendUint64(b, tag)
	return append(b, bit(multiple, 0)|bit(requeue, 1), FrameEnd)
}

// AppendBasicReturn appends a complete basic.return method frame.
func AppendBasicReturn(b []byte, channel uint16, code uint16, text, exchange, routingKey string) []byte {
	n := 2 + shortLen(text) + shortLen(exchange) + shortLen(routingKey)
	b = appendMethodHeader(b, channel, ClassBasic, methodBasicReturn, n)
	b = binary.BigEndian.AppendUint16(b, code)
	b = appendShortstr(b, text)
	b = appendShortstr(b, exchange)
	b = appendShortstr(b, routingKey)
	return append(b, FrameEnd)
}

// AppendBasicGetOk appends a complete basic.get-ok method frame.
func AppendBasicGetOk(b []byte, channel uint16, deliveryTag uint64, redelivered bool, exchange, routingKey string, messageCount uint32) []byte {
	n := 8 + 1 + shortLen(exchange) + shortLen(routingKey) + 4
	b = appendMethodHeader(b, channel, ClassBasic, methodBasicGetOk, n)
	b = binary.BigEndian.AppendUint64(b, deliveryTag)
	b = append(b, bit(redelivered, 0))
	b = appendShortstr(b, exchange)
	b = appendShortstr(b, routingKey)
	b = binary.BigEndian.AppendUint32(b, messageCount)
	return append(b, FrameEnd)
}
