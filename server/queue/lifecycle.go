package queue

import "slices"

// Overflow is the x-overflow behaviour: what happens to a publish that would take the queue over
// its length limits.
type Overflow uint8

// The x-overflow values.
const (
	DropHead         Overflow = iota // enqueue, then drop (dead-letter) from the head until within the limits
	RejectPublish                    // refuse the message: the publisher gets basic.nack
	RejectPublishDLX                 // refuse the message and dead-letter it
)

// Config is a queue's lifecycle configuration, from its x-arguments. Use DefaultConfig as the
// starting point: in the zero value MessageTTL, MaxLength, MaxLengthBytes and DeliveryLimit are 0,
// which are valid limits, not "none".
type Config struct {
	// MaxPriority is x-max-priority, 1..255; 0 = not a priority queue. Messages are delivered
	// strictly by priority, higher first, FIFO within a priority; a priority above MaxPriority
	// counts as MaxPriority.
	MaxPriority uint8
	// MessageTTL is x-message-ttl in ms; < 0 = none. A message's deadline is the earlier of
	// publish time + MessageTTL and its Message.ExpiresAt. 0 is valid: the message expires unless
	// a consumer takes it at once (see PublishEntry).
	MessageTTL int64
	// MaxLength is x-max-length, counting ready messages only; < 0 = none.
	MaxLength int64
	// MaxLengthBytes is x-max-length-bytes, counting the body sizes of ready messages; < 0 = none.
	MaxLengthBytes int64
	// Overflow says what a publish over the limits does.
	Overflow Overflow
	// DeliveryLimit is x-delivery-limit; < 0 = none. The rule is that of RabbitMQ quorum queues
	// (rabbit_fifo return_one: the delivery count is incremented on return and the message is
	// dead-lettered when it "has been returned more times than the limit"): ReturnAt increments
	// the message's DeliveryCount, and if the new count is greater than DeliveryLimit the message is
	// dead-lettered (ReasonDeliveryLimit) instead of requeued. So with limit N a message is
	// delivered at most N+1 times: N returns requeue it, the (N+1)th dead-letters it; with limit 0
	// its first return dead-letters it.
	DeliveryLimit int64
	// SingleActiveConsumer is x-single-active-consumer: only one consumer receives messages (see
	// ActiveConsumer).
	SingleActiveConsumer bool
}

// DefaultConfig returns the configuration of a classic queue with no lifecycle arguments: no TTL,
// no length limits (drop-head), no priorities, no delivery limit, all consumers active.
func DefaultConfig() Config {
	return Config{MessageTTL: -1, MaxLength: -1, MaxLengthBytes: -1, DeliveryLimit: -1}
}

// Reason is why a message was dead-lettered, as written in the x-death header.
type Reason string

// The dead-letter reasons.
const (
	ReasonRejected      Reason = "rejected"       // rejected or nacked without requeue
	ReasonExpired       Reason = "expired"        // its TTL ran out
	ReasonMaxLen        Reason = "maxlen"         // dropped or refused by a length limit
	ReasonDeliveryLimit Reason = "delivery_limit" // returned more times than the delivery limit
)

// Dead is a message that left the queue for a reason that dead-letters it (or drops it when the
// queue has no dead-letter exchange: the caller decides).
type Dead struct {
	ID            uint64   // its id in this queue; 0 for a publish refused by reject-publish-dlx
	Msg           *Message // nil if its body is paged out: the caller loads it by ID and Flags
	Flags         uint8
	Reason        Reason
	DeliveryCount uint32 // its delivery count when it left (for delivery_limit: the count that went over)
	Size          uint32
}

func deadOf(e entry, r Reason, count uint32) Dead {
	return Dead{ID: e.id, Msg: e.msg, Flags: e.flags, Reason: r, DeliveryCount: count, Size: e.size}
}

// timedMsg is the machine's record of a live message with a deadline.
type timedMsg struct {
	e        entry // the message as it is now (its count changes on return)
	deadline int64 // Unix ms
	unacked  bool
	// queued is set while the expiry heap holds an item for it; there is then exactly one.
	queued bool
}

// track records e, which has just become ready, as a timed message with this deadline (0: keep
// the deadline of its record, for a returned message); arm puts it on the expiry heap if it is not
// there yet.
func (m *Machine) track(e entry, deadline int64, arm bool) {
	if m.timed == nil {
		m.timed = make(map[uint64]timedMsg)
	}
	t := m.timed[e.id]
	t.e, t.unacked = e, false
	if deadline != 0 {
		t.deadline = deadline
	}
	if arm && !t.queued {
		t.queued = true
		m.queuedLive++
		m.pushExpiry(deadlineItem{deadline: t.deadline, id: e.id})
	}
	m.timed[e.id] = t
}

