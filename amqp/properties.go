package amqp

import (
	"encoding/binary"
	"fmt"
	"time"
)

// Presence flags of the basic class content properties, as on the wire.
const (
	FlagContentType     uint16 = 0x8000
	FlagContentEncoding uint16 = 0x4000
	FlagHeaders         uint16 = 0x2000
	FlagDeliveryMode    uint16 = 0x1000
	FlagPriority        uint16 = 0x0800
	FlagCorrelationID   uint16 = 0x0400
	FlagReplyTo         uint16 = 0x0200
	FlagExpiration      uint16 = 0x0100
	FlagMessageID       uint16 = 0x0080
	FlagTimestamp       uint16 = 0x0040
	FlagType            uint16 = 0x0020
	FlagUserID          uint16 = 0x0010
	FlagAppID           uint16 = 0x0008
	FlagClusterID       uint16 = 0x0004

	// flagContinuation marks that another 16-bit flag word follows.
	flagContinuation uint16 = 0x0001
	// flagsKnown are the flags of the basic class properties.
	flagsKnown uint16 = 0xFFFC
)

// Properties are the basic class content header properties.
type Properties struct {
	ContentType, ContentEncoding string
	Headers                      Table
	DeliveryMode                 uint8
	Priority                     uint8
	CorrelationID, ReplyTo       string
	Expiration, MessageID        string
	Timestamp                    time.Time // zero = absent
	Type, UserID, AppID          string
	ClusterID                    string
	// Flags holds the presence bits as on the wire. DecodeProperties fills
	// it; Append uses it if non-zero and otherwise derives it from the
	// non-zero fields (a non-nil Headers counts as present).
	Flags uint16
}

// DecodeProperties decodes raw property bytes (flags then fields: the part of
// a content header payload after body-size). Errors wrap ErrMalformed.
func DecodeProperties(raw []byte) (Properties, error) {
	var p Properties
	flags, off, ok := readPropertyFlags(raw)
	if !ok {
		return p, fmt.Errorf("amqp: decoding properties: flags truncated: %w", ErrMalformed)
	}
	p.Flags = flags
	d := decoder{b: raw, off: off}
	if flags&FlagContentType != 0 {
		p.ContentType = d.shortstr()
	}
	if flags&FlagContentEncoding != 0 {
		p.ContentEncoding = d.shortstr()
	}
	if flags&FlagHeaders != 0 {
		p.Headers = d.table()
	}
	if flags&FlagDeliveryMode != 0 {
		p.DeliveryMode = d.octet()
	}
	if flags&FlagPriority != 0 {
		p.Priority = d.octet()
	}
	if flags&FlagCorrelationID != 0 {
		p.CorrelationID = d.shortstr()
	}
	if flags&FlagReplyTo != 0 {
		p.ReplyTo = d.shortstr()
	}
	if flags&FlagExpiration != 0 {
		p.Expiration = d.shortstr()
	}
	if flags&FlagMessageID != 0 {
		p.MessageID = d.shortstr()
	}
	if flags&FlagTimestamp != 0 {
		p.Timestamp = d.timestamp()
	}
	if flags&FlagType != 0 {
		p.Type = d.shortstr()
	}
	if flags&FlagUserID != 0 {
		p.UserID = d.shortstr()
	}
	if flags&FlagAppID != 0 {
		p.AppID = d.shortstr()
	}
	if flags&FlagClusterID != 0 {
		p.ClusterID = d.shortstr()
	}
	if d.err != nil {
		return Properties{}, fmt.Errorf("amqp: decoding properties: %w", d.err)
	}
	return p, nil
}

// readPropertyFlags returns the first flag word (without the continuation
// bit) and the offset of the first property field. Further flag words, which
// the basic class never needs, are skipped.
func readPropertyFlags(raw []byte) (flags uint16, off int, ok bool) {
	for {
		if len(raw)-off < 2 {
			return 0, 0, false
		}
		w := binary.BigEndian.Uint16(raw[off:])
		if off == 0 {
			flags = w & flagsKnown
		}
		off += 2
		if w&flagContinuation == 0 {
			return flags, off, true
		}
	}
}

