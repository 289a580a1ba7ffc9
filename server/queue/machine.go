// Package queue holds the queue types of the broker. Machine is the pure, deterministic state machine
// shared by classic queues (driven directly) and quorum queues (driven as a Raft FSM): it has no
// goroutines, locks, I/O, clock or randomness, and its results never depend on map iteration order.
package queue

import "slices"

// Message is the immutable content of a queued message. The machine never mutates or copies it.
type Message struct {
	Exchange, RoutingKey string
	Props                []byte // raw AMQP basic properties (flags + fields)
	Body                 []byte
	Persistent           bool // delivery-mode 2
}

// ConsumerID identifies a consumer within one queue. 0 is reserved for basic.get and must not be
// used for a consumer.
type ConsumerID uint64

// Delivery is one message handed to a consumer (or to basic.get).
type Delivery struct {
	Consumer      ConsumerID // 0 for basic.get
	ID            uint64     // message id within this queue (from Enqueue)
	Msg           *Message
	Redelivered   bool   // true once the message has been returned at least once
	DeliveryCount uint32 // deliveries before this one (0 on first delivery)
	Flags         uint8  // the caller's flags from EnqueueEntry (e.g. where the message is stored)
	Settled       bool   // removed at delivery (no-ack consumer or basic.get without ack)
}

// ConsumerSpec describes a consumer attached to the queue.
type ConsumerSpec struct {
	ID       ConsumerID
	Prefetch uint32 // max unacked for this consumer; 0 = unlimited
	Priority int32  // x-priority; higher first
	NoAck    bool   // auto-ack: delivered messages are removed at once and never count as unacked
}

// entry is a message in the queue together with its per-queue delivery state.
type entry struct {
	id          uint64
	msg         *Message // nil while the body is paged out to disk (the caller loads it)
	count       uint32   // times delivered and returned so far
	size        uint32   // body size, kept while msg is paged out
	flags       uint8    // caller-defined, opaque to the machine
	redelivered bool
}

// unackedEntry is a delivered message awaiting settlement. owner is nil for basic.get; it stays
// pointing at a removed consumer so that a later consumer reusing the ID is not credited by mistake.
type unackedEntry struct {
	entry
	owner *consumer
}

// consumer is the machine's view of one consumer.
type consumer struct {
	spec    ConsumerSpec
	group   *group
	unacked int  // delivered, not yet settled/returned/discarded (never counts NoAck deliveries)
	active  bool // has credit: it is in group.ring (or taken out of it by the running Checkout)
}

func (c *consumer) hasCredit() bool {
	return c.spec.NoAck || c.spec.Prefetch == 0 || c.unacked < int(c.spec.Prefetch)
}

// group holds the consumers of one priority. ring lists those with credit in round-robin order:
// Checkout serves the front and moves it to the back.
type group struct {
	priority int32
	members  int // consumers in the group, with or without credit
	ring     deque[*consumer]
}

// Machine is the state of one queue: ready messages in id order, unacked messages by id, and the
// consumers. It is not safe for concurrent use; the caller serialises every call.
//
// Ready messages live in two places. fifo holds messages never delivered, in id order; it only grows
// at the back (Enqueue) and shrinks at the front, so every id ever delivered is below its head.
// returned is a min-heap of requeued messages, whose ids are therefore all below the fifo head:
// the next ready message is the heap minimum if the heap is not empty, else the fifo head.
type Machine struct {
	nextID     uint64
	fifo       deque[entry]
	returned   idHeap
	readyBytes int
	unacked    map[uint64]unackedEntry

	consumers map[ConsumerID]*consumer // lookup only, never iterated
	groups    []*group                 // by priority, highest first
	skipped   []*consumer              // scratch for Checkout, kept to avoid allocating
}

// NewMachine returns an empty queue with no consumers.
func NewMachine() *Machine {
	return &Machine{
		nextID:    1,
		unacked:   make(map[uint64]unackedEntry),
		consumers: make(map[ConsumerID]*consumer),
	}
}

// Enqueue appends a message at the tail and returns its id (1, 2, 3, ...: strictly increasing).
// msg must not be nil.
func (m *Machine) Enqueue(msg *Message) uint64 {
	return m.EnqueueEntry(msg, uint32(len(msg.Body)), 0)
}

// EnqueueEntry is Enqueue with the body size given separately, so msg may be nil for a message whose
// body lives only on disk, and with caller-defined flags that come back in its Delivery.
func (m *Machine) EnqueueEntry(msg *Message, size uint32, flags uint8) uint64 {
	id := m.nextID
	m.nextID++
	m.fifo.PushBack(entry{id: id, msg: msg, size: size, flags: flags})
	m.readyBytes += int(size)
	return id
}

