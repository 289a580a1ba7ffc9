package queue

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"warren/storage"
)

// Replicator orders the commands of a replicated (quorum) queue: in Warren, a Raft group.
type Replicator interface {
	// Propose replicates cmd. done is called once, from another goroutine, with what Apply returned on
	// the leader, or with an error if the command could not be committed in time. A command may be
	// applied more than once (a retry after a lost leadership); Apply dedupes what matters.
	Propose(cmd []byte, done func(resp []byte, err error))
	// IsLeader reports whether this node leads the group now. Effects that must happen once (dead
	// letters, timer ticks) are carried out by the leader.
	IsLeader() bool
}

// ConsumerNode returns the node tag of a consumer id: replicated queues need consumer ids that are
// unique in the cluster, so the server builds them as node tag (16 bits) | boot epoch (16 bits) |
// counter (32 bits).
func ConsumerNode(id ConsumerID) uint16 { return uint16(id >> 48) }

// ConsumerEpoch returns the boot epoch part of a consumer id (see ConsumerNode).
func ConsumerEpoch(id ConsumerID) uint16 { return uint16(id >> 32) }

// Command types of a replicated queue; the first byte of every command is replVersion.
const (
	replVersion byte = 1

	cmdEnqueue byte = iota + 1
	cmdSettle
	cmdReturn
	cmdDiscard
	cmdAddConsumer
	cmdRemoveConsumer
	cmdNodeReset
	cmdTick
	cmdGet
	cmdPurge
)

// replMaxInflight bounds the proposals a node has outstanding for one queue; publishers wait beyond it.
const replMaxInflight = 4096

// replTimeout bounds how long a proposal may take (a leader election included).
const replTimeout = 10 * time.Second

// dedupeWindow is how many recent sequence numbers per producer Apply remembers.
const dedupeWindow = 1 << 14

// ErrNoQuorum is the error of operations a replicated queue could not commit.
var ErrNoQuorum = errors.New("queue: no quorum (the queue has no leader)")

// errRejected is what a publisher's done receives for a message refused by x-overflow.
var errRejected = errors.New("queue: message rejected by the queue's length limit")

// ErrRejected reports whether err means the queue refused the message (x-overflow reject-publish).
func ErrRejected(err error) bool { return errors.Is(err, errRejected) }

// seqWindow remembers which of a producer's recent sequence numbers were applied.
type seqWindow struct {
	max  uint64
	bits []uint64 // bit (seq % dedupeWindow) set = seq applied, for seq in (max-dedupeWindow, max]
}

// seen records seq and reports whether it had been applied before (or is too old to tell).
func (w *seqWindow) seen(seq uint64) bool {
	if w.bits == nil {
		w.bits = make([]uint64, dedupeWindow/64)
	}
	if seq+dedupeWindow <= w.max {
		return true
	}
	for w.max < seq {
		w.max++
		i := w.max % dedupeWindow
		w.bits[i/64] &^= 1 << (i % 64)
	}
	i := seq % dedupeWindow
	if w.bits[i/64]&(1<<(i%64)) != 0 {
		return true
	}
	w.bits[i/64] |= 1 << (i % 64)
	return false
}

// replState is what a replicated queue keeps besides the machine. Fields marked (replicated) are part
// of the state machine and its snapshots; the others are local to this node.
type replState struct {
	rep      Replicator
	tag      uint16 // this node's tag in consumer ids (local)
	epoch    uint16 // this boot's epoch in consumer ids (local)
	producer uint64 // this node's producer id for its publishes (local)
	seq      atomic.Uint64
	inflight atomic.Int64
	slots    chan struct{} // publish window (local)

	producers map[uint64]*seqWindow // (replicated) dedupe of enqueues
	getOwner  map[uint64]uint16     // (replicated) node of each unacked basic.get message
	applied   uint64                // last applied index (local)

	pending map[ConsumerID]bool // local consumers whose basic.consume-ok has not gone out yet
	outbox  []Delivery          // deliveries to local consumers, for the dispatcher
	held    []Delivery          // deliveries to pending consumers
	// stale are this node's consumers that are gone locally but still attached in the replicated
	// state (their removal is in flight, or failed for want of a quorum); reaping marks those whose
	// removal this node has proposed and not yet seen answered.
	stale   []ConsumerID
	reaping map[ConsumerID]bool

	disk *storage.DB // this node's store, for SpaceLow only (local)
}

