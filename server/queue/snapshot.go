package queue

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// machineSnapshotVersion is written first in every machine snapshot. decodeMachine also reads
// version 1 (before consumer credit), which the quorum queues of the previous release wrote.
const machineSnapshotVersion = 2

// errSnapshot is wrapped by every DecodeMachine error.
var errSnapshot = errors.New("malformed machine snapshot")

// Machine snapshot layout (version 2). Integers are uvarints, signed ones (marked ±) zig-zag varints; a
// "string" is a uvarint length followed by the bytes. Lists are a uvarint count then the items.
//
//	version          byte (machineSnapshotVersion)
//	config           MaxPriority byte, ±MessageTTL, ±MaxLength, ±MaxLengthBytes, Overflow byte,
//	                 ±DeliveryLimit, SingleActiveConsumer byte
//	nextID, seq
//	consumers        list, by increasing ID: ID, Prefetch, ±Priority, bits (NoAck, standby,
//	                 credited), seq, delivered, Credit if credited, sent records still pending
//	                 (list of ±at, id, count)
//	rings            for each priority group, highest priority first (the groups are the distinct
//	                 priorities of the consumers): list of consumer IDs in turn order
//	single active    bits (active set, quiescing), then the active consumer's ID if set
//	levels           for each message priority 0..MaxPriority: the FIFO (list of entries, front
//	                 first), then the returned heap (list of entries, in heap array order)
//	unacked          list by increasing id: entry, priority level byte, owner kind byte (0 basic.get,
//	                 1 attached consumer, 2 removed consumer), owner ID unless kind 0, ±deadline
//	atOnce           list of ids
//
// An entry is: bits (message present, redelivered, timed, live timed record, queued on the expiry
// heap), id, count, size, flags byte, ±deadline if it has a live timed record, then the message if
// present: bits (Persistent, Props/Body/BCC not nil, Dedupe set), Exchange string, RoutingKey
// string, Props string if not nil, Body string if not nil, Priority byte, BCC list of strings if not
// nil, ±ExpiresAt, Dedupe (source, seq) if set.
//
// Not written, because it is derived from the rest or cannot affect any later result:
//   - ready, readyBytes, tombs, queuedLive, group membership and member counts, consumer unacked
//     counts and active flags (a consumer is active exactly when it is in its group's ring), all
//     recomputed; top becomes the highest non-empty level (the machine may hold a higher, lazily
//     lowered value, which only costs popReady a few empty levels);
//   - the expiry heap: it holds exactly one item (timed record's deadline, id) per queued record,
//     plus stale items of ids that are gone for good (ids are never reused), which are skipped; its
//     pops come in (deadline, id) order, a total order, so its array layout is unobservable. It is
//     rebuilt from the queued records.
//   - the entry kept in a timed record: for a ready message it is the level entry itself; for an
//     unacked one it is never read before the message is returned, which overwrites it.
//   - sent records that no longer match an unacked delivery of their consumer: they can never match
//     again (a message's delivery count only grows), so they are only ever dropped.
//   - removed consumers other than their ID: a removed consumer is only reached through the unacked
//     messages it owns, and only its ID (ReturnConsumer) and identity against attached consumers
//     matter; removed owners with the same ID are merged.
//   - the deque and heap capacities, and the Checkout scratch slice.
//
// Version 1 had no credited bit, delivered count or Credit: its consumers decode as not credited.
//
// Tombstones are kept as they are, not compacted: sweeping them rebuilds the returned heaps, whose
// array layout decides the order of PurgeEntries' callbacks, so a sweep must happen on every
// replica at the same point.

// Entry bits.
const (
	snapHasMsg = 1 << iota
	snapRedelivered
	snapTimed
	snapLive   // has a timed record
	snapQueued // its timed record is on the expiry heap
	snapEntryBits
)

// Message bits.
const (
	snapPersistent = 1 << iota
	snapProps
	snapBody
	snapBCC
	snapDedupe
	snapMsgBits
)

