// Package queue holds the queue types of the broker: classic queues (Classic) and quorum queues
// (Quorum), both built on one pure, deterministic state machine (State), and the queue-type
// interface (api.go) the broker core and the protocol sessions call.
//
// # Queue commands are the single implementation
//
// Every change to a queue is a typed Command applied by one pure function:
//
//	func (s *State) Apply(cmd *Command, now int64, fx *Effects)
//
// State is everything that is replicated about a queue: the machine (ready messages by priority
// and id, unacked deliveries, consumers and their round-robin turns, TTL deadlines, single active
// consumer), the exclusive consumer, the enqueue dedupe windows by (producer, sequence), the
// dead-letter dedupe windows by (source queue, sequence), the node of each unacked basic.get
// message, each consumer's credit, the answers of recent basic.get and queue.purge commands (so a
// retry gets the first answer), and the dead letters not yet handed over. It has no goroutines,
// locks, I/O, clock or randomness; time comes in as now (Unix ms), and nothing depends on map
// iteration order, so two states given the same commands are equal (and snapshot to equal bytes).
//
// Apply changes the state and appends what must happen outside it to fx (Effects): the deliveries
// (each names its consumer), the dead letters, the command's Reply (publish accepted, rejected or
// dropped as a duplicate; the basic.get result; the purge count; a refused consume), and the
// storage work of a classic queue (records to delete, side records to rewrite). Apply never runs
// an effect itself.
//
// Who runs it where:
//   - A classic queue (Classic) calls Apply directly under its mutex, on the caller's goroutine
//     (publish, settle, get, purge on the session's goroutine; checkout and timers on its
//     dispatcher goroutine), and runs the effects after unlocking: it loads paged bodies, hands
//     deliveries to consumers, republishes dead letters through Hooks.DeadLetter, and deletes the
//     records of messages that left. Checkout is an explicit command (CmdCheckout) applied by the
//     holder of the delivery lock, so each consumer gets its deliveries in queue order; it asks
//     each consumer's Reserve (the connection's high-water mark and the channel's global prefetch)
//     before assigning a message.
//   - A quorum queue (Quorum) encodes each command (AppendCommand: a version byte, a type byte,
//     the proposer's clock, the fields), proposes it to its Raft group (Replicator), and every
//     replica's FSM decodes it and calls the same Apply (Quorum.Apply, which the core's raft.FSM
//     adapter calls). Its State is Replicated: after every command it checks out ready messages to
//     the consumers that have credit, with no node-local input, so every replica makes the same
//     assignment; time never goes backwards (a command from a node whose clock lags is applied at
//     the latest time seen). Apply on the FSM goroutine only records: deliveries for this node's
//     consumers go to an outbox that the queue's dispatcher goroutine hands over; dead letters
//     are recorded in the state and handed over by the leader (below); the reply goes back to the
//     proposer, whose done callback (a publisher confirm) runs on the cluster layer's goroutine.
//     No delivery, dead-letter publish or confirm runs on the FSM goroutine. A replica that
//     installs a snapshot (a follower cut off from the log) hands its consumers the deliveries
//     the skipped log assigned them, never one twice, and tells consumers the state dropped
//     (CancelUnavailable).
//
// A classic queue's dead letters are emitted (Effects.Dead) without a dedupe key and handed to
// Hooks.DeadLetter with a nil done: their records are deleted once the hook returns, after the
// hook's republishing was submitted to storage, so a crash can duplicate them but not lose them.
//
// # Retries are idempotent
//
// A proposal whose leader was lost may be applied twice. Enqueue carries its proposer's
// (producer, sequence) and a repeat is dropped (reported Accepted). Settle, Return and Discard name
// deliveries by Tag (message id and delivery count), so a repeat cannot touch a later delivery of
// the same message (a returned message has a higher count). Get and Purge carry a (producer,
// sequence) command id and a repeat gets the first answer from the state's reply cache, not a
// second message. Credit carries an absolute total, so a repeat cannot raise it twice. Consume
// with a known id replaces the spec; Cancel of an unknown id does nothing; NodeReset names the
// epochs it removes.
//
// # Dead letters from a quorum queue: at least once from the log
//
// A quorum queue's State records each dead message (expired, rejected, over a length or delivery
// limit) with a dedupe key (the queue's id, a sequence number from the state) instead of emitting
// it. The leader hands the records to Hooks.DeadLetter with a done callback; once done reports that
// every target has them, it proposes CmdDeadLettered with their sequence numbers, which removes
// them. A node that becomes leader (Quorum.LeaderChanged, called from raft's leadership
// notification) hands over every record still there; a failed hand-over is retried. A message can
// thus be handed over twice (the old leader's removal was lost), never zero times; each target,
// classic or quorum, drops a message whose Message.Dedupe key it has already taken (a window per
// source in its State), and still reports it accepted, so the duplicate is never visible. Nothing
// is gated on being leader at apply time.
//
// # Credit: back-pressure in a replicated checkout
//
// A classic checkout asks each consumer's connection (Consumer.Reserve) before it assigns a
// message, so a slow connection is skipped. A replicated checkout cannot ask a node-local
// question, so quorum consumers are credited: the state delivers to a consumer while its total
// deliveries are below its credit, a total that its own node raises with CmdCredit (absolute, so
// a retry is harmless) as the consumer's connection drains (Consumer.HasRoom), as RabbitMQ's
// Ra-based queues do. Consume grants an initial window; the node grants handed+window whenever
// the unused credit falls below half a window and the connection has room. A consumer with
// prefetch 0 on a long queue therefore holds at most one window beyond its socket's high-water
// mark, never the whole queue.
package queue

