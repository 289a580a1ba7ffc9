// Package queue holds the queue types of the broker. Machine is the pure, deterministic state machine
// shared by classic queues (driven directly) and quorum queues (driven as a Raft FSM): it has no
// goroutines, locks, I/O, clock or randomness, and its results never depend on map iteration order.
// Time, where a rule needs it, is passed in as now = Unix milliseconds.
package queue

import "slices"

// Message is the immutable content of a queued message. The machine never mutates or copies it.
type Message struct {
	Exchange, RoutingKey string
	Props                []byte // raw AMQP basic properties (flags + fields)
	Body                 []byte
	Persistent           bool  // delivery-mode 2
	Priority             uint8 // basic property priority; a priority above Config.MaxPriority counts as MaxPriority
	// BCC holds the BCC routing keys, removed from the headers before delivery but still used when
	// the message is dead-lettered with its original keys (as RabbitMQ). Not stored on disk.
	BCC       []string
	ExpiresAt int64 // absolute expiry from the per-message expiration property, Unix ms; 0 = none
	// FilterValue is the x-stream-filter-value header, decoded once by the publishing session
	// (streams index it; other queue types ignore it). Not stored by classic and quorum queues.
	FilterValue string
	// PublisherID and PublishingID are the x-publisher-id and x-publishing-id headers (decoded by
	// the publishing session; "" = none): a stream stores the message only if the publishing id
	// is above the highest stored for the publisher. Other queue types ignore them.
	PublisherID  string
	PublishingID uint64
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
	prio        uint8    // priority level, already clamped to the queue's MaxPriority
	redelivered bool
	timed       bool // has a deadline: see Machine.timed
}

// unackedEntry is a delivered message awaiting settlement. owner is nil for basic.get; it stays
// pointing at a removed consumer so that a later consumer reusing the ID is not credited by mistake.
// deadline is the message's expiry (Unix ms, 0 = none), copied from its timed record.
type unackedEntry struct {
	entry
	owner    *consumer
	deadline int64
}

// outstanding records when a consumer was handed a message, for consumer-timeout detection. The
// delivery count tells this delivery from a later one of the same message.
type outstanding struct {
	at    int64
	id    uint64
	count uint32
}

// consumer is the machine's view of one consumer.
type consumer struct {
	spec    ConsumerSpec
	group   *group
	unacked int  // delivered, not yet settled/returned/discarded (never counts NoAck deliveries)
	active  bool // in group.ring (or taken out of it by the running Checkout)
	// standby is set for every consumer but the serving one under single active consumer.
	standby bool
	seq     uint64 // attach order
	// sent lists the deliveries made with a time (CheckoutAt), oldest first; records whose
	// delivery is no longer unacked by this consumer are dropped lazily.
	sent deque[outstanding]
}

// eligible reports whether c may be in its group's ring.
func (c *consumer) eligible() bool { return !c.standby && c.hasCredit() }

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

// level holds the ready messages of one message priority.
//
// fifo holds messages never delivered, in id order; it only grows at the back (Enqueue) and shrinks
// at the front, so every id ever delivered from this level is below its head. returned is a
// min-heap of requeued messages, whose ids are therefore all below the fifo head: the next ready
// message of the level is the heap minimum if the heap is not empty, else the fifo head.
type level struct {
	fifo     deque[entry]
	returned idHeap
}

func (l *level) len() int { return l.fifo.Len() + len(l.returned) }

// Machine is the state of one queue: ready messages by priority and id, unacked messages by id, and
// the consumers. It is not safe for concurrent use; the caller serialises every call.
//
// Messages with a deadline (TTL) are also tracked in timed, and the expiry heap orders them by
// deadline with lazy deletion. A ready message that expires is removed from timed at once but stays
// in its level as a tombstone (an entry marked timed with no record in timed), skipped when it
// reaches the head and swept out when tombstones outnumber the live messages.
type Machine struct {
	cfg        Config
	nextID     uint64
	levels     []level // by message priority; one level unless MaxPriority > 0
	top        int     // no level above top holds an entry
	ready      int     // live ready messages (tombstones excluded)
	readyBytes int
	tombs      int // expired entries still in levels
	unacked    map[uint64]unackedEntry

	timed      map[uint64]timedMsg // every live message with a deadline, ready or unacked; nil until needed
	expiry     deadlineHeap
	queuedLive int      // timed records with queued set (= live items in expiry)
	atOnce     []uint64 // messages published already due while a consumer could take them

	consumers map[ConsumerID]*consumer // lookup only, never iterated where order matters
	groups    []*group                 // by priority, highest first
	skipped   []*consumer              // scratch for Checkout, kept to avoid allocating
	seq       uint64                   // attach counter

	// Single active consumer: sacActive is the consumer that owns the queue; sacQuiescing is set
	// while it finishes its unacked messages before a higher priority consumer takes over.
	sacActive    *consumer
	sacQuiescing bool
}