// Restore appends a recovered message with a known id (larger than every id so far), for rebuilding
// a queue from storage. It counts as redelivered: it may have been delivered before the restart.
func (m *Machine) Restore(id uint64, msg *Message, size uint32, flags uint8, count uint32) {
	if id < m.nextID {
		return
	}
	m.nextID = id + 1
	m.fifo.PushBack(entry{id: id, msg: msg, size: size, flags: flags, count: count, redelivered: true})
	m.readyBytes += int(size)
}

// AddConsumer attaches a consumer; it takes part in the next Checkout. If a consumer with the same
// ID exists its spec is replaced (keeping its unacked messages) and it moves to the back of its
// priority group's rotation.
func (m *Machine) AddConsumer(c ConsumerSpec) {
	if old, ok := m.consumers[c.ID]; ok {
		m.detach(old)
		old.spec = c
		m.attach(old)
		return
	}
	nc := &consumer{spec: c}
	m.consumers[c.ID] = nc
	m.attach(nc)
}

// RemoveConsumer stops deliveries to the consumer. Its unacked messages STAY unacked (RabbitMQ:
// basic.cancel does not requeue); they are settled, returned or discarded later by id.
// It returns false if the consumer is unknown.
func (m *Machine) RemoveConsumer(id ConsumerID) bool {
	c, ok := m.consumers[id]
	if !ok {
		return false
	}
	delete(m.consumers, id)
	m.detach(c)
	return true
}

// HasConsumer reports whether a consumer with this ID is attached.
func (m *Machine) HasConsumer(id ConsumerID) bool {
	_, ok := m.consumers[id]
	return ok
}

// attach puts c in the group of its priority, creating the group if needed.
func (m *Machine) attach(c *consumer) {
	i := 0
	for i < len(m.groups) && m.groups[i].priority > c.spec.Priority {
		i++
	}
	if i == len(m.groups) || m.groups[i].priority != c.spec.Priority {
		m.groups = slices.Insert(m.groups, i, &group{priority: c.spec.Priority})
	}
	g := m.groups[i]
	g.members++
	c.group = g
	if c.hasCredit() {
		c.active = true
		g.ring.PushBack(c)
	}
}

// detach takes c out of its group, dropping the group once empty. O(consumers).
func (m *Machine) detach(c *consumer) {
	g := c.group
	if c.active {
		for i := 0; i < g.ring.Len(); i++ {
			if g.ring.At(i) == c {
				g.ring.Remove(i)
				break
			}
		}
		c.active = false
	}
	c.group = nil
	g.members--
	if g.members > 0 {
		return
	}
	if i := slices.Index(m.groups, g); i >= 0 {
		m.groups = slices.Delete(m.groups, i, i+1)
	}
}

// Checkout assigns ready messages to consumers and appends the deliveries to dst, at most max
// (max <= 0: no limit). Among consumers with credit (unacked < prefetch, prefetch 0, or NoAck) the
// highest priority group wins; within a group consumers take turns message by message, and the turn
// is remembered between calls. Before assigning each message to consumer X it calls reserve(X):
// false means X cannot take anything now and X is skipped for the rest of this call (it keeps its
// turn for the next call); true commits the assignment. reserve may be nil (always true) and must not
// call back into the machine. NoAck deliveries remove the message for good; the others become
// unacked. Checkout stops when no ready message remains or no consumer can take one.
func (m *Machine) Checkout(dst []Delivery, max int, reserve func(ConsumerID) bool) []Delivery {
	skipped := m.skipped
	for n := 0; (max <= 0 || n < max) && m.Ready() > 0; {
		c := m.nextConsumer()
		if c == nil {
			break
		}
		if reserve != nil && !reserve(c.spec.ID) {
			skipped = append(skipped, c)
			continue
		}
		dst = append(dst, m.deliver(m.popReady(), c))
		n++
		if c.hasCredit() {
			c.group.ring.PushBack(c)
		} else {
			c.active = false
		}
	}
	// Skipped consumers got nothing: they go back to the front, in their previous order.
	for i := len(skipped) - 1; i >= 0; i-- {
		skipped[i].group.ring.PushFront(skipped[i])
		skipped[i] = nil
	}
	m.skipped = skipped[:0]
	return dst
}

// nextConsumer takes the consumer whose turn it is out of the highest priority group that has
// credit, or returns nil if no consumer has credit.
func (m *Machine) nextConsumer() *consumer {
	for _, g := range m.groups {
		if g.ring.Len() > 0 {
			return g.ring.PopFront()
		}
	}
	return nil
}