// untrack forgets a timed message that left the queue. Its expiry item, if any, goes stale.
func (m *Machine) untrack(id uint64) {
	if t, ok := m.timed[id]; ok {
		if t.queued {
			m.queuedLive--
		}
		delete(m.timed, id)
	}
}

// leaveReady updates the record of a timed message that was just delivered: gone if it was
// removed at delivery (no-ack), else it is now unacked (and its unacked entry gets the deadline).
func (m *Machine) leaveReady(e entry, gone bool) {
	if gone {
		m.untrack(e.id)
		return
	}
	t := m.timed[e.id]
	t.unacked = true
	m.timed[e.id] = t
	u := m.unacked[e.id]
	u.deadline = t.deadline
	m.unacked[e.id] = u
}

// pushExpiry adds an item to the expiry heap, first sweeping out stale items when they are the
// majority (amortised O(1) per item).
func (m *Machine) pushExpiry(it deadlineItem) {
	if n := len(m.expiry); n >= 64 && n >= 2*m.queuedLive {
		h := m.expiry[:0]
		for _, x := range m.expiry {
			if _, live := m.timed[x.id]; live {
				h = append(h, x)
			}
		}
		clear(m.expiry[len(h):])
		h.heapify()
		m.expiry = h
	}
	m.expiry.push(it)
}

// expireReady turns the ready message e, already untracked, into a tombstone and reports it.
func (m *Machine) expireReady(e entry) Dead {
	m.ready--
	m.readyBytes -= int(e.size)
	m.tombs++
	// Let go of the body now if the tombstone is in the FIFO (found by id in O(log n)); a returned
	// one keeps it until it is popped or swept.
	l := &m.levels[e.prio]
	if i := l.fifo.search(func(x entry) bool { return x.id < e.id }); i < l.fifo.Len() && l.fifo.At(i).id == e.id {
		x := l.fifo.At(i)
		x.msg = nil
		l.fifo.set(i, x)
	}
	return deadOf(e, ReasonExpired, e.count)
}

// maybeSweep removes the tombstones from the levels once they outnumber the live ready messages.
func (m *Machine) maybeSweep() {
	if m.tombs <= 32 || m.tombs <= m.ready {
		return
	}
	live := func(e entry) bool {
		if !e.timed {
			return true
		}
		_, ok := m.timed[e.id]
		return ok
	}
	for p := range m.levels {
		l := &m.levels[p]
		j := 0
		for i := 0; i < l.fifo.Len(); i++ {
			if e := l.fifo.At(i); live(e) {
				l.fifo.set(j, e)
				j++
			}
		}
		l.fifo.truncate(j)
		r := l.returned[:0]
		for _, e := range l.returned {
			if live(e) {
				r = append(r, e)
			}
		}
		clear(l.returned[len(r):])
		r.heapify()
		l.returned = r
	}
	m.tombs = 0
}

// deadline returns the deadline of a message published at now with the given absolute expiry
// (0 = none), and whether it has one.
func (m *Machine) deadline(expiresAt, now int64) (int64, bool) {
	d := expiresAt
	if m.cfg.MessageTTL >= 0 {
		if q := now + m.cfg.MessageTTL; d == 0 || q < d {
			d = q
		}
	}
	return d, d != 0 || expiresAt != 0 || m.cfg.MessageTTL >= 0
}

// full reports whether a message of size bytes would take the queue over a length limit.
func (m *Machine) full(size uint32) bool {
	return (m.cfg.MaxLength >= 0 && int64(m.ready) >= m.cfg.MaxLength) ||
		(m.cfg.MaxLengthBytes >= 0 && int64(m.readyBytes)+int64(size) > m.cfg.MaxLengthBytes)
}

// over reports whether the queue is over a length limit.
func (m *Machine) over() bool {
	return (m.cfg.MaxLength >= 0 && int64(m.ready) > m.cfg.MaxLength) ||
		(m.cfg.MaxLengthBytes >= 0 && int64(m.readyBytes) > m.cfg.MaxLengthBytes)
}

// Publish is Enqueue with the lifecycle rules, at time now (Unix ms). msg must not be nil; its
// Priority and ExpiresAt are used (PublishEntry takes them separately, for a paged-out body).
func (m *Machine) Publish(msg *Message, size uint32, flags uint8, now int64) (id uint64, accepted bool, dead []Dead) {
	return m.PublishEntry(msg, size, flags, msg.Priority, msg.ExpiresAt, now)
}