// NewMachine returns an empty queue with no consumers and no lifecycle limits
// (NewMachineConfig(DefaultConfig())).
func NewMachine() *Machine { return NewMachineConfig(DefaultConfig()) }

// NewMachineConfig returns an empty queue with the given lifecycle configuration.
func NewMachineConfig(cfg Config) *Machine {
	return &Machine{
		cfg:       cfg,
		nextID:    1,
		levels:    make([]level, int(cfg.MaxPriority)+1),
		unacked:   make(map[uint64]unackedEntry),
		consumers: make(map[ConsumerID]*consumer),
	}
}

// Config returns the configuration the machine was created with.
func (m *Machine) Config() Config { return m.cfg }

// levelOf returns the level of a message priority.
func (m *Machine) levelOf(priority uint8) uint8 { return min(priority, m.cfg.MaxPriority) }

// Enqueue appends a message at the tail and returns its id (1, 2, 3, ...: strictly increasing).
// msg must not be nil.
func (m *Machine) Enqueue(msg *Message) uint64 {
	return m.EnqueueEntry(msg, uint32(len(msg.Body)), 0)
}

// EnqueueEntry is Enqueue with the body size given separately, so msg may be nil for a message whose
// body lives only on disk, and with caller-defined flags that come back in its Delivery. In a
// priority queue the message goes to the level of msg.Priority (0 if msg is nil). It applies no TTL
// and no length limit: Publish does.
func (m *Machine) EnqueueEntry(msg *Message, size uint32, flags uint8) uint64 {
	id := m.nextID
	m.nextID++
	var prio uint8
	if msg != nil && m.cfg.MaxPriority > 0 {
		prio = m.levelOf(msg.Priority)
	}
	m.pushReady(entry{id: id, msg: msg, size: size, flags: flags, prio: prio})
	return id
}

// Restore appends a recovered message with a known id (larger than every id so far), for rebuilding
// a queue from storage. It counts as redelivered: it may have been delivered before the restart.
// It is RestoreAt with no deadline and the priority of msg (0 if nil).
func (m *Machine) Restore(id uint64, msg *Message, size uint32, flags uint8, count uint32) {
	var prio uint8
	if msg != nil {
		prio = msg.Priority
	}
	m.RestoreAt(id, msg, size, flags, count, 0, prio)
}

// RestoreAt is Restore keeping the message's absolute deadline (Unix ms, 0 = none: the queue TTL is
// not applied again) and priority. A deadline already past expires at the next Expire, CheckoutAt
// or GetAt. Ids not above every id so far are ignored.
func (m *Machine) RestoreAt(id uint64, msg *Message, size uint32, flags uint8, count uint32, expiresAt int64, priority uint8) {
	if id < m.nextID {
		return
	}
	m.nextID = id + 1
	e := entry{id: id, msg: msg, size: size, flags: flags, count: count, redelivered: true,
		prio: m.levelOf(priority), timed: expiresAt > 0}
	m.pushReady(e)
	if e.timed {
		m.track(e, expiresAt, true)
	}
}

// pushReady appends a new (never delivered) message to its level.
func (m *Machine) pushReady(e entry) {
	m.levels[e.prio].fifo.PushBack(e)
	m.top = max(m.top, int(e.prio))
	m.ready++
	m.readyBytes += int(e.size)
}

// AddConsumer attaches a consumer; it takes part in the next Checkout. If a consumer with the same
// ID exists its spec is replaced (keeping its unacked messages) and it moves to the back of its
// priority group's rotation. With SingleActiveConsumer only the active consumer receives messages
// (see ActiveConsumer).
func (m *Machine) AddConsumer(c ConsumerSpec) {
	if old, ok := m.consumers[c.ID]; ok {
		m.detach(old)
		old.spec = c
		m.attach(old)
		m.sacUpdate()
		return
	}
	m.seq++
	nc := &consumer{spec: c, seq: m.seq, standby: m.cfg.SingleActiveConsumer}
	m.consumers[c.ID] = nc
	m.attach(nc)
	m.sacUpdate()
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
	if c == m.sacActive {
		m.sacActive, m.sacQuiescing = nil, false
	}
	m.sacUpdate()
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
	if c.eligible() {
		c.active = true
		g.ring.PushBack(c)
	}
}