import "slices"

// CommandType names a queue command. The values are part of the replicated encoding: never
// renumber them.
type CommandType uint8

// The commands. Checkout and Recover are local to a classic queue and are never encoded.
const (
	// CmdEnqueue publishes Msg (Producer/Seq: the proposer's command id, 0 = none).
	CmdEnqueue CommandType = iota + 1
	// CmdSettle acknowledges the deliveries Tags names.
	CmdSettle
	// CmdReturn requeues the deliveries Tags names (dead-lettering those over the delivery limit).
	CmdReturn
	// CmdDiscard drops (dead-letters) the deliveries Tags names.
	CmdDiscard
	// CmdConsume attaches consumer Consumer (Prefetch, Priority, NoAck, Exclusive, Credited,
	// Credit: the initial total).
	CmdConsume
	// CmdCancel detaches Consumer; with GiveBack its unacked deliveries return to the queue.
	CmdCancel
	// CmdCredit raises a credited consumer's total credit to Credit.
	CmdCredit
	// CmdGet takes the next message (basic.get: NoAck; Owner: the asking node and epoch;
	// Producer/Seq: the command id).
	CmdGet
	// CmdPurge removes the ready messages (Producer/Seq: the command id).
	CmdPurge
	// CmdTick expires what is due at now.
	CmdTick
	// CmdNodeReset removes the consumers of node Node with the given epochs (with Except: every
	// epoch but Epochs[0]) and returns their unacked deliveries and the node's basic.get ones.
	CmdNodeReset
	// CmdDeadLettered removes the recorded dead letters whose sequence numbers Seqs lists.
	CmdDeadLettered
	// CmdCheckout assigns ready messages to consumers (at most Max; 0 = no limit). Local.
	CmdCheckout
	// CmdRecover adds a message recovered from storage (ID, Flags, Count, ExpiresAt, MsgPriority;
	// its body stays on disk). Local.
	CmdRecover
	// CmdConfigure changes the limits a policy may change while the queue runs (Limits:
	// MessageTTL, MaxLength, MaxLengthBytes, Overflow, DeliveryLimit) and trims the queue to them.
	CmdConfigure
	// CmdTouch records a use of the queue (a replicated classic queue redeclared), for x-expires;
	// it changes nothing in the state.
	CmdTouch
	// CmdTake takes the ready message ID as CmdGet takes the next one (NoAck, Owner,
	// Producer/Seq as Get): the management API's redrive of selected dead letters.
	CmdTake
	cmdTypes
)

