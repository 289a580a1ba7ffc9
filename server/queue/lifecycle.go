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
	// a consumer takes it at once (see machine.publish).
	MessageTTL int64
	// MaxLength is x-max-length, counting ready messages only; < 0 = none.
	MaxLength int64
	// MaxLengthBytes is x-max-length-bytes, counting the body sizes of ready messages; < 0 = none.
	MaxLengthBytes int64
	// Overflow says what a publish over the limits does.
	Overflow Overflow
	// DeliveryLimit is x-delivery-limit; < 0 = none. The rule is that of RabbitMQ quorum queues
	// (rabbit_fifo return_one: the delivery count is incremented on return and the message is
	// dead-lettered when it "has been returned more times than the limit"): a return increments
	// the message's DeliveryCount, and if the new count is greater than DeliveryLimit the message is
	// dead-lettered (ReasonDeliveryLimit) instead of requeued. So with limit N a message is
	// delivered at most N+1 times: N returns requeue it, the (N+1)th dead-letters it; with limit 0
	// its first return dead-letters it.
	DeliveryLimit int64
	// SingleActiveConsumer is x-single-active-consumer: only one consumer receives messages (see
	// machine.activeConsumer).
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
// queue has no dead-letter exchange: the core decides).
type Dead struct {
	ID     uint64   // its id in this queue; 0 for a publish refused by reject-publish-dlx
	Msg    *Message // the message; inside the package nil while its body is paged out
	Reason Reason
	// DeliveryCount is its delivery count when it left (for delivery_limit: the count that went over).
	DeliveryCount uint32
	// Key is the dedupe key the dead letter must carry to its targets (Message.Dedupe): set by
	// quorum queues, whose dead letters are handed over at least once; zero for classic queues.
	Key DedupeKey

	flags uint8 // storage flags, to load a paged body
	size  uint32
}