// detach takes c out of its group, dropping the group once empty. O(consumers).
func (m *Machine) detach(c *consumer) {
	g := c.group
	m.unring(c)
	c.group = nil
	g.members--
	if g.members > 0 {
		return
	}
	if i := slices.Index(m.groups, g); i >= 0 {
		m.groups = slices.Delete(m.groups, i, i+1)
	}
}

// unring takes c out of its group's ring if it is in it. O(consumers in the group).
func (m *Machine) unring(c *consumer) {
	if !c.active {
		return
	}
	g := c.group
	for i := 0; i < g.ring.Len(); i++ {
		if g.ring.At(i) == c {
			g.ring.Remove(i)
			break
		}
	}
	c.active = false
}

// Checkout assigns ready messages to consumers and appends the deliveries to dst, at most max
// (max <= 0: no limit). Among consumers with credit (unacked < prefetch, prefetch 0, or NoAck) the
// highest priority group wins; within a group consumers take turns message by message, and the turn
// is remembered between calls. Before assigning each message to consumer X it calls reserve(X):
// false means X cannot take anything now and X is skipped for the rest of this call (it keeps its
// turn for the next call); true commits the assignment. reserve may be nil (always true) and must not
// call back into the machine. NoAck deliveries remove the message for good; the others become
// unacked. Checkout stops when no ready message remains or no consumer can take one.
// Checkout takes no time: it expires nothing and records no delivery time (see CheckoutAt).
func (m *Machine) Checkout(dst []Delivery, max int, reserve func(ConsumerID) bool) []Delivery {
	dst, _ = m.checkout(dst, max, reserve, 0)
	return dst
}