// NewReplicated creates a replicated (quorum) queue driven by rep: every change is a command that
// rep replicates and every replica applies with Apply. nodeTag and epoch are this node's tag and
// this boot's epoch in consumer ids (see ConsumerNode).
func NewReplicated(opts Options, rep Replicator, nodeTag, epoch uint16) *Queue {
	var b [4]byte
	rand.Read(b[:])
	disk := opts.DB
	opts.DB = nil // bodies live in the Raft log and snapshots
	opts.Expires = 0
	q := newQueue(opts)
	q.r = &replState{
		disk:      disk,
		rep:       rep,
		tag:       nodeTag,
		epoch:     epoch,
		producer:  uint64(nodeTag)<<48 | uint64(binary.BigEndian.Uint32(b[:])),
		slots:     make(chan struct{}, replMaxInflight),
		producers: make(map[uint64]*seqWindow),
		getOwner:  make(map[uint64]uint16),
		pending:   make(map[ConsumerID]bool),
	}
	// Each node times out its own consumers: the delivery times are in the replicated state (they
	// come from the commands), the decision to cancel is local.
	q.timeoutFn = func(id ConsumerID) int64 {
		if _, local := q.consumers[id]; local {
			return q.ConsumerTimeout
		}
		return 0
	}
	go q.rdispatch()
	return q
}

// Replicated reports whether q is a replicated (quorum) queue.
func (q *Queue) Replicated() bool { return q.r != nil }

func appendMsg(dst []byte, m *Message) []byte {
	dst = append(dst, m.Priority)
	dst = binary.AppendVarint(dst, m.ExpiresAt)
	dst = binary.AppendUvarint(dst, uint64(len(m.BCC)))
	for _, k := range m.BCC {
		dst = binary.AppendUvarint(dst, uint64(len(k)))
		dst = append(dst, k...)
	}
	return encodeRecord(dst, m, 0)
}

// rdec reads a command; any overrun sets err and yields zeros.
type rdec struct {
	b   []byte
	err error
}

func (d *rdec) fail() {
	if d.err == nil {
		d.err = errors.New("queue: malformed replicated command")
	}
	d.b = nil
}

func (d *rdec) byte() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *rdec) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *rdec) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *rdec) u64() uint64 {
	if len(d.b) < 8 {
		d.fail()
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *rdec) str() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *rdec) msg() *Message {
	prio := d.byte()
	exp := d.varint()
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	var bcc []string
	for i := uint64(0); i < n && d.err == nil; i++ {
		bcc = append(bcc, d.str())
	}
	if d.err != nil {
		return nil
	}
	m, _, err := decodeRecord(d.b)
	if err != nil {
		d.fail()
		return nil
	}
	d.b = nil
	m.Priority, m.ExpiresAt, m.BCC = prio, exp, bcc
	return m
}

func cmdHeader(kind byte, size int) []byte {
	b := make([]byte, 0, size+2)
	return append(b, replVersion, kind)
}

func idsCmd(kind byte, ids []uint64) []byte {
	b := cmdHeader(kind, 12+len(ids)*5)
	b = binary.AppendVarint(b, nowMs())
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, id)
	}
	return b
}

// propose sends a command without waiting; failures are logged (the replicated state is unchanged,
// so an ack that did not make it leaves the message unacked until its consumer goes away).
func (q *Queue) propose(cmd []byte) {
	q.r.rep.Propose(cmd, func(_ []byte, err error) {
		if err != nil {
			q.Logger.Warn("quorum queue command not replicated", "queue", q.Name, "err", err)
		}
	})
}