// Consumer bits.
const (
	snapNoAck = 1 << iota
	snapStandby
	snapCredited
	snapConsumerBits
)

// Single active consumer bits.
const (
	snapSACActive = 1 << iota
	snapSACQuiescing
	snapSACBits
)

// Owner kinds of an unacked message.
const (
	ownerGet = iota
	ownerAttached
	ownerRemoved
)

// appendSnapshot appends an exact, self-contained encoding of m to dst: configuration, id counter, every ready
// and unacked message (Message fields including Props, Body, Exchange, RoutingKey, Persistent, Priority,
// ExpiresAt, BCC; entries whose msg is nil (paged) keep their size and nil), delivery counts, redelivered flags,
// flags, priorities, deadlines and expiry state, consumers (spec, group/ring order, standby, attach order,
// unacked counts, sent records) and the ownership of unacked messages (including owners that were removed:
// see unackedEntry.owner), SAC state, atOnce, tombstones (may be compacted away if that cannot change any
// later observable result).
//
// Equal machines give equal bytes: maps are written in key order. m is not modified, but like every
// other method appendSnapshot must be serialised with the calls that change m (for a Raft FSM: take
// the snapshot in FSM.Snapshot, not later in Persist). The bytes do not alias m.
func (m *machine) appendSnapshot(dst []byte) []byte {
	dst = append(dst, machineSnapshotVersion, m.cfg.MaxPriority)
	dst = binary.AppendVarint(dst, m.cfg.MessageTTL)
	dst = binary.AppendVarint(dst, m.cfg.MaxLength)
	dst = binary.AppendVarint(dst, m.cfg.MaxLengthBytes)
	dst = append(dst, byte(m.cfg.Overflow))
	dst = binary.AppendVarint(dst, m.cfg.DeliveryLimit)
	dst = append(dst, snapBool(m.cfg.SingleActiveConsumer))
	dst = binary.AppendUvarint(dst, m.nextID)
	dst = binary.AppendUvarint(dst, m.seq)

	cids := make([]ConsumerID, 0, len(m.consumers))
	for id := range m.consumers {
		cids = append(cids, id)
	}
	slices.Sort(cids)
	dst = binary.AppendUvarint(dst, uint64(len(cids)))
	for _, id := range cids {
		dst = m.appendConsumer(dst, m.consumers[id])
	}
	for _, g := range m.groups {
		dst = binary.AppendUvarint(dst, uint64(g.ring.Len()))
		for i := range g.ring.Len() {
			dst = binary.AppendUvarint(dst, uint64(g.ring.At(i).spec.ID))
		}
	}
	var sac byte
	if m.sacActive != nil {
		sac |= snapSACActive
	}
	if m.sacQuiescing {
		sac |= snapSACQuiescing
	}
	dst = append(dst, sac)
	if m.sacActive != nil {
		dst = binary.AppendUvarint(dst, uint64(m.sacActive.spec.ID))
	}

	for p := range m.levels {
		l := &m.levels[p]
		dst = binary.AppendUvarint(dst, uint64(l.fifo.Len()))
		for i := range l.fifo.Len() {
			dst = m.appendEntry(dst, l.fifo.At(i))
		}
		dst = binary.AppendUvarint(dst, uint64(len(l.returned)))
		for _, e := range l.returned {
			dst = m.appendEntry(dst, e)
		}
	}

	uids := make([]uint64, 0, len(m.unacked))
	for id := range m.unacked {
		uids = append(uids, id)
	}
	slices.Sort(uids)
	dst = binary.AppendUvarint(dst, uint64(len(uids)))
	for _, id := range uids {
		u := m.unacked[id]
		dst = m.appendEntry(dst, u.entry)
		dst = append(dst, u.prio)
		switch {
		case u.owner == nil:
			dst = append(dst, ownerGet)
		case m.consumers[u.owner.spec.ID] == u.owner:
			dst = append(dst, ownerAttached)
			dst = binary.AppendUvarint(dst, uint64(u.owner.spec.ID))
		default:
			dst = append(dst, ownerRemoved)
			dst = binary.AppendUvarint(dst, uint64(u.owner.spec.ID))
		}
		dst = binary.AppendVarint(dst, u.deadline)
	}

	dst = binary.AppendUvarint(dst, uint64(len(m.atOnce)))
	for _, id := range m.atOnce {
		dst = binary.AppendUvarint(dst, id)
	}
	return dst
}

