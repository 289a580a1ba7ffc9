package queue

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"warren/storage"
)

// Bodies of a replicated queue on disk.
//
// A replica keeps the bodies of its first quorumPageWindow ready messages (at most
// quorumPageBytes) in memory, as a classic queue does. A message enqueued beyond that window keeps
// an index entry only (id, size, flags, priority, deadline); its FSM apply submits the body as a
// record under PrefixReplicaBody|queue|id to the node's group committer without waiting (the raft
// log entry is the durable copy until then) and keeps the body in pending until the commit is done.
// Whether a message is paged out depends on the replicated state only (ready count and bytes at
// the enqueue), so every replica pages out the same messages and snapshots to the same bytes.
// Bodies are read back when delivered (by the node of the consumer, from its own store), handed
// over as dead letters, or answered to basic.get; the record goes when the message leaves the
// queue.
//
// A snapshot (version 3) is the replicated state with paged messages as index entries, then the
// bodies of the paged messages streamed from a storage view: CaptureSnapshot (raft's FSM goroutine)
// waits for the records submitted so far to be committed, opens the view and encodes the state;
// WriteTo (raft's snapshot goroutine, while applies go on) streams the records from the view. A
// snapshot is thus self-contained: a follower that installs it writes the bodies it does not have
// and deletes the records of messages that are gone. Because writing one costs the whole backlog,
// a replica declines a snapshot (CaptureSnapshot returns nil) until at least as many log entries
// as it has paged messages were applied since the last one, so the bytes written for snapshots stay
// proportional to the bytes published, and the raft log (truncated behind each snapshot) stays
// proportional to the backlog.

// PrefixReplicaBody is the storage keyspace of the bodies a replicated queue paged out:
// 0x05 | queue id u64 | message id u64.
const PrefixReplicaBody byte = 0x05

// The in-memory window of a replicated queue (see above).
const (
	quorumPageWindow = DefaultPageWindow
	quorumPageBytes  = pageWindowBytes
)

// quorumSnapshotV3 is the snapshot version with paged bodies streamed after the state.
const quorumSnapshotV3 byte = 3

// restoreChunk bounds the bytes of one storage batch written by a restore.
const restoreChunk = 4 << 20

func (q *Quorum) bodyKey(id uint64) []byte { return storage.U64U64Key(PrefixReplicaBody, q.id, id) }

func (q *Quorum) bodyPrefix() []byte { return storage.U64Key(PrefixReplicaBody, q.id) }

// pageOut decides, on the FSM goroutine before the enqueue is applied, whether the message of
// q.cmd keeps an index entry only (q.mu held).
func (q *Quorum) pageOut() {
	if q.disk == nil || q.cmd.Type != CmdEnqueue || q.cmd.Msg == nil {
		return
	}
	m := q.s.m
	if m.ready >= quorumPageWindow || m.readyBytes+len(q.cmd.Msg.Body) > quorumPageBytes {
		q.cmd.Offload, q.cmd.Flags = true, flagPaged
	}
}

// storeEffects submits the storage work of an applied command (q.mu held, on the FSM goroutine, so
// that writes and deletes reach the committer in log order): the record of a paged-out message and
// the deletes of the records of paged messages that left the queue. Settled deliveries to this
// node's consumers keep their record until the dispatcher has read the body (it deletes them).
func (q *Quorum) storeEffects(fx *Effects) {
	if q.disk == nil {
		return
	}
	var b, del storage.Batch // the record to add; the records to delete (a batch of its own, so
	// that deletes go through on a full disk while a record that adds data is refused)
	var id uint64
	if q.cmd.Offload && fx.Reply.ID != 0 && !fx.Reply.Duplicate {
		id = fx.Reply.ID
		b.Set(q.bodyKey(id), encodeRecord(nil, q.cmd.Msg, 0))
		q.pmu.Lock()
		if q.pending == nil {
			q.pending = make(map[uint64]*Message)
		}
		q.pending[id] = q.cmd.Msg
		q.pmu.Unlock()
		q.paged++
	}
	var held map[uint64]bool // settled deliveries to this node's consumers
	for i := range fx.Deliveries {
		if d := &fx.Deliveries[i]; d.Settled && d.flags&flagPaged != 0 && q.consumers[d.Consumer] != nil {
			if held == nil {
				held = make(map[uint64]bool)
			}
			held[d.ID] = true
		}
	}
	for _, st := range fx.forget {
		if st.flags&flagPaged == 0 || held[st.id] {
			continue
		}
		del.Delete(q.bodyKey(st.id))
		q.paged--
		q.pmu.Lock()
		delete(q.pending, st.id) // a body kept in memory because its record could not be written
		q.pmu.Unlock()
	}
	if del.Len() > 0 {
		q.disk.Commit(&del, func(err error) {
			if err != nil {
				q.log.Error("replicated queue: body records not deleted", "queue", q.name, "err", err)
			}
		})
	}
	if b.Len() == 0 {
		return
	}
	// The record is a second copy of a body the raft log already holds, so it does not use the
	// storage reserve (which raft's own writes, acks and deletes need on a nearly full disk). When
	// it is refused, the body stays in pending, in memory, until the message leaves the queue.
	q.disk.Commit(&b, func(err error) {
		if err != nil {
			q.log.Warn("replicated queue: body record not written; the body stays in memory", "queue", q.name, "err", err)
			return
		}
		q.pmu.Lock()
		delete(q.pending, id)
		q.pmu.Unlock()
	})
}

