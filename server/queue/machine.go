package queue

import "slices"

// Message is the immutable content of a queued message. The queues never mutate or copy it.
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
	// Dedupe, if set, names the message for its target queues: a queue that has taken a message
	// with this key drops the next one (and still reports it accepted). Dead letters carry their
	// source queue's key (Dead.Key), so a dead letter handed over twice (at least once, across a
	// leader change) reaches each target once. Not stored on disk.
	Dedupe DedupeKey
	// FilterValue is the x-stream-filter-value header, decoded once by the publishing session
	// (streams index it; other queue types ignore it). Not stored by classic and quorum queues.
	FilterValue string
	// PublisherID and PublishingID are the x-publisher-id and x-publishing-id headers (decoded by
	// the publishing session; "" = none): a stream stores the message only if the publishing id
	// is above the highest stored for the publisher. Other queue types ignore them.
	PublisherID  string
	PublishingID uint64
}

// DedupeKey names a message for deduplication at its targets: a source (a queue id, unique in the
// cluster) and a sequence number that the source never reuses. The zero key means none.
type DedupeKey struct {
	Source, Seq uint64
}

// ConsumerID identifies a consumer within one queue (for replicated queues, within the cluster: see
// ConsumerNode). 0 is reserved for basic.get and must not be used for a consumer.
type ConsumerID uint64

// Delivery is one message handed to a consumer (or to basic.get).
type Delivery struct {
	Consumer      ConsumerID // 0 for basic.get
	ID            uint64     // message id within this queue (1, 2, 3, ... in publish order)
	Msg           *Message
	Redelivered   bool   // true once the message has been returned at least once
	DeliveryCount uint32 // deliveries before this one (0 on first delivery)
	Settled       bool   // removed at delivery (no-ack consumer or basic.get without ack)
	flags         uint8  // the queue's storage flags (where its record lives)
}

// Tag names this delivery for Settle: the message and its delivery count at this delivery.
func (d Delivery) Tag() Tag { return Tag{ID: d.ID, Count: d.DeliveryCount} }

// anyCount is the Tag.Count of settlements decoded from version 1 commands, which named messages
// only: it matches whatever delivery of the message is outstanding.
const anyCount = ^uint32(0)

// consumerSpec is the machine's view of a consumer's settings.
type consumerSpec struct {
	ID       ConsumerID
	Prefetch uint32 // max unacked for this consumer; 0 = unlimited
	Priority int32  // x-priority; higher first
	NoAck    bool   // auto-ack: delivered messages are removed at once and never count as unacked
	// Credited consumers receive at most Credit deliveries in total (their node raises the total
	// with CmdCredit as its outbound buffer drains): the back-pressure of replicated queues, whose
	// checkout cannot ask the consumer's connection.
	Credited bool
	Credit   uint64
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
	timed       bool // has a deadline: see machine.timed
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
	spec    consumerSpec
	group   *group
	unacked int  // delivered, not yet settled/returned/discarded (never counts NoAck deliveries)
	active  bool // in group.ring (or taken out of it by the running checkout)
	// standby is set for every consumer but the serving one under single active consumer.
	standby bool
	seq     uint64 // attach order
	// delivered counts every delivery made to the consumer (for credit: it may receive while
	// delivered < spec.Credit).
	delivered uint64
	// sent lists the deliveries made with a time (checkoutAt), oldest first; records whose
	// delivery is no longer unacked by this consumer are dropped lazily.
	sent deque[outstanding]
}

// eligible reports whether c may be in its group's ring.
func (c *consumer) eligible() bool { return !c.standby && c.hasCredit() }

func (c *consumer) hasCredit() bool {
	return (c.spec.NoAck || c.spec.Prefetch == 0 || c.unacked < int(c.spec.Prefetch)) &&
		(!c.spec.Credited || c.delivered < c.spec.Credit)
}

// group holds the consumers of one priority. ring lists those with credit in round-robin order:
// checkout serves the front and moves it to the back.
type group struct {
	priority int32
	members  int // consumers in the group, with or without credit
	ring     deque[*consumer]
}

// level holds the ready messages of one message priority.
//
// fifo holds messages in id order; it grows at the back (Enqueue) and shrinks at the front, so
// every id delivered from its head is below the new head. returned is a min-heap of requeued
// messages, whose ids are therefore all below the fifo head: the next ready message of the level
// is the heap minimum if the heap is not empty, else the fifo head. The one exception, an
// operator's take of a named message from the middle of the fifo (takeReady, browse.go), keeps
// this: if that message is requeued, it goes back to its place in the fifo, not to the heap.
type level struct {
	fifo     deque[entry]
	returned idHeap
}

func (l *level) len() int { return l.fifo.Len() + len(l.returned) }