// checkout is Checkout recording now (0: none) as the delivery time. It also reports whether it
// stopped because it reached max.
func (m *Machine) checkout(dst []Delivery, max int, reserve func(ConsumerID) bool, now int64) ([]Delivery, bool) {
	skipped := m.skipped
	n := 0
	for (max <= 0 || n < max) && m.ready > 0 {
		c := m.nextConsumer()
		if c == nil {
			break
		}
		if reserve != nil && !reserve(c.spec.ID) {
			skipped = append(skipped, c)
			continue
		}
		e := m.popReady()
		dst = append(dst, m.deliver(e, c))
		if now != 0 || e.timed {
			m.delivered(e, c, now)
		}
		n++
		if c.eligible() {
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
	return dst, max > 0 && n >= max
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

// canTakeNow reports whether some consumer could be given a message right now.
func (m *Machine) canTakeNow() bool {
	for _, g := range m.groups {
		if g.ring.Len() > 0 {
			return true
		}
	}
	return false
}

// Get implements basic.get: it takes the next ready message (Consumer 0). With noAck it is removed
// at once, otherwise it becomes unacked. It returns false if no message is ready.
// Like Checkout it takes no time (see GetAt).
func (m *Machine) Get(noAck bool) (Delivery, bool) { return m.get(noAck) }

func (m *Machine) get(noAck bool) (Delivery, bool) {
	if m.ready == 0 {
		return Delivery{}, false
	}
	e := m.popReady()
	d := Delivery{ID: e.id, Msg: e.msg, Redelivered: e.redelivered, DeliveryCount: e.count, Flags: e.flags, Settled: noAck}
	if !noAck {
		m.unacked[e.id] = unackedEntry{entry: e}
	}
	if e.timed {
		m.leaveReady(e, noAck)
	}
	return d, true
}

// popReady removes and returns the next ready message: highest priority level first, smallest id
// within it. Tombstones met on the way are dropped. m.ready must be > 0.
func (m *Machine) popReady() entry {
	for {
		l := &m.levels[m.top]
		var e entry
		switch {
		case len(l.returned) > 0:
			e = l.returned.pop()
		case l.fifo.Len() > 0:
			e = l.fifo.PopFront()
		default:
			m.top--
			continue
		}
		if e.timed {
			if _, live := m.timed[e.id]; !live {
				m.tombs--
				continue
			}
		}
		m.ready--
		m.readyBytes -= int(e.size)
		return e
	}
}

// deliver hands e to c, recording it as unacked unless c is NoAck.
// The caller then calls delivered if the delivery has a time or the message a deadline.
func (m *Machine) deliver(e entry, c *consumer) Delivery {
	if !c.spec.NoAck {
		m.unacked[e.id] = unackedEntry{entry: e, owner: c}
		c.unacked++
	}
	return Delivery{Consumer: c.spec.ID, ID: e.id, Msg: e.msg, Redelivered: e.redelivered, DeliveryCount: e.count,
		Flags: e.flags, Settled: c.spec.NoAck}
}

// delivered does the lifecycle bookkeeping of a delivery made by deliver, kept apart so that
// deliver stays inlined in the Checkout loop.
func (m *Machine) delivered(e entry, c *consumer, now int64) {
	if now != 0 && !c.spec.NoAck {
		m.recordSent(c, outstanding{at: now, id: e.id, count: e.count})
	}
	if e.timed {
		m.leaveReady(e, c.spec.NoAck)
	}
}

// take removes id from the unacked set and gives its consumer the credit back. final means the
// message leaves the queue (it is not requeued).
func (m *Machine) take(id uint64, final bool) (entry, bool) {
	u, ok := m.unacked[id]
	if !ok {
		return entry{}, false
	}
	delete(m.unacked, id)
	if c := u.owner; c != nil {
		c.unacked--
		if c.group != nil && !c.active && c.eligible() {
			c.active = true
			c.group.ring.PushBack(c)
		}
		if c == m.sacActive && m.sacQuiescing && c.unacked == 0 {
			m.sacUpdate()
		}
	}
	if final && u.timed {
		m.untrack(id)
	}
	return u.entry, true
}

// Settle (ack) forgets an unacked message. It returns false if id is not unacked.
func (m *Machine) Settle(id uint64) bool {
	_, ok := m.take(id, true)
	return ok
}

// SettleEntry is Settle returning the message's flags.
func (m *Machine) SettleEntry(id uint64) (flags uint8, ok bool) {
	e, ok := m.take(id, true)
	return e.flags, ok
}

// Return (requeue) puts an unacked message back at its original position: it is delivered before
// any ready message of its priority with a larger id. It is marked redelivered and its
// DeliveryCount incremented. It returns false if id is not unacked. Return ignores the delivery
// limit and the length limits (see ReturnAt and Trim).
func (m *Machine) Return(id uint64) bool {
	e, ok := m.take(id, false)
	if ok {
		m.requeue(e)
	}
	return ok
}

// requeue puts a message taken from the unacked set back among the ready ones.
func (m *Machine) requeue(e entry) {
	e.count++
	e.redelivered = true
	m.levels[e.prio].returned.push(e)
	m.top = max(m.top, int(e.prio))
	m.ready++
	m.readyBytes += int(e.size)
	if e.timed {
		m.track(e, 0, true)
	}
}

// Discard (reject or nack without requeue) removes an unacked message and returns it.
// It returns false if id is not unacked.
func (m *Machine) Discard(id uint64) (*Message, bool) {
	e, ok := m.take(id, true)
	return e.msg, ok
}

// DiscardEntry is Discard returning the message's flags as well.
func (m *Machine) DiscardEntry(id uint64) (*Message, uint8, bool) {
	e, ok := m.take(id, true)
	return e.msg, e.flags, ok
}

// Purge removes all ready messages (unacked ones stay) and returns how many it removed.
func (m *Machine) Purge() int { return m.PurgeEntries(nil) }

// PurgeEntries is Purge calling fn (if not nil) for every removed message with its flags.
func (m *Machine) PurgeEntries(fn func(id uint64, flags uint8)) int {
	visit := func(e entry) {
		if e.timed {
			if _, live := m.timed[e.id]; !live {
				return // tombstone
			}
			m.untrack(e.id)
		}
		if fn != nil {
			fn(e.id, e.flags)
		}
	}
	if fn != nil || m.timed != nil {
		for p := len(m.levels) - 1; p >= 0; p-- {
			l := &m.levels[p]
			for _, e := range l.returned {
				visit(e)
			}
			for i := 0; i < l.fifo.Len(); i++ {
				visit(l.fifo.At(i))
			}
		}
	}
	n := m.ready
	for p := range m.levels {
		m.levels[p].fifo.Clear()
		m.levels[p].returned = nil
	}
	m.top, m.ready, m.readyBytes, m.tombs = 0, 0, 0, 0
	return n
}

// Ready returns the number of messages waiting for delivery.
func (m *Machine) Ready() int { return m.ready }

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