// loadBody reads a paged message's body back: from pending while its record is being committed,
// else from the store.
func (q *Quorum) loadBody(id uint64) (*Message, error) {
	q.pmu.Lock()
	m := q.pending[id]
	q.pmu.Unlock()
	if m != nil {
		return m, nil
	}
	if q.disk == nil {
		return nil, errors.New("no store")
	}
	rec, err := q.disk.Get(q.bodyKey(id))
	if err != nil {
		return nil, err
	}
	m, _, err = decodeRecord(rec)
	return m, err
}

// forgetBodies deletes the records of paged messages that were delivered settled to this node's
// consumers once their bodies were read (dispatcher).
func (q *Quorum) forgetBodies(ids []uint64) {
	if q.disk == nil || len(ids) == 0 {
		return
	}
	var b storage.Batch
	for _, id := range ids {
		b.Delete(q.bodyKey(id))
	}
	q.disk.Commit(&b, nil)
	q.mu.Lock()
	q.paged -= len(ids)
	q.mu.Unlock()
}

// dropBodies deletes every body record of the queue (it was deleted).
func (q *Quorum) dropBodies() {
	if q.disk == nil {
		return
	}
	if _, err := q.disk.DeleteRange(q.bodyPrefix()); err != nil {
		q.log.Warn("replicated queue deleted: body records not removed", "queue", q.name, "err", err)
	}
}

// ReplicaSnapshot is a replicated queue's state captured for a raft snapshot: the encoded state,
// and a storage view from which WriteTo streams the paged bodies.
type ReplicaSnapshot struct {
	head   []byte
	view   *storage.View
	prefix []byte
}

// CaptureSnapshot captures the state for a raft snapshot. It must be called between two Applies
// (raft's FSM goroutine calls it): it waits for the body records submitted so far to be
// committed, opens a storage view and encodes the state (paged messages as index entries) under
// the queue's lock; nothing is copied from the store until WriteTo. Unless force is set it returns
// nil while fewer log entries than paged messages were applied since the last snapshot (see the
// top of this file).
func (q *Quorum) CaptureSnapshot(force bool) (*ReplicaSnapshot, error) {
	force = q.forceSnap.Swap(false) || force
	q.mu.Lock()
	if !force && q.paged > 0 && q.applied-q.snapIndex < uint64(q.paged) {
		q.mu.Unlock()
		return nil, nil
	}
	q.mu.Unlock()
	start := time.Now()
	snap := &ReplicaSnapshot{prefix: q.bodyPrefix()}
	if q.disk != nil {
		// Every record the state refers to was submitted by an Apply before this call; an empty
		// commit is answered after all of them.
		if err := q.disk.CommitSync(&storage.Batch{}); err != nil {
			return nil, fmt.Errorf("replicated queue '%s': snapshot: %w", q.name, err)
		}
		v, err := q.disk.NewView()
		if err != nil {
			return nil, fmt.Errorf("replicated queue '%s': snapshot view: %w", q.name, err)
		}
		snap.view = v
	}
	q.mu.Lock()
	b := binary.AppendUvarint([]byte{quorumSnapshotV3}, q.applied)
	state := q.s.AppendSnapshot(nil)
	b = binary.AppendUvarint(b, uint64(len(state)))
	snap.head = append(b, state...)
	q.snapIndex = q.applied
	paged := q.paged
	q.mu.Unlock()
	q.lastCapture.Store(int64(time.Since(start)))
	q.log.Debug("replicated queue snapshot captured", "queue", q.name, "paged", paged,
		"state_bytes", len(state), "blocked", time.Since(start))
	return snap, nil
}

// WriteTo writes the snapshot: the state, then every body record of the queue in the view (id,
// length, record; id 0 ends the list). It runs off the FSM goroutine while applies go on.
func (s *ReplicaSnapshot) WriteTo(w io.Writer) (int64, error) {
	bw := bufio.NewWriterSize(w, 256<<10)
	n := int64(len(s.head))
	if _, err := bw.Write(s.head); err != nil {
		return 0, err
	}
	var hdr []byte
	if s.view != nil {
		err := s.view.ScanChunks(s.prefix, 1024, func(key, val []byte) error {
			_, id, ok := storage.ParseU64U64Key(PrefixReplicaBody, key)
			if !ok || id == 0 {
				return nil
			}
			hdr = binary.AppendUvarint(hdr[:0], id)
			hdr = binary.AppendUvarint(hdr, uint64(len(val)))
			if _, err := bw.Write(hdr); err != nil {
				return err
			}
			if _, err := bw.Write(val); err != nil {
				return err
			}
			n += int64(len(hdr) + len(val))
			return nil
		})
		if err != nil {
			return n, fmt.Errorf("stream bodies: %w", err)
		}
	}
	if err := bw.WriteByte(0); err != nil {
		return n, err
	}
	return n + 1, bw.Flush()
}