func snapBool(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// appendConsumer writes an attached consumer, keeping only the sent records that still match one of
// its unacked deliveries.
func (m *machine) appendConsumer(dst []byte, c *consumer) []byte {
	dst = binary.AppendUvarint(dst, uint64(c.spec.ID))
	dst = binary.AppendUvarint(dst, uint64(c.spec.Prefetch))
	dst = binary.AppendVarint(dst, int64(c.spec.Priority))
	var bits byte
	if c.spec.NoAck {
		bits |= snapNoAck
	}
	if c.standby {
		bits |= snapStandby
	}
	if c.spec.Credited {
		bits |= snapCredited
	}
	dst = append(dst, bits)
	dst = binary.AppendUvarint(dst, c.seq)
	dst = binary.AppendUvarint(dst, c.delivered)
	if c.spec.Credited {
		dst = binary.AppendUvarint(dst, c.spec.Credit)
	}
	n := 0
	for i := range c.sent.Len() {
		if m.stillSent(c, c.sent.At(i)) {
			n++
		}
	}
	dst = binary.AppendUvarint(dst, uint64(n))
	for i := range c.sent.Len() {
		if o := c.sent.At(i); m.stillSent(c, o) {
			dst = binary.AppendVarint(dst, o.at)
			dst = binary.AppendUvarint(dst, o.id)
			dst = binary.AppendUvarint(dst, uint64(o.count))
		}
	}
	return dst
}

// appendEntry writes e with its timed record, if it has one.
func (m *machine) appendEntry(dst []byte, e entry) []byte {
	var bits byte
	if e.msg != nil {
		bits |= snapHasMsg
	}
	if e.redelivered {
		bits |= snapRedelivered
	}
	var t timedMsg
	var live bool
	if e.timed {
		bits |= snapTimed
		if t, live = m.timed[e.id]; live {
			bits |= snapLive
			if t.queued {
				bits |= snapQueued
			}
		}
	}
	dst = append(dst, bits)
	dst = binary.AppendUvarint(dst, e.id)
	dst = binary.AppendUvarint(dst, uint64(e.count))
	dst = binary.AppendUvarint(dst, uint64(e.size))
	dst = append(dst, e.flags)
	if live {
		dst = binary.AppendVarint(dst, t.deadline)
	}
	if e.msg != nil {
		dst = appendMessage(dst, e.msg)
	}
	return dst
}

func appendMessage(dst []byte, msg *Message) []byte {
	var bits byte
	if msg.Persistent {
		bits |= snapPersistent
	}
	if msg.Props != nil {
		bits |= snapProps
	}
	if msg.Body != nil {
		bits |= snapBody
	}
	if msg.BCC != nil {
		bits |= snapBCC
	}
	if msg.Dedupe != (DedupeKey{}) {
		bits |= snapDedupe
	}
	dst = append(dst, bits)
	dst = appendSnapString(dst, msg.Exchange)
	dst = appendSnapString(dst, msg.RoutingKey)
	if msg.Props != nil {
		dst = appendSnapBytes(dst, msg.Props)
	}
	if msg.Body != nil {
		dst = appendSnapBytes(dst, msg.Body)
	}
	dst = append(dst, msg.Priority)
	if msg.BCC != nil {
		dst = binary.AppendUvarint(dst, uint64(len(msg.BCC)))
		for _, k := range msg.BCC {
			dst = appendSnapString(dst, k)
		}
	}
	dst = binary.AppendVarint(dst, msg.ExpiresAt)
	if msg.Dedupe != (DedupeKey{}) {
		dst = binary.AppendUvarint(dst, msg.Dedupe.Source)
		dst = binary.AppendUvarint(dst, msg.Dedupe.Seq)
	}
	return dst
}

// appendSnapString writes a length-prefixed string.
func appendSnapString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// appendSnapBytes writes a length-prefixed byte string.
func appendSnapBytes(dst []byte, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// snapReader reads a snapshot. The first error sticks: later reads return zero values.
type snapReader struct {
	b   []byte
	err error
}

func (r *snapReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errSnapshot)
	}
	r.b = nil
}