// machine holds the messages and consumers of one queue: ready messages by priority and id, unacked
// messages by id, and the consumers. It is the core of State (see state.go), which is the only
// caller: every change comes from State.Apply. It is not safe for concurrent use. It has no
// goroutines, locks, I/O, clock or randomness, and its results never depend on map iteration
// order; time, where a rule needs it, is passed in as now = Unix milliseconds.
//
// Messages with a deadline (TTL) are also tracked in timed, and the expiry heap orders them by
// deadline with lazy deletion. A ready message that expires is removed from timed at once but stays
// in its level as a tombstone (an entry marked timed with no record in timed), skipped when it
// reaches the head and swept out when tombstones outnumber the live messages.
type machine struct {
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
	skipped   []*consumer              // scratch for checkout, kept to avoid allocating
	seq       uint64                   // attach counter

	// Single active consumer: sacActive is the consumer that owns the queue; sacQuiescing is set
	// while it finishes its unacked messages before a higher priority consumer takes over.
	sacActive    *consumer
	sacQuiescing bool
}

// newMachine returns an empty queue with the given lifecycle configuration.
func newMachine(cfg Config) *machine {
	return &machine{
		cfg:       cfg,
		nextID:    1,
		levels:    make([]level, int(cfg.MaxPriority)+1),
		unacked:   make(map[uint64]unackedEntry),
		consumers: make(map[ConsumerID]*consumer),
	}
}

// levelOf returns the level of a message priority.
func (m *machine) levelOf(priority uint8) uint8 { return min(priority, m.cfg.MaxPriority) }

