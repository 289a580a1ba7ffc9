package queue

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"warren/storage"

	"warren/amqp"
)

// Replicator orders the commands of a replicated queue: in Warren, its Raft group.
type Replicator interface {
	// Propose replicates cmd. done is called once, from another goroutine, with the command's log
	// index and what Apply returned on the leader, or with an error if the command could not be
	// committed in time. The answer can come before this node's replica has applied the command
	// (the leader answers a forwarded proposal once it applied it), so a proposer that needs its
	// own replica to have seen the command compares index with what the replica applied. A command
	// may be applied more than once (a retry after a lost leadership); the State dedupes what
	// matters, and index is the last application's.
	Propose(cmd []byte, done func(index uint64, resp []byte, err error))
	// IsLeader reports whether this node leads the group now. Work that the cluster needs done
	// once (timer ticks, dead-letter hand-over) is started by the leader; none of it depends on
	// the answer being exact.
	IsLeader() bool
}

// LeaderProposer is implemented by a Replicator that can propose a command only while this node
// leads, never forwarding or retrying it elsewhere: a leader's verdict that a node is down must not
// be committed by the next leader after a partition heals (NodeDown uses it when it can).
type LeaderProposer interface {
	ProposeAsLeader(cmd []byte, done func(index uint64, resp []byte, err error))
}

// QuorumConfig is OpenConfig.Extra for a quorum queue (QuorumType), and for a durable classic
// queue that the core replicates in a cluster (ClassicType).
type QuorumConfig struct {
	Replicator Replicator
	// Node is this node's tag and Epoch this boot's epoch in consumer ids (see ConsumerNode).
	Node, Epoch uint16
	// Classic makes the queue serve a durable classic queue in a cluster (one voter, with
	// non-voting replicas elsewhere): Kind is "classic", a channel's global prefetch applies per
	// consumer (as RabbitMQ 4.3 does) instead of being refused, and a redeclaration renews its
	// x-expires lease (quorumexpires.go). Like every replicated queue it is never auto-deleted.
	Classic bool
}

// QuorumType opens quorum queues; OpenConfig.Extra must be a *QuorumConfig.
type QuorumType struct{}

// Kind implements Type.
func (QuorumType) Kind() string { return "quorum" }

// Open implements Type (see OpenQuorum).
func (QuorumType) Open(cfg OpenConfig) (Queue, error) {
	qc, ok := cfg.Extra.(*QuorumConfig)
	if !ok || qc == nil {
		return nil, fmt.Errorf("queue: quorum queue '%s' opened without a *QuorumConfig", cfg.Name)
	}
	return OpenQuorum(cfg, *qc)
}

// Limits of a quorum queue's node-local work.
const (
	// quorumMaxInflight bounds the publishes a node has outstanding for one queue; publishers
	// wait beyond it (and Close wakes them).
	quorumMaxInflight = 4096
	// creditWindow is the credit a node grants a consumer at a time: at most this many
	// deliveries beyond its connection's high-water mark (at least its prefetch).
	creditWindow = 256
	// dlxBatch and dlxMaxInflight bound the dead letters the leader hands over at a time.
	dlxBatch       = 128
	dlxMaxInflight = 1024
	// defaultDLXRetry is how long the leader waits before handing over again dead letters whose
	// targets failed.
	defaultDLXRetry = time.Second
)

// quorumSnapshotVersion is the first byte of the previous release's snapshots (every body
// inline), which Restore still reads, as it reads version 1 (the replicated classic struct of the
// release before); this release writes quorumSnapshotV3 (quorumdisk.go).
const quorumSnapshotVersion byte = 2

// Quorum is a replicated queue: a quorum queue, or in a cluster a durable classic queue. Every
// change is a command that the Replicator orders and every replica applies to its State (Apply,
// called by the core's raft.FSM adapter). The state assigns deliveries with no node-local input;
// each node hands those for its own consumers (node tag and boot epoch in the consumer id) to
// them from its dispatcher goroutine, grants them credit as their connections drain, times them
// out, and, while it leads, proposes timer ticks and hands the recorded dead letters over.
//
// Lock order: mu -> pmu (bodies being written); a consumer's Deliver, HasRoom and Cancelled, a Done and the hooks
// run with no lock held, never on the FSM goroutine.
type Quorum struct {
	disk            *storage.DB // this node's store, asked only whether it is down to its reserve
	name, vhost     string
	id              uint64
	classic         bool
	log             *slog.Logger
	hooks           Hooks
	consumerTimeout int64
	rep             Replicator
	node, epoch     uint16
	producer        uint64 // this node's producer id for its commands
	seq             atomic.Uint64
	slots           chan struct{} // publish window

	mu        sync.Mutex
	s         *State
	applied   uint64  // last applied log index
	cmd       Command // decode buffer of Apply (FSM goroutine)
	fx        Effects // effects buffer of Apply
	consumers map[ConsumerID]*quorumConsumer
	closed    bool
	flow      flowGate
	outbox    []Delivery // deliveries for local consumers, for the dispatcher
	expiry    int64      // earliest deadline of a ready message (hasExpiry)
	hasExpiry bool
	ticking   bool
	exp       quorumExpiry // x-expires (quorumexpires.go)
	// stale are this node's consumers (this epoch) that are gone locally but still attached in
	// the replicated state; reaping marks those whose removal is proposed and not yet answered.
	stale   []ConsumerID
	reaping map[ConsumerID]bool
	// lost are local consumers the replicated state dropped (a node reset of this node while it
	// was cut off): the dispatcher tells them CancelUnavailable.
	lost []Consumer
	// Dead-letter hand-over (leader): the records handed over and not yet removed, by sequence
	// number; dlxGen changes with leadership and snapshots so that late callbacks are ignored.
	dlxInflight map[uint64]bool
	dlxGen      uint64
	dlxRetryAt  time.Time
	dlxRetry    time.Duration

	// Bodies on disk (quorumdisk.go): paged counts the messages whose bodies are in records
	// (for the snapshot schedule; q.mu), snapIndex is the applied index of the last snapshot
	// (q.mu), pending holds the bodies whose records are not yet committed (pmu, a leaf).
	paged       int
	snapIndex   uint64
	lastCapture atomic.Int64
	forceSnap   atomic.Bool
	pmu         sync.Mutex
	pending     map[uint64]*Message

	kick chan struct{}
	quit chan struct{}
	done chan struct{}
}

