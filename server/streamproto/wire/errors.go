package wire

import (
	"errors"
	"fmt"
)

// Errors that decoding wraps; test with errors.Is.
var (
	// ErrMalformed marks a frame whose fields do not decode: truncated, over-long, a count
	// larger than the bytes that follow, an out-of-range value or trailing bytes.
	ErrMalformed = errors.New("malformed frame")
	// ErrUnknownCommand marks a frame whose key is not a command of the protocol (or not one
	// that travels in that direction, such as a response key no command answers).
	ErrUnknownCommand = errors.New("unknown command")
	// ErrUnsupportedVersion marks a known command in a version this codec does not implement.
	ErrUnsupportedVersion = errors.New("unsupported command version")
	// ErrFrameTooLarge marks a frame whose declared size is over the reader's maximum.
	ErrFrameTooLarge = errors.New("frame too large")
	// ErrEncode marks a value that cannot be encoded (a string over MaxStringLength bytes, a
	// message over 2^31-1 bytes, more elements than a count field holds).
	ErrEncode = errors.New("cannot encode")
)

// FrameTooLargeError reports a frame over the reader's maximum; it wraps ErrFrameTooLarge. The
// connection cannot go on after it (the frame's bytes were not read): RabbitMQ answers with a
// close carrying ResponseCodeFrameTooLarge.
type FrameTooLargeError struct {
	Size, Max uint32
}

func (e *FrameTooLargeError) Error() string {
	return fmt.Sprintf("stream wire: frame of %d bytes exceeds the maximum of %d", e.Size, e.Max)
}

func (e *FrameTooLargeError) Unwrap() error { return ErrFrameTooLarge }

// DecodeError says which command and field did not decode. It wraps one of ErrMalformed,
// ErrUnknownCommand or ErrUnsupportedVersion.
type DecodeError struct {
	Key     Key
	Version uint16
	Field   string // empty when the problem is the key or version
	Reason  string
	Err     error
}

func (e *DecodeError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("stream wire: %s v%d: %s", e.Key, e.Version, e.Reason)
	}
	return fmt.Sprintf("stream wire: %s v%d: field %s: %s", e.Key, e.Version, e.Field, e.Reason)
}

func (e *DecodeError) Unwrap() error { return e.Err }

func errorf(format string, args ...any) error {
	return fmt.Errorf("stream wire: "+format+": %w", append(args, ErrEncode)...)
}