// restoreAt appends a message recovered from storage with a known id (larger than every id so far)
// and its absolute deadline (Unix ms, 0 = none: the queue TTL is not applied again) and priority.
// It counts as redelivered: it may have been delivered before the restart. A deadline already past
// expires at the next expiry. Ids not above every id so far are ignored.
func (m *machine) restoreAt(id uint64, msg *Message, size uint32, flags uint8, count uint32, expiresAt int64, priority uint8) {
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
func (m *machine) pushReady(e entry) {
	m.levels[e.prio].fifo.PushBack(e)
	m.top = max(m.top, int(e.prio))
	m.ready++
	m.readyBytes += int(e.size)
}

// addConsumer attaches a consumer; it takes part in the next checkout. If a consumer with the same
// ID exists its spec is replaced (keeping its unacked messages, its delivery count, and the larger
// of the two credits) and it moves to the back of its priority group's rotation. With
// SingleActiveConsumer only the active consumer receives messages (see activeConsumer).
func (m *machine) addConsumer(c consumerSpec) {
	if !c.Credited {
		c.Credit = 0
	}
	if old, ok := m.consumers[c.ID]; ok {
		m.detach(old)
		if c.Credited {
			c.Credit = max(c.Credit, old.spec.Credit)
		}
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

// removeConsumer stops deliveries to the consumer. Its unacked messages STAY unacked (RabbitMQ:
// basic.cancel does not requeue); they are settled, returned or discarded later by tag.
// It returns false if the consumer is unknown.
func (m *machine) removeConsumer(id ConsumerID) bool {
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

// hasConsumer reports whether a consumer with this ID is attached.
func (m *machine) hasConsumer(id ConsumerID) bool {
	_, ok := m.consumers[id]
	return ok
}

// credit raises a credited consumer's total credit to total (never lowers it: a retried grant is
// a no-op) and puts it back in its ring if that gave it room. It returns false if the consumer is
// unknown or not credited.
func (m *machine) credit(id ConsumerID, total uint64) bool {
	c, ok := m.consumers[id]
	if !ok || !c.spec.Credited {
		return false
	}
	if total > c.spec.Credit {
		c.spec.Credit = total
		if c.group != nil && !c.active && c.eligible() {
			c.active = true
			c.group.ring.PushBack(c)
		}
	}
	return true
}

// attach puts c in the group of its priority, creating the group if needed.
func (m *machine) attach(c *consumer) {
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
func (m *machine) detach(c *consumer) {
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
func (m *machine) unring(c *consumer) {
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

// checkout assigns ready messages to consumers and appends the deliveries to dst, at most max
// (max <= 0: no limit). Among consumers with credit (unacked < prefetch, prefetch 0, or NoAck, and
// for credited consumers deliveries below their credit) the highest priority group wins; within a
// group consumers take turns message by message, and the turn is remembered between calls. Before
// assigning each message to consumer X it calls reserve(X): false means X cannot take anything now
// and X is skipped for the rest of this call (it keeps its turn for the next call); true commits
// the assignment. reserve may be nil (always true) and must not call back into the machine. NoAck
// deliveries remove the message for good; the others become unacked. It records now (0: none) as
// the delivery time of each unacked delivery, for consumer timeouts. It stops when no ready message
// remains or no consumer can take one, and reports whether it stopped because it reached max.
func (m *machine) checkout(dst []Delivery, max int, reserve func(ConsumerID) bool, now int64) ([]Delivery, bool) {
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
		c.delivered++
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
func (m *machine) nextConsumer() *consumer {
	for _, g := range m.groups {
		if g.ring.Len() > 0 {
			return g.ring.PopFront()
		}
	}
	return nil
}

// canTakeNow reports whether some consumer could be given a message right now.
func (m *machine) canTakeNow() bool {
	for _, g := range m.groups {
		if g.ring.Len() > 0 {
			return true
		}
	}
	return false
}

// get implements basic.get: it takes the next ready message (Consumer 0). With noAck it is removed
// at once, otherwise it becomes unacked. It returns false if no message is ready.
func (m *machine) get(noAck bool) (Delivery, bool) {
	if m.ready == 0 {
		return Delivery{}, false
	}
	e := m.popReady()
	d := Delivery{ID: e.id, Msg: e.msg, Redelivered: e.redelivered, DeliveryCount: e.count, flags: e.flags, Settled: noAck}
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
func (m *machine) popReady() entry {
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
func (m *machine) deliver(e entry, c *consumer) Delivery {
	if !c.spec.NoAck {
		m.unacked[e.id] = unackedEntry{entry: e, owner: c}
		c.unacked++
	}
	return Delivery{Consumer: c.spec.ID, ID: e.id, Msg: e.msg, Redelivered: e.redelivered, DeliveryCount: e.count,
		flags: e.flags, Settled: c.spec.NoAck}
}

// delivered does the lifecycle bookkeeping of a delivery made by deliver, kept apart so that
// deliver stays inlined in the checkout loop.
func (m *machine) delivered(e entry, c *consumer, now int64) {
	if now != 0 && !c.spec.NoAck {
		m.recordSent(c, outstanding{at: now, id: e.id, count: e.count})
	}
	if e.timed {
		m.leaveReady(e, c.spec.NoAck)
	}
}

// take removes the delivery tag names from the unacked set and gives its consumer the credit back.
// A tag whose count is not the message's current delivery count names an earlier delivery, already
// settled or returned: take ignores it, so a settlement applied twice cannot touch a later delivery.
// final means the message leaves the queue (it is not requeued).
func (m *machine) take(tag Tag, final bool) (entry, bool) {
	id := tag.ID
	u, ok := m.unacked[id]
	if !ok || (tag.Count != u.count && tag.Count != anyCount) {
		return entry{}, false
	}
	delete(m.unacked, id)
	m.released(u.owner)
	if final && u.timed {
		m.untrack(id)
	}
	return u.entry, true
}

// released gives a consumer back the credit of a delivery that was settled or returned.
func (m *machine) released(c *consumer) {
	if c == nil {
		return
	}
	c.unacked--
	if c.group != nil && !c.active && c.eligible() {
		c.active = true
		c.group.ring.PushBack(c)
	}
	if c == m.sacActive && m.sacQuiescing && c.unacked == 0 {
		m.sacUpdate()
	}
}

// settle (ack) forgets an unacked delivery and returns the message's flags. It returns false if
// tag is not an unacked delivery. It is take without copying the entry out: the ack path.
func (m *machine) settle(tag Tag) (flags uint8, ok bool) {
	u, ok := m.unacked[tag.ID]
	if !ok || (tag.Count != u.count && tag.Count != anyCount) {
		return 0, false
	}
	delete(m.unacked, tag.ID)
	m.released(u.owner)
	if u.timed {
		m.untrack(tag.ID)
	}
	return u.flags, true
}

// requeue puts a message taken from the unacked set back among the ready ones and returns it as
// it is now.
func (m *machine) requeue(e entry) entry {
	e.count++
	e.redelivered = true
	if l := &m.levels[e.prio]; l.fifo.Len() > 0 && e.id > l.fifo.At(0).id {
		// Taken from the middle of the FIFO (takeReady, browse.go): back to its place there, so
		// that every returned id stays below the FIFO's head.
		l.fifo.insert(l.fifo.search(func(x entry) bool { return x.id < e.id }), e)
	} else {
		l.returned.push(e)
	}
	m.top = max(m.top, int(e.prio))
	m.ready++
	m.readyBytes += int(e.size)
	if e.timed {
		m.track(e, 0, true)
	}
	return e
}

// purge removes all ready messages (unacked ones stay), calling fn (if not nil) for every removed
// message with its flags, and returns how many it removed.
func (m *machine) purge(fn func(id uint64, flags uint8)) int {
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

// consumerUnacked returns the number of unacked messages of an attached consumer (0 if unknown).
func (m *machine) consumerUnacked(id ConsumerID) int {
	if c, ok := m.consumers[id]; ok {
		return c.unacked
	}
	return 0
}