// quorumConsumer is a consumer attached through this node. Its fields are guarded by Quorum.mu.
type quorumConsumer struct {
	c        Consumer
	pending  bool       // basic.consume-ok has not gone out: deliveries wait in held
	held     []Delivery // deliveries made before consume-ok
	window   uint64     // credit granted at a time
	granted  uint64     // the highest credit total proposed
	handed   uint64     // deliveries handed to c (or taken back)
	timedOut bool       // told CancelTimeout; the session cancels it
	// out holds the unsettled deliveries handed to c (message id -> delivery count), so that
	// after a snapshot is installed the node hands over what the state assigned in the log it
	// skipped, and nothing twice.
	out map[uint64]uint32
	// index is the log index of the consumer's CmdConsume, known once the leader answered it
	// (0 before). Until this replica has applied that index, the consumer's absence from the
	// replicated state means nothing: the leader can answer before this replica applies.
	index uint64
}

// OpenQuorum creates this node's replica of a replicated queue and starts its dispatcher. Its
// state is empty (or, once the core's Raft group replays, its log's and snapshot's): the core
// wires Apply, Snapshot and Restore into the group's FSM and LeaderChanged into its leadership
// notification, and calls Rejoin once the group runs.
func OpenQuorum(cfg OpenConfig, qc QuorumConfig) (*Quorum, error) {
	if qc.Replicator == nil {
		return nil, fmt.Errorf("queue: replicated queue '%s' opened without a replicator", cfg.Name)
	}
	var b [4]byte
	rand.Read(b[:])
	q := &Quorum{
		disk: cfg.DB,
		name: cfg.Name, vhost: cfg.VHost, id: cfg.ID, classic: qc.Classic,
		log: loggerOr(cfg.Logger), hooks: cfg.Hooks, consumerTimeout: cfg.ConsumerTimeout,
		rep: qc.Replicator, node: qc.Node, epoch: qc.Epoch,
		producer:  uint64(qc.Node)<<48 | uint64(qc.Epoch)<<32 | uint64(binary.BigEndian.Uint32(b[:])),
		slots:     make(chan struct{}, quorumMaxInflight),
		s:         NewState(StateConfig{Config: cfg.Lifecycle, Replicated: true, Source: cfg.ID}),
		consumers: make(map[ConsumerID]*quorumConsumer),
		exp:       quorumExpiry{ttl: cfg.Expires, lastActive: nowMs()},
		dlxRetry:  defaultDLXRetry,
		kick:      make(chan struct{}, 1),
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	go q.dispatch()
	return q, nil
}

// Name implements Queue.
func (q *Quorum) Name() string { return q.name }

// Kind implements Queue: "quorum", or "classic" for a replicated classic queue.
func (q *Quorum) Kind() string {
	if q.classic {
		return "classic"
	}
	return "quorum"
}

// Kick implements Queue. It never blocks.
func (q *Quorum) Kick() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// Touch implements Queue: a redeclaration renews a replicated classic queue's x-expires lease
// (through its log, so that its leader sees it); a quorum queue's is not renewed, as in RabbitMQ.
func (q *Quorum) Touch() {
	q.mu.Lock()
	touch := q.classic && q.exp.ttl > 0 && !q.closed
	q.mu.Unlock()
	if touch {
		q.propose(&Command{Type: CmdTouch}, nil)
	}
}

// encode encodes a command at the current time.
func encode(cmd *Command, size int) []byte {
	return AppendCommand(make([]byte, 0, 16+size), cmd, nowMs())
}

// propose replicates a command without waiting; failures are logged (the replicated state is
// unchanged, so e.g. an ack that did not make it leaves the message unacked until its consumer
// goes away).
func (q *Quorum) propose(cmd *Command, then func(err error)) {
	q.rep.Propose(encode(cmd, 16+10*len(cmd.Tags)), func(_ uint64, _ []byte, err error) {
		if err != nil {
			q.log.Warn("replicated queue command not committed", "queue", q.name, "command", cmd.Type, "err", err)
		}
		if then != nil {
			then(err)
		}
	})
}

// proposeWait replicates a command and waits for the leader's answer; it also returns the
// command's log index.
func (q *Quorum) proposeWait(cmd *Command) (Reply, uint64, error) {
	type result struct {
		index uint64
		resp  []byte
		err   error
	}
	ch := make(chan result, 1)
	q.rep.Propose(encode(cmd, 32), func(index uint64, resp []byte, err error) { ch <- result{index, resp, err} })
	var r result
	select {
	case r = <-ch:
	case <-q.quit:
		return Reply{}, 0, ErrGone
	}
	if r.err != nil {
		return Reply{}, 0, fmt.Errorf("%w: %v", ErrNoQuorum, r.err)
	}
	if r.resp == nil {
		return Reply{Stale: true}, r.index, nil
	}
	reply, err := decodeReply(r.resp)
	return reply, r.index, err
}

// Publish implements Queue: done gets nil once the message is on a majority, ErrRejected for a
// message refused by x-overflow, ErrNoQuorum if it could not be committed, ErrGone if the queue
// closed first. A publisher waits while the node has quorumMaxInflight publishes outstanding
// (Close wakes it) and, while the queue is long and has consumers here, a little more (flow).
func (q *Quorum) Publish(msg *Message, done Done) PublishStatus {
	q.mu.Lock()
	closed := q.closed
	throttle := q.flow.throttle(q.s.m.ready, len(q.consumers))
	q.mu.Unlock()
	if closed {
		finish(done, ErrGone)
		return Gone
	}
	if q.disk != nil && q.disk.SpaceLow() {
		// The raft log keeps taking acks on a nearly full disk (storage.Batch.UseReserve);
		// publishes must not take that room: nack them, as a classic queue's failed write is.
		finish(done, storage.ErrNoSpace)
		return Rejected
	}
	select {
	case q.slots <- struct{}{}:
	case <-q.quit:
		finish(done, ErrGone)
		return Gone
	}
	cmd := Command{Type: CmdEnqueue, Msg: msg, Producer: q.producer, Seq: q.seq.Add(1)}
	b := encode(&cmd, 48+len(msg.Body)+len(msg.Props)+len(msg.Exchange)+len(msg.RoutingKey))
	q.rep.Propose(b, func(_ uint64, resp []byte, err error) {
		<-q.slots
		if err != nil {
			err = fmt.Errorf("%w: %v", ErrNoQuorum, err)
		} else if resp != nil {
			if r, derr := decodeReply(resp); derr == nil && r.Status == Rejected {
				err = ErrRejected
			}
		}
		finish(done, err)
	})
	if throttle != nil {
		q.flow.wait(throttle)
	}
	return Accepted
}

// Consume implements Queue. The consumer is known locally before its command is applied, so the
// deliveries the command produces find it; they wait until spec.OnAdded (basic.consume-ok) has
// run. A channel's global prefetch is refused (RabbitMQ's text), except by a replicated classic
// queue, which applies it per consumer.
func (q *Quorum) Consume(spec ConsumeSpec, c Consumer) error {
	prefetch := spec.Prefetch
	if g := spec.GlobalPrefetch; g > 0 {
		if !q.classic {
			return amqp.Errorf(amqp.NotImplemented, "queue '%s' in vhost '%s' does not support global qos", q.name, q.vhost)
		}
		if prefetch == 0 || g < prefetch {
			prefetch = g
		}
	}
	window := max(creditWindow, uint64(prefetch))
	cc := &quorumConsumer{c: c, pending: true, window: window, granted: window}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrGone
	}
	q.consumers[spec.ID] = cc
	q.mu.Unlock()
	cmd := Command{Type: CmdConsume, Consumer: spec.ID, Prefetch: prefetch, Priority: spec.Priority,
		NoAck: spec.NoAck, Exclusive: spec.Exclusive, Credited: true, Credit: window}
	r, index, err := q.proposeWait(&cmd)
	if err == nil && (r.Refused || r.Stale) {
		err = ErrInExclusiveUse
		if r.Stale {
			err = fmt.Errorf("%w: consume not applied", ErrNoQuorum)
		}
	}
	q.mu.Lock()
	if err != nil || q.closed || q.consumers[spec.ID] != cc {
		if q.consumers[spec.ID] == cc {
			delete(q.consumers, spec.ID)
		}
		back := unsettled(cc.held)
		cc.held = nil
		q.mu.Unlock()
		if len(back) > 0 {
			q.propose(&Command{Type: CmdReturn, Tags: back}, nil)
		}
		switch {
		case err == nil:
			// Attached, but the queue closed or the consumer was cancelled meanwhile.
			q.propose(&Command{Type: CmdCancel, Consumer: spec.ID, GiveBack: true}, nil)
			return ErrGone
		case errors.Is(err, ErrInExclusiveUse):
			return err
		default:
			// It may have been applied after all.
			q.propose(&Command{Type: CmdCancel, Consumer: spec.ID, GiveBack: true}, nil)
			return err
		}
	}
	if spec.OnAdded != nil {
		spec.OnAdded()
	}
	cc.pending, cc.index = false, max(index, 1)
	q.outbox = append(q.outbox, cc.held...)
	cc.held = nil
	q.mu.Unlock()
	q.Kick()
	return nil
}