// Command is one change to a queue's state. Which fields matter depends on Type (see the
// CommandType constants); the others are zero. Callers on hot paths reuse one Command.
type Command struct {
	Type CommandType

	// Enqueue: the message. Flags are the classic queue's storage flags and Offload keeps only
	// an index entry (the body is on disk); neither is encoded.
	Msg     *Message
	Flags   uint8
	Offload bool

	// Enqueue, Get, Take, Purge: the command id, for retries (Producer 0 = none).
	Producer, Seq uint64

	// Settle, Return, Discard.
	Tags []Tag

	// Consume, Cancel, Credit.
	Consumer  ConsumerID
	Prefetch  uint32
	Priority  int32
	NoAck     bool // also Get
	Exclusive bool
	Credited  bool
	Credit    uint64
	GiveBack  bool

	// Get: the node (tag << 16 | epoch) that owns the message until it is settled.
	Owner uint32

	// NodeReset.
	Node   uint16
	Epochs []uint16
	Except bool

	// DeadLettered.
	Seqs []uint64

	// Checkout.
	Max int

	// Configure: the new limits (the other Config fields are ignored).
	Limits Config

	// Recover; Take: the message.
	ID          uint64
	Count       uint32
	ExpiresAt   int64
	MsgPriority uint8
}

// Reply is a command's answer.
type Reply struct {
	// Enqueue: Accepted or Rejected (x-overflow reject-publish).
	Status PublishStatus
	// Duplicate: Enqueue dropped as a repeat (command id or Message.Dedupe), or a Get or Purge
	// answered from the reply cache.
	Duplicate bool
	// Stale: a repeated Get or Purge too old for the reply cache to answer.
	Stale bool
	// ID is the new message's id (Enqueue; 0 if rejected or a duplicate).
	ID uint64
	// Get: the delivery, whether there was one, and the messages still ready.
	Delivery  Delivery
	OK        bool
	Remaining int
	// Count is the number of messages purged (Purge) or of tags that named an outstanding
	// delivery (Settle, Return, Discard).
	Count int
	// Refused: Consume refused (the queue is in exclusive use, or an exclusive consume with
	// other consumers attached).
	Refused bool
}

// Effects collects what a command asks its caller to do outside the state. Apply appends to the
// slices, so a caller may reuse one Effects (Reset between commands).
type Effects struct {
	Reply Reply
	// Deliveries are the messages assigned to consumers, in order.
	Deliveries []Delivery
	// Dead are the messages that died (not Replicated: a replicated state records them instead).
	Dead []Dead
	// DeadRecorded counts the dead letters a Replicated state recorded for hand-over.
	DeadRecorded int
	// NextExpiry (Replicated only) is the earliest deadline of a ready message, for the leader's
	// tick timer; HasExpiry is false if there is none.
	NextExpiry int64
	HasExpiry  bool

	// Storage work of a classic queue: records to delete once bodies are loaded and handed on,
	// and side records to rewrite (a stored message's new delivery count).
	forget  []stored
	rewrite []rewrite
}

// stored names a message's storage records.
type stored struct {
	id    uint64
	flags uint8
}

// rewrite is a stored message's side record after a return.
type rewrite struct {
	id       uint64
	deadline int64
	priority uint8
	count    uint32
}

// Reset empties fx for the next command, keeping the slices' capacity.
func (fx *Effects) Reset() {
	clear(fx.Deliveries)
	clear(fx.Dead)
	fx.Reply = Reply{}
	fx.Deliveries, fx.Dead, fx.forget, fx.rewrite = fx.Deliveries[:0], fx.Dead[:0], fx.forget[:0], fx.rewrite[:0]
	fx.DeadRecorded, fx.NextExpiry, fx.HasExpiry = 0, 0, false
}

// StateConfig configures a State.
type StateConfig struct {
	// Config is the lifecycle configuration (TTL, limits, priorities, delivery limit, SAC).
	Config Config
	// Replicated makes the state a Raft FSM's: it checks out after every command (no Reserve:
	// credit only), records dead letters for an at-least-once hand-over instead of emitting them,
	// reports NextExpiry, and never lets time go backwards.
	Replicated bool
	// Source is the queue's id, unique in the cluster: the Source of its dead letters' dedupe keys.
	Source uint64
}

// Limits of the state's bounded records.
const (
	// maxWindows bounds the producer and the source dedupe windows each (the least recently used
	// goes first).
	maxWindows = 256
	// replyCache is how many Get/Purge answers per producer the state keeps for retries.
	replyCache = 32
)