// proposeWait sends a command and waits for the leader's answer.
func (q *Queue) proposeWait(cmd []byte) ([]byte, error) {
	type result struct {
		resp []byte
		err  error
	}
	ch := make(chan result, 1)
	q.r.rep.Propose(cmd, func(resp []byte, err error) { ch <- result{resp, err} })
	r := <-ch
	return r.resp, r.err
}

// rPublish is Publish for a replicated queue: done gets nil once the message is on a majority, or an
// error (errRejected for a message refused by x-overflow).
func (q *Queue) rPublish(msg *Message, done func(error)) (PublishStatus, bool) {
	q.mu.Lock()
	closed := q.closed
	var throttle chan struct{}
	if !closed && len(q.consumers) > 0 && q.m.Ready() > flowHigh {
		if q.flow == nil {
			q.flow = make(chan struct{})
		}
		throttle = q.flow
	}
	q.mu.Unlock()
	if closed {
		return Gone, false
	}
	r := q.r
	if r.disk.SpaceLow() {
		// The raft log keeps taking acks on a nearly full disk (storage.Batch.UseReserve); publishes
		// must not take that room: nack them, as a classic queue's failed write is.
		return Rejected, false
	}
	r.slots <- struct{}{} // bounded in-flight proposals per node and queue
	b := cmdHeader(cmdEnqueue, 48+len(msg.Body)+len(msg.Props)+len(msg.Exchange)+len(msg.RoutingKey))
	b = binary.BigEndian.AppendUint64(b, r.producer)
	b = binary.BigEndian.AppendUint64(b, r.seq.Add(1))
	b = binary.AppendVarint(b, nowMs())
	b = appendMsg(b, msg)
	r.rep.Propose(b, func(resp []byte, err error) {
		<-r.slots
		if err == nil && len(resp) == 1 && PublishStatus(resp[0]) == Rejected {
			err = errRejected
		} else if err != nil {
			err = fmt.Errorf("%w: %v", ErrNoQuorum, err)
		}
		if done != nil {
			done(err)
		}
	})
	if throttle != nil {
		t := time.NewTimer(flowMaxWait)
		select {
		case <-throttle:
		case <-t.C:
		}
		t.Stop()
	}
	return Accepted, true
}

// rAddConsumer attaches a consumer through the log. The consumer is known locally before the
// command is applied, so the deliveries the command produces find it; they are held back until
// onAdded (basic.consume-ok) has run.
func (q *Queue) rAddConsumer(spec ConsumerSpec, exclusive bool, c Consumer, onAdded func()) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrQueueDeleted
	}
	q.consumers[spec.ID] = c
	q.r.pending[spec.ID] = true
	q.mu.Unlock()
	b := cmdHeader(cmdAddConsumer, 32)
	b = binary.BigEndian.AppendUint64(b, uint64(spec.ID))
	b = binary.AppendUvarint(b, uint64(spec.Prefetch))
	b = binary.AppendVarint(b, int64(spec.Priority))
	b = append(b, boolByte(spec.NoAck), boolByte(exclusive))
	b = binary.AppendVarint(b, nowMs())
	resp, err := q.proposeWait(b)
	q.mu.Lock()
	if err == nil && (len(resp) != 1 || resp[0] != 0) {
		err = ErrInExclusiveUse
	}
	if err != nil || q.closed {
		delete(q.consumers, spec.ID)
		delete(q.r.pending, spec.ID)
		var back []uint64
		kept := q.r.held[:0]
		for _, d := range q.r.held {
			if d.Consumer == spec.ID {
				if !d.Settled {
					back = append(back, d.ID)
				}
			} else {
				kept = append(kept, d)
			}
		}
		q.r.held = kept
		q.mu.Unlock()
		if len(back) > 0 {
			q.propose(idsCmd(cmdReturn, back))
		}
		if err == nil {
			q.propose(q.removeCmd(spec.ID, true))
			return ErrQueueDeleted
		}
		if err != ErrInExclusiveUse {
			q.propose(q.removeCmd(spec.ID, true)) // it may have been applied after all
			return fmt.Errorf("%w: %v", ErrNoQuorum, err)
		}
		return err
	}
	if onAdded != nil {
		onAdded()
	}
	delete(q.r.pending, spec.ID)
	q.hadConsumers = true
	q.r.outbox = append(q.r.outbox, q.r.held...)
	q.r.held = q.r.held[:0]
	q.mu.Unlock()
	q.Kick()
	return nil
}

