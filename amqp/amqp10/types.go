// Package amqp10 is the AMQP 1.0 message format (OASIS AMQP 1.0, part 3: the sections of a
// message and the type system they are written in) that RabbitMQ's stream protocol carries and
// that RabbitMQ stores in streams, and the mapping between such a message and an AMQP 0-9-1
// message (basic properties, headers and body) exactly as RabbitMQ maps them (mapping.go).
//
// It lives beside the 0-9-1 codec (package amqp) rather than under server/ because both the
// stream log (stream/) and the protocol front-ends need it: a message published over AMQP 0-9-1
// to a stream is stored in this format, and read back by 0-9-1 and stream-protocol consumers.
//
// Values of the type system are Go values:
//
//	null nil           boolean bool (Boolean for the 0x56 form)             ubyte uint8
//	ushort uint16      uint uint32
//	ulong uint64       byte int8          short int16     int int32        long int64
//	float float32      double float64     decimal32/64/128 Decimal32/64/128
//	char Char          timestamp Timestamp (ms since the epoch)             uuid UUID
//	binary []byte      string string      symbol Symbol
//	list List          map Map (ordered)  array Array     described *Described
//
// Decoding never panics on malformed input; errors wrap ErrMalformed.
package amqp10

import (
	"errors"
	"fmt"
)

// Boolean is an AMQP 1.0 boolean written in its one-byte form (constructor 0x56 and a 0 or 1
// byte) rather than as the constructors 0x41 (true) and 0x42 (false) that a bool is written
// with. It means the same as bool; the decoder returns it for that form, and RabbitMQ writes
// 0-9-1 boolean headers in it, so keeping it keeps re-encoded bytes identical.
type Boolean bool

// Symbol is the AMQP 1.0 symbol type (ASCII names, such as annotation keys and content types).
type Symbol string

// Timestamp is the AMQP 1.0 timestamp: milliseconds since the Unix epoch.
type Timestamp int64

// UUID is the AMQP 1.0 uuid type (RFC 4122 byte order).
type UUID [16]byte

// Char is the AMQP 1.0 char type (a UTF-32 code point).
type Char rune

// Decimal32, Decimal64 and Decimal128 are IEEE 754 decimals, kept as their bytes.
type (
	Decimal32  [4]byte
	Decimal64  [8]byte
	Decimal128 [16]byte
)

// List is the AMQP 1.0 list type: a sequence of values of any type.
type List []any

// Array is the AMQP 1.0 array type: values of one type. The encoder takes the element type
// from the first element; an empty array is written with the null constructor.
type Array []any

// KeyValue is one entry of a Map.
type KeyValue struct {
	Key, Value any
}

// Map is the AMQP 1.0 map type, in wire order (keys of any type; annotations use Symbol keys,
// application properties string keys).
type Map []KeyValue

// Get returns the value of the first entry whose key equals key.
func (m Map) Get(key any) (any, bool) {
	for _, kv := range m {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// Described is a described value: a descriptor (usually a uint64 code or a Symbol) and a value.
type Described struct {
	Descriptor any
	Value      any
}

// ErrMalformed marks bytes that are not a well-formed AMQP 1.0 value or message.
var ErrMalformed = errors.New("amqp10: malformed")

// ErrUnsupported marks a Go value that has no AMQP 1.0 encoding.
var ErrUnsupported = errors.New("amqp10: unsupported value")

func malformed(format string, args ...any) error {
	return fmt.Errorf("amqp10: "+format+": %w", append(args, ErrMalformed)...)
}

// Ptr returns a pointer to v (for the optional fields of Header and Properties).
func Ptr[T any](v T) *T { return &v }