// State is the state of one queue: see the package documentation. It is not safe for concurrent
// use; its owner serialises Apply (a classic queue's mutex, a Raft FSM's goroutine).
type State struct {
	m          *machine
	replicated bool
	source     uint64
	// reserve, if set, is asked before each checkout assignment (a classic queue's consumers'
	// Reserve). Replicated states never have one.
	reserve func(ConsumerID) bool

	now       int64  // latest time applied (Replicated: never goes backwards)
	ops       uint64 // commands applied, for least-recently-used eviction
	exclusive ConsumerID
	producers map[uint64]*producer  // enqueue/get/purge dedupe by command id
	sources   map[uint64]*seqWindow // dead-letter dedupe by Message.Dedupe
	getOwner  map[uint64]uint32     // unacked basic.get message -> node<<16 | epoch
	dlx       deque[deadRecord]     // recorded dead letters, by seq (Replicated)
	dlxLive   int                   // records in dlx not yet removed
	dlxSeq    uint64                // last dead-letter sequence number
	tags      []Tag                 // scratch
}

// producer is a proposer's dedupe window and its recent Get/Purge answers.
type producer struct {
	w       seqWindow
	replies []cachedReply // at most replyCache, oldest first
}

type cachedReply struct {
	seq   uint64
	reply Reply
}

// deadRecord is a recorded dead letter (Replicated).
type deadRecord struct {
	seq  uint64
	dead Dead
	gone bool // removed (CmdDeadLettered) but not yet popped from the front
}

// NewState returns the state of an empty queue.
func NewState(cfg StateConfig) *State {
	return &State{m: newMachine(cfg.Config), replicated: cfg.Replicated, source: cfg.Source}
}

// Ready returns the number of messages waiting for delivery.
func (s *State) Ready() int { return s.m.ready }

// ReadyBytes returns the sum of the body sizes of the ready messages.
func (s *State) ReadyBytes() int { return s.m.readyBytes }

// Unacked returns the number of delivered messages not yet settled, returned or discarded.
func (s *State) Unacked() int { return len(s.m.unacked) }

// Consumers returns the number of attached consumers (for a replicated queue, on every node).
func (s *State) Consumers() int { return len(s.m.consumers) }

// DeadLetters returns the number of recorded dead letters not yet handed over (Replicated).
func (s *State) DeadLetters() int { return s.dlxLive }

// Apply applies cmd at time now (Unix ms) and appends its effects to fx (see Effects). Unknown
// command types change nothing. Only Enqueue, Get, Tick and Checkout read the time of a state that
// is not Replicated (settlements, consume and cancel do not); a Replicated state applies every
// command at the latest time it has seen, and checks out after it.
func (s *State) Apply(cmd *Command, now int64, fx *Effects) {
	if s.replicated {
		now = max(now, s.now)
	}
	s.now = now
	s.ops++
	m := s.m
	dead0 := len(fx.Dead)
	switch cmd.Type {
	case CmdEnqueue:
		s.enqueue(cmd, now, fx)
	case CmdSettle:
		for _, t := range cmd.Tags {
			if flags, ok := m.settle(t); ok {
				fx.Reply.Count++
				s.settled(t.ID, flags, fx)
			}
		}
	case CmdReturn:
		for _, t := range cmd.Tags {
			s.returnTag(t, fx)
		}
		fx.Dead = m.trim(fx.Dead)
	case CmdDiscard:
		for _, t := range cmd.Tags {
			if d, ok := m.discardTag(t); ok {
				fx.Reply.Count++
				delete(s.getOwner, t.ID)
				fx.Dead = append(fx.Dead, d)
			}
		}
	case CmdConsume:
		fx.Reply.Refused = !s.consume(cmd)
	case CmdCancel:
		m.removeConsumer(cmd.Consumer)
		if s.exclusive == cmd.Consumer {
			s.exclusive = 0
		}
		if cmd.GiveBack {
			id := cmd.Consumer
			s.returnOwned(func(c ConsumerID) bool { return c == id }, fx)
		}
	case CmdCredit:
		m.credit(cmd.Consumer, cmd.Credit)
	case CmdGet, CmdTake:
		s.get(cmd, now, fx)
	case CmdPurge:
		s.purge(cmd, fx)
	case CmdTick:
		fx.Dead = m.expire(now, fx.Dead)
	case CmdTouch:
	case CmdNodeReset:
		s.nodeReset(cmd, fx)
	case CmdDeadLettered:
		s.deadLettered(cmd.Seqs, fx)
	case CmdCheckout:
		s.checkout(cmd.Max, s.reserve, now, fx)
	case CmdRecover:
		m.restoreAt(cmd.ID, nil, 0, cmd.Flags, cmd.Count, cmd.ExpiresAt, cmd.MsgPriority)
	case CmdConfigure:
		// A new TTL applies to messages published from now on, as when RabbitMQ's policy
		// changes; new length limits apply at once (drop-head trims the head).
		l := cmd.Limits
		m.cfg.MessageTTL, m.cfg.MaxLength, m.cfg.MaxLengthBytes = l.MessageTTL, l.MaxLength, l.MaxLengthBytes
		m.cfg.Overflow, m.cfg.DeliveryLimit = l.Overflow, l.DeliveryLimit
		fx.Dead = m.trim(fx.Dead)
	}
	if s.replicated {
		s.checkout(0, nil, now, fx)
		fx.NextExpiry, fx.HasExpiry = m.nextExpiry()
	}
	if len(fx.Dead) != dead0 {
		s.deadEffects(dead0, fx)
	}
}

