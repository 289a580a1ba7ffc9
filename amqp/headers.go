package amqp

import "encoding/binary"

// WithHeader returns raw basic properties with one header set to v, or removed when v is nil. The
// original bytes are never modified (other queues may share them); properties that cannot be
// decoded come back unchanged. Queues use it to add x-delivery-count, x-stream-offset and the
// like to a delivered copy, once per delivery: adding a header the properties do not have yet
// (the common case) splices its entry into a copy of the encoded properties, without decoding
// them or encoding them again.
func WithHeader(raw []byte, name string, v any) []byte {
	if f, ok := walkProperties(raw, name); ok && !f.has {
		if v == nil {
			return raw
		}
		if out, ok := spliceHeader(raw, f, name, v); ok {
			return out
		}
	}
	props, err := DecodeProperties(raw)
	if err != nil {
		return raw
	}
	if _, ok := props.Headers[name]; !ok && v == nil {
		return raw
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

// headersField is where raw properties keep their headers.
type headersField struct {
	at, end int  // the field's bytes (the 4-byte length, then the table); at == end without one
	table   bool // the properties have a headers table
	has     bool // the table holds the name looked for
}

// walkProperties checks raw properties as DecodeProperties decodes them, without building
// anything, and finds their headers field and whether name is in it. ok is false when
// DecodeProperties would refuse raw, and for a second flag word (never used by the basic class).
func walkProperties(raw []byte, name string) (f headersField, ok bool) {
	if len(raw) < 2 || raw[1]&byte(flagContinuation) != 0 {
		return f, false
	}
	flags := binary.BigEndian.Uint16(raw) & flagsKnown
	off := 2
	shortstr := func() bool {
		if off >= len(raw) {
			return false
		}
		off += 1 + int(raw[off])
		return off <= len(raw)
	}
	fixed := func(n int) bool {
		off += n
		return off <= len(raw)
	}
	if flags&FlagContentType != 0 && !shortstr() || flags&FlagContentEncoding != 0 && !shortstr() {
		return f, false
	}
	f.at, f.end = off, off
	if flags&FlagHeaders != 0 {
		body, err := sizedBlock(raw[off:], "table")
		if err != nil {
			return f, false
		}
		has, ok := walkTable(body, 0, name)
		if !ok {
			return f, false
		}
		f.table, f.has = true, has
		off += 4 + len(body)
		f.end = off
	}
	for _, field := range []struct {
		flag uint16
		size int // 0: a shortstr
	}{
		{FlagDeliveryMode, 1}, {FlagPriority, 1}, {FlagCorrelationID, 0}, {FlagReplyTo, 0},
		{FlagExpiration, 0}, {FlagMessageID, 0}, {FlagTimestamp, 8}, {FlagType, 0},
		{FlagUserID, 0}, {FlagAppID, 0}, {FlagClusterID, 0},
	} {
		if flags&field.flag == 0 {
			continue
		}
		if field.size == 0 && !shortstr() || field.size > 0 && !fixed(field.size) {
			return f, false
		}
	}
	return f, true
}

// walkTable checks a table's entries (body, after its length) as decodeTable decodes them, and
// reports whether one of them is called name.
func walkTable(body []byte, depth int, name string) (has, ok bool) {
	if depth > maxTableDepth {
		return false, false
	}
	for off := 0; off < len(body); {
		kl := int(body[off])
		off++
		if len(body)-off < kl {
			return false, false
		}
		if string(body[off:off+kl]) == name {
			has = true
		}
		off += kl
		n, ok := walkValue(body[off:], depth)
		if !ok {
			return false, false
		}
		off += n
	}
	return has, true
}

// walkValue checks one field value as decodeValue decodes it and returns its size.
func walkValue(b []byte, depth int) (int, bool) {
	if len(b) < 1 {
		return 0, false
	}
	tag, p := b[0], b[1:]
	if n := fixedSize(tag); n > 0 {
		return 1 + n, len(p) >= n
	}
	switch tag {
	case 'S', 'x':
		s, err := sizedBlock(p, "string")
		return 5 + len(s), err == nil
	case 'A':
		if depth+1 > maxTableDepth {
			return 0, false
		}
		body, err := sizedBlock(p, "array")
		if err != nil {
			return 0, false
		}
		for off := 0; off < len(body); {
			n, ok := walkValue(body[off:], depth+1)
			if !ok {
				return 0, false
			}
			off += n
		}
		return 5 + len(body), true
	case 'F':
		body, err := sizedBlock(p, "table")
		if err != nil {
			return 0, false
		}
		if _, ok := walkTable(body, depth+1, ""); !ok {
			return 0, false
		}
		return 5 + len(body), true
	case 'V':
		return 1, true
	}
	return 0, false
}

// spliceHeader returns a copy of raw with the entry name = v added at the end of the headers
// table f describes (a table is added when there is none). ok is false when the entry cannot be
// encoded: a name too long for a table key, or a value AppendFieldValue refuses.
func spliceHeader(raw []byte, f headersField, name string, v any) (out []byte, ok bool) {
	if len(name) > 255 {
		return nil, false
	}
	var buf [64]byte
	entry := append(buf[:0], byte(len(name)))
	entry = append(entry, name...)
	entry, err := AppendFieldValue(entry, v)
	if err != nil {
		return nil, false
	}
	if f.table {
		n := binary.BigEndian.Uint32(raw[f.at:])
		out = make([]byte, 0, len(raw)+len(entry))
		out = append(out, raw[:f.at]...)
		out = binary.BigEndian.AppendUint32(out, n+uint32(len(entry)))
		out = append(out, raw[f.at+4:f.end]...)
		out = append(out, entry...)
		return append(out, raw[f.end:]...), true
	}
	out = make([]byte, 0, len(raw)+4+len(entry))
	out = append(out, raw[0]|byte(FlagHeaders>>8), raw[1])
	out = append(out, raw[2:f.at]...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(entry)))
	out = append(out, entry...)
	return append(out, raw[f.at:]...), true
}
