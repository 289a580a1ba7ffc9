// Package raftstore implements hashicorp/raft's LogStore and StableStore for one raft group on the node's
// shared storage DB (warren/storage). Many groups share one DB: their keys are separated by the group id
// (storage.RaftLogKey, storage.RaftStableKey).
//
// The first and last log index are loaded once when the Store is created and then kept in atomics, so
// FirstIndex and LastIndex never touch badger (badger iterators would walk the tombstones DeleteRange
// leaves behind). Every write goes through the DB's group committer and is durable when the call returns.
//
// Wrap the Store in raft.NewLogCache for the leader's replication reads. Exactly one Store may exist per
// group and DB at a time: the cached indexes are not shared.
package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"warren/storage"
)

// ErrKeyNotFound is returned by Get and GetUint64 for a key that was never set. Its text is exactly
// "not found": hashicorp/raft recognises a missing stable key by that text (as with raft-boltdb and
// raft.InmemStore).
var ErrKeyNotFound = errors.New("not found")

// deleteChunk bounds how many log deletions go into one storage batch, which bounds DeleteRange's memory.
const deleteChunk = 16384

// Store is the raft.LogStore and raft.StableStore of one raft group. It is safe for concurrent use.
type Store struct {
	db    *storage.DB
	group uint64

	// wmu serialises the log writes (StoreLogs, DeleteRange, Drop) with the updates of first and last.
	wmu   sync.Mutex
	first atomic.Uint64 // lowest stored index, 0 when the log is empty
	last  atomic.Uint64 // highest stored index, 0 when the log is empty
}

var (
	_ raft.LogStore    = (*Store)(nil)
	_ raft.StableStore = (*Store)(nil)
)

// New returns the Store of group on db, loading the first and last log index with one keys-only scan of
// the group's log.
func New(db *storage.DB, group uint64) (*Store, error) {
	if db == nil {
		return nil, errors.New("raftstore: new: nil storage DB")
	}
	s := &Store{db: db, group: group}
	if err := s.reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Group returns the raft group id the Store was created for.
func (s *Store) Group() uint64 { return s.group }

// reload recomputes first and last from the stored keys.
func (s *Store) reload() error {
	var first, last uint64
	err := s.db.Scan(storage.RaftLogPrefix(s.group), true, func(key, _ []byte) error {
		g, idx, ok := storage.ParseRaftLogKey(key)
		if !ok || g != s.group {
			return fmt.Errorf("raftstore: group %d: malformed log key %x", s.group, key)
		}
		if first == 0 {
			first = idx
		}
		last = idx
		return nil
	})
	if err != nil {
		return fmt.Errorf("raftstore: group %d: load log bounds: %w", s.group, err)
	}
	s.first.Store(first)
	s.last.Store(last)
	return nil
}

// FirstIndex returns the lowest stored log index, 0 for an empty log.
func (s *Store) FirstIndex() (uint64, error) { return s.first.Load(), nil }

// LastIndex returns the highest stored log index, 0 for an empty log.
func (s *Store) LastIndex() (uint64, error) { return s.last.Load(), nil }

// GetLog reads the entry at index into log. It returns raft.ErrLogNotFound when there is none.
func (s *Store) GetLog(index uint64, log *raft.Log) error {
	first := s.first.Load()
	if first == 0 || index < first || index > s.last.Load() {
		return raft.ErrLogNotFound
	}
	val, err := s.db.Get(storage.RaftLogKey(s.group, index))
	if errors.Is(err, storage.ErrNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return fmt.Errorf("raftstore: group %d: get log %d: %w", s.group, index, err)
	}
	if err := decodeLog(val, log); err != nil {
		return fmt.Errorf("raftstore: group %d: log %d: %w", s.group, index, err)
	}
	if log.Index != index {
		return fmt.Errorf("raftstore: group %d: log %d: %w: the entry records index %d",
			s.group, index, storage.ErrCorrupt, log.Index)
	}
	return nil
}

// StoreLog stores one log entry; it is durable when StoreLog returns.
func (s *Store) StoreLog(log *raft.Log) error {
	return s.StoreLogs([]*raft.Log{log})
}

// StoreLogs stores the entries in one storage batch; they are durable when StoreLogs returns. Entries need
// not be contiguous with the stored ones. Index 0 is refused: raft never uses it and FirstIndex and
// LastIndex use 0 for an empty log.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	lo, hi := ^uint64(0), uint64(0)
	size := 0
	for _, l := range logs {
		if l == nil {
			return fmt.Errorf("raftstore: group %d: store logs: nil entry", s.group)
		}
		if l.Index == 0 {
			return fmt.Errorf("raftstore: group %d: store logs: entry with index 0", s.group)
		}
		lo, hi = min(lo, l.Index), max(hi, l.Index)
		size += maxEncodedLen(l)
	}
	// One buffer for all keys and one for all values: the batch keeps sub-slices of them until the commit
	// is done, and nothing writes to a sub-slice once it was taken.
	keys := make([]byte, 0, 17*len(logs))
	vals := make([]byte, 0, size)
	var b storage.Batch
	for _, l := range logs {
		k := len(keys)
		keys = storage.AppendU64U64Key(keys, storage.PrefixRaftLog, s.group, l.Index)
		v := len(vals)
		vals = appendLog(vals, l)
		b.Set(keys[k:len(keys):len(keys)], vals[v:len(vals):len(vals)])
	}

	// Raft entries carry acknowledgements and settlements too, which must work on a nearly full disk so
	// that it can be drained; publishes into quorum queues are refused before they are proposed
	// (storage.DB.SpaceLow), so they do not take this room.
	b.UseReserve()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.db.CommitSync(&b); err != nil {
		// A batch larger than one badger transaction may be partly written: re-read the bounds.
		_ = s.reload()
		return fmt.Errorf("raftstore: group %d: store logs %d..%d: %w", s.group, lo, hi, err)
	}
	if first := s.first.Load(); first == 0 || lo < first {
		s.first.Store(lo)
	}
	if hi > s.last.Load() {
		s.last.Store(hi)
	}
	return nil
}