// unsettled returns the tags of the deliveries that still need an answer.
func unsettled(ds []Delivery) []Tag {
	var tags []Tag
	for _, d := range ds {
		if !d.Settled {
			tags = append(tags, d.Tag())
		}
	}
	return tags
}

// Cancel implements Queue: replicated queues are never auto-deleted.
func (q *Quorum) Cancel(id ConsumerID) bool {
	q.mu.Lock()
	_, ok := q.consumers[id]
	delete(q.consumers, id)
	closed := q.closed
	q.mu.Unlock()
	if ok && !closed {
		q.propose(&Command{Type: CmdCancel, Consumer: id}, nil)
	}
	return false
}

// Settle implements Queue: the settlement is proposed and applied on every replica; a failure to
// commit is logged (the deliveries stay unacknowledged until their consumer's node resets them).
func (q *Quorum) Settle(id ConsumerID, op SettleOp, tags []Tag) error {
	if int(op) >= len(settleCommands) {
		return fmt.Errorf("queue: unknown settle operation %d", op)
	}
	if len(tags) == 0 {
		return nil
	}
	q.mu.Lock()
	if cc := q.consumers[id]; cc != nil && cc.out != nil {
		for _, t := range tags {
			if n, ok := cc.out[t.ID]; ok && n == t.Count {
				delete(cc.out, t.ID)
			}
		}
	}
	q.mu.Unlock()
	q.propose(&Command{Type: settleCommands[op], Tags: tags}, nil)
	return nil
}

