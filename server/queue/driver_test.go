package queue

// driver runs a State the way the queues do, one Command through State.Apply at a time, under
// names that read like the operations the machine-level tests check (Enqueue, CheckoutAt, Settle,
// ...). It embeds the state's machine for the tests' white-box invariant checks. Every change goes
// through Apply; the only direct calls are the read-only queries the queues make themselves
// (NextExpiry, TimedOut, NextTimeout, the single active consumer).
type driver struct {
	*machine
	s  *State
	fx Effects
	// trace, if set, receives a description of every command's effects.
	trace func(cmd *Command, fx *Effects)
}

// ConsumerSpec is a consumer as the tests attach it (CmdConsume's fields).
type ConsumerSpec struct {
	ID        ConsumerID
	Prefetch  uint32
	Priority  int32
	NoAck     bool
	Exclusive bool
	Credited  bool
	Credit    uint64
}

func newDriver(cfg Config) *driver { return newDriverState(StateConfig{Config: cfg}) }

func newDriverState(cfg StateConfig) *driver {
	s := NewState(cfg)
	return &driver{machine: s.m, s: s}
}

// fromState wraps a decoded state.
func fromState(s *State) *driver { return &driver{machine: s.m, s: s} }

func (m *driver) apply(cmd Command, now int64) *Effects {
	m.fx.Reset()
	m.s.Apply(&cmd, now, &m.fx)
	m.machine = m.s.m
	if m.trace != nil {
		m.trace(&cmd, &m.fx)
	}
	return &m.fx
}

func (m *driver) dead() []Dead { return append([]Dead(nil), m.fx.Dead...) }

// tag names the outstanding delivery of message id (or a delivery that does not exist).
func (m *driver) tag(id uint64) Tag {
	if u, ok := m.unacked[id]; ok {
		return Tag{ID: id, Count: u.count}
	}
	return Tag{ID: id}
}

func (m *driver) Config() Config { return m.cfg }
func (m *driver) Ready() int     { return m.ready }
func (m *driver) Unacked() int   { return len(m.unacked) }
func (m *driver) Len() int       { return m.ready + len(m.unacked) }
func (m *driver) ReadyBytes() int {
	return m.readyBytes
}
func (m *driver) Consumers() int                         { return len(m.consumers) }
func (m *driver) HasConsumer(id ConsumerID) bool         { return m.hasConsumer(id) }
func (m *driver) ConsumerUnacked(id ConsumerID) int      { return m.consumerUnacked(id) }
func (m *driver) ActiveConsumer() (ConsumerID, bool)     { return m.activeConsumer() }
func (m *driver) NextExpiry() (int64, bool)              { return m.nextExpiry() }
func (m *driver) DeadlineFor(expiresAt, now int64) int64 { return m.deadlineFor(expiresAt, now) }
func (m *driver) TimedOut(now int64, timeout func(ConsumerID) int64) []ConsumerID {
	return m.timedOut(now, timeout)
}
func (m *driver) NextTimeout(timeout func(ConsumerID) int64) (int64, bool) {
	return m.nextTimeout(timeout)
}

// Enqueue publishes msg at time 0 and returns its id.
func (m *driver) Enqueue(msg *Message) uint64 {
	return m.apply(Command{Type: CmdEnqueue, Msg: msg}, 0).Reply.ID
}

// EnqueueEntry is Enqueue with storage flags; a nil msg is a body of size bytes kept on disk.
func (m *driver) EnqueueEntry(msg *Message, size uint32, flags uint8) uint64 {
	id, _, _ := m.PublishEntry(msg, size, flags, 0, 0, 0)
	return id
}

// Publish publishes msg at now with storage flags (size must be len(msg.Body)).
func (m *driver) Publish(msg *Message, size uint32, flags uint8, now int64) (uint64, bool, []Dead) {
	fx := m.apply(Command{Type: CmdEnqueue, Msg: msg, Flags: flags}, now)
	return fx.Reply.ID, fx.Reply.Status == Accepted, m.dead()
}

// PublishEntry publishes at now; a nil msg is a body of size bytes kept on disk (Offload) with the
// given priority and expiry.
func (m *driver) PublishEntry(msg *Message, size uint32, flags uint8, prio uint8, expiresAt, now int64) (uint64, bool, []Dead) {
	offload := msg == nil
	if offload {
		msg = &Message{Body: make([]byte, size), Priority: prio, ExpiresAt: expiresAt}
	}
	fx := m.apply(Command{Type: CmdEnqueue, Msg: msg, Flags: flags, Offload: offload}, now)
	return fx.Reply.ID, fx.Reply.Status == Accepted, m.dead()
}

// RestoreAt recovers a stored message (its body stays on disk).
func (m *driver) RestoreAt(id uint64, flags uint8, count uint32, expiresAt int64, priority uint8) {
	m.apply(Command{Type: CmdRecover, ID: id, Flags: flags, Count: count, ExpiresAt: expiresAt, MsgPriority: priority}, 0)
}