// removeCmd detaches a consumer; with giveBack its unacked messages also return to the queue.
func (q *Queue) removeCmd(id ConsumerID, giveBack bool) []byte {
	b := cmdHeader(cmdRemoveConsumer, 20)
	b = binary.BigEndian.AppendUint64(b, uint64(id))
	b = append(b, boolByte(giveBack))
	return binary.AppendVarint(b, nowMs())
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// rRemoveConsumer detaches a local consumer; its unacked messages stay unacked (the channel returns
// them). Replicated queues are never auto-deleted.
func (q *Queue) rRemoveConsumer(id ConsumerID) bool {
	q.mu.Lock()
	_, ok := q.consumers[id]
	delete(q.consumers, id)
	q.mu.Unlock()
	if ok {
		q.propose(q.removeCmd(id, false))
	}
	return false
}

// NodeReset removes every consumer of node tag whose epoch is not keepEpoch (all of them if all is
// set), returning their unacked messages (and the node's unacked basic.get messages) to the queue.
// The server proposes it for a node that went down, and for itself at boot (consumers of its
// previous life).
func (q *Queue) NodeReset(tag, keepEpoch uint16, all bool) {
	if q.r == nil {
		return
	}
	b := cmdHeader(cmdNodeReset, 16)
	b = binary.BigEndian.AppendUint16(b, tag)
	b = binary.BigEndian.AppendUint16(b, keepEpoch)
	b = append(b, boolByte(all))
	b = binary.AppendVarint(b, nowMs())
	q.propose(b)
}

// LocalConsumers returns the consumers attached to q through this node.
func (q *Queue) LocalConsumers() map[ConsumerID]Consumer {
	q.mu.Lock()
	defer q.mu.Unlock()
	return maps.Clone(q.consumers)
}

// ConsumerNodes lists the node tags of the consumers the replicated state knows (to find those of
// nodes that are down).
func (q *Queue) ConsumerNodes() []uint16 {
	q.mu.Lock()
	defer q.mu.Unlock()
	var tags []uint16
	for _, id := range q.m.ConsumerIDs() {
		if t := ConsumerNode(id); !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	for _, t := range q.r.getOwner {
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	return tags
}

// rGet is basic.get through the log: the leader's answer carries the message.
func (q *Queue) rGet(noAck bool, nodeTag uint16) (Delivery, int, bool, error) {
	b := cmdHeader(cmdGet, 16)
	b = append(b, boolByte(noAck))
	b = binary.BigEndian.AppendUint16(b, nodeTag)
	b = binary.AppendVarint(b, nowMs())
	resp, err := q.proposeWait(b)
	if err != nil {
		return Delivery{}, 0, false, fmt.Errorf("%w: %v", ErrNoQuorum, err)
	}
	d := rdec{b: resp}
	ok := d.byte() == 1
	ready := int(d.uvarint())
	if !ok || d.err != nil {
		return Delivery{}, ready, false, nil
	}
	del := Delivery{ID: d.uvarint(), Redelivered: d.byte() == 1, DeliveryCount: uint32(d.uvarint()), Settled: noAck}
	del.Msg = d.msg()
	if d.err != nil {
		return Delivery{}, ready, false, d.err
	}
	return del, ready, true, nil
}

// GetFrom is Get for a replicated queue, saying which node asks (so that the node's unacked message
// goes back if the node goes down).
func (q *Queue) GetFrom(noAck bool, nodeTag uint16) (Delivery, int, bool, error) {
	if q.r == nil {
		d, n, ok := q.Get(noAck)
		return d, n, ok, nil
	}
	return q.rGet(noAck, nodeTag)
}

// PurgeErr is Purge reporting a replication failure.
func (q *Queue) PurgeErr() (int, error) {
	if q.r == nil {
		return q.Purge(), nil
	}
	resp, err := q.proposeWait(binary.AppendVarint(cmdHeader(cmdPurge, 10), nowMs()))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrNoQuorum, err)
	}
	n, _ := binary.Uvarint(resp)
	return int(n), nil
}

var alwaysReserve = func(ConsumerID) bool { return true }

// Apply applies one replicated command; every replica applies the same commands in the same order.
// index is the command's position in the log (commands at or below the last applied one are
// skipped). It returns the response the proposer receives.
func (q *Queue) Apply(index uint64, cmd []byte) []byte {
	if len(cmd) < 2 || cmd[0] != replVersion {
		q.Logger.Error("quorum queue: unknown command version; skipped", "queue", q.Name, "index", index)
		return nil
	}
	d := rdec{b: cmd[2:]}
	var resp []byte
	var dead []Dead
	q.mu.Lock()
	if index != 0 && index <= q.r.applied {
		q.mu.Unlock()
		return nil
	}
	if index != 0 {
		q.r.applied = index
	}
	now := int64(0)
	switch cmd[1] {
	case cmdEnqueue:
		producer, seq := d.u64(), d.u64()
		now = d.varint()
		msg := d.msg()
		if d.err != nil {
			break
		}
		w := q.r.producers[producer]
		if w == nil {
			w = &seqWindow{}
			q.r.producers[producer] = w
		}
		if w.seen(seq) {
			resp = []byte{byte(Accepted)}
			break
		}
		_, accepted, dd := q.m.PublishEntry(msg, uint32(len(msg.Body)), 0, msg.Priority, msg.ExpiresAt, now)
		dead = dd
		if accepted {
			resp = []byte{byte(Accepted)}
		} else {
			resp = []byte{byte(Rejected)}
			for i := range dead {
				if dead[i].Msg == nil {
					dead[i].Msg = msg
				}
			}
		}
	case cmdSettle, cmdReturn, cmdDiscard:
		now = d.varint()
		n := d.uvarint()
		for i := uint64(0); i < n && d.err == nil; i++ {
			id := d.uvarint()
			if d.err != nil {
				break
			}
			delete(q.r.getOwner, id)
			switch cmd[1] {
			case cmdSettle:
				q.m.SettleEntry(id)
			case cmdReturn:
				if dd, ok := q.m.ReturnAt(id); ok && dd != nil {
					dead = append(dead, *dd)
				}
			case cmdDiscard:
				if dd, ok := q.m.DiscardDead(id); ok {
					dead = append(dead, dd)
				}
			}
		}
		if cmd[1] == cmdReturn {
			dead = append(dead, q.m.Trim()...)
		}
	case cmdAddConsumer:
		id := ConsumerID(d.u64())
		spec := ConsumerSpec{ID: id, Prefetch: uint32(d.uvarint()), Priority: int32(d.varint())}
		spec.NoAck = d.byte() == 1
		exclusive := d.byte() == 1
		now = d.varint()
		if d.err != nil || id == 0 {
			break
		}
		if q.exclusiveConsumer != 0 && q.exclusiveConsumer != id || exclusive && q.m.Consumers() > 0 && !q.m.HasConsumer(id) {
			resp = []byte{1}
			break
		}
		if exclusive {
			q.exclusiveConsumer = id
		}
		q.m.AddConsumer(spec)
		resp = []byte{0}
	case cmdRemoveConsumer:
		id := ConsumerID(d.u64())
		giveBack := d.byte() == 1
		now = d.varint()
		if d.err == nil {
			q.m.RemoveConsumer(id)
			if q.exclusiveConsumer == id {
				q.exclusiveConsumer = 0
			}
			if giveBack {
				_, dd := q.m.ReturnConsumer(id)
				dead = append(dead, dd...)
			}
		}
	case cmdNodeReset:
		if len(d.b) < 5 {
			d.fail()
			break
		}
		tag, keep, all := binary.BigEndian.Uint16(d.b), binary.BigEndian.Uint16(d.b[2:]), d.b[4] == 1
		d.b = d.b[5:]
		now = d.varint()
		if d.err != nil {
			break
		}
		gone := func(id ConsumerID) bool { return ConsumerNode(id) == tag && (all || ConsumerEpoch(id) != keep) }
		for _, id := range q.m.ConsumerIDs() {
			if gone(id) {
				q.m.RemoveConsumer(id)
				if q.exclusiveConsumer == id {
					q.exclusiveConsumer = 0
				}
			}
		}
		for _, id := range q.m.UnackedOwners() {
			if gone(id) {
				_, dd := q.m.ReturnConsumer(id)
				dead = append(dead, dd...)
			}
		}
		var gets []uint64
		for id, t := range q.r.getOwner {
			if t == tag {
				gets = append(gets, id)
			}
		}
		slices.Sort(gets)
		for _, id := range gets {
			delete(q.r.getOwner, id)
			if dd, ok := q.m.ReturnAt(id); ok && dd != nil {
				dead = append(dead, *dd)
			}
		}
		for p := range q.r.producers {
			if uint16(p>>48) == tag && p != q.r.producer && all {
				delete(q.r.producers, p)
			}
		}
	case cmdTick:
		now = d.varint()
		if d.err == nil {
			dead = q.m.Expire(now)
		}
	case cmdGet:
		noAck := d.byte() == 1
		if len(d.b) < 2 {
			d.fail()
			break
		}
		tag := binary.BigEndian.Uint16(d.b)
		d.b = d.b[2:]
		now = d.varint()
		if d.err != nil {
			break
		}
		del, ok, dd := q.m.GetAt(noAck, now)
		dead = dd
		if !ok {
			resp = binary.AppendUvarint([]byte{0}, uint64(q.m.Ready()))
			break
		}
		if !noAck {
			q.r.getOwner[del.ID] = tag
		}
		resp = binary.AppendUvarint([]byte{1}, uint64(q.m.Ready()))
		resp = binary.AppendUvarint(resp, del.ID)
		resp = append(resp, boolByte(del.Redelivered))
		resp = binary.AppendUvarint(resp, uint64(del.DeliveryCount))
		resp = appendMsg(resp, del.Msg)
	case cmdPurge:
		if now = d.varint(); d.err == nil {
			resp = binary.AppendUvarint(nil, uint64(q.m.Purge()))
		}
	default:
		q.Logger.Error("quorum queue: unknown command; skipped", "queue", q.Name, "index", index, "type", cmd[1])
	}
	if d.err != nil {
		q.Logger.Error("quorum queue: malformed command; skipped", "queue", q.Name, "index", index)
	}
	dead = append(dead, q.rCheckout(now)...)
	q.releaseFlow()
	stale := q.r.stale
	q.r.stale = nil
	q.mu.Unlock()
	for _, id := range stale {
		// Detach it and give its messages back; until that is applied, a new delivery to it
		// proposes nothing more (reaping), and a failed proposal is made again at the next one.
		q.r.rep.Propose(q.removeCmd(id, true), func([]byte, error) {
			q.mu.Lock()
			delete(q.r.reaping, id)
			q.mu.Unlock()
		})
	}
	if len(dead) > 0 && q.Hooks != nil && q.r.rep.IsLeader() {
		q.Hooks.DeadLetter(q, dead)
	}
	q.Kick()
	return resp
}

// rCheckout hands ready messages to consumers with credit (q.mu held). The choice depends only on the
// replicated state, so every replica makes the same; each node delivers to its own consumers.
func (q *Queue) rCheckout(now int64) []Dead {
	var all []Dead
	var ds []Delivery
	for {
		var dead []Dead
		if now != 0 {
			ds, dead = q.m.CheckoutAt(ds[:0], checkoutBatch, alwaysReserve, now)
		} else {
			ds = q.m.Checkout(ds[:0], checkoutBatch, alwaysReserve)
		}
		all = append(all, dead...)
		for _, del := range ds {
			if _, local := q.consumers[del.Consumer]; !local {
				// One of ours that went away before its removal was applied (or whose removal
				// failed): only this node knows, so this node detaches it and gives its messages
				// back, this one included.
				if c := del.Consumer; ConsumerNode(c) == q.r.tag && ConsumerEpoch(c) == q.r.epoch && !q.r.reaping[c] {
					if q.r.reaping == nil {
						q.r.reaping = make(map[ConsumerID]bool)
					}
					q.r.reaping[c] = true
					q.r.stale = append(q.r.stale, c)
				}
				continue
			}
			if q.r.pending[del.Consumer] {
				q.r.held = append(q.r.held, del)
			} else {
				q.r.outbox = append(q.r.outbox, del)
			}
		}
		if len(ds) < checkoutBatch {
			return all
		}
	}
}

// rdispatch hands the deliveries Apply produced for local consumers to them, and on the leader turns
// due deadlines into Tick commands.
func (q *Queue) rdispatch() {
	defer close(q.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var out []Delivery
	var targets []Consumer
	var ticking atomic.Bool
	for {
		leader := q.r.rep.IsLeader()
		q.mu.Lock()
		expAt, hasExp := q.m.NextExpiry()
		hasExp = hasExp && leader && !ticking.Load()
		var toAt int64
		hasTo := false
		if q.ConsumerTimeout > 0 && len(q.consumers) > 0 {
			toAt, hasTo = q.m.NextTimeout(q.timeoutFn)
		}
		q.mu.Unlock()
		var wake <-chan time.Time
		if hasExp || hasTo {
			at := expAt
			if !hasExp || hasTo && toAt < at {
				at = toAt
			}
			d := time.Until(time.UnixMilli(at))
			if d < time.Millisecond {
				d = time.Millisecond
			}
			timer.Reset(d)
			wake = timer.C
		}
		select {
		case <-q.quit:
			return
		case <-q.kick:
		case <-wake:
			now := nowMs()
			if hasExp && now >= expAt && q.r.rep.IsLeader() {
				ticking.Store(true)
				b := cmdHeader(cmdTick, 10)
				b = binary.AppendVarint(b, now)
				q.r.rep.Propose(b, func([]byte, error) { ticking.Store(false); q.Kick() })
			}
			if hasTo && now >= toAt {
				q.timeOutConsumers(now)
			}
		}
		if wake != nil && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return
		}
		out, q.r.outbox = q.r.outbox, out[:0]
		targets = targets[:0]
		for _, d := range out {
			targets = append(targets, q.consumers[d.Consumer])
		}
		q.mu.Unlock()
		var back []uint64
		for i, d := range out {
			if c := targets[i]; c != nil {
				c.Deliver(q, d)
			} else if !d.Settled {
				back = append(back, d.ID) // the consumer went away meanwhile
			}
			out[i], targets[i] = Delivery{}, nil
		}
		if len(back) > 0 {
			q.propose(idsCmd(cmdReturn, back))
		}
	}
}

// timeOutConsumers reports this node's consumers that held a delivery too long to the hooks (which
// cancel them and return their messages).
func (q *Queue) timeOutConsumers(now int64) {
	q.mu.Lock()
	var late []Consumer
	for _, id := range q.m.TimedOut(now, q.timeoutFn) {
		if c := q.consumers[id]; c != nil {
			late = append(late, c)
		}
	}
	q.mu.Unlock()
	if q.Hooks != nil {
		for _, c := range late {
			q.Hooks.ConsumerTimedOut(q, c)
		}
	}
}

// Snapshot returns the replicated state: the machine and the dedupe and basic.get records. It must
// be called between two Applies (Raft's FSM goroutine does so).
func (q *Queue) Snapshot() []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	b := []byte{replVersion}
	b = binary.AppendUvarint(b, q.r.applied)
	b = binary.BigEndian.AppendUint64(b, uint64(q.exclusiveConsumer))
	ps := make([]uint64, 0, len(q.r.producers))
	for p := range q.r.producers {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	b = binary.AppendUvarint(b, uint64(len(ps)))
	for _, p := range ps {
		w := q.r.producers[p]
		b = binary.BigEndian.AppendUint64(b, p)
		b = binary.AppendUvarint(b, w.max)
		n := 0
		if w.bits != nil {
			n = len(w.bits)
		}
		b = binary.AppendUvarint(b, uint64(n))
		for i := 0; i < n; i++ {
			b = binary.LittleEndian.AppendUint64(b, w.bits[i])
		}
	}
	gs := make([]uint64, 0, len(q.r.getOwner))
	for id := range q.r.getOwner {
		gs = append(gs, id)
	}
	slices.Sort(gs)
	b = binary.AppendUvarint(b, uint64(len(gs)))
	for _, id := range gs {
		b = binary.AppendUvarint(b, id)
		b = binary.BigEndian.AppendUint16(b, q.r.getOwner[id])
	}
	return q.m.AppendSnapshot(b)
}

// RestoreSnapshot replaces the replicated state with a snapshot's.
func (q *Queue) RestoreSnapshot(snap []byte) error {
	d := rdec{b: snap}
	if d.byte() != replVersion {
		return errors.New("queue: unknown replicated snapshot version")
	}
	applied := d.uvarint()
	excl := ConsumerID(d.u64())
	producers := make(map[uint64]*seqWindow)
	np := d.uvarint()
	for i := uint64(0); i < np && d.err == nil; i++ {
		p := d.u64()
		w := &seqWindow{max: d.uvarint()}
		n := d.uvarint()
		if n > 0 {
			if n != dedupeWindow/64 || uint64(len(d.b)) < n*8 {
				d.fail()
				break
			}
			w.bits = make([]uint64, n)
			for j := range w.bits {
				w.bits[j] = binary.LittleEndian.Uint64(d.b[j*8:])
			}
			d.b = d.b[n*8:]
		}
		producers[p] = w
	}
	gets := make(map[uint64]uint16)
	ng := d.uvarint()
	for i := uint64(0); i < ng && d.err == nil; i++ {
		id := d.uvarint()
		if len(d.b) < 2 {
			d.fail()
			break
		}
		gets[id] = binary.BigEndian.Uint16(d.b)
		d.b = d.b[2:]
	}
	if d.err != nil {
		return fmt.Errorf("restore quorum queue %q: %w", q.Name, d.err)
	}
	m, err := DecodeMachine(d.b)
	if err != nil {
		return fmt.Errorf("restore quorum queue %q: %w", q.Name, err)
	}
	q.mu.Lock()
	q.m = m
	q.exclusiveConsumer = excl
	q.r.producers, q.r.getOwner, q.r.applied = producers, gets, applied
	q.r.outbox, q.r.held, q.r.stale = nil, nil, nil
	q.mu.Unlock()
	q.Kick()
	return nil
}

// ConsumerIDs returns the attached consumers' ids in increasing order.
func (m *Machine) ConsumerIDs() []ConsumerID {
	ids := make([]ConsumerID, 0, len(m.consumers))
	for id := range m.consumers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// UnackedOwners returns the ids of the consumers (attached or removed) that hold unacked messages, in
// increasing order; basic.get messages have no owner and are not listed.
func (m *Machine) UnackedOwners() []ConsumerID {
	var ids []ConsumerID
	for _, u := range m.unacked {
		if u.owner != nil && !slices.Contains(ids, u.owner.spec.ID) {
			ids = append(ids, u.owner.spec.ID)
		}
	}
	slices.Sort(ids)
	return ids
}
