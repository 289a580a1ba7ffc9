package replica

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// The stream's coordination group (one raft group per replicated stream, with the stream's
// replicas as members) orders only small commands: claims of an epoch by a new leader, named
// consumer offsets and retention decisions. Its state machine is here; the core runs it as the
// group's raft FSM. Records never go through it.

// Coordinator commands (first byte).
const (
	cmdClaim     byte = 1 // node id: the next epoch is the node's; answers the epoch (u64)
	cmdOffsets   byte = 2 // count, then (name, offset): named consumer offsets
	cmdRetention byte = 3 // first offset to keep
)

// fsmState is the replicated state besides what lives in the log.
type fsmState struct {
	mu        sync.Mutex
	epoch     uint64 // the last claimed epoch
	leader    string // who claimed it
	retention uint64 // first offset to keep
}

func encodeClaim(node string) []byte {
	return append([]byte{cmdClaim}, node...)
}

func encodeOffsets(m map[string]uint64) []byte {
	e := enc{b: []byte{cmdOffsets}}
	names := slices.Sorted(maps.Keys(m))
	e.u32(uint32(len(names)))
	for _, n := range names {
		e.str(n)
		e.u64(m[n])
	}
	return e.b
}

func encodeRetention(first uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{cmdRetention}, first)
}

// Apply applies one coordinator command (in log order, on every replica) and returns the
// leader's answer: the epoch for a claim, nil otherwise.
func (r *Replica) Apply(cmd []byte) []byte {
	if len(cmd) == 0 {
		return nil
	}
	switch cmd[0] {
	case cmdClaim:
		r.fsm.mu.Lock()
		r.fsm.epoch++
		r.fsm.leader = string(cmd[1:])
		e := r.fsm.epoch
		r.fsm.mu.Unlock()
		return binary.BigEndian.AppendUint64(nil, e)
	case cmdOffsets:
		d := dec{b: cmd[1:]}
		n := d.u32()
		for range n {
			name, off := d.str(), d.u64()
			if d.err {
				break
			}
			if r.off.applied(name, off) {
				r.log.StoreOffset(name, off)
			}
		}
		if d.err {
			r.logger.Error("malformed stream offsets command; skipped the rest")
		}
	case cmdRetention:
		if len(cmd) != 9 {
			r.logger.Error("malformed stream retention command")
			return nil
		}
		first := binary.BigEndian.Uint64(cmd[1:])
		r.fsm.mu.Lock()
		newer := first > r.fsm.retention
		if newer {
			r.fsm.retention = first
		}
		r.fsm.mu.Unlock()
		if newer {
			r.log.DropBefore(first)
		}
	default:
		r.logger.Error("unknown stream coordination command", "command", cmd[0])
	}
	return nil
}

// Snapshot encodes the coordination state: version, epoch, leader, retention, offsets.
func (r *Replica) Snapshot() []byte {
	r.fsm.mu.Lock()
	e := enc{b: []byte{1}}
	e.u64(r.fsm.epoch)
	e.str(r.fsm.leader)
	e.u64(r.fsm.retention)
	r.fsm.mu.Unlock()
	offs := r.log.Offsets()
	e.b = append(e.b, encodeOffsets(offs)[1:]...)
	return e.b
}

// Restore replaces the coordination state with a snapshot's.
func (r *Replica) Restore(b []byte) error {
	if len(b) == 0 || b[0] != 1 {
		return fmt.Errorf("stream coordination snapshot: unknown version")
	}
	d := dec{b: b[1:]}
	epoch, leader, retention := d.u64(), d.str(), d.u64()
	n := d.u32()
	offs := make(map[string]uint64, n)
	for range n {
		name, off := d.str(), d.u64()
		offs[name] = off
	}
	if err := d.done(); err != nil {
		return fmt.Errorf("stream coordination snapshot: %w", err)
	}
	r.fsm.mu.Lock()
	r.fsm.epoch, r.fsm.leader = epoch, leader
	newer := retention > r.fsm.retention
	r.fsm.retention = max(r.fsm.retention, retention)
	r.fsm.mu.Unlock()
	r.log.SetOffsets(offs)
	if newer {
		r.log.DropBefore(retention)
	}
	return nil
}