// Release closes the snapshot's storage view.
func (s *ReplicaSnapshot) Release() {
	if s.view != nil {
		s.view.Close()
		s.view = nil
	}
}

// ForceNextSnapshot makes the next CaptureSnapshot capture even if the schedule would decline
// (an operator's or a test's explicit snapshot).
func (q *Quorum) ForceNextSnapshot() { q.forceSnap.Store(true) }

// LastCaptureTime is how long the last CaptureSnapshot held raft's FSM goroutine.
func (q *Quorum) LastCaptureTime() time.Duration { return time.Duration(q.lastCapture.Load()) }

// pagedIDs lists, in id order, the messages of s whose bodies are in records.
func pagedIDs(s *State) []uint64 {
	var ids []uint64
	m := s.m
	for p := range m.levels {
		l := &m.levels[p]
		for i := range l.fifo.Len() {
			if e := l.fifo.At(i); e.flags&flagPaged != 0 && e.msg == nil {
				ids = append(ids, e.id)
			}
		}
		for _, e := range l.returned {
			if e.flags&flagPaged != 0 && e.msg == nil {
				ids = append(ids, e.id)
			}
		}
	}
	for id, u := range m.unacked {
		if u.flags&flagPaged != 0 && u.msg == nil {
			ids = append(ids, id)
		}
	}
	for i := range s.dlx.Len() {
		if r := s.dlx.At(i); !r.gone && r.dead.flags&flagPaged != 0 && r.dead.Msg == nil {
			ids = append(ids, r.dead.ID)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// restoreStream reads a version 3 snapshot after its version byte: the state, then the bodies. It
// writes the bodies the state needs and this node's store lacks, deletes the records of messages
// the state no longer has, and returns the state and its applied index.
func (q *Quorum) restoreStream(r *bufio.Reader) (*State, uint64, int, error) {
	applied, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("applied index: %w", err)
	}
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("state length: %w", err)
	}
	if n > 1<<34 {
		return nil, 0, 0, fmt.Errorf("state length %d: %w", n, errSnapshot)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, 0, 0, fmt.Errorf("state: %w", err)
	}
	s, err := DecodeState(buf)
	if err != nil {
		return nil, 0, 0, err
	}
	if !s.replicated {
		return nil, 0, 0, errors.New("not a replicated queue's state")
	}
	want := pagedIDs(s)
	var local []uint64
	if q.disk != nil {
		err := q.disk.Scan(q.bodyPrefix(), true, func(key, _ []byte) error {
			if _, id, ok := storage.ParseU64U64Key(PrefixReplicaBody, key); ok {
				local = append(local, id)
			}
			return nil
		})
		if err != nil {
			return nil, 0, 0, fmt.Errorf("list body records: %w", err)
		}
	}
	var b storage.Batch
	size := 0
	flush := func() error {
		if b.Len() == 0 {
			return nil
		}
		b.UseReserve()
		err := q.disk.CommitSync(&b)
		b.Reset()
		size = 0
		return err
	}
	var prev uint64
	written := 0
	for {
		id, err := binary.ReadUvarint(r)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("body id: %w", err)
		}
		if id == 0 {
			break
		}
		if id <= prev {
			return nil, 0, 0, fmt.Errorf("body %d after %d: %w", id, prev, errSnapshot)
		}
		prev = id
		ln, err := binary.ReadUvarint(r)
		if err != nil || ln > 1<<31 {
			return nil, 0, 0, fmt.Errorf("body %d length: %w", id, errSnapshot)
		}
		_, need := slices.BinarySearch(want, id)
		_, have := slices.BinarySearch(local, id)
		if !need || have || q.disk == nil {
			if _, err := r.Discard(int(ln)); err != nil {
				return nil, 0, 0, fmt.Errorf("body %d: %w", id, err)
			}
			continue
		}
		rec := make([]byte, ln)
		if _, err := io.ReadFull(r, rec); err != nil {
			return nil, 0, 0, fmt.Errorf("body %d: %w", id, err)
		}
		b.Set(q.bodyKey(id), rec)
		written++
		if size += len(rec); size >= restoreChunk {
			if err := flush(); err != nil {
				return nil, 0, 0, fmt.Errorf("write bodies: %w", err)
			}
		}
	}
	for _, id := range local {
		if _, need := slices.BinarySearch(want, id); !need {
			b.Delete(q.bodyKey(id))
			if b.Len() >= 16384 {
				if err := flush(); err != nil {
					return nil, 0, 0, fmt.Errorf("delete stale bodies: %w", err)
				}
			}
		}
	}
	if q.disk != nil {
		if err := flush(); err != nil {
			return nil, 0, 0, fmt.Errorf("write bodies: %w", err)
		}
	}
	q.log.Debug("replicated queue restored from snapshot", "queue", q.name, "paged", len(want), "bodies_written", written)
	return s, applied, len(want), nil
}