// enqueue applies CmdEnqueue.
func (s *State) enqueue(cmd *Command, now int64, fx *Effects) {
	msg := cmd.Msg
	if msg == nil {
		return
	}
	if cmd.Producer != 0 {
		if p := s.producer(cmd.Producer); p.w.seen(cmd.Seq, true) {
			fx.Reply = Reply{Status: Accepted, Duplicate: true}
			return
		}
	}
	if k := msg.Dedupe; k != (DedupeKey{}) && s.sourceSeen(k) {
		fx.Reply = Reply{Status: Accepted, Duplicate: true}
		return
	}
	keep := msg
	if cmd.Offload {
		keep = nil
	}
	n := len(fx.Dead)
	id, accepted, dead := s.m.publish(keep, uint32(len(msg.Body)), cmd.Flags, msg.Priority, msg.ExpiresAt, now, fx.Dead)
	fx.Dead = dead
	for i := n; i < len(fx.Dead); i++ {
		if d := &fx.Dead[i]; d.Msg == nil && (d.ID == id || d.ID == 0) {
			d.Msg = msg // the message itself, refused or dead at once: its body is at hand
		}
	}
	fx.Reply.ID = id
	if accepted {
		fx.Reply.Status = Accepted
	} else {
		fx.Reply.Status = Rejected
	}
}

// producer returns the dedupe record of a proposer, creating it (and evicting the least recently
// used one beyond maxWindows).
func (s *State) producer(id uint64) *producer {
	p := s.producers[id]
	if p == nil {
		if s.producers == nil {
			s.producers = make(map[uint64]*producer)
		}
		if len(s.producers) >= maxWindows {
			evictLRU(s.producers, func(p *producer) uint64 { return p.w.last })
		}
		p = &producer{}
		s.producers[id] = p
	}
	p.w.last = s.ops
	return p
}

// sourceSeen records a dead letter's dedupe key and reports whether the queue took it before.
func (s *State) sourceSeen(k DedupeKey) bool {
	w := s.sources[k.Source]
	if w == nil {
		if s.sources == nil {
			s.sources = make(map[uint64]*seqWindow)
		}
		if len(s.sources) >= maxWindows {
			evictLRU(s.sources, func(w *seqWindow) uint64 { return w.last })
		}
		w = &seqWindow{}
		s.sources[k.Source] = w
	}
	w.last = s.ops
	return w.seen(k.Seq, false)
}

// evictLRU removes the entry used least recently (ties: the smallest key), whatever the map order.
func evictLRU[V any](m map[uint64]V, last func(V) uint64) {
	var victim uint64
	var vlast uint64
	found := false
	for k, v := range m {
		if l := last(v); !found || l < vlast || (l == vlast && k < victim) {
			victim, vlast, found = k, l, true
		}
	}
	delete(m, victim)
}

// settled does the bookkeeping of a message that was acknowledged.
func (s *State) settled(id uint64, flags uint8, fx *Effects) {
	if s.getOwner != nil {
		delete(s.getOwner, id)
	}
	if flags != 0 {
		fx.forget = append(fx.forget, stored{id, flags})
	}
}