// Get implements basic.get: it takes the next ready message (Consumer 0). With noAck it is removed
// at once, otherwise it becomes unacked. It returns false if no message is ready.
func (m *Machine) Get(noAck bool) (Delivery, bool) {
	if m.Ready() == 0 {
		return Delivery{}, false
	}
	e := m.popReady()
	d := Delivery{ID: e.id, Msg: e.msg, Redelivered: e.redelivered, DeliveryCount: e.count, Flags: e.flags, Settled: noAck}
	if !noAck {
		m.unacked[e.id] = unackedEntry{entry: e}
	}
	return d, true
}

// popReady removes and returns the ready message with the smallest id. Ready must be > 0.
func (m *Machine) popReady() entry {
	var e entry
	if len(m.returned) > 0 {
		e = m.returned.pop()
	} else {
		e = m.fifo.PopFront()
	}
	m.readyBytes -= int(e.size)
	return e
}

// deliver hands e to c, recording it as unacked unless c is NoAck.
func (m *Machine) deliver(e entry, c *consumer) Delivery {
	if !c.spec.NoAck {
		m.unacked[e.id] = unackedEntry{entry: e, owner: c}
		c.unacked++
	}
	return Delivery{Consumer: c.spec.ID, ID: e.id, Msg: e.msg, Redelivered: e.redelivered, DeliveryCount: e.count,
		Flags: e.flags, Settled: c.spec.NoAck}
}

// take removes id from the unacked set and gives its consumer the credit back.
func (m *Machine) take(id uint64) (entry, bool) {
	u, ok := m.unacked[id]
	if !ok {
		return entry{}, false
	}
	delete(m.unacked, id)
	if c := u.owner; c != nil {
		c.unacked--
		if c.group != nil && !c.active && c.hasCredit() {
			c.active = true
			c.group.ring.PushBack(c)
		}
	}
	return u.entry, true
}

// Settle (ack) forgets an unacked message. It returns false if id is not unacked.
func (m *Machine) Settle(id uint64) bool {
	_, ok := m.take(id)
	return ok
}

// SettleEntry is Settle returning the message's flags.
func (m *Machine) SettleEntry(id uint64) (flags uint8, ok bool) {
	e, ok := m.take(id)
	return e.flags, ok
}

// Return (requeue) puts an unacked message back at its original position: it is delivered before
// any ready message with a larger id. It is marked redelivered and its DeliveryCount incremented.
// It returns false if id is not unacked.
func (m *Machine) Return(id uint64) bool {
	e, ok := m.take(id)
	if !ok {
		return false
	}
	e.count++
	e.redelivered = true
	m.returned.push(e)
	m.readyBytes += int(e.size)
	return true
}

// Discard (reject or nack without requeue) removes an unacked message and returns it.
// It returns false if id is not unacked.
func (m *Machine) Discard(id uint64) (*Message, bool) {
	e, ok := m.take(id)
	return e.msg, ok
}

// DiscardEntry is Discard returning the message's flags as well.
func (m *Machine) DiscardEntry(id uint64) (*Message, uint8, bool) {
	e, ok := m.take(id)
	return e.msg, e.flags, ok
}

// Purge removes all ready messages (unacked ones stay) and returns how many it removed.
func (m *Machine) Purge() int { return m.PurgeEntries(nil) }

// PurgeEntries is Purge calling fn (if not nil) for every removed message with its flags.
func (m *Machine) PurgeEntries(fn func(id uint64, flags uint8)) int {
	if fn != nil {
		for _, e := range m.returned {
			fn(e.id, e.flags)
		}
		for i := 0; i < m.fifo.Len(); i++ {
			e := m.fifo.At(i)
			fn(e.id, e.flags)
		}
	}
	n := m.Ready()
	m.fifo.Clear()
	m.returned = nil
	m.readyBytes = 0
	return n
}

// Ready returns the number of messages waiting for delivery.
func (m *Machine) Ready() int { return m.fifo.Len() + len(m.returned) }

// Unacked returns the number of delivered messages not yet settled, returned or discarded,
// including those of removed consumers and of basic.get.
func (m *Machine) Unacked() int { return len(m.unacked) }

// ReadyBytes returns the sum of the body sizes of the ready messages.
func (m *Machine) ReadyBytes() int { return m.readyBytes }

// Consumers returns the number of attached consumers.
func (m *Machine) Consumers() int { return len(m.consumers) }

// ConsumerUnacked returns the number of unacked messages of an attached consumer (0 if unknown).
func (m *Machine) ConsumerUnacked(id ConsumerID) int {
	if c, ok := m.consumers[id]; ok {
		return c.unacked
	}
	return 0
}

// Len returns Ready() + Unacked().
func (m *Machine) Len() int { return m.Ready() + m.Unacked() }