// DeleteRange deletes the entries with minIdx <= index <= maxIdx; it is durable when it returns. Deleting
// the head of the log (compaction) goes from low to high indexes and deleting the tail (a conflicting
// suffix) from high to low, so that a crash in the middle of a large range still leaves a contiguous log.
func (s *Store) DeleteRange(minIdx, maxIdx uint64) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	first, last := s.first.Load(), s.last.Load()
	if minIdx > maxIdx || first == 0 || maxIdx < first || minIdx > last {
		return nil
	}
	lo, hi := max(minIdx, first), min(maxIdx, last)
	ascending := !(hi == last && lo != first) // only a tail truncation goes downwards
	if err := s.deleteIndexes(lo, hi, ascending); err != nil {
		_ = s.reload()
		return fmt.Errorf("raftstore: group %d: delete logs %d..%d: %w", s.group, lo, hi, err)
	}
	switch {
	case lo == first && hi == last:
		s.first.Store(0)
		s.last.Store(0)
	case lo == first:
		next, err := s.storedAfter(hi)
		if err != nil {
			return fmt.Errorf("raftstore: group %d: delete logs %d..%d: find the new first index: %w",
				s.group, lo, hi, err)
		}
		s.first.Store(next)
	case hi == last:
		prev, err := s.storedBefore(lo)
		if err != nil {
			return fmt.Errorf("raftstore: group %d: delete logs %d..%d: find the new last index: %w",
				s.group, lo, hi, err)
		}
		s.last.Store(prev)
	}
	return nil
}

// deleteIndexes deletes every index in lo..hi, in chunks of deleteChunk keys, in the given direction.
func (s *Store) deleteIndexes(lo, hi uint64, ascending bool) error {
	n := hi - lo + 1
	keys := make([]byte, 0, 17*min(n, deleteChunk))
	var b storage.Batch
	for done := uint64(0); done < n; {
		keys = keys[:0]
		for ; done < n && b.Len() < deleteChunk; done++ {
			idx := lo + done
			if !ascending {
				idx = hi - done
			}
			k := len(keys)
			keys = storage.AppendU64U64Key(keys, storage.PrefixRaftLog, s.group, idx)
			b.Delete(keys[k:len(keys):len(keys)])
		}
		if err := s.db.CommitSync(&b); err != nil {
			return err
		}
	}
	return nil
}