// PublishEntry is Publish with the priority and the absolute expiry (Unix ms, 0 = none) given
// separately, so that msg may be nil for a body that lives only on disk.
//
// Length limits, by Overflow:
//   - DropHead: the message is enqueued, then messages are dropped from the head of the queue (the
//     next to be delivered: highest priority, oldest) until the queue is within its limits; they
//     come back in dead with ReasonMaxLen. The new message itself may be among them.
//   - RejectPublish: if the queue is full (ready count >= MaxLength, or ready bytes + size >
//     MaxLengthBytes) the message is not enqueued: accepted=false, id=0, dead empty; the caller
//     nacks the publisher.
//   - RejectPublishDLX: as RejectPublish, and dead holds the refused message (ID 0,
//     ReasonMaxLen) for the caller to dead-letter.
//
// TTL: the deadline is the earlier of now + MessageTTL and expiresAt. A message already due when
// published (TTL 0, expiration 0 or in the past) is "delivered at once or expired", as in
// RabbitMQ: if no consumer can take a message right now it is not enqueued and comes back in dead
// with ReasonExpired (accepted=true: the publisher gets an ack, and id was used up); otherwise it
// is enqueued, Expire leaves it alone, and the next CheckoutAt that does not stop at its max either
// delivers it or reports it expired.
func (m *Machine) PublishEntry(msg *Message, size uint32, flags uint8, priority uint8, expiresAt int64, now int64) (id uint64, accepted bool, dead []Dead) {
	if m.cfg.Overflow != DropHead && m.full(size) {
		if m.cfg.Overflow == RejectPublishDLX {
			dead = []Dead{{Msg: msg, Flags: flags, Reason: ReasonMaxLen, Size: size}}
		}
		return 0, false, dead
	}
	id = m.nextID
	m.nextID++
	e := entry{id: id, msg: msg, size: size, flags: flags, prio: m.levelOf(priority)}
	d, timed := m.deadline(expiresAt, now)
	if !timed {
		m.pushReady(e)
		return id, true, m.trim(nil)
	}
	due := d <= now
	if due && !m.canTakeNow() {
		return id, true, []Dead{{ID: id, Msg: msg, Flags: flags, Reason: ReasonExpired, Size: size}}
	}
	e.timed = true
	m.pushReady(e)
	m.track(e, max(d, 1), !due)
	if due {
		m.atOnce = append(m.atOnce, id)
	}
	return id, true, m.trim(nil)
}

// Trim applies the drop-head length limits now and returns the messages it dropped
// (ReasonMaxLen). Publish trims by itself; call Trim after returning messages, as RabbitMQ drops
// from the head after a requeue too. It does nothing unless Overflow is DropHead.
func (m *Machine) Trim() []Dead { return m.trim(nil) }

func (m *Machine) trim(dead []Dead) []Dead {
	if m.cfg.Overflow != DropHead {
		return dead
	}
	for m.ready > 0 && m.over() {
		e := m.popReady()
		if e.timed {
			m.untrack(e.id)
		}
		dead = append(dead, deadOf(e, ReasonMaxLen, e.count))
	}
	return dead
}

// Expire removes every ready message whose deadline is <= now, wherever it is in the queue (not
// only at the head), and returns them (ReasonExpired) in deadline order, ties by id. The one
// exception are messages published already due while a consumer could take them, which wait for
// the next CheckoutAt (see PublishEntry). Unacked messages do not expire; one whose deadline passed
// while it was unacked expires as soon as it is returned. O(log n) per message.
func (m *Machine) Expire(now int64) []Dead { return m.expire(now, nil) }

func (m *Machine) expire(now int64, dead []Dead) []Dead {
	for len(m.expiry) > 0 && m.expiry[0].deadline <= now {
		it := m.expiry.pop()
		t, ok := m.timed[it.id]
		if !ok {
			continue // stale: the message is gone
		}
		t.queued = false
		m.queuedLive--
		if t.unacked {
			m.timed[it.id] = t // re-armed when it is returned
			continue
		}
		delete(m.timed, it.id)
		dead = append(dead, m.expireReady(t.e))
	}
	m.maybeSweep()
	return dead
}

// NextExpiry returns the earliest deadline among the ready messages that Expire would remove, for
// the caller's timer; ok is false if there is none.
func (m *Machine) NextExpiry() (deadline int64, ok bool) {
	for len(m.expiry) > 0 {
		it := m.expiry[0]
		t, live := m.timed[it.id]
		if live && !t.unacked {
			return it.deadline, true
		}
		m.expiry.pop()
		if live {
			t.queued = false
			m.queuedLive--
			m.timed[it.id] = t
		}
	}
	return 0, false
}

