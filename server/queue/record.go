package queue

import (
	"encoding/binary"
	"errors"
)

// recordVersion is the first byte of every stored message record, so the format can evolve.
const recordVersion = 1

// record flag bits.
const (
	recPersistent = 1 << iota
)

var errBadRecord = errors.New("queue: malformed message record")

// encodeRecord appends a stored message: version, flags, delivery count, exchange, routing key,
// properties and body.
func encodeRecord(dst []byte, m *Message, deliveryCount uint32) []byte {
	var flags byte
	if m.Persistent {
		flags |= recPersistent
	}
	dst = append(dst, recordVersion, flags)
	dst = binary.BigEndian.AppendUint32(dst, deliveryCount)
	dst = append(dst, byte(len(m.Exchange)))
	dst = append(dst, m.Exchange...)
	dst = append(dst, byte(len(m.RoutingKey)))
	dst = append(dst, m.RoutingKey...)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(m.Props)))
	dst = append(dst, m.Props...)
	return append(dst, m.Body...)
}

// decodeRecord parses a stored message. The message's slices alias b.
func decodeRecord(b []byte) (*Message, uint32, error) {
	if len(b) < 7 || b[0] != recordVersion {
		return nil, 0, errBadRecord
	}
	m := &Message{Persistent: b[1]&recPersistent != 0}
	count := binary.BigEndian.Uint32(b[2:])
	b = b[6:]
	n := int(b[0])
	if len(b) < 1+n+1 {
		return nil, 0, errBadRecord
	}
	m.Exchange = string(b[1 : 1+n])
	b = b[1+n:]
	n = int(b[0])
	if len(b) < 1+n+4 {
		return nil, 0, errBadRecord
	}
	m.RoutingKey = string(b[1 : 1+n])
	b = b[1+n:]
	pl := int(binary.BigEndian.Uint32(b))
	b = b[4:]
	if pl > len(b) {
		return nil, 0, errBadRecord
	}
	m.Props = b[:pl:pl]
	m.Body = b[pl:]
	return m, count, nil
}