// Get implements Queue: basic.get through the log. The command id makes a retry get the first
// answer; the node owns the message until it is settled (NodeDown returns it).
func (q *Quorum) Get(noAck bool) (Delivery, int, bool, error) {
	cmd := Command{Type: CmdGet, NoAck: noAck, Owner: uint32(q.node)<<16 | uint32(q.epoch),
		Producer: q.producer, Seq: q.seq.Add(1)}
	r, _, err := q.proposeWait(&cmd)
	if err != nil {
		return Delivery{}, 0, false, err
	}
	if r.Stale {
		return Delivery{}, 0, false, fmt.Errorf("%w: basic.get not applied", ErrNoQuorum)
	}
	return r.Delivery, r.Remaining, r.OK, nil
}

// Purge implements Queue.
func (q *Quorum) Purge() (int, error) {
	cmd := Command{Type: CmdPurge, Producer: q.producer, Seq: q.seq.Add(1)}
	r, _, err := q.proposeWait(&cmd)
	if err != nil {
		return 0, err
	}
	if r.Stale {
		return 0, fmt.Errorf("%w: queue.purge not applied", ErrNoQuorum)
	}
	return r.Count, nil
}

// Stats implements Queue: the counts of the replicated state (consumers on every node).
func (q *Quorum) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return Stats{Ready: q.s.m.ready, Unacked: len(q.s.m.unacked), Consumers: len(q.s.m.consumers),
		ReadyBytes: int64(q.s.m.readyBytes)}
}

// stop closes the queue and stops its dispatcher, returning the local consumers (ok=false if it
// was already stopped). Publishers waiting for the publish window are woken.
func (q *Quorum) stop() (map[ConsumerID]*quorumConsumer, int, bool) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil, 0, false
	}
	q.closed = true
	q.flow.release(0, 0, true)
	cs := q.consumers
	q.consumers = map[ConsumerID]*quorumConsumer{}
	ready := q.s.m.ready
	q.mu.Unlock()
	close(q.quit)
	<-q.done
	return cs, ready, true
}

// Close implements Queue (broker shutdown): the replica's state stays in its group's log and
// snapshots.
func (q *Quorum) Close() { q.stop() }

// Delete implements Queue: local consumers are told CancelDeleted; the core removes the group.
func (q *Quorum) Delete() int {
	cs, ready, _ := q.stop()
	q.dropBodies()
	cancelAll(q, cs, CancelDeleted)
	return ready
}

// cancelAll tells consumers, in id order, that the queue dropped them.
func cancelAll(q *Quorum, cs map[ConsumerID]*quorumConsumer, why CancelReason) {
	ids := make([]ConsumerID, 0, len(cs))
	for id := range cs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		cs[id].c.Cancelled(q, why)
	}
}

// Unavailable cancels the consumers attached through this node (CancelUnavailable): the core
// calls it for a replicated classic queue whose home node (its one voter) is down, as RabbitMQ
// cancels the consumers of an unavailable classic queue. The replicated state still lists them;
// it returns their messages once the home node is back (NodeDown, or this node's reaping).
func (q *Quorum) Unavailable() {
	q.mu.Lock()
	cs := q.consumers
	q.consumers = map[ConsumerID]*quorumConsumer{}
	q.mu.Unlock()
	cancelAll(q, cs, CancelUnavailable)
}

// NodeDown proposes the removal of the consumers of a node that went down (every boot epoch of it
// the state knows now), returning their unacked deliveries and the node's basic.get messages to the
// queue. The core calls it on the leader when the node goes down, and for the nodes that are down
// when this node becomes leader. A retry removes the same epochs only, never a consumer the node
// attached after it came back.
func (q *Quorum) NodeDown(node uint16) {
	q.mu.Lock()
	var epochs []uint16
	for id := range q.s.m.consumers {
		if ConsumerNode(id) == node && !slices.Contains(epochs, ConsumerEpoch(id)) {
			epochs = append(epochs, ConsumerEpoch(id))
		}
	}
	for _, u := range q.s.m.unacked {
		if c := u.owner; c != nil && ConsumerNode(c.spec.ID) == node && !slices.Contains(epochs, ConsumerEpoch(c.spec.ID)) {
			epochs = append(epochs, ConsumerEpoch(c.spec.ID))
		}
	}
	for _, o := range q.s.getOwner {
		if uint16(o>>16) == node && !slices.Contains(epochs, uint16(o)) {
			epochs = append(epochs, uint16(o))
		}
	}
	q.mu.Unlock()
	if len(epochs) == 0 {
		return
	}
	slices.Sort(epochs)
	cmd := &Command{Type: CmdNodeReset, Node: node, Epochs: epochs}
	lp, ok := q.rep.(LeaderProposer)
	if !ok {
		q.propose(cmd, nil)
		return
	}
	lp.ProposeAsLeader(encode(cmd, 16), func(_ uint64, _ []byte, err error) {
		if err != nil {
			// A leader that lost its leadership meanwhile: the next leader decides for itself.
			q.log.Info("node reset not committed by this leader", "queue", q.name, "node", node, "err", err)
		}
	})
}

