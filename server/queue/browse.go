package queue

import (
	"cmp"
	"fmt"
	"slices"
)

// This file is the operators' read path into a queue: a peek at the ready messages that changes
// nothing (no delivery count, no redelivered flag, no order), and the basic.get of one named
// message that a redrive of selected dead letters takes. The management API's browse and redrive
// use them; AMQP clients never do.

// Browser is implemented by the queue types whose messages can be read without taking them.
type Browser interface {
	// Peek returns up to n ready messages in the order they would be delivered, with their
	// bodies, without changing the queue: a peek is not a delivery, so delivery counts, the
	// redelivered flag and the order stay as they are. Streams return their records from the
	// first offset (Delivery.ID is the offset). Messages that leave the queue while their bodies
	// are read are left out.
	Peek(n int) ([]Delivery, error)
}

// Taker is implemented by the queue types that can take one named ready message.
type Taker interface {
	// GetID takes the ready message id as basic.get without no-ack takes the next one: it becomes
	// unacknowledged (consumer 0) until Settle(0, ...) acknowledges or returns it. ok is false if
	// the message is not ready (delivered, gone, expired).
	GetID(id uint64) (d Delivery, ok bool, err error)
}

// liveAt reports whether a ready entry is a live message at now (not a tombstone of an expired
// one, and not due).
func (m *machine) liveAt(e entry, now int64) bool {
	if !e.timed {
		return true
	}
	t, ok := m.timed[e.id]
	return ok && (now == 0 || t.deadline == 0 || t.deadline > now)
}

// peek calls fn with the ready messages in delivery order (the order popReady takes them:
// highest priority level first, smallest id within a level) until fn returns false, skipping
// expired ones. It changes nothing.
func (m *machine) peek(now int64, fn func(e entry) bool) {
	for p := min(m.top, len(m.levels)-1); p >= 0; p-- {
		l := &m.levels[p]
		if len(l.returned) > 0 {
			ret := slices.Clone(l.returned)
			slices.SortFunc(ret, func(a, b entry) int { return cmp.Compare(a.id, b.id) })
			for _, e := range ret {
				if m.liveAt(e, now) && !fn(e) {
					return
				}
			}
		}
		for i := 0; i < l.fifo.Len(); i++ {
			if e := l.fifo.At(i); m.liveAt(e, now) && !fn(e) {
				return
			}
		}
	}
}

// takeReady removes the ready message id from its level and hands it out as get does (unacked
// with no owner unless noAck). It returns false if id is not a live ready message. O(ready) for
// the shift in its level: an operator's action, not a hot path.
func (m *machine) takeReady(id uint64, noAck bool) (Delivery, bool) {
	for p := min(m.top, len(m.levels)-1); p >= 0; p-- {
		l := &m.levels[p]
		var e entry
		found := false
		if i := l.fifo.search(func(x entry) bool { return x.id < id }); i < l.fifo.Len() && l.fifo.At(i).id == id {
			e = l.fifo.At(i)
			if !m.liveAt(e, 0) {
				return Delivery{}, false
			}
			l.fifo.Remove(i)
			found = true
		} else if j := slices.IndexFunc(l.returned, func(x entry) bool { return x.id == id }); j >= 0 {
			e = l.returned[j]
			if !m.liveAt(e, 0) {
				return Delivery{}, false
			}
			last := len(l.returned) - 1
			l.returned[j] = l.returned[last]
			l.returned[last] = entry{}
			l.returned = l.returned[:last]
			l.returned.heapify()
			found = true
		}
		if !found {
			continue
		}
		m.ready--
		m.readyBytes -= int(e.size)
		d := Delivery{ID: e.id, Msg: e.msg, Redelivered: e.redelivered, DeliveryCount: e.count, flags: e.flags, Settled: noAck}
		if !noAck {
			m.unacked[e.id] = unackedEntry{entry: e}
		}
		if e.timed {
			m.leaveReady(e, noAck)
		}
		return d, true
	}
	return Delivery{}, false
}