// returnTag requeues one delivery, keeping a stored message's new delivery count in its side
// record so the delivery limit holds across restarts.
func (s *State) returnTag(t Tag, fx *Effects) {
	m := s.m
	u, had := m.unacked[t.ID]
	if had && u.flags&flagStored != 0 && u.flags&flagMeta == 0 && (t.Count == u.count || t.Count == anyCount) {
		u.flags |= flagMeta // the new delivery count gets a side record
		m.unacked[t.ID] = u
	}
	e, d, ok := m.returnTag(t)
	if !ok {
		return
	}
	fx.Reply.Count++
	delete(s.getOwner, t.ID)
	if d != nil {
		fx.Dead = append(fx.Dead, *d)
	} else if e.flags&flagStored != 0 {
		fx.rewrite = append(fx.rewrite, rewrite{id: e.id, deadline: u.deadline, priority: e.prio, count: e.count})
	}
}

// returnOwned returns every unacked delivery of the consumers owned reports, in id order.
func (s *State) returnOwned(owned func(ConsumerID) bool, fx *Effects) {
	s.tags = s.m.ownedBy(s.tags[:0], owned)
	for _, t := range s.tags {
		s.returnTag(t, fx)
	}
	fx.Dead = s.m.trim(fx.Dead)
}

// consume applies CmdConsume and reports whether the consumer was accepted: an exclusive consumer
// holds the queue alone, and a retried consume (same id) is accepted again.
func (s *State) consume(cmd *Command) bool {
	id := cmd.Consumer
	m := s.m
	if id == 0 {
		return false
	}
	others := len(m.consumers)
	if m.hasConsumer(id) {
		others--
	}
	if (s.exclusive != 0 && s.exclusive != id) || (cmd.Exclusive && others > 0) {
		return false
	}
	if cmd.Exclusive {
		s.exclusive = id
	}
	m.addConsumer(consumerSpec{ID: id, Prefetch: cmd.Prefetch, Priority: cmd.Priority, NoAck: cmd.NoAck,
		Credited: cmd.Credited, Credit: cmd.Credit})
	return true
}

// get applies CmdGet.
func (s *State) get(cmd *Command, now int64, fx *Effects) {
	var p *producer
	if cmd.Producer != 0 {
		p = s.producer(cmd.Producer)
		if p.w.seen(cmd.Seq, true) {
			s.cached(p, cmd.Seq, fx)
			return
		}
	}
	var d Delivery
	var ok bool
	if cmd.Type == CmdTake {
		fx.Dead = s.m.expire(now, fx.Dead)
		d, ok = s.m.takeReady(cmd.ID, cmd.NoAck)
	} else {
		d, ok, fx.Dead = s.m.getAt(cmd.NoAck, now, fx.Dead)
	}
	if ok {
		if !cmd.NoAck && cmd.Owner != 0 {
			if s.getOwner == nil {
				s.getOwner = make(map[uint64]uint32)
			}
			s.getOwner[d.ID] = cmd.Owner
		}
		if cmd.NoAck && d.flags != 0 {
			fx.forget = append(fx.forget, stored{d.ID, d.flags})
		}
	}
	fx.Reply.Delivery, fx.Reply.OK, fx.Reply.Remaining = d, ok, s.m.ready
	if p != nil {
		p.remember(cmd.Seq, fx.Reply)
	}
}

// purge applies CmdPurge.
func (s *State) purge(cmd *Command, fx *Effects) {
	var p *producer
	if cmd.Producer != 0 {
		p = s.producer(cmd.Producer)
		if p.w.seen(cmd.Seq, true) {
			s.cached(p, cmd.Seq, fx)
			return
		}
	}
	fx.Reply.Count = s.m.purge(func(id uint64, flags uint8) {
		if flags != 0 {
			fx.forget = append(fx.forget, stored{id, flags})
		}
	})
	if p != nil {
		p.remember(cmd.Seq, fx.Reply)
	}
}

// cached answers a repeated Get or Purge from the reply cache.
func (s *State) cached(p *producer, seq uint64, fx *Effects) {
	for i := range p.replies {
		if p.replies[i].seq == seq {
			fx.Reply = p.replies[i].reply
			fx.Reply.Duplicate = true
			return
		}
	}
	fx.Reply = Reply{Stale: true}
}

// remember keeps a Get or Purge answer for a retry, forgetting the oldest beyond replyCache.
func (p *producer) remember(seq uint64, r Reply) {
	if len(p.replies) >= replyCache {
		copy(p.replies, p.replies[1:])
		p.replies[len(p.replies)-1] = cachedReply{}
		p.replies = p.replies[:len(p.replies)-1]
	}
	p.replies = append(p.replies, cachedReply{seq: seq, reply: r})
}