// errStop ends a Scan early.
var errStop = errors.New("stop")

// storedAfter returns the lowest stored index above after. The log is nearly always contiguous, so it
// looks at after+1 first and scans only when there is a gap (raft may leave one behind a snapshot).
func (s *Store) storedAfter(after uint64) (uint64, error) {
	if _, err := s.db.Get(storage.RaftLogKey(s.group, after+1)); err == nil {
		return after + 1, nil
	} else if !errors.Is(err, storage.ErrNotFound) {
		return 0, err
	}
	var found uint64
	err := s.db.Scan(storage.RaftLogPrefix(s.group), true, func(key, _ []byte) error {
		if _, idx, ok := storage.ParseRaftLogKey(key); ok && idx > after {
			found = idx
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return 0, err
	}
	return found, nil
}

// storedBefore returns the highest stored index below before (0 if none), looking at before-1 first.
func (s *Store) storedBefore(before uint64) (uint64, error) {
	if before <= 1 {
		return 0, nil
	}
	if _, err := s.db.Get(storage.RaftLogKey(s.group, before-1)); err == nil {
		return before - 1, nil
	} else if !errors.Is(err, storage.ErrNotFound) {
		return 0, err
	}
	var found uint64
	err := s.db.Scan(storage.RaftLogPrefix(s.group), true, func(key, _ []byte) error {
		if _, idx, ok := storage.ParseRaftLogKey(key); ok {
			if idx >= before {
				return errStop
			}
			found = idx
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return 0, err
	}
	return found, nil
}

// Drop deletes the group's whole log, its stable keys and its applied index (storage.RaftAppliedKey), for
// a group that is being removed from this node. The Store is empty afterwards.
func (s *Store) Drop() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	prefixes := [][]byte{
		storage.RaftLogPrefix(s.group),
		storage.RaftStableKey(s.group, nil),
		storage.RaftAppliedKey(s.group),
	}
	for _, p := range prefixes {
		if _, err := s.db.DeleteRange(p); err != nil {
			_ = s.reload()
			return fmt.Errorf("raftstore: group %d: drop: %w", s.group, err)
		}
	}
	s.first.Store(0)
	s.last.Store(0)
	return nil
}

// Set stores val under key in the group's stable store; it is durable when Set returns.
func (s *Store) Set(key []byte, val []byte) error {
	var b storage.Batch
	b.Set(storage.RaftStableKey(s.group, key), val)
	b.UseReserve() // terms and votes: a node that cannot vote cannot elect the leader that drains
	if err := s.db.CommitSync(&b); err != nil {
		return fmt.Errorf("raftstore: group %d: set %q: %w", s.group, key, err)
	}
	return nil
}

// Get returns the value stored under key, or ErrKeyNotFound. A key set to an empty value returns an empty,
// non-nil slice.
func (s *Store) Get(key []byte) ([]byte, error) {
	val, err := s.db.Get(storage.RaftStableKey(s.group, key))
	if errors.Is(err, storage.ErrNotFound) {
		return nil, ErrKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("raftstore: group %d: get %q: %w", s.group, key, err)
	}
	if val == nil {
		val = []byte{}
	}
	return val, nil
}

// SetUint64 stores val under key (8 bytes, big-endian); it is durable when SetUint64 returns.
func (s *Store) SetUint64(key []byte, val uint64) error {
	return s.Set(key, binary.BigEndian.AppendUint64(make([]byte, 0, 8), val))
}

// GetUint64 returns the integer stored under key by SetUint64, or ErrKeyNotFound.
func (s *Store) GetUint64(key []byte) (uint64, error) {
	val, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(val) != 8 {
		return 0, fmt.Errorf("raftstore: group %d: get %q: %w: %d bytes where a uint64 was stored",
			s.group, key, storage.ErrCorrupt, len(val))
	}
	return binary.BigEndian.Uint64(val), nil
}
