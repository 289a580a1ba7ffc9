package core

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"

	"warren/amqp"
	"warren/exchange"
	"warren/storage"
)

// The metadata is a set of typed records, one per durable object: a change writes (or, in the
// metadata raft group, replicates) that record only, and recovery reads them all once. Keys:
//
//	PrefixMeta 'F'                                   format version of the records (metaFormat)
//	PrefixMeta 'A'                                   last metadata-group index in the records
//	PrefixMeta 'X' vhost name                        exchange
//	PrefixMeta 'Q' vhost name                        queue (of any type)
//	PrefixMeta 'B' vhost source kind dest key args#  binding
//	PrefixMeta 'L' / 'K'                             as 'Q' / 'B', for records of this node only
//
// where vhost, source, dest and key are uvarint-length-prefixed and args# is the FNV-64 of the
// encoded binding arguments (AMQP tables encode with sorted keys, so equal arguments hash the
// same). Values are a version byte followed by an AMQP table of the record's fields, so fields
// can be added without a new version. Format 1 (before this layout) kept every record of the one
// vhost under lowercase kinds; migrateV1 converts it at the first start.
const (
	kindFormat   byte = 'F'
	kindApplied  byte = 'A'
	kindExchange byte = 'X'
	kindQueue    byte = 'Q'
	kindBinding  byte = 'B'
	// Records of this node only (not replicated): durable queues served by this node alone and
	// bindings from a durable exchange to them.
	kindLocalQueue   byte = 'L'
	kindLocalBinding byte = 'K'
)

// metaFormat is the version of the record layout written by this code.
const metaFormat = 2

// recordVersion is the first byte of every record value.
const recordVersion = 1

// ExchangeRecord is a durable exchange.
type ExchangeRecord struct {
	VHost, Name, Type    string
	AutoDelete, Internal bool
	Args                 amqp.Table
}

// QueueRecord is a durable queue of any type.
type QueueRecord struct {
	VHost, Name string
	// ID names the queue in storage keys and is its raft group id when it is replicated: chosen
	// at random by the node that proposed the declaration, so every node agrees on it.
	ID         uint64
	Kind       string // x-queue-type: classic, quorum or stream
	AutoDelete bool
	Args       amqp.Table
	// Voters and Nonvoters are the initial members of a replicated queue's raft group (quorum
	// queues, and durable classic queues in a cluster); empty for a queue served by one node.
	Voters, Nonvoters []string
}

// BindingRecord is a binding between durable ends.
type BindingRecord struct {
	VHost string
	exchange.Binding
}

func appendLP(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func metaKey(kind byte, vhost string, rest ...string) []byte {
	k := []byte{storage.PrefixMeta, kind}
	k = appendLP(k, vhost)
	for i, r := range rest {
		if i == len(rest)-1 && kind != kindBinding {
			k = append(k, r...) // the name ends the key: no length needed
			continue
		}
		k = appendLP(k, r)
	}
	return k
}

func (r *ExchangeRecord) key() []byte { return metaKey(kindExchange, r.VHost, r.Name) }
func (r *QueueRecord) key() []byte    { return metaKey(kindQueue, r.VHost, r.Name) }

func (r *BindingRecord) key() []byte {
	k := metaKey(kindBinding, r.VHost, r.Source)
	k = append(k, byte(r.DestKind))
	k = appendLP(k, r.Dest)
	k = appendLP(k, r.Key)
	h := fnv.New64a()
	h.Write(encodeTable(r.Args))
	return binary.BigEndian.AppendUint64(k, h.Sum64())
}

// encodeTable encodes a table that came from decoded client input or from our own fields, so every
// value has a wire type; the lenient fallback keeps a record writable even if that ever fails.
func encodeTable(t amqp.Table) []byte {
	b, err := amqp.AppendTable(nil, t)
	if err != nil {
		b, _ = amqp.AppendTable(nil, nil)
	}
	return b
}

func encodeRecord(t amqp.Table) []byte {
	return append([]byte{recordVersion}, encodeTable(t)...)
}

var errBadRecord = errors.New("malformed metadata record")

func decodeRecord(b []byte) (amqp.Table, error) {
	if len(b) < 1 || b[0] != recordVersion {
		return nil, errBadRecord
	}
	t, _, err := amqp.DecodeTable(b[1:])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadRecord, err)
	}
	return t, nil
}

func (r *ExchangeRecord) encode() []byte {
	return encodeRecord(amqp.Table{"vhost": r.VHost, "name": r.Name, "type": r.Type,
		"auto_delete": r.AutoDelete, "internal": r.Internal, "arguments": r.Args})
}

func (r *QueueRecord) encode() []byte {
	t := amqp.Table{"vhost": r.VHost, "name": r.Name, "id": int64(r.ID), "type": r.Kind,
		"auto_delete": r.AutoDelete, "arguments": r.Args}
	if len(r.Voters) > 0 {
		t["voters"], t["nonvoters"] = anys(r.Voters), anys(r.Nonvoters)
	}
	return encodeRecord(t)
}

func (r *BindingRecord) encode() []byte {
	return encodeRecord(amqp.Table{"vhost": r.VHost, "source": r.Source, "destination": r.Dest,
		"destination_type": r.DestKind.String(), "routing_key": r.Key, "arguments": r.Args})
}

func str(t amqp.Table, k string) string {
	switch v := t[k].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

func boolean(t amqp.Table, k string) bool { b, _ := t[k].(bool); return b }

func table(t amqp.Table, k string) amqp.Table { x, _ := t[k].(amqp.Table); return x }

func decodeExchange(b []byte) (ExchangeRecord, error) {
	t, err := decodeRecord(b)
	if err != nil {
		return ExchangeRecord{}, err
	}
	return ExchangeRecord{VHost: str(t, "vhost"), Name: str(t, "name"), Type: str(t, "type"),
		AutoDelete: boolean(t, "auto_delete"), Internal: boolean(t, "internal"), Args: table(t, "arguments")}, nil
}

func decodeQueue(b []byte) (QueueRecord, error) {
	t, err := decodeRecord(b)
	if err != nil {
		return QueueRecord{}, err
	}
	id, _ := amqp.AsInt64(t["id"])
	return QueueRecord{VHost: str(t, "vhost"), Name: str(t, "name"), ID: uint64(id), Kind: str(t, "type"),
		AutoDelete: boolean(t, "auto_delete"), Args: table(t, "arguments"),
		Voters: stringList(t["voters"]), Nonvoters: stringList(t["nonvoters"])}, nil
}

func decodeBinding(b []byte) (BindingRecord, error) {
	t, err := decodeRecord(b)
	if err != nil {
		return BindingRecord{}, err
	}
	r := BindingRecord{VHost: str(t, "vhost")}
	r.Source, r.Dest, r.Key, r.Args = str(t, "source"), str(t, "destination"), str(t, "routing_key"), table(t, "arguments")
	r.DestKind = exchange.ToQueue
	if str(t, "destination_type") == "exchange" {
		r.DestKind = exchange.ToExchange
	}
	return r, nil
}

func stringList(v any) []string {
	arr, _ := v.([]any)
	out := make([]string, 0, len(arr))
	for _, x := range arr {
		switch s := x.(type) {
		case string:
			out = append(out, s)
		case []byte:
			out = append(out, string(s))
		}
	}
	return out
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