// peekState copies out up to max ready messages of s at now (bodies as the state holds them:
// nil when paged out).
func peekState(s *State, n int, now int64) []Delivery {
	var out []Delivery
	if n <= 0 {
		return out
	}
	s.m.peek(now, func(e entry) bool {
		out = append(out, Delivery{ID: e.id, Msg: e.msg, Redelivered: e.redelivered, DeliveryCount: e.count, flags: e.flags})
		return len(out) < n
	})
	return out
}

// Peek implements Browser. The state is read under the queue's lock; paged-out bodies are read
// from storage afterwards, and a message whose record went meanwhile (acked, purged) is left out.
func (q *Classic) Peek(n int) ([]Delivery, error) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil, ErrGone
	}
	ds := peekState(q.s, n, nowMs())
	q.mu.Unlock()
	out := ds[:0]
	for _, d := range ds {
		if d.Msg == nil {
			m, ok := q.peekLoad(d.ID, d.flags)
			if !ok {
				continue
			}
			d.Msg = m
		}
		out = append(out, d)
	}
	return out, nil
}

// peekLoad reads a paged-out body for Peek without load's error log: a record that went is a
// message that left the queue since the state was read.
func (q *Classic) peekLoad(id uint64, flags uint8) (*Message, bool) {
	q.pmu.Lock()
	m := q.pending[id]
	q.pmu.Unlock()
	if m != nil {
		return m, true
	}
	if q.db == nil || flags == 0 {
		return nil, false
	}
	rec, err := q.db.Get(q.recordKey(flags, id))
	if err != nil {
		return nil, false
	}
	m, _, err = decodeRecord(rec)
	return m, err == nil
}

// GetID implements Taker.
func (q *Classic) GetID(id uint64) (Delivery, bool, error) {
	var fx Effects
	now := nowMs()
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return Delivery{}, false, ErrGone
	}
	q.lastUsed = now
	cmd := Command{Type: CmdTake, ID: id}
	q.s.Apply(&cmd, now, &fx)
	q.flow.release(q.s.m.ready, len(q.consumers), q.closed)
	q.mu.Unlock()
	d := fx.Reply.Delivery
	loaded := true
	if fx.Reply.OK && d.Msg == nil {
		d.Msg, loaded = q.load(d.ID, d.flags)
	}
	q.runEffects(&fx)
	if !fx.Reply.OK {
		return Delivery{}, false, nil
	}
	if !loaded {
		q.apply(CmdDiscard, []Tag{d.Tag()}) // unreadable: dropped, as Get does
		return Delivery{}, false, fmt.Errorf("queue '%s': message %d cannot be read", q.name, id)
	}
	return d, true, nil
}

// Peek implements Browser: this node's replica read under its lock (on the leader, the state
// every committed command has been applied to; on a follower, the state as far as it has applied
// the log), so a peek is not a command and changes nothing in the replicated state. Paged-out
// bodies are read from this node's records afterwards.
func (q *Quorum) Peek(n int) ([]Delivery, error) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil, ErrGone
	}
	ds := peekState(q.s, n, max(q.s.now, nowMs()))
	q.mu.Unlock()
	out := ds[:0]
	for _, d := range ds {
		if d.Msg == nil {
			m, err := q.loadBody(d.ID)
			if err != nil {
				continue // left the queue since the state was read
			}
			d.Msg = m
		}
		out = append(out, d)
	}
	return out, nil
}

// GetID implements Taker: CmdTake through the log, with basic.get's command id (a retry gets the
// first answer) and ownership (NodeDown returns the message).
func (q *Quorum) GetID(id uint64) (Delivery, bool, error) {
	cmd := Command{Type: CmdTake, ID: id, Owner: uint32(q.node)<<16 | uint32(q.epoch),
		Producer: q.producer, Seq: q.seq.Add(1)}
	r, _, err := q.proposeWait(&cmd)
	if err != nil {
		return Delivery{}, false, err
	}
	if r.Stale {
		return Delivery{}, false, fmt.Errorf("%w: take of message %d not applied", ErrNoQuorum, id)
	}
	return r.Delivery, r.OK, nil
}

// OffsetBrowser is implemented by the queue types addressed by offset (streams): Peek from a
// given offset instead of the first.
type OffsetBrowser interface {
	PeekFrom(offset uint64, n int) ([]Delivery, error)
}