func (m *driver) AddConsumer(c ConsumerSpec) bool {
	return !m.apply(Command{Type: CmdConsume, Consumer: c.ID, Prefetch: c.Prefetch, Priority: c.Priority, NoAck: c.NoAck,
		Exclusive: c.Exclusive, Credited: c.Credited, Credit: c.Credit}, 0).Reply.Refused
}

func (m *driver) RemoveConsumer(id ConsumerID) bool {
	had := m.hasConsumer(id)
	m.apply(Command{Type: CmdCancel, Consumer: id}, 0)
	return had
}

// Checkout checks out at time 0 (no delivery times recorded).
func (m *driver) Checkout(dst []Delivery, max int, reserve func(ConsumerID) bool) []Delivery {
	ds, _ := m.CheckoutAt(dst, max, reserve, 0)
	return ds
}

func (m *driver) CheckoutAt(dst []Delivery, max int, reserve func(ConsumerID) bool, now int64) ([]Delivery, []Dead) {
	if !m.s.replicated {
		m.s.reserve = reserve // replicated states never consult their consumers' connections
	}
	fx := m.apply(Command{Type: CmdCheckout, Max: max}, now)
	m.s.reserve = nil
	return append(dst, fx.Deliveries...), m.dead()
}

func (m *driver) Get(noAck bool) (Delivery, bool) {
	d, ok, _ := m.GetAt(noAck, 0)
	return d, ok
}

func (m *driver) GetAt(noAck bool, now int64) (Delivery, bool, []Dead) {
	fx := m.apply(Command{Type: CmdGet, NoAck: noAck}, now)
	return fx.Reply.Delivery, fx.Reply.OK, m.dead()
}

func (m *driver) settle(t CommandType, id uint64) *Effects {
	return m.apply(Command{Type: t, Tags: []Tag{m.tag(id)}}, 0)
}

func (m *driver) Settle(id uint64) bool { return m.settle(CmdSettle, id).Reply.Count == 1 }

func (m *driver) SettleEntry(id uint64) (uint8, bool) {
	fx := m.settle(CmdSettle, id)
	var flags uint8
	if len(fx.forget) > 0 {
		flags = fx.forget[0].flags
	}
	return flags, fx.Reply.Count == 1
}

// Return requeues a delivery (with the delivery limit and the drop-head trim).
func (m *driver) Return(id uint64) bool { return m.settle(CmdReturn, id).Reply.Count == 1 }

// ReturnAt is Return reporting what died: the message itself over the delivery limit, then what
// the drop-head trim took.
func (m *driver) ReturnAt(id uint64) ([]Dead, bool) {
	fx := m.settle(CmdReturn, id)
	return m.dead(), fx.Reply.Count == 1
}

func (m *driver) DiscardDead(id uint64) (Dead, bool) {
	fx := m.settle(CmdDiscard, id)
	if fx.Reply.Count != 1 {
		return Dead{}, false
	}
	if len(fx.Dead) == 0 { // a replicated state recorded it
		return m.s.dlx.At(m.s.dlx.Len() - 1).dead, true
	}
	return fx.Dead[0], true
}

func (m *driver) Discard(id uint64) (*Message, bool) {
	d, ok := m.DiscardDead(id)
	return d.Msg, ok
}

func (m *driver) DiscardEntry(id uint64) (*Message, uint8, bool) {
	d, ok := m.DiscardDead(id)
	return d.Msg, d.flags, ok
}

func (m *driver) Purge() int { return m.apply(Command{Type: CmdPurge}, 0).Reply.Count }

func (m *driver) Expire(now int64) []Dead {
	m.apply(Command{Type: CmdTick}, now)
	return m.dead()
}

// ReturnConsumer returns every unacked delivery of a consumer (attached or removed), as
// CmdCancel's GiveBack does, and reports the ids requeued (not over the delivery limit) and what
// died (over the limit, then what the drop-head trim took).
func (m *driver) ReturnConsumer(id ConsumerID) ([]uint64, []Dead) {
	tags := m.ownedBy(nil, func(c ConsumerID) bool { return c == id })
	m.apply(Command{Type: CmdReturn, Tags: tags}, 0)
	dead := m.dead()
	var requeued []uint64
	for _, t := range tags {
		if !overLimit(dead, t.ID) {
			requeued = append(requeued, t.ID)
		}
	}
	return requeued, dead
}

func overLimit(ds []Dead, id uint64) bool {
	for _, d := range ds {
		if d.ID == id && d.Reason == ReasonDeliveryLimit {
			return true
		}
	}
	return false
}

// unackedDeadline returns the deadline an unacked message carries.
func (m *driver) unackedDeadline(id uint64) (int64, bool) {
	u, ok := m.unacked[id]
	return u.deadline, ok
}

func (m *driver) AppendSnapshot(dst []byte) []byte { return m.s.AppendSnapshot(dst) }