func deadOf(e entry, r Reason, count uint32) Dead {
	return Dead{ID: e.id, Msg: e.msg, flags: e.flags, Reason: r, DeliveryCount: count, size: e.size}
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
func (m *machine) track(e entry, deadline int64, arm bool) {
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
func (m *machine) untrack(id uint64) {
	if t, ok := m.timed[id]; ok {
		if t.queued {
			m.queuedLive--
		}
		delete(m.timed, id)
	}
}

// leaveReady updates the record of a timed message that was just delivered: gone if it was
// removed at delivery (no-ack), else it is now unacked (and its unacked entry gets the deadline).
func (m *machine) leaveReady(e entry, gone bool) {
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
func (m *machine) pushExpiry(it deadlineItem) {
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
func (m *machine) expireReady(e entry) Dead {
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
func (m *machine) maybeSweep() {
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
func (m *machine) deadline(expiresAt, now int64) (int64, bool) {
	d := expiresAt
	if m.cfg.MessageTTL >= 0 {
		if q := now + m.cfg.MessageTTL; d == 0 || q < d {
			d = q
		}
	}
	return d, d != 0 || expiresAt != 0 || m.cfg.MessageTTL >= 0
}

// full reports whether a message of size bytes would take the queue over a length limit.
func (m *machine) full(size uint32) bool {
	return (m.cfg.MaxLength >= 0 && int64(m.ready) >= m.cfg.MaxLength) ||
		(m.cfg.MaxLengthBytes >= 0 && int64(m.readyBytes)+int64(size) > m.cfg.MaxLengthBytes)
}

// over reports whether the queue is over a length limit.
func (m *machine) over() bool {
	return (m.cfg.MaxLength >= 0 && int64(m.ready) > m.cfg.MaxLength) ||
		(m.cfg.MaxLengthBytes >= 0 && int64(m.readyBytes) > m.cfg.MaxLengthBytes)
}

// publish appends a message at the tail with the lifecycle rules, at time now (Unix ms), and
// returns its id (1, 2, 3, ...: strictly increasing). The priority and the absolute expiry (Unix
// ms, 0 = none) are given apart from msg, which may be nil for a body that lives only on disk (the
// Dead values it returns then carry a nil Msg; the caller fills in the message it has).
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
// is enqueued, expire leaves it alone, and the next checkout that does not stop at its max either
// delivers it or reports it expired.
func (m *machine) publish(msg *Message, size uint32, flags uint8, priority uint8, expiresAt int64, now int64, dead []Dead) (id uint64, accepted bool, _ []Dead) {
	if m.cfg.Overflow != DropHead && m.full(size) {
		if m.cfg.Overflow == RejectPublishDLX {
			dead = append(dead, Dead{Msg: msg, flags: flags, Reason: ReasonMaxLen, size: size})
		}
		return 0, false, dead
	}
	id = m.nextID
	m.nextID++
	e := entry{id: id, msg: msg, size: size, flags: flags, prio: m.levelOf(priority)}
	d, timed := m.deadline(expiresAt, now)
	if !timed {
		m.pushReady(e)
		return id, true, m.trim(dead)
	}
	due := d <= now
	if due && !m.canTakeNow() {
		return id, true, append(dead, Dead{ID: id, Msg: msg, flags: flags, Reason: ReasonExpired, size: size})
	}
	e.timed = true
	m.pushReady(e)
	m.track(e, max(d, 1), !due)
	if due {
		m.atOnce = append(m.atOnce, id)
	}
	return id, true, m.trim(dead)
}

// trim applies the drop-head length limits now and appends the messages it dropped (ReasonMaxLen)
// to dead. publish trims by itself; State trims after returning messages too, as RabbitMQ drops
// from the head after a requeue. It does nothing unless Overflow is DropHead.
func (m *machine) trim(dead []Dead) []Dead {
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

// expire removes every ready message whose deadline is <= now, wherever it is in the queue (not
// only at the head), and appends them (ReasonExpired) to dead in deadline order, ties by id. The
// one exception are messages published already due while a consumer could take them, which wait
// for the next checkout (see publish). Unacked messages do not expire; one whose deadline passed
// while it was unacked expires as soon as it is returned. O(log n) per message.
func (m *machine) expire(now int64, dead []Dead) []Dead {
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

// nextExpiry returns the earliest deadline among the ready messages that expire would remove, for
// the caller's timer; ok is false if there is none. It drops stale heap items on the way, which no
// snapshot or later result can observe.
func (m *machine) nextExpiry() (deadline int64, ok bool) {
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
func (m *machine) sweepAtOnce(dead []Dead) []Dead {
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

// checkoutAt is checkout at time now: first it expires what is due (as expire), so it never hands
// out an expired message; and unless it stopped because it reached max, it expires the messages
// published already due that it could not deliver. It returns the deliveries and appends the
// expired messages to dead.
func (m *machine) checkoutAt(dst []Delivery, max int, reserve func(ConsumerID) bool, now int64, dead []Dead) ([]Delivery, []Dead) {
	dead = m.expire(now, dead)
	dst, atMax := m.checkout(dst, max, reserve, now)
	if len(m.atOnce) > 0 && (!atMax || m.ready == 0) {
		dead = m.sweepAtOnce(dead)
	}
	return dst, dead
}

// getAt is get at time now: it expires what is due first (as expire), so it never hands out an
// expired message, and it appends what expired on the way to dead.
func (m *machine) getAt(noAck bool, now int64, dead []Dead) (Delivery, bool, []Dead) {
	dead = m.expire(now, dead)
	d, ok := m.get(noAck)
	return d, ok, dead
}

// returnTag requeues an unacked delivery with the delivery limit (see Config.DeliveryLimit): the
// message goes back to its original position, or, if its incremented delivery count is over the
// limit, it is removed and reported as dead (ReasonDeliveryLimit). ok is false if tag is not an
// unacked delivery. requeued is the message as it is now ready (valid when dead is nil).
func (m *machine) returnTag(tag Tag) (requeued entry, dead *Dead, ok bool) {
	e, ok := m.take(tag, false)
	if !ok {
		return entry{}, nil, false
	}
	if lim := m.cfg.DeliveryLimit; lim >= 0 && int64(e.count)+1 > lim {
		if e.timed {
			m.untrack(e.id)
		}
		d := deadOf(e, ReasonDeliveryLimit, e.count+1)
		return entry{}, &d, true
	}
	return m.requeue(e), nil, true
}

// discardTag removes an unacked delivery (reject or nack without requeue) and reports the message as
// Dead with ReasonRejected. ok is false if tag is not an unacked delivery.
func (m *machine) discardTag(tag Tag) (Dead, bool) {
	e, ok := m.take(tag, true)
	if !ok {
		return Dead{}, false
	}
	return deadOf(e, ReasonRejected, e.count), true
}

// ownedBy returns, in id order, the tags of the unacked deliveries of consumers (attached or
// already removed) for which owned is true. It appends to dst.
func (m *machine) ownedBy(dst []Tag, owned func(ConsumerID) bool) []Tag {
	n := len(dst)
	for uid, u := range m.unacked {
		if u.owner != nil && owned(u.owner.spec.ID) {
			dst = append(dst, Tag{ID: uid, Count: u.count})
		}
	}
	slices.SortFunc(dst[n:], func(a, b Tag) int { return cmpID(a.ID, b.ID) })
	return dst
}

func cmpID(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// recordSent notes a delivery to c made with a time.
func (m *machine) recordSent(c *consumer, o outstanding) {
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
func (m *machine) stillSent(c *consumer, o outstanding) bool {
	u, ok := m.unacked[o.id]
	return ok && u.owner == c && u.count == o.count
}

// oldestSent returns the delivery time of c's oldest unacked message delivered with a time,
// dropping the stale records in front of it.
func (m *machine) oldestSent(c *consumer) (int64, bool) {
	for c.sent.Len() > 0 {
		if o := c.sent.At(0); m.stillSent(c, o) {
			return o.at, true
		}
		c.sent.PopFront()
	}
	return 0, false
}

// timedOut returns, in increasing id order, the attached consumers that have an unacked message
// delivered (by a checkout with a time) timeout(c) ms or more before now; timeout(c) <= 0 means
// never. timeout is called once per attached consumer, in no particular order, and must not call
// back into the machine. basic.get deliveries carry no time and never time out.
func (m *machine) timedOut(now int64, timeout func(ConsumerID) int64) []ConsumerID {
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

// nextTimeout returns the earliest time at which timedOut would report a consumer, for the caller's
// timer (ok=false if none would ever be, as things stand).
func (m *machine) nextTimeout(timeout func(ConsumerID) int64) (deadline int64, ok bool) {
	for id, c := range m.consumers {
		if t := timeout(id); t > 0 {
			if at, has := m.oldestSent(c); has && (!ok || at+t < deadline) {
				deadline, ok = at+t, true
			}
		}
	}
	return deadline, ok
}

// activeConsumer returns the single active consumer (SingleActiveConsumer queues only; ok=false
// otherwise or when no consumer is attached). The active consumer is the first attached, unless a
// consumer with a higher Priority is attached: as in RabbitMQ 4.x quorum queues, the current one
// then gets no new messages and the higher priority one takes over once the current one has no
// unacked messages left (until then activeConsumer still names the current one). When the active
// consumer is removed, the consumer with the highest priority, earliest attached among equals,
// becomes active at once.
func (m *machine) activeConsumer() (ConsumerID, bool) {
	if m.sacActive == nil {
		return 0, false
	}
	return m.sacActive.spec.ID, true
}

// sacUpdate applies the single active consumer rules after a change.
func (m *machine) sacUpdate() {
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

// deadlineFor returns the deadline (Unix ms, 0 = none) that publish at time now gives a message
// with the absolute expiry expiresAt (0 = none): the earlier of expiresAt and now + MessageTTL.
// A deadline <= now means the message is due at once.
func (m *machine) deadlineFor(expiresAt, now int64) int64 {
	d, timed := m.deadline(expiresAt, now)
	if !timed {
		return 0
	}
	return max(d, 1)
}
