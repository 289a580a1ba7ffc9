package amqp

import "encoding/binary"

// WithHeader returns raw basic properties with one header set to v, or removed when v is nil. The
// original bytes are never modified (other queues may share them); properties that cannot be
// decoded come back unchanged. Queues use it to add x-delivery-count, x-stream-offset and the
// like to a delivered copy, once per delivery: adding a header the properties do not have yet
// (the common case) splices its entry into the encoded properties instead of encoding them all
// again.
func WithHeader(raw []byte, name string, v any) []byte {
	props, err := DecodeProperties(raw)
	if err != nil {
		return raw
	}
	_, had := props.Headers[name]
	if !had && v == nil {
		return raw
	}
	if !had {
		if out, ok := spliceHeader(raw, props.Flags, name, v); ok {
			return out
		}
	}
	h := make(Table, len(props.Headers)+1)
	for k, x := range props.Headers {
		h[k] = x
	}
	if v == nil {
		delete(h, name)
	} else {
		h[name] = v
	}
	props.Headers = h
	props.Flags = 0
	return props.Append(nil)
}

// spliceHeader returns a copy of raw, valid properties whose headers do not hold name, with the
// entry name = v added at the end of the headers table (a table is added when there is none). ok
// is false when it cannot: a name too long for a table key, a value AppendFieldValue refuses, or
// a second flag word.
func spliceHeader(raw []byte, flags uint16, name string, v any) (out []byte, ok bool) {
	if len(name) > 255 || raw[1]&1 != 0 {
		return nil, false
	}
	var buf [64]byte
	entry := append(buf[:0], byte(len(name)))
	entry = append(entry, name...)
	entry, err := AppendFieldValue(entry, v)
	if err != nil {
		return nil, false
	}
	// raw was decoded, so the offsets below are in range.
	at := 2 // the headers field, or where it goes: after content-type and content-encoding
	if flags&FlagContentType != 0 {
		at += 1 + int(raw[at])
	}
	if flags&FlagContentEncoding != 0 {
		at += 1 + int(raw[at])
	}
	if flags&FlagHeaders != 0 {
		n := binary.BigEndian.Uint32(raw[at:])
		end := at + 4 + int(n)
		out = make([]byte, 0, len(raw)+len(entry))
		out = append(out, raw[:at]...)
		out = binary.BigEndian.AppendUint32(out, n+uint32(len(entry)))
		out = append(out, raw[at+4:end]...)
		out = append(out, entry...)
		return append(out, raw[end:]...), true
	}
	out = make([]byte, 0, len(raw)+4+len(entry))
	out = append(out, raw[0]|byte(FlagHeaders>>8), raw[1])
	out = append(out, raw[2:at]...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(entry)))
	out = append(out, entry...)
	return append(out, raw[at:]...), true
}