// Rejoin proposes the removal of this node's consumers and basic.get messages from its earlier
// boots (they are gone with the process). The core calls it once the queue's group runs.
func (q *Quorum) Rejoin() {
	q.propose(&Command{Type: CmdNodeReset, Node: q.node, Except: true, Epochs: []uint16{q.epoch}}, nil)
}

// ConsumerNodes lists the node tags of the consumers and basic.get messages in the replicated
// state (to find those of nodes that are down).
func (q *Quorum) ConsumerNodes() []uint16 {
	q.mu.Lock()
	defer q.mu.Unlock()
	var tags []uint16
	for id := range q.s.m.consumers {
		if t := ConsumerNode(id); !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	for _, u := range q.s.m.unacked {
		if c := u.owner; c != nil && !slices.Contains(tags, ConsumerNode(c.spec.ID)) {
			tags = append(tags, ConsumerNode(c.spec.ID))
		}
	}
	for _, o := range q.s.getOwner {
		if t := uint16(o >> 16); !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	slices.Sort(tags)
	return tags
}

// LeaderChanged tells the queue that this node became (or stopped being) its group's leader; the
// core calls it from raft's leadership notification. A new leader hands over every dead letter
// still recorded, whatever an earlier leader did with it (the targets drop the duplicates).
func (q *Quorum) LeaderChanged(leader bool) {
	q.mu.Lock()
	q.dlxGen++
	q.dlxInflight = nil
	q.dlxRetryAt = time.Time{}
	q.ticking = false
	q.mu.Unlock()
	q.Kick()
}

// Apply applies one replicated command; every replica applies the same commands in the same order
// (the core's raft.FSM calls it from its one goroutine). index is the command's position in the
// log: commands at or below the last applied one are skipped. It returns the answer for the
// proposer. Malformed commands, unknown versions and unknown types are logged and skipped.
func (q *Quorum) Apply(index uint64, data []byte) []byte {
	q.mu.Lock()
	if index != 0 && index <= q.applied {
		q.mu.Unlock()
		return nil
	}
	if index != 0 {
		q.applied = index
	}
	now, err := DecodeCommand(data, &q.cmd)
	if err != nil {
		q.mu.Unlock()
		q.log.Error("replicated queue: command skipped", "queue", q.name, "index", index, "err", err)
		return nil
	}
	fx := &q.fx
	fx.Reset()
	q.pageOut()
	q.s.Apply(&q.cmd, now, fx)
	if (q.cmd.Type == CmdGet || q.cmd.Type == CmdTake) && fx.Reply.OK && fx.Reply.Delivery.Msg == nil && fx.Reply.Delivery.flags&flagPaged != 0 {
		// basic.get answers with the body: read it before a no-ack get's record goes.
		if m, err := q.loadBody(fx.Reply.Delivery.ID); err == nil {
			fx.Reply.Delivery.Msg = m
		} else {
			q.log.Error("replicated queue: cannot read a paged message for basic.get", "queue", q.name,
				"id", fx.Reply.Delivery.ID, "err", err)
		}
	}
	q.storeEffects(fx)
	kick := q.route(fx.Deliveries) || fx.DeadRecorded > 0 || q.expiry != fx.NextExpiry
	if isUse(q.cmd.Type) && q.exp.used(q.s.now) {
		kick = true // the dispatcher re-arms the x-expires timer
	}
	switch {
	case q.cmd.Type == CmdNodeReset && q.cmd.Node == q.node:
		for id, cc := range q.consumers {
			if q.droppedLocked(id, cc) {
				q.lost = append(q.lost, cc.c)
				delete(q.consumers, id)
				kick = true
			}
		}
	case q.cmd.Type == CmdConsume && q.consumers[q.cmd.Consumer] == nil && q.s.m.hasConsumer(q.cmd.Consumer):
		// One of this boot's consumers attached in the log after it went away here (its
		// consume timed out, say, and was committed later): detach it as route does.
		kick = q.reapLocked(q.cmd.Consumer) || kick
	}
	q.expiry, q.hasExpiry = fx.NextExpiry, fx.HasExpiry
	var resp []byte
	switch q.cmd.Type {
	case CmdEnqueue, CmdConsume, CmdGet, CmdTake, CmdPurge:
		resp = appendReply(make([]byte, 0, 16), &fx.Reply)
	}
	q.flow.release(q.s.m.ready, len(q.consumers), q.closed)
	q.cmd.Msg = nil
	q.mu.Unlock()
	if kick {
		q.Kick()
	}
	return resp
}

// route hands the deliveries of an applied command to this node's consumers (q.mu held) and
// reports whether the dispatcher has work.
func (q *Quorum) route(ds []Delivery) bool {
	work := false
	for _, d := range ds {
		cc := q.consumers[d.Consumer]
		switch {
		case cc == nil:
			// One of this boot's consumers that went away before its removal was applied (or
			// whose removal failed): only this node knows, so this node detaches it and gives its
			// messages back, this one included.
			work = q.reapLocked(d.Consumer) || work
		case cc.pending:
			cc.held = append(cc.held, d)
		default:
			q.outbox = append(q.outbox, d)
			work = true
		}
	}
	return work
}

// reapLocked queues the removal of consumer c from the replicated state if it is one of this
// boot's and not being removed already (q.mu held); it reports whether the dispatcher has work.
func (q *Quorum) reapLocked(c ConsumerID) bool {
	if ConsumerNode(c) != q.node || ConsumerEpoch(c) != q.epoch || q.reaping[c] {
		return false
	}
	if q.reaping == nil {
		q.reaping = make(map[ConsumerID]bool)
	}
	q.reaping[c] = true
	q.stale = append(q.stale, c)
	return true
}

// droppedLocked reports whether the replicated state dropped local consumer cc (q.mu held): it
// is not in the state although this replica has applied its consume. A consumer whose consume
// is pending or not yet applied here (the leader answered first) is not dropped.
func (q *Quorum) droppedLocked(id ConsumerID, cc *quorumConsumer) bool {
	return !cc.pending && cc.index != 0 && cc.index <= q.applied && !q.s.m.hasConsumer(id)
}

// Snapshot returns a whole snapshot in memory (CaptureSnapshot, forced, then WriteTo): for tests
// and tools; the core streams snapshots instead.
func (q *Quorum) Snapshot() []byte {
	snap, err := q.CaptureSnapshot(true)
	if err != nil {
		q.log.Error("replicated queue: snapshot", "queue", q.name, "err", err)
		return nil
	}
	defer snap.Release()
	var buf bytes.Buffer
	if _, err := snap.WriteTo(&buf); err != nil {
		q.log.Error("replicated queue: snapshot", "queue", q.name, "err", err)
		return nil
	}
	return buf.Bytes()
}

// Restore replaces the replicated state with a snapshot's (RestoreFrom on a byte slice).
func (q *Quorum) Restore(snap []byte) error { return q.RestoreFrom(bytes.NewReader(snap)) }

// RestoreFrom replaces the replicated state with a snapshot's, read from r: this release's
// (version 3: the state, then the paged bodies, which it writes to this node's store where they
// are missing) or an earlier one's (every body inline). It must be called between two Applies.
func (q *Quorum) RestoreFrom(r io.Reader) error {
	br := bufio.NewReaderSize(r, 256<<10)
	version, err := br.ReadByte()
	if err != nil {
		return fmt.Errorf("restore replicated queue '%s': version: %w", q.name, err)
	}
	var s *State
	var applied uint64
	paged := 0
	switch version {
	case quorumSnapshotV3:
		s, applied, paged, err = q.restoreStream(br)
	case quorumSnapshotVersion, 1:
		var rest []byte
		if rest, err = io.ReadAll(br); err != nil {
			break
		}
		rd := &snapReader{b: rest}
		applied = rd.uvarint("applied")
		if rd.err != nil {
			err = rd.err
			break
		}
		if version == 1 {
			s, err = decodeStateV1(rd.b, q.id)
			break
		}
		s, err = DecodeState(rd.b)
		if err == nil && !s.replicated {
			err = errors.New("not a replicated queue's state")
		}
	default:
		err = fmt.Errorf("unknown snapshot version %d", version)
	}
	if err != nil {
		return fmt.Errorf("restore replicated queue '%s': %w", q.name, err)
	}
	s.source = q.id
	q.mu.Lock()
	q.s, q.applied = s, applied
	q.paged, q.snapIndex = paged, applied
	q.outbox, q.stale, q.reaping = nil, nil, nil
	q.reconcileLocked()
	q.expiry, q.hasExpiry = s.m.nextExpiry()
	q.exp.lastActive, q.exp.reportedAt = max(q.exp.lastActive, s.now), 0
	q.dlxGen++
	q.dlxInflight = nil
	q.mu.Unlock()
	q.Kick()
	return nil
}

// reconcileLocked brings this node's consumers in line with a state installed from a snapshot
// (q.mu held): the deliveries the state assigned to them that they were never handed (the log
// this node skipped) go to the outbox, or wait for basic.consume-ok; consumers the state no
// longer has (the leader reset this node while it was cut off) are dropped and told by the
// dispatcher (lost).
func (q *Quorum) reconcileLocked() {
	owned := make(map[ConsumerID][]Delivery)
	for uid, u := range q.s.m.unacked {
		if u.owner != nil && q.consumers[u.owner.spec.ID] != nil && q.s.m.consumers[u.owner.spec.ID] == u.owner {
			owned[u.owner.spec.ID] = append(owned[u.owner.spec.ID], Delivery{Consumer: u.owner.spec.ID, ID: uid,
				Msg: u.msg, Redelivered: u.redelivered, DeliveryCount: u.count})
		}
	}
	for id, cc := range q.consumers {
		cc.held = nil
		if !q.s.m.hasConsumer(id) {
			// A consume not yet applied here may still be ahead in the log.
			if q.droppedLocked(id, cc) {
				q.lost = append(q.lost, cc.c)
				delete(q.consumers, id)
			}
			continue
		}
		ds := owned[id]
		slices.SortFunc(ds, func(a, b Delivery) int { return cmpID(a.ID, b.ID) })
		keep := make(map[uint64]uint32, len(ds))
		for _, d := range ds {
			if n, ok := cc.out[d.ID]; ok && n == d.DeliveryCount {
				keep[d.ID] = n
				continue
			}
			if cc.pending {
				cc.held = append(cc.held, d)
			} else {
				q.outbox = append(q.outbox, d)
			}
		}
		cc.out = keep
	}
}

// timeout is the consumer timeout of a consumer in the replicated state: this node times out its
// own consumers only (q.mu held).
func (q *Quorum) timeout(id ConsumerID) int64 {
	if cc := q.consumers[id]; cc != nil && !cc.timedOut {
		return q.consumerTimeout
	}
	return 0
}

// dispatch is the queue's goroutine: it hands the outbox to local consumers, grants credit,
// reaps stale consumers, times consumers out, and while leading proposes ticks and hands over
// dead letters.
func (q *Quorum) dispatch() {
	defer close(q.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var out []Delivery
	var targets []*quorumConsumer
	for {
		leader := q.rep.IsLeader()
		q.mu.Lock()
		var at int64
		timed := false
		if q.hasExpiry && leader && !q.ticking {
			at, timed = q.expiry, true
		}
		if q.consumerTimeout > 0 && len(q.consumers) > 0 {
			if t, ok := q.s.m.nextTimeout(q.timeout); ok && (!timed || t < at) {
				at, timed = t, true
			}
		}
		if !q.dlxRetryAt.IsZero() && leader {
			if t := q.dlxRetryAt.UnixMilli(); !timed || t < at {
				at, timed = t, true
			}
		}
		if leader {
			if t, ok := q.exp.deadline(len(q.s.m.consumers)); ok && (!timed || t < at) {
				at, timed = t, true
			}
		}
		q.mu.Unlock()
		var wake <-chan time.Time
		if timed {
			timer.Reset(max(time.Until(time.UnixMilli(at)), time.Millisecond))
			wake = timer.C
		}
		select {
		case <-q.quit:
			return
		case <-q.kick:
		case <-wake:
		}
		if timed && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		now := nowMs()
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return
		}
		isLeader := q.rep.IsLeader()
		tick := q.hasExpiry && !q.ticking && now >= q.expiry && isLeader
		if tick {
			q.ticking = true
		}
		expired := isLeader && q.exp.due(now, len(q.s.m.consumers))
		var late []Consumer
		if q.consumerTimeout > 0 && len(q.consumers) > 0 {
			for _, id := range q.s.m.timedOut(now, q.timeout) {
				if cc := q.consumers[id]; cc != nil {
					cc.timedOut = true
					late = append(late, cc.c)
				}
			}
		}
		stale, lost := q.stale, q.lost
		q.stale, q.lost = nil, nil
		out, q.outbox = q.outbox, out[:0]
		targets = targets[:0]
		for _, d := range out {
			targets = append(targets, q.consumers[d.Consumer])
		}
		q.mu.Unlock()

		if expired && q.hooks != nil {
			q.hooks.Expired(q) // the core deletes the queue on every member
		}
		if tick {
			gen := q.dlxGenNow()
			q.propose(&Command{Type: CmdTick}, func(error) {
				q.mu.Lock()
				if q.dlxGen == gen {
					q.ticking = false
				}
				q.mu.Unlock()
				q.Kick()
			})
		}
		for _, c := range late {
			c.Cancelled(q, CancelTimeout)
		}
		for _, c := range lost {
			c.Cancelled(q, CancelUnavailable)
		}
		for _, id := range stale {
			// Detach it and give its messages back; until that is applied, a new delivery to it
			// proposes nothing more (reaping), and a failed proposal is made again at the next one.
			q.propose(&Command{Type: CmdCancel, Consumer: id, GiveBack: true}, func(error) {
				q.mu.Lock()
				delete(q.reaping, id)
				q.mu.Unlock()
			})
		}
		var back []Tag
		var read []uint64
		for i := range out {
			d := &out[i]
			if d.Msg != nil || d.flags&flagPaged == 0 {
				continue
			}
			m, err := q.loadBody(d.ID)
			if err != nil {
				// Never expected (the record is written before its message can be delivered):
				// drop the message rather than wedge the consumer.
				q.log.Error("replicated queue: cannot read a paged message; dropping it", "queue", q.name,
					"id", d.ID, "err", err)
				if !d.Settled {
					q.propose(&Command{Type: CmdDiscard, Tags: []Tag{d.Tag()}}, nil)
				}
				targets[i] = nil
				d.Settled = true
				continue
			}
			d.Msg = m
			if d.Settled {
				read = append(read, d.ID)
			}
		}
		for i, d := range out {
			if cc := targets[i]; cc == nil || d.Msg == nil || !cc.c.Deliver(q, d) {
				if !d.Settled {
					back = append(back, d.Tag()) // the consumer went away meanwhile
				}
			}
		}
		if len(back) > 0 {
			q.propose(&Command{Type: CmdReturn, Tags: back}, nil)
		}
		q.forgetBodies(read)
		q.mu.Lock()
		for i := range out {
			if cc := targets[i]; cc != nil {
				cc.handed++
				if d := &out[i]; !d.Settled && !slices.Contains(back, d.Tag()) {
					if cc.out == nil {
						cc.out = make(map[uint64]uint32)
					}
					cc.out[d.ID] = d.DeliveryCount
				}
			}
			out[i], targets[i] = Delivery{}, nil
		}
		q.mu.Unlock()
		q.grantCredit()
		q.handOverDeadLetters()
	}
}

func (q *Quorum) dlxGenNow() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dlxGen
}

// grantCredit raises the credit of local consumers that used half their window, if their
// connection has room now (otherwise the connection kicks the queue once it has).
func (q *Quorum) grantCredit() {
	type grant struct {
		id    ConsumerID
		cc    *quorumConsumer
		total uint64
	}
	var grants []grant
	q.mu.Lock()
	for id, cc := range q.consumers {
		if !cc.pending && !cc.timedOut && cc.granted < cc.handed+cc.window/2 {
			grants = append(grants, grant{id, cc, cc.handed + cc.window})
		}
	}
	q.mu.Unlock()
	for _, g := range grants {
		if !g.cc.c.HasRoom(q) {
			continue
		}
		q.mu.Lock()
		g.cc.granted = g.total
		q.mu.Unlock()
		q.propose(&Command{Type: CmdCredit, Consumer: g.id, Credit: g.total}, func(err error) {
			if err != nil {
				q.mu.Lock()
				if g.cc.granted == g.total {
					g.cc.granted = 0 // grant again at the next wake-up (absolute: harmless)
				}
				q.mu.Unlock()
				q.Kick()
			}
		})
	}
}

// handOverDeadLetters hands the recorded dead letters to the hook while this node leads; once the
// hook reports that their targets have them, it proposes their removal. Records whose hand-over
// failed are handed over again after dlxRetry.
func (q *Quorum) handOverDeadLetters() {
	if q.hooks == nil || !q.rep.IsLeader() {
		return
	}
	for {
		q.mu.Lock()
		if q.closed || (!q.dlxRetryAt.IsZero() && time.Now().Before(q.dlxRetryAt)) || len(q.dlxInflight) >= dlxMaxInflight {
			q.mu.Unlock()
			return
		}
		q.dlxRetryAt = time.Time{}
		batch := q.s.pendingDeadLetters(nil, min(dlxBatch, dlxMaxInflight-len(q.dlxInflight)),
			func(seq uint64) bool { return q.dlxInflight[seq] })
		if len(batch) == 0 {
			q.mu.Unlock()
			return
		}
		if q.dlxInflight == nil {
			q.dlxInflight = make(map[uint64]bool)
		}
		seqs := make([]uint64, len(batch))
		for i, d := range batch {
			seqs[i] = d.Key.Seq
			q.dlxInflight[d.Key.Seq] = true
		}
		gen := q.dlxGen
		q.mu.Unlock()
		for i := range batch {
			if d := &batch[i]; d.Msg == nil && d.flags&flagPaged != 0 {
				m, err := q.loadBody(d.ID)
				if err != nil {
					q.log.Error("replicated queue: cannot read a paged dead letter", "queue", q.name, "id", d.ID, "err", err)
					m = &Message{}
				}
				d.Msg = m
			}
		}
		q.hooks.DeadLetter(q, batch, func(err error) { q.deadLettered(gen, seqs, err) })
	}
}

// deadLettered is the hook's answer for a batch of dead letters.
func (q *Quorum) deadLettered(gen uint64, seqs []uint64, err error) {
	release := func() {
		q.mu.Lock()
		if q.dlxGen == gen {
			for _, s := range seqs {
				delete(q.dlxInflight, s)
			}
		}
		q.mu.Unlock()
	}
	if err != nil {
		q.log.Warn("dead letters not taken by their targets; handing them over again later", "queue", q.name,
			"messages", len(seqs), "err", err)
		q.mu.Lock()
		if q.dlxGen == gen {
			q.dlxRetryAt = time.Now().Add(q.dlxRetry)
		}
		q.mu.Unlock()
		release()
		q.Kick()
		return
	}
	q.propose(&Command{Type: CmdDeadLettered, Seqs: seqs}, func(perr error) {
		// Applied: the records are gone. Not applied: hand them over again later (the targets
		// drop what they already have).
		if perr != nil {
			q.mu.Lock()
			if q.dlxGen == gen {
				q.dlxRetryAt = time.Now().Add(q.dlxRetry)
			}
			q.mu.Unlock()
		}
		release()
		if perr != nil {
			q.Kick()
		}
	})
}

// Compile-time checks.
var (
	_ Queue = (*Quorum)(nil)
	_ Type  = QuorumType{}
)

// Reconfigure changes the limits a policy sets while the queue runs (core.Reconfigurer). The
// limits are replicated state: the change goes through the queue's log, so every replica trims
// at the same point (each replica's node proposes it; applying it twice changes nothing). The
// consumer timeout is this node's own.
func (q *Quorum) Reconfigure(cfg OpenConfig) error {
	q.mu.Lock()
	closed := q.closed
	q.consumerTimeout = cfg.ConsumerTimeout
	q.exp.ttl = cfg.Expires
	q.mu.Unlock()
	if closed {
		return ErrGone
	}
	q.propose(&Command{Type: CmdConfigure, Limits: cfg.Lifecycle}, nil)
	q.Kick()
	return nil
}