// nodeReset applies CmdNodeReset.
func (s *State) nodeReset(cmd *Command, fx *Effects) {
	if cmd.Except && len(cmd.Epochs) == 0 {
		return
	}
	gone := func(node, epoch uint16) bool {
		if node != cmd.Node {
			return false
		}
		if cmd.Except {
			return epoch != cmd.Epochs[0]
		}
		return slices.Contains(cmd.Epochs, epoch)
	}
	goneConsumer := func(id ConsumerID) bool { return gone(ConsumerNode(id), ConsumerEpoch(id)) }
	m := s.m
	var ids []ConsumerID
	for id := range m.consumers {
		if goneConsumer(id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		m.removeConsumer(id)
		if s.exclusive == id {
			s.exclusive = 0
		}
	}
	s.returnOwned(goneConsumer, fx)
	var gets []uint64
	for id, o := range s.getOwner {
		if gone(uint16(o>>16), uint16(o)) {
			gets = append(gets, id)
		}
	}
	slices.Sort(gets)
	for _, id := range gets {
		delete(s.getOwner, id)
		if u, ok := m.unacked[id]; ok {
			s.returnTag(Tag{ID: id, Count: u.count}, fx)
		}
	}
	fx.Dead = m.trim(fx.Dead)
	if cmd.Except {
		// The node restarted: its earlier lives will never propose again.
		for p := range s.producers {
			if gone(uint16(p>>48), uint16(p>>32)) {
				delete(s.producers, p)
			}
		}
	}
}

// checkout assigns ready messages to consumers (at most max, 0 = no limit).
func (s *State) checkout(max int, reserve func(ConsumerID) bool, now int64, fx *Effects) {
	n := len(fx.Deliveries)
	fx.Deliveries, fx.Dead = s.m.checkoutAt(fx.Deliveries, max, reserve, now, fx.Dead)
	for i := n; i < len(fx.Deliveries); i++ {
		if d := &fx.Deliveries[i]; d.Settled && d.flags != 0 {
			fx.forget = append(fx.forget, stored{d.ID, d.flags})
		}
	}
}

// deadEffects handles the dead letters a command produced (fx.Dead[from:]): their storage
// records go, and a Replicated state records them with dedupe keys instead of emitting them (their
// records, which hold the bodies to hand over, go once they were handed over: deadLettered).
func (s *State) deadEffects(from int, fx *Effects) {
	if !s.replicated {
		for i := from; i < len(fx.Dead); i++ {
			if d := &fx.Dead[i]; d.ID != 0 && d.flags != 0 {
				fx.forget = append(fx.forget, stored{d.ID, d.flags})
			}
		}
		return
	}
	for i := from; i < len(fx.Dead); i++ {
		d := fx.Dead[i]
		s.dlxSeq++
		d.Key = DedupeKey{Source: s.source, Seq: s.dlxSeq}
		s.dlx.PushBack(deadRecord{seq: s.dlxSeq, dead: d})
		s.dlxLive++
		fx.DeadRecorded++
		fx.Dead[i] = Dead{}
	}
	fx.Dead = fx.Dead[:from]
}

// deadLettered removes recorded dead letters by sequence number, and their storage records.
func (s *State) deadLettered(seqs []uint64, fx *Effects) {
	for _, seq := range seqs {
		i := s.dlx.search(func(r deadRecord) bool { return r.seq < seq })
		if i < s.dlx.Len() {
			if r := s.dlx.At(i); r.seq == seq && !r.gone {
				if d := &r.dead; d.ID != 0 && d.flags != 0 {
					fx.forget = append(fx.forget, stored{d.ID, d.flags})
				}
				r.gone, r.dead = true, Dead{}
				s.dlx.set(i, r)
				s.dlxLive--
			}
		}
	}
	for s.dlx.Len() > 0 && s.dlx.At(0).gone {
		s.dlx.PopFront()
	}
}

// pendingDeadLetters appends to dst, in sequence order, the recorded dead letters for which skip
// is false, at most max (with their sequence numbers in Key.Seq).
func (s *State) pendingDeadLetters(dst []Dead, max int, skip func(seq uint64) bool) []Dead {
	for i := 0; i < s.dlx.Len() && len(dst) < max; i++ {
		if r := s.dlx.At(i); !r.gone && !skip(r.seq) {
			dst = append(dst, r.dead)
		}
	}
	return dst
}
