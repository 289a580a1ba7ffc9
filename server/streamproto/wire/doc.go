// Package wire is the codec of RabbitMQ's binary stream protocol (the one its stream clients speak
// on port 5552), as RabbitMQ 3.13/4.x implements it in rabbit_stream_core.erl: frames, every
// command key and version, response codes and offset specifications.
//
// A frame on the wire is a uint32 size followed by that many bytes: a uint16 key (the top bit set
// on responses), a uint16 version and the command's fields. Strings are a uint16 length and UTF-8
// bytes, byte blobs a uint32 length (-1 for none), arrays a uint32 count and the elements; all
// integers are big-endian.
//
// Reading: a Reader returns one frame at a time from a reused buffer, refusing a frame whose size
// is over the negotiated maximum before it reads or allocates for it. Decode turns a frame into a
// Command; each command type also decodes into a caller's value (its Decode method), which is how
// the hot paths avoid allocation: Publish.Decode reuses its Messages slice and every message, filter
// value and sub-entry batch it yields is a slice of the frame, valid until the next read.
//
// Writing: every command's Append adds one whole frame (size prefix included) to a caller's []byte.
// For Deliver, AppendDeliverHeader writes only the frame start, so that a stored chunk can follow
// it unchanged (from memory or with sendfile).
//
// Decoding never panics: a truncated or over-long field, a count larger than the bytes that
// follow, trailing bytes, an unknown key or an unsupported version all return an error that wraps
// ErrMalformed, ErrUnknownCommand or ErrUnsupportedVersion and names the command and field.
package wire