func (r *snapReader) u8(what string) byte {
	if len(r.b) == 0 {
		r.fail("%s: truncated", what)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *snapReader) uvarint(what string) uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("%s: truncated or overlong uvarint", what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *snapReader) varint(what string) int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("%s: truncated or overlong varint", what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *snapReader) u32(what string) uint32 {
	v := r.uvarint(what)
	if v > math.MaxUint32 {
		r.fail("%s: %d out of range", what, v)
		return 0
	}
	return uint32(v)
}

// count reads a list length, refusing one that the remaining input cannot hold with at least
// minSize bytes per item (so a corrupt length cannot make the decoder allocate without bound).
func (r *snapReader) count(what string, minSize int) int {
	v := r.uvarint(what)
	if v > uint64(len(r.b)/minSize) {
		r.fail("%s: count %d exceeds the input", what, v)
		return 0
	}
	return int(v)
}

// raw reads a length-prefixed string, aliasing the input.
func (r *snapReader) raw(what string) []byte {
	n := r.count(what, 1)
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// bytes reads a length-prefixed string into a new non-nil slice.
func (r *snapReader) bytes(what string) []byte {
	v := r.raw(what)
	return append(make([]byte, 0, len(v)), v...)
}

func (r *snapReader) message() *Message {
	bits := r.u8("message bits")
	if bits >= snapMsgBits {
		r.fail("message bits %#x", bits)
		return nil
	}
	msg := &Message{Persistent: bits&snapPersistent != 0}
	msg.Exchange = string(r.raw("exchange"))
	msg.RoutingKey = string(r.raw("routing key"))
	if bits&snapProps != 0 {
		msg.Props = r.bytes("properties")
	}
	if bits&snapBody != 0 {
		msg.Body = r.bytes("body")
	}
	msg.Priority = r.u8("message priority")
	if bits&snapBCC != 0 {
		msg.BCC = make([]string, r.count("bcc", 1))
		for i := range msg.BCC {
			msg.BCC[i] = string(r.raw("bcc key"))
		}
	}
	msg.ExpiresAt = r.varint("expires at")
	if bits&snapDedupe != 0 {
		msg.Dedupe = DedupeKey{Source: r.uvarint("dedupe source"), Seq: r.uvarint("dedupe seq")}
	}
	return msg
}

// entry reads an entry and its timed record (live reports whether it has one; the record's e and
// unacked are for the caller to set).
func (r *snapReader) entry() (e entry, t timedMsg, live bool) {
	bits := r.u8("entry bits")
	if bits >= snapEntryBits || (bits&snapLive != 0 && bits&snapTimed == 0) ||
		(bits&snapQueued != 0 && bits&snapLive == 0) {
		r.fail("entry bits %#x", bits)
		return entry{}, timedMsg{}, false
	}
	e.id = r.uvarint("id")
	e.count = r.u32("delivery count")
	e.size = r.u32("size")
	e.flags = r.u8("flags")
	e.redelivered = bits&snapRedelivered != 0
	e.timed = bits&snapTimed != 0
	if live = bits&snapLive != 0; live {
		t.deadline = r.varint("deadline")
		t.queued = bits&snapQueued != 0
	}
	if bits&snapHasMsg != 0 {
		e.msg = r.message()
	}
	if e.id == 0 && r.err == nil {
		r.fail("message id 0")
	}
	return e, t, live
}

// minimum encoded sizes, for count.
const (
	snapMinEntry    = 5 // bits, id, count, size, flags
	snapMinConsumer = 6 // id, prefetch, priority, bits, seq, sent count (and delivered from version 2)
	snapMinSent     = 3
)

// decodeMachine rebuilds a machine from appendSnapshot's output. Corrupt or truncated input returns an error,
// never panics.
//
// Besides the structure it checks the invariants the machine relies on (ids unique and below the
// id counter, FIFO and heap order, priority levels in range, owners and the active consumer
// attached, attach order unique), so an accepted snapshot gives a machine that can be driven
// safely. The decoded machine does not alias b.
func decodeMachine(b []byte) (*machine, error) {
	m, err := decodeMachineRaw(b)
	if err != nil {
		return nil, fmt.Errorf("queue: decode machine snapshot: %w", err)
	}
	return m, nil
}

func decodeMachineRaw(b []byte) (*machine, error) {
	r := &snapReader{b: b}
	version := r.u8("version")
	if r.err == nil && version != machineSnapshotVersion && version != 1 {
		return nil, fmt.Errorf("version %d, want 1 or %d: %w", version, machineSnapshotVersion, errSnapshot)
	}
	var cfg Config
	cfg.MaxPriority = r.u8("max priority")
	cfg.MessageTTL = r.varint("message ttl")
	cfg.MaxLength = r.varint("max length")
	cfg.MaxLengthBytes = r.varint("max length bytes")
	cfg.Overflow = Overflow(r.u8("overflow"))
	cfg.DeliveryLimit = r.varint("delivery limit")
	sac := r.u8("single active consumer")
	if r.err == nil && (cfg.Overflow > RejectPublishDLX || sac > 1) {
		r.fail("config overflow %d, single active consumer %d", cfg.Overflow, sac)
	}
	cfg.SingleActiveConsumer = sac == 1
	if r.err != nil {
		return nil, r.err
	}
	m := newMachine(cfg)
	m.nextID = r.uvarint("next id")
	m.seq = r.uvarint("attach counter")
	if r.err == nil && m.nextID == 0 {
		r.fail("next id 0")
	}

	m.decodeConsumers(r, version)
	m.decodeLevels(r)
	ids := m.decodeUnacked(r)
	n := r.count("at once", 1)
	if n > 0 {
		m.atOnce = make([]uint64, n)
		for i := range m.atOnce {
			m.atOnce[i] = r.uvarint("at once id")
		}
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return nil, r.err
	}

	// Every id held, ready (tombstones included) or unacked, is unique and was issued.
	for p := range m.levels {
		l := &m.levels[p]
		for i := range l.fifo.Len() {
			ids = append(ids, l.fifo.At(i).id)
		}
		for _, e := range l.returned {
			ids = append(ids, e.id)
		}
	}
	slices.Sort(ids)
	for i := 1; i < len(ids); i++ {
		if ids[i] == ids[i-1] {
			return nil, fmt.Errorf("message id %d held twice: %w", ids[i], errSnapshot)
		}
	}
	if len(ids) > 0 && ids[len(ids)-1] >= m.nextID {
		return nil, fmt.Errorf("message id %d not below the next id %d: %w", ids[len(ids)-1], m.nextID, errSnapshot)
	}
	m.expiry.heapify()
	return m, nil
}

// decodeConsumers reads the consumers, the rings of their priority groups and the single active
// consumer state.
func (m *machine) decodeConsumers(r *snapReader, version byte) {
	n := r.count("consumers", snapMinConsumer)
	seqs := make([]uint64, 0, n)
	var prev ConsumerID
	for i := 0; i < n && r.err == nil; i++ {
		c := &consumer{}
		c.spec.ID = ConsumerID(r.uvarint("consumer id"))
		c.spec.Prefetch = r.u32("prefetch")
		prio := r.varint("consumer priority")
		bits := r.u8("consumer bits")
		c.seq = r.uvarint("consumer attach order")
		if version >= 2 {
			c.delivered = r.uvarint("consumer deliveries")
			if bits&snapCredited != 0 {
				c.spec.Credited = true
				c.spec.Credit = r.uvarint("consumer credit")
			}
		} else if bits&snapCredited != 0 {
			r.fail("consumer %d bits %#x", c.spec.ID, bits)
		}
		if r.err != nil {
			break
		}
		switch {
		case i > 0 && c.spec.ID <= prev:
			r.fail("consumer %d out of order", c.spec.ID)
		case prio < math.MinInt32 || prio > math.MaxInt32:
			r.fail("consumer %d priority %d out of range", c.spec.ID, prio)
		case bits >= snapConsumerBits:
			r.fail("consumer %d bits %#x", c.spec.ID, bits)
		case c.seq == 0 || c.seq > m.seq:
			r.fail("consumer %d attach order %d with counter %d", c.spec.ID, c.seq, m.seq)
		}
		prev = c.spec.ID
		c.spec.Priority = int32(prio)
		c.spec.NoAck = bits&snapNoAck != 0
		c.standby = bits&snapStandby != 0
		k := r.count("sent records", snapMinSent)
		for j := 0; j < k && r.err == nil; j++ {
			var o outstanding
			o.at = r.varint("sent time")
			o.id = r.uvarint("sent id")
			o.count = r.u32("sent count")
			c.sent.PushBack(o)
		}
		m.consumers[c.spec.ID] = c
		seqs = append(seqs, c.seq)
		// Groups by priority, highest first.
		gi, found := slices.BinarySearchFunc(m.groups, c.spec.Priority, func(g *group, p int32) int {
			return cmp.Compare(p, g.priority)
		})
		if !found {
			m.groups = slices.Insert(m.groups, gi, &group{priority: c.spec.Priority})
		}
		c.group = m.groups[gi]
		c.group.members++
	}
	if r.err != nil {
		return
	}
	slices.Sort(seqs)
	for i := 1; i < len(seqs); i++ {
		if seqs[i] == seqs[i-1] {
			r.fail("attach order %d used twice", seqs[i])
			return
		}
	}
	for _, g := range m.groups {
		k := r.count("ring", 1)
		if k > g.members {
			r.fail("ring of priority %d: %d consumers, %d members", g.priority, k, g.members)
		}
		for j := 0; j < k && r.err == nil; j++ {
			id := ConsumerID(r.uvarint("ring consumer"))
			c := m.consumers[id]
			if c == nil || c.group != g || c.active {
				r.fail("ring of priority %d: consumer %d", g.priority, id)
				break
			}
			c.active = true
			g.ring.PushBack(c)
		}
	}
	bits := r.u8("single active consumer bits")
	if bits >= snapSACBits {
		r.fail("single active consumer bits %#x", bits)
	}
	if bits&snapSACActive != 0 {
		id := ConsumerID(r.uvarint("active consumer"))
		if m.sacActive = m.consumers[id]; m.sacActive == nil {
			r.fail("active consumer %d not attached", id)
		}
	}
	m.sacQuiescing = bits&snapSACQuiescing != 0
	if r.err != nil {
		return
	}
	if !m.cfg.SingleActiveConsumer {
		if m.sacActive != nil || m.sacQuiescing {
			r.fail("single active consumer state without single active consumer")
		}
		for _, c := range m.consumers {
			if c.standby {
				r.fail("standby consumer %d without single active consumer", c.spec.ID)
				break
			}
		}
	} else if (m.sacActive != nil) != (len(m.consumers) > 0) || (m.sacQuiescing && m.sacActive == nil) {
		r.fail("single active consumer state with %d consumers", len(m.consumers))
	}
}

// decodeLevels reads the ready messages and tombstones, level by level.
func (m *machine) decodeLevels(r *snapReader) {
	for p := 0; p < len(m.levels) && r.err == nil; p++ {
		l := &m.levels[p]
		n := r.count("ready", snapMinEntry)
		for i := 0; i < n && r.err == nil; i++ {
			e := m.decodeReady(r, uint8(p))
			if i > 0 && e.id <= l.fifo.At(i-1).id {
				r.fail("ready message %d out of order", e.id)
			}
			l.fifo.PushBack(e)
		}
		n = r.count("returned", snapMinEntry)
		if n > 0 {
			l.returned = make(idHeap, 0, n)
		}
		for i := 0; i < n && r.err == nil; i++ {
			e := m.decodeReady(r, uint8(p))
			if i > 0 && l.returned[(i-1)/2].id > e.id {
				r.fail("returned message %d out of heap order", e.id)
			}
			l.returned = append(l.returned, e)
		}
		if l.len() > 0 {
			m.top = p
		}
	}
}

// decodeReady reads a ready message (or tombstone) of level p and accounts for it.
func (m *machine) decodeReady(r *snapReader, p uint8) entry {
	e, t, live := r.entry()
	e.prio = p
	switch {
	case live:
		t.e = e
		m.addTimed(e.id, t)
	case e.timed:
		m.tombs++
		return e
	}
	m.ready++
	m.readyBytes += int(e.size)
	return e
}

// addTimed adds a decoded timed record, putting it on the expiry heap (heapified by the caller) if
// it is queued.
func (m *machine) addTimed(id uint64, t timedMsg) {
	if m.timed == nil {
		m.timed = make(map[uint64]timedMsg)
	}
	m.timed[id] = t
	if t.queued {
		m.queuedLive++
		m.expiry = append(m.expiry, deadlineItem{deadline: t.deadline, id: id})
	}
}

// decodeUnacked reads the unacked messages and returns their ids.
func (m *machine) decodeUnacked(r *snapReader) []uint64 {
	n := r.count("unacked", snapMinEntry+3)
	ids := make([]uint64, 0, n)
	removed := make(map[ConsumerID]*consumer)
	for i := 0; i < n && r.err == nil; i++ {
		e, t, live := r.entry()
		e.prio = r.u8("unacked priority")
		kind := r.u8("owner kind")
		var owner *consumer
		if kind == ownerAttached || kind == ownerRemoved {
			id := ConsumerID(r.uvarint("owner"))
			if kind == ownerAttached {
				if owner = m.consumers[id]; owner == nil {
					r.fail("unacked message %d: owner %d not attached", e.id, id)
				}
			} else if owner = removed[id]; owner == nil {
				owner = &consumer{spec: consumerSpec{ID: id}}
				removed[id] = owner
			}
		}
		deadline := r.varint("unacked deadline")
		if r.err != nil {
			break
		}
		switch {
		case len(ids) > 0 && e.id <= ids[len(ids)-1]:
			r.fail("unacked message %d out of order", e.id)
		case kind > ownerRemoved:
			r.fail("unacked message %d: owner kind %d", e.id, kind)
		case e.prio > m.cfg.MaxPriority:
			r.fail("unacked message %d: priority %d above %d", e.id, e.prio, m.cfg.MaxPriority)
		case e.timed != live:
			r.fail("unacked message %d: timed without a record", e.id)
		}
		if live {
			t.e, t.unacked = e, true
			m.addTimed(e.id, t)
		}
		if owner != nil {
			owner.unacked++
		}
		m.unacked[e.id] = unackedEntry{entry: e, owner: owner, deadline: deadline}
		ids = append(ids, e.id)
	}
	return ids
}