// sweepAtOnce expires the messages published already due that no consumer took.
func (m *Machine) sweepAtOnce(dead []Dead) []Dead {
	for _, id := range m.atOnce {
		if t, ok := m.timed[id]; ok && !t.unacked && !t.queued {
			delete(m.timed, id)
			dead = append(dead, m.expireReady(t.e))
		}
	}
	m.atOnce = m.atOnce[:0]
	m.maybeSweep()
	return dead
}

// CheckoutAt is Checkout at time now: first it expires what is due (as Expire), so it never hands
// out an expired message; it records now as the delivery time of each unacked delivery (for
// TimedOut); and unless it stopped because it reached max, it expires the messages published already
// due that it could not deliver. It returns the deliveries and the expired messages.
func (m *Machine) CheckoutAt(dst []Delivery, max int, reserve func(ConsumerID) bool, now int64) ([]Delivery, []Dead) {
	dead := m.expire(now, nil)
	dst, atMax := m.checkout(dst, max, reserve, now)
	if len(m.atOnce) > 0 && (!atMax || m.ready == 0) {
		dead = m.sweepAtOnce(dead)
	}
	return dst, dead
}

// GetAt is Get at time now: it expires what is due first (as Expire), so it never hands out an
// expired message, and it returns what expired on the way.
func (m *Machine) GetAt(noAck bool, now int64) (Delivery, bool, []Dead) {
	dead := m.expire(now, nil)
	d, ok := m.get(noAck)
	return d, ok, dead
}

// ReturnAt is Return with the delivery limit (see Config.DeliveryLimit): the message is requeued at
// its original position, or, if its incremented delivery count is over the limit, removed and
// reported as dead (ReasonDeliveryLimit). ok is false if id is not unacked.
func (m *Machine) ReturnAt(id uint64) (dead *Dead, ok bool) {
	e, ok := m.take(id, false)
	if !ok {
		return nil, false
	}
	if lim := m.cfg.DeliveryLimit; lim >= 0 && int64(e.count)+1 > lim {
		if e.timed {
			m.untrack(id)
		}
		d := deadOf(e, ReasonDeliveryLimit, e.count+1)
		return &d, true
	}
	m.requeue(e)
	return nil, true
}

// DiscardDead is Discard reporting the message as Dead with ReasonRejected.
func (m *Machine) DiscardDead(id uint64) (Dead, bool) {
	e, ok := m.take(id, true)
	if !ok {
		return Dead{}, false
	}
	return deadOf(e, ReasonRejected, e.count), true
}

// ReturnConsumer returns (requeues) every unacked message delivered to a consumer with this ID,
// attached or already removed, in id order, applying the delivery limit as ReturnAt does. It
// returns the ids requeued and the dead. It does not remove the consumer.
func (m *Machine) ReturnConsumer(id ConsumerID) (requeued []uint64, dead []Dead) {
	var ids []uint64
	for uid, u := range m.unacked {
		if u.owner != nil && u.owner.spec.ID == id {
			ids = append(ids, uid)
		}
	}
	slices.Sort(ids)
	for _, uid := range ids {
		if d, _ := m.ReturnAt(uid); d != nil {
			dead = append(dead, *d)
		} else {
			requeued = append(requeued, uid)
		}
	}
	return requeued, dead
}

// recordSent notes a delivery to c made with a time.
func (m *Machine) recordSent(c *consumer, o outstanding) {
	m.oldestSent(c)
	if n := c.sent.Len(); n >= 32 && n > 2*c.unacked {
		j := 0
		for i := range n {
			if x := c.sent.At(i); m.stillSent(c, x) {
				c.sent.set(j, x)
				j++
			}
		}
		c.sent.truncate(j)
	}
	c.sent.PushBack(o)
}

// stillSent reports whether o is still an unacked delivery of c.
func (m *Machine) stillSent(c *consumer, o outstanding) bool {
	u, ok := m.unacked[o.id]
	return ok && u.owner == c && u.count == o.count
}

// oldestSent returns the delivery time of c's oldest unacked message delivered with a time,
// dropping the stale records in front of it.
func (m *Machine) oldestSent(c *consumer) (int64, bool) {
	for c.sent.Len() > 0 {
		if o := c.sent.At(0); m.stillSent(c, o) {
			return o.at, true
		}
		c.sent.PopFront()
	}
	return 0, false
}

