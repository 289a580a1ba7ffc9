package amqp

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrMalformed is wrapped by every error caused by truncated or invalid wire
// data.
var ErrMalformed = errors.New("amqp: malformed data")

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
// formatted message, truncated to 255 bytes (on a UTF-8 boundary) so that it
// fits the reply-text shortstr.
func Errorf(code uint16, format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	if name := ReplyName(code); name != "" {
		msg = name + " - " + msg
	}
	return &Error{Code: code, Text: truncateShortstr(msg)}
}

// truncateShortstr cuts s to at most 255 bytes without splitting a UTF-8
// sequence (when s is valid UTF-8).
func truncateShortstr(s string) string {
	if len(s) <= maxShortstr {
		return s
	}
	n := maxShortstr
	for n > 0 && n > maxShortstr-utf8.UTFMax && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
