package storage

import "encoding/binary"

// Key prefixes: the first byte of every key names its keyspace. Integers in keys are big-endian and fixed
// width so that byte order equals numeric order; names never appear in message keys.
const (
	PrefixMeta         byte = 0x01 // metadata: 0x01 | kind u8 | name bytes (vhost "/" only for now)
	PrefixMessage      byte = 0x02 // 0x02 | queueID u64 | msgID u64
	PrefixQueueState   byte = 0x03 // 0x03 | queueID u64 (+ suffix)
	PrefixRaftLog      byte = 0x10 // 0x10 | group u64 | index u64
	PrefixRaftStable   byte = 0x11 // 0x11 | group u64 | key
	PrefixRaftApplied  byte = 0x12 // 0x12 | group u64
	PrefixStreamChunk  byte = 0x20 // 0x20 | stream u64 | firstOffset u64
	PrefixStreamOffset byte = 0x21 // 0x21 | stream u64 | consumer name
	PrefixStreamMeta   byte = 0x22 // 0x22 | stream u64
	PrefixSeq          byte = 0x30 // 0x30 | name : persistent counters (e.g. next queue id)

	prefixReclaim byte = 0x7f // one key, written and dropped at once by reclaim (reclaim.go)
)

// U64Key returns prefix | a (8 bytes, big-endian) | rest... concatenated.
func U64Key(prefix byte, a uint64, rest ...[]byte) []byte {
	n := 9
	for _, r := range rest {
		n += len(r)
	}
	k := make([]byte, 9, n)
	k[0] = prefix
	binary.BigEndian.PutUint64(k[1:9], a)
	for _, r := range rest {
		k = append(k, r...)
	}
	return k
}

// U64U64Key returns prefix | a | b, both 8 bytes big-endian (17 bytes).
func U64U64Key(prefix byte, a, b uint64) []byte {
	return AppendU64U64Key(make([]byte, 0, 17), prefix, a, b)
}

// AppendU64U64Key appends prefix | a | b to dst and returns the extended slice. It lets hot paths reuse
// a key buffer.
func AppendU64U64Key(dst []byte, prefix byte, a, b uint64) []byte {
	dst = append(dst, prefix)
	dst = binary.BigEndian.AppendUint64(dst, a)
	return binary.BigEndian.AppendUint64(dst, b)
}

// ParseU64U64Key splits a key made by U64U64Key. ok is false when k is not exactly 17 bytes with the
// given prefix.
func ParseU64U64Key(prefix byte, k []byte) (a, b uint64, ok bool) {
	if len(k) != 17 || k[0] != prefix {
		return 0, 0, false
	}
	return binary.BigEndian.Uint64(k[1:9]), binary.BigEndian.Uint64(k[9:17]), true
}

// ParseU64Key returns the first integer of a key made by U64Key and the bytes after it. ok is false when k
// is shorter than 9 bytes or has another prefix.
func ParseU64Key(prefix byte, k []byte) (a uint64, rest []byte, ok bool) {
	if len(k) < 9 || k[0] != prefix {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(k[1:9]), k[9:], true
}

// MetaKey is the key of a metadata record: 0x01 | kind | name.
func MetaKey(kind byte, name string) []byte {
	k := make([]byte, 2, 2+len(name))
	k[0], k[1] = PrefixMeta, kind
	return append(k, name...)
}

// MetaPrefix is the prefix of every metadata record of one kind.
func MetaPrefix(kind byte) []byte { return []byte{PrefixMeta, kind} }

// ParseMetaKey returns the kind and name of a metadata key.
func ParseMetaKey(k []byte) (kind byte, name string, ok bool) {
	if len(k) < 2 || k[0] != PrefixMeta {
		return 0, "", false
	}
	return k[1], string(k[2:]), true
}

// MessageKey is the key of one stored message: 0x02 | queueID | msgID.
func MessageKey(queueID, msgID uint64) []byte { return U64U64Key(PrefixMessage, queueID, msgID) }

// AppendMessageKey appends MessageKey(queueID, msgID) to dst.
func AppendMessageKey(dst []byte, queueID, msgID uint64) []byte {
	return AppendU64U64Key(dst, PrefixMessage, queueID, msgID)
}

// MessagePrefix is the prefix of every message of one queue.
func MessagePrefix(queueID uint64) []byte { return U64Key(PrefixMessage, queueID) }

// ParseMessageKey splits a MessageKey.
func ParseMessageKey(k []byte) (queueID, msgID uint64, ok bool) {
	return ParseU64U64Key(PrefixMessage, k)
}

// QueueStateKey is the key of a queue's persistent state: 0x03 | queueID | suffix.
func QueueStateKey(queueID uint64, suffix ...[]byte) []byte {
	return U64Key(PrefixQueueState, queueID, suffix...)
}

// RaftLogKey is the key of one raft log entry: 0x10 | group | index.
func RaftLogKey(group, index uint64) []byte { return U64U64Key(PrefixRaftLog, group, index) }

// RaftLogPrefix is the prefix of every log entry of one raft group.
func RaftLogPrefix(group uint64) []byte { return U64Key(PrefixRaftLog, group) }

// ParseRaftLogKey splits a RaftLogKey.
func ParseRaftLogKey(k []byte) (group, index uint64, ok bool) {
	return ParseU64U64Key(PrefixRaftLog, k)
}

// RaftStableKey is the key of a raft stable-store entry: 0x11 | group | key.
func RaftStableKey(group uint64, key []byte) []byte { return U64Key(PrefixRaftStable, group, key) }

// RaftAppliedKey is the key of a raft group's last applied index: 0x12 | group.
func RaftAppliedKey(group uint64) []byte { return U64Key(PrefixRaftApplied, group) }

// StreamChunkKey is the key of one stream chunk: 0x20 | stream | first offset in the chunk.
func StreamChunkKey(stream, first uint64) []byte { return U64U64Key(PrefixStreamChunk, stream, first) }

// StreamChunkPrefix is the prefix of every chunk of one stream.
func StreamChunkPrefix(stream uint64) []byte { return U64Key(PrefixStreamChunk, stream) }

// ParseStreamChunkKey splits a StreamChunkKey.
func ParseStreamChunkKey(k []byte) (stream, first uint64, ok bool) {
	return ParseU64U64Key(PrefixStreamChunk, k)
}

// StreamOffsetKey is the key of a consumer's tracked offset: 0x21 | stream | consumer name.
func StreamOffsetKey(stream uint64, consumer string) []byte {
	return U64Key(PrefixStreamOffset, stream, []byte(consumer))
}

// StreamOffsetPrefix is the prefix of every tracked offset of one stream.
func StreamOffsetPrefix(stream uint64) []byte { return U64Key(PrefixStreamOffset, stream) }

// ParseStreamOffsetKey splits a StreamOffsetKey.
func ParseStreamOffsetKey(k []byte) (stream uint64, consumer string, ok bool) {
	s, rest, ok := ParseU64Key(PrefixStreamOffset, k)
	return s, string(rest), ok
}

// StreamMetaKey is the key of a stream's metadata record: 0x22 | stream.
func StreamMetaKey(stream uint64) []byte { return U64Key(PrefixStreamMeta, stream) }

// SeqKey is the key of a persistent counter: 0x30 | name.
func SeqKey(name string) []byte {
	k := make([]byte, 1, 1+len(name))
	k[0] = PrefixSeq
	return append(k, name...)
}