// presentFlags derives the presence flags from the non-zero fields.
func (p *Properties) presentFlags() uint16 {
	var f uint16
	set := func(cond bool, flag uint16) {
		if cond {
			f |= flag
		}
	}
	set(p.ContentType != "", FlagContentType)
	set(p.ContentEncoding != "", FlagContentEncoding)
	set(p.Headers != nil, FlagHeaders)
	set(p.DeliveryMode != 0, FlagDeliveryMode)
	set(p.Priority != 0, FlagPriority)
	set(p.CorrelationID != "", FlagCorrelationID)
	set(p.ReplyTo != "", FlagReplyTo)
	set(p.Expiration != "", FlagExpiration)
	set(p.MessageID != "", FlagMessageID)
	set(!p.Timestamp.IsZero(), FlagTimestamp)
	set(p.Type != "", FlagType)
	set(p.UserID != "", FlagUserID)
	set(p.AppID != "", FlagAppID)
	set(p.ClusterID != "", FlagClusterID)
	return f
}

// Append appends the flags and the present fields to b. Header values of
// unsupported Go types are encoded as void; strings longer than 255 bytes are
// truncated.
func (p *Properties) Append(b []byte) []byte {
	flags := p.Flags & flagsKnown
	if flags == 0 {
		flags = p.presentFlags()
	}
	b = binary.BigEndian.AppendUint16(b, flags)
	if flags&FlagContentType != 0 {
		b = appendShortstr(b, p.ContentType)
	}
	if flags&FlagContentEncoding != 0 {
		b = appendShortstr(b, p.ContentEncoding)
	}
	if flags&FlagHeaders != 0 {
		b = appendTable(b, p.Headers)
	}
	if flags&FlagDeliveryMode != 0 {
		b = append(b, p.DeliveryMode)
	}
	if flags&FlagPriority != 0 {
		b = append(b, p.Priority)
	}
	if flags&FlagCorrelationID != 0 {
		b = appendShortstr(b, p.CorrelationID)
	}
	if flags&FlagReplyTo != 0 {
		b = appendShortstr(b, p.ReplyTo)
	}
	if flags&FlagExpiration != 0 {
		b = appendShortstr(b, p.Expiration)
	}
	if flags&FlagMessageID != 0 {
		b = appendShortstr(b, p.MessageID)
	}
	if flags&FlagTimestamp != 0 {
		b = appendTimestamp(b, p.Timestamp)
	}
	if flags&FlagType != 0 {
		b = appendShortstr(b, p.Type)
	}
	if flags&FlagUserID != 0 {
		b = appendShortstr(b, p.UserID)
	}
	if flags&FlagAppID != 0 {
		b = appendShortstr(b, p.AppID)
	}
	if flags&FlagClusterID != 0 {
		b = appendShortstr(b, p.ClusterID)
	}
	return b
}

// skipShortstr returns the offset after the shortstr at off, or -1.
func skipShortstr(raw []byte, off int) int {
	if off < 0 || off >= len(raw) {
		return -1
	}
	end := off + 1 + int(raw[off])
	if end > len(raw) {
		return -1
	}
	return end
}

// PropsDeliveryMode returns the delivery-mode property from raw property
// bytes without allocating: 0 if absent or malformed.
func PropsDeliveryMode(raw []byte) uint8 {
	flags, off, ok := readPropertyFlags(raw)
	if !ok || flags&FlagDeliveryMode == 0 {
		return 0
	}
	if flags&FlagContentType != 0 {
		off = skipShortstr(raw, off)
	}
	if flags&FlagContentEncoding != 0 {
		off = skipShortstr(raw, off)
	}
	if flags&FlagHeaders != 0 {
		if off < 0 || len(raw)-off < 4 {
			return 0
		}
		n := binary.BigEndian.Uint32(raw[off:])
		if uint64(n) > uint64(len(raw)-off-4) {
			return 0
		}
		off += 4 + int(n)
	}
	if off < 0 || off >= len(raw) {
		return 0
	}
	return raw[off]
}

// PropsHasHeaders reports whether raw property bytes carry the headers
// property.
func PropsHasHeaders(raw []byte) bool {
	flags, _, ok := readPropertyFlags(raw)
	return ok && flags&FlagHeaders != 0
}