// TimedOut returns, in increasing id order, the attached consumers that have an unacked message
// delivered (by CheckoutAt) timeout(c) ms or more before now; timeout(c) <= 0 means never. timeout
// is called once per attached consumer, in no particular order, and must not call back into the
// machine. The caller typically cancels them and returns their messages (ReturnConsumer).
// Messages delivered by Checkout or Get carry no time and never time out; now must not go backwards.
func (m *Machine) TimedOut(now int64, timeout func(ConsumerID) int64) []ConsumerID {
	var out []ConsumerID
	for id, c := range m.consumers {
		if t := timeout(id); t > 0 {
			if at, ok := m.oldestSent(c); ok && now-at >= t {
				out = append(out, id)
			}
		}
	}
	slices.Sort(out)
	return out
}

// NextTimeout returns the earliest time at which TimedOut would report a consumer, for the caller's
// timer (ok=false if none would ever be, as things stand).
func (m *Machine) NextTimeout(timeout func(ConsumerID) int64) (deadline int64, ok bool) {
	for id, c := range m.consumers {
		if t := timeout(id); t > 0 {
			if at, has := m.oldestSent(c); has && (!ok || at+t < deadline) {
				deadline, ok = at+t, true
			}
		}
	}
	return deadline, ok
}

// ActiveConsumer returns the single active consumer (SingleActiveConsumer queues only; ok=false
// otherwise or when no consumer is attached). The active consumer is the first attached, unless a
// consumer with a higher Priority is attached: as in RabbitMQ 4.x quorum queues, the current one
// then gets no new messages and the higher priority one takes over once the current one has no
// unacked messages left (until then ActiveConsumer still names the current one). When the active
// consumer is removed, the consumer with the highest priority, earliest attached among equals,
// becomes active at once.
func (m *Machine) ActiveConsumer() (ConsumerID, bool) {
	if m.sacActive == nil {
		return 0, false
	}
	return m.sacActive.spec.ID, true
}

// sacUpdate applies the single active consumer rules after a change.
func (m *Machine) sacUpdate() {
	if !m.cfg.SingleActiveConsumer {
		return
	}
	// The candidate does not depend on map order: priority, then attach order, are a total order.
	var cand *consumer
	for _, c := range m.consumers {
		if cand == nil || c.spec.Priority > cand.spec.Priority ||
			(c.spec.Priority == cand.spec.Priority && c.seq < cand.seq) {
			cand = c
		}
	}
	act := m.sacActive
	if act == nil || (cand.spec.Priority > act.spec.Priority && act.unacked == 0) {
		act = cand
	}
	m.sacActive = act
	m.sacQuiescing = act != nil && cand.spec.Priority > act.spec.Priority
	// At most one consumer (act) leaves standby, so the ring order stays deterministic.
	for _, c := range m.consumers {
		standby := c != act || m.sacQuiescing
		if standby == c.standby {
			continue
		}
		c.standby = standby
		if standby {
			m.unring(c)
		} else if !c.active && c.eligible() {
			c.active = true
			c.group.ring.PushBack(c)
		}
	}
}

// EntryInfo describes a message held by the machine, for the caller's own records (e.g. what it
// persists to recover the message with RestoreAt).
type EntryInfo struct {
	Flags         uint8
	Priority      uint8  // its priority level, clamped to MaxPriority
	ExpiresAt     int64  // its deadline, Unix ms; 0 = none
	DeliveryCount uint32 // deliveries before the current one
	Size          uint32
}

// UnackedInfo describes an unacked message (ok=false if id is not unacked). O(1).
func (m *Machine) UnackedInfo(id uint64) (EntryInfo, bool) {
	u, ok := m.unacked[id]
	if !ok {
		return EntryInfo{}, false
	}
	return EntryInfo{Flags: u.flags, Priority: u.prio, ExpiresAt: u.deadline, DeliveryCount: u.count, Size: u.size}, true
}

// SetUnackedFlags replaces the caller's flags of an unacked message (they travel with it when it is
// returned). It reports false if id is not unacked.
func (m *Machine) SetUnackedFlags(id uint64, flags uint8) bool {
	u, ok := m.unacked[id]
	if !ok {
		return false
	}
	u.flags = flags
	m.unacked[id] = u
	return true
}

// DeadlineFor returns the deadline (Unix ms, 0 = none) that Publish at time now gives a message
// with the absolute expiry expiresAt (0 = none): the earlier of expiresAt and now + MessageTTL.
// A deadline <= now means the message is due at once.
func (m *Machine) DeadlineFor(expiresAt, now int64) int64 {
	d, timed := m.deadline(expiresAt, now)
	if !timed {
		return 0
	}
	return max(d, 1)
}
