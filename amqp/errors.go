package amqp

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrMalformed is wrapped by every error caused by truncated or invalid wire
// data.
var ErrMalformed = errors.New("amqp: malformed data")

// errFraming is wrapped by the decoder errors that make a *FramingError: a field that runs past
// the end of the method's arguments, or bytes left over after the last field.
var errFraming = fmt.Errorf("arguments do not fill their frame: %w", ErrMalformed)

// FramingError is a method whose arguments do not fill its frame exactly: a field runs past the
// end of the frame (a truncated frame, or a field table longer than what is left of it), or bytes
// are left over after the last field. RabbitMQ decodes the arguments with one binary pattern and
// answers a mismatch with connection.close 501 FRAME_ERROR "cannot decode <<...>>"; malformed data
// inside a field table of the right length is a different failure (see decodeError in server).
// It wraps ErrMalformed.
type FramingError struct {
	// ClassID and MethodID name the method.
	ClassID, MethodID uint16
	// Args holds the start of the arguments (a copy: at most framingArgsMax bytes, enough to fill
	// the 255-byte reply text).
	Args []byte
	err  error
}

// framingArgsMax bounds FramingError.Args: even bytes printed as one digit and a comma fill the
// reply text long before that.
const framingArgsMax = 128

func newFramingError(classID, methodID uint16, args []byte, err error) *FramingError {
	return &FramingError{ClassID: classID, MethodID: methodID, Args: append([]byte(nil), args[:min(len(args), framingArgsMax)]...), err: err}
}

// Error implements error.
func (e *FramingError) Error() string { return e.err.Error() }

// Unwrap returns the decoder's error, which wraps ErrMalformed.
func (e *FramingError) Unwrap() error { return e.err }

// Reply is the connection.close RabbitMQ sends for e: 501 "cannot decode <<0,0,5,...>>" with the
// arguments as Erlang prints a binary, and the method's ids.
func (e *FramingError) Reply() *Error {
	r := Errorf(FrameError, "cannot decode %s", erlangBinary(e.Args))
	r.ClassID, r.MethodID = e.ClassID, e.MethodID
	return r
}

// UnknownMethodError is returned by DecodeMethod for a class/method id pair
// that is not part of the protocol.
type UnknownMethodError struct{ ClassID, MethodID uint16 }

// Error implements error.
func (e *UnknownMethodError) Error() string {
	return fmt.Sprintf("amqp: unknown method (class %d, method %d)", e.ClassID, e.MethodID)
}

// Error is an AMQP close reason: a reply code and the full reply text
// ("NOT_FOUND - no queue 'q' in vhost '/'"), plus the class and method that
// caused it (0, 0 if none).
type Error struct {
	Code              uint16
	Text              string
	ClassID, MethodID uint16
}

// Error implements error.
func (e *Error) Error() string {
	if e.ClassID == 0 && e.MethodID == 0 {
		return fmt.Sprintf("amqp: %d %s", e.Code, e.Text)
	}
	return fmt.Sprintf("amqp: %d %s (class %d, method %d)", e.Code, e.Text, e.ClassID, e.MethodID)
}

// Hard reports whether the error closes the whole connection rather than
// just the channel.
func (e *Error) Hard() bool { return IsHardError(e.Code) }

// maxShortstr is the longest string a shortstr can carry.
const maxShortstr = 255

// Errorf builds an *Error whose Text is ReplyName(code) + " - " + the
// formatted message, cut as RabbitMQ cuts it to fit the reply-text shortstr:
// a text longer than 255 bytes keeps its first 252 (on a UTF-8 boundary) and
// ends in "...".
func Errorf(code uint16, format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	if name := ReplyName(code); name != "" {
		msg = name + " - " + msg
	}
	return &Error{Code: code, Text: truncateShortstr(msg)}
}

// truncateShortstr cuts a text longer than 255 bytes to its first 252 and
// "..." (RabbitMQ's rule), without splitting a UTF-8 sequence (when s is valid
// UTF-8).
func truncateShortstr(s string) string {
	if len(s) <= maxShortstr {
		return s
	}
	const keep = maxShortstr - len("...")
	n := keep
	for n > 0 && n > keep-utf8.UTFMax && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
