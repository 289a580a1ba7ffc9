package queue

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"warren/storage"
)

// PrefixTransient is the storage keyspace of transient messages paged out of long queues. Nothing in
// it survives a restart: a classic queue clears its own range when it is reopened.
const PrefixTransient byte = 0x04

// Flags a classic queue puts on machine entries: where a message's record lives.
const (
	flagStored uint8 = 1 << iota // persistent message of a durable queue, under storage.PrefixMessage
	flagPaged                    // transient message paged out, under PrefixTransient
	flagMeta                     // a stored message that also has a side record (see metaSuffix)
)

// metaSuffix marks, under storage.PrefixQueueState, the small side record that keeps a stored
// message's deadline, priority and delivery count across restarts (keys only are scanned at boot).
const metaSuffix = 'm'

// DefaultPageWindow is how many ready messages a queue keeps with their bodies in memory; messages
// enqueued beyond it (or beyond pageWindowBytes of bodies) keep only an index entry and are read back
// from disk when delivered. Publisher flow control (flowHigh) starts well before, so a queue whose
// consumers keep up never touches the disk for transient messages.
const DefaultPageWindow = 4096

// pageWindowBytes bounds the bodies a queue keeps in memory.
const pageWindowBytes = 8 << 20

// ClassicType opens classic queues. In a cluster the core may serve a durable classic queue as a
// replicated queue (one voter, classic semantics): it then passes a *QuorumConfig with Classic set
// as OpenConfig.Extra, and Open returns a *Quorum.
type ClassicType struct{}

// Kind implements Type.
func (ClassicType) Kind() string { return "classic" }

// Open implements Type: see OpenClassic (or OpenQuorum for a replicated classic queue).
func (ClassicType) Open(cfg OpenConfig) (Queue, error) {
	if qc, ok := cfg.Extra.(*QuorumConfig); ok {
		c := *qc
		c.Classic = true
		return OpenQuorum(cfg, c)
	}
	return OpenClassic(cfg)
}

// ClassicConfig is the optional OpenConfig.Extra of a classic queue.
type ClassicConfig struct {
	// PageWindow overrides DefaultPageWindow.
	PageWindow int
}

// Classic is a classic queue: a State behind a mutex, plus one dispatcher goroutine that hands
// ready messages to consumers with room and runs the timers (TTL, consumer timeout, x-expires).
// Publishing, settling and basic.get run on the caller's goroutine.
//
// Persistent messages of durable queues are written through the storage group committer, as are
// the bodies of long queues beyond the page window; each write is submitted under the queue's
// lock, before the message becomes visible, so a later ack's delete can never overtake it.
//
// Lock order: dmu (the delivery lock, only try-locked outside the dispatcher) -> mu -> pmu, and a
// consumer's Reserve runs under mu. No lock is held while a consumer's Deliver or Cancelled, a Done
// or a hook runs.
type Classic struct {
	name, vhost                    string
	id                             uint64
	durable, exclusive, autoDelete bool
	db                             *storage.DB
	log                            *slog.Logger
	hooks                          Hooks
	pageWindow                     int
	expires, consumerTimeout       int64

	mu              sync.Mutex
	s               *State
	consumers       map[ConsumerID]Consumer
	hadConsumers    bool
	closed, deleted bool
	lastUsed        int64 // Unix ms, for x-expires
	expiredReported bool
	timeoutFn       func(ConsumerID) int64
	flow            flowGate

	kick chan struct{}
	quit chan struct{}
	done chan struct{}

	// dmu is held while ready messages are checked out and handed to consumers, by the dispatcher
	// or by a publisher delivering inline, so that each consumer gets them in queue order. dcmd
	// (the checkout command, never changed), dfx and targets are the buffers of that work.
	dmu     sync.Mutex
	dcmd    Command
	dfx     Effects
	targets []Consumer

	// pcmd, scmd and fx are the publish and settle commands and their effects, reused under mu
	// (hot paths allocate nothing); what must run after the lock is released is copied out, which
	// only dead letters and stored messages need.
	pcmd, scmd Command
	fx         Effects

	// pending holds bodies of paged messages whose record is not yet committed.
	pmu     sync.Mutex
	pending map[uint64]*Message
}

// OpenClassic creates a classic queue and starts its dispatcher; with cfg.Recovered it first
// recovers the queue's stored messages (keys only: bodies stay on disk until delivered) and clears
// its paged transient messages. Close or Delete stops it.
func OpenClassic(cfg OpenConfig) (*Classic, error) {
	q := &Classic{
		name: cfg.Name, vhost: cfg.VHost, id: cfg.ID,
		durable: cfg.Durable, exclusive: cfg.Exclusive, autoDelete: cfg.AutoDelete,
		db: cfg.DB, log: loggerOr(cfg.Logger), hooks: cfg.Hooks, pageWindow: DefaultPageWindow,
		expires: cfg.Expires, consumerTimeout: cfg.ConsumerTimeout,
		s:         NewState(StateConfig{Config: cfg.Lifecycle, Source: cfg.ID}),
		consumers: make(map[ConsumerID]Consumer),
		kick:      make(chan struct{}, 1),
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
		lastUsed:  nowMs(),
	}
	if x, ok := cfg.Extra.(*ClassicConfig); ok && x.PageWindow > 0 {
		q.pageWindow = x.PageWindow
	}
	q.s.reserve = q.reserve
	q.dcmd = Command{Type: CmdCheckout, Max: checkoutBatch}
	q.pcmd = Command{Type: CmdEnqueue}
	q.timeoutFn = func(ConsumerID) int64 { return q.consumerTimeout }
	if cfg.Recovered && q.db != nil {
		if err := q.recover(); err != nil {
			return nil, err
		}
	}
	go q.dispatch()
	return q, nil
}

// Name implements Queue.
func (q *Classic) Name() string { return q.name }

// Kind implements Queue.
func (q *Classic) Kind() string { return "classic" }

func (q *Classic) recordKey(flags uint8, id uint64) []byte {
	if flags&flagStored != 0 {
		return storage.MessageKey(q.id, id)
	}
	return binary.BigEndian.AppendUint64(storage.U64Key(PrefixTransient, q.id), id)
}

func (q *Classic) metaKey(id uint64) []byte {
	return binary.BigEndian.AppendUint64(storage.QueueStateKey(q.id, []byte{metaSuffix}), id)
}

// metaPrefix is the prefix of a queue's per-message side records.
func metaPrefix(queueID uint64) []byte { return storage.QueueStateKey(queueID, []byte{metaSuffix}) }

// encodeMeta is the side record: deadline (Unix ms), priority, delivery count.
func encodeMeta(deadline int64, priority uint8, count uint32) []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 13), uint64(deadline))
	b = append(b, priority)
	return binary.BigEndian.AppendUint32(b, count)
}

// restoredMeta is what a side record holds for a recovered message.
type restoredMeta struct {
	deadline int64
	priority uint8
	count    uint32
}

// parseMeta decodes a side record's key and value.
func parseMeta(key, val []byte) (id uint64, meta restoredMeta, ok bool) {
	if len(key) < 8 || len(val) < 13 {
		return 0, meta, false
	}
	id = binary.BigEndian.Uint64(key[len(key)-8:])
	meta.deadline = int64(binary.BigEndian.Uint64(val))
	meta.priority = val[8]
	meta.count = binary.BigEndian.Uint32(val[9:])
	return id, meta, true
}

// recover rebuilds the queue from its stored records (at Open, before the dispatcher starts).
func (q *Classic) recover() error {
	metas := make(map[uint64]restoredMeta)
	err := q.db.Scan(metaPrefix(q.id), false, func(key, val []byte) error {
		if id, m, ok := parseMeta(key, val); ok {
			metas[id] = m
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("recover queue '%s': read message side records: %w", q.name, err)
	}
	var fx Effects
	cmd := Command{Type: CmdRecover}
	n := 0
	err = q.db.Scan(storage.MessagePrefix(q.id), true, func(key, _ []byte) error {
		qid, mid, ok := storage.ParseMessageKey(key)
		if !ok || qid != q.id {
			return nil
		}
		meta, hasMeta := metas[mid]
		cmd.ID, cmd.Flags = mid, flagStored
		if hasMeta {
			cmd.Flags |= flagMeta
		}
		cmd.Count, cmd.ExpiresAt, cmd.MsgPriority = meta.count, meta.deadline, meta.priority
		q.s.Apply(&cmd, 0, &fx)
		n++
		return nil
	})
	if err != nil {
		return fmt.Errorf("recover queue '%s': read messages: %w", q.name, err)
	}
	// Paged-out transient messages never survive a restart.
	if _, err := q.db.DeleteRange(storage.U64Key(PrefixTransient, q.id)); err != nil {
		return fmt.Errorf("recover queue '%s': delete transient pages: %w", q.name, err)
	}
	if n > 0 {
		q.log.Debug("recovered queue messages", "queue", q.name, "messages", n)
	}
	return nil
}

// load fills in the body of a paged-out message.
func (q *Classic) load(id uint64, flags uint8) (*Message, bool) {
	q.pmu.Lock()
	m := q.pending[id]
	q.pmu.Unlock()
	if m != nil {
		return m, true
	}
	if q.db == nil || flags == 0 {
		return nil, false
	}
	rec, err := q.db.Get(q.recordKey(flags, id))
	if err == nil {
		m, _, err = decodeRecord(rec)
		if err == nil {
			return m, true
		}
	}
	q.log.Error("cannot read a stored message; dropping it", "queue", q.name, "id", id, "err", err)
	return nil, false
}

// forget deletes the stored records of messages that left the queue.
func (q *Classic) forget(list []stored) {
	if q.db == nil || len(list) == 0 {
		return
	}
	var b storage.Batch
	for _, st := range list {
		b.Delete(q.recordKey(st.flags, st.id))
		if st.flags&flagMeta != 0 {
			b.Delete(q.metaKey(st.id))
		}
	}
	q.db.Commit(&b, nil)
}

// rewriteLocked submits the side records a command asked for (q.mu held, so that the write is
// queued before any later delete of the message's records).
func (q *Classic) rewriteLocked(fx *Effects) {
	if q.db == nil || len(fx.rewrite) == 0 {
		return
	}
	var b storage.Batch
	for _, r := range fx.rewrite {
		b.Set(q.metaKey(r.id), encodeMeta(r.deadline, r.priority, r.count))
	}
	b.UseReserve() // delivery counts of requeued messages: requeues must work on a nearly full disk
	q.db.Commit(&b, nil)
}

// runEffects carries out what a command left to do once the lock is released: dead letters first
// (their bodies are loaded from the records), then the deletes of the records of messages that
// left. The hook's republishing is submitted to storage before the deletes, so a crash in between
// can duplicate a dead-lettered message but never lose it.
func (q *Classic) runEffects(fx *Effects) { q.runLeft(fx.Dead, fx.forget) }

func (q *Classic) runLeft(dead []Dead, forget []stored) {
	if len(dead) > 0 {
		q.handleDead(dead)
	}
	q.forget(forget)
}

// leftOver copies out of the shared q.fx (q.mu held) what runLeft needs after the lock is
// released: usually nothing.
func (q *Classic) leftOver() (dead []Dead, forget []stored) {
	if len(q.fx.Dead) > 0 {
		dead = append([]Dead(nil), q.fx.Dead...)
	}
	if len(q.fx.forget) > 0 {
		forget = append([]stored(nil), q.fx.forget...)
	}
	return dead, forget
}

// handleDead loads the bodies of dead messages and hands them to the dead-letter hook.
func (q *Classic) handleDead(dead []Dead) {
	live := make([]Dead, 0, len(dead))
	for _, d := range dead {
		if d.Msg == nil {
			m, ok := q.load(d.ID, d.flags)
			if !ok {
				continue
			}
			d.Msg = m
		}
		live = append(live, d)
	}
	if q.hooks != nil && len(live) > 0 {
		q.hooks.DeadLetter(q, live, nil)
	}
}

// reserve runs under q.mu, from the checkout.
func (q *Classic) reserve(id ConsumerID) bool {
	c, ok := q.consumers[id]
	if !ok {
		return false
	}
	return c.Reserve(q)
}

// Kick implements Queue: it wakes the dispatcher. It never blocks.
func (q *Classic) Kick() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// nextDeadline returns when the dispatcher must wake up by itself (q.mu held).
func (q *Classic) nextDeadline() (int64, bool) {
	d, ok := q.s.m.nextExpiry()
	if q.consumerTimeout > 0 && len(q.consumers) > 0 {
		t, tok := q.s.m.nextTimeout(q.timeoutFn)
		if !tok {
			// No delivery is outstanding; one made from now on times out after this at the
			// earliest. Waking then lets Publish deliver inline without telling the dispatcher.
			t = nowMs() + q.consumerTimeout
		}
		if !ok || t < d {
			d, ok = t, true
		}
	}
	if q.expires > 0 && len(q.consumers) == 0 && !q.expiredReported {
		if t := q.lastUsed + q.expires; !ok || t < d {
			d, ok = t, true
		}
	}
	return d, ok
}

func (q *Classic) dispatch() {
	defer close(q.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		q.mu.Lock()
		deadline, timed := q.nextDeadline()
		q.mu.Unlock()
		var wake <-chan time.Time
		if timed {
			timer.Reset(max(time.Until(time.UnixMilli(deadline)), time.Millisecond))
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
		if !q.tick() {
			return
		}
		q.dmu.Lock()
		closed := q.deliverReady(true)
		q.dmu.Unlock()
		if closed {
			return
		}
	}
}

// deliverReady checks out ready messages for consumers with room and hands them over: one batch,
// or with all until no more can go. It reports true if the queue is closed. q.dmu is held.
func (q *Classic) deliverReady(all bool) (closed bool) {
	fx := &q.dfx
	for {
		now := nowMs()
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return true
		}
		fx.Reset()
		q.s.Apply(&q.dcmd, now, fx)
		q.flow.release(q.s.m.ready, len(q.consumers), q.closed)
		ds := fx.Deliveries
		q.targets = q.targets[:0]
		for i := range ds {
			q.targets = append(q.targets, q.consumers[ds[i].Consumer])
		}
		targets := q.targets
		q.mu.Unlock()
		if len(fx.Dead) > 0 {
			q.handleDead(fx.Dead)
		}
		if len(ds) == 0 {
			q.forget(fx.forget)
			return false
		}
		var back, lost []Tag
		for i := range ds {
			d := &ds[i]
			if d.Msg == nil {
				m, ok := q.load(d.ID, d.flags)
				if !ok {
					if !d.Settled {
						lost = append(lost, d.Tag())
					}
					ds[i], targets[i] = Delivery{}, nil
					continue
				}
				d.Msg = m
			}
			if !targets[i].Deliver(q, *d) && !d.Settled {
				back = append(back, d.Tag()) // the consumer is gone: take the delivery back
			}
			ds[i], targets[i] = Delivery{}, nil
		}
		q.forget(fx.forget)
		if len(lost) > 0 {
			q.apply(CmdDiscard, lost) // unreadable: dropped (its records go)
		}
		if len(back) > 0 {
			q.apply(CmdReturn, back)
		}
		if len(ds) < checkoutBatch || !all {
			return false
		}
	}
}

// tick runs the timers: message expiry, consumer timeouts and x-expires. It reports false once the
// queue is closed.
func (q *Classic) tick() bool {
	now := nowMs()
	var fx Effects
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false
	}
	cmd := Command{Type: CmdTick}
	q.s.Apply(&cmd, now, &fx)
	var timedOut []Consumer
	if q.consumerTimeout > 0 && len(q.consumers) > 0 {
		for _, id := range q.s.m.timedOut(now, q.timeoutFn) {
			if c := q.consumers[id]; c != nil {
				// It gets no more deliveries; its unacked ones stay with it until the session
				// settles or returns them, and it stays counted until the session cancels it.
				cmd = Command{Type: CmdCancel, Consumer: id}
				q.s.Apply(&cmd, now, &fx)
				timedOut = append(timedOut, c)
			}
		}
	}
	expired := false
	if q.expires > 0 && len(q.consumers) == 0 && !q.expiredReported && now >= q.lastUsed+q.expires {
		q.expiredReported = true
		expired = true
	}
	q.mu.Unlock()
	q.runEffects(&fx)
	for _, c := range timedOut {
		c.Cancelled(q, CancelTimeout)
	}
	if expired && q.hooks != nil {
		q.hooks.Expired(q)
	}
	return true
}

// Publish implements Queue. A persistent message of a durable queue, or one paged out of a long
// queue, is written before it becomes visible and done runs from the write's commit; otherwise
// done runs before Publish returns. While the queue is long and has consumers, Publish waits a
// little for them (flow control).
func (q *Classic) Publish(msg *Message, done Done) PublishStatus {
	now := nowMs()
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		finish(done, ErrGone)
		return Gone
	}
	var flags uint8
	offload := false
	if q.db != nil {
		if q.durable && msg.Persistent {
			flags = flagStored
		}
		if q.s.m.ready >= q.pageWindow || q.s.m.readyBytes >= pageWindowBytes {
			if flags == 0 {
				flags = flagPaged
			}
			offload = true
		}
	}
	var deadline int64
	if flags&flagStored != 0 {
		if deadline = q.s.m.deadlineFor(msg.ExpiresAt, now); deadline != 0 || msg.Priority != 0 {
			flags |= flagMeta
		}
	}
	cmd, fx := &q.pcmd, &q.fx
	cmd.Msg, cmd.Flags, cmd.Offload = msg, flags, offload
	fx.Reset()
	q.s.Apply(cmd, now, fx)
	cmd.Msg = nil
	dead, forget := q.leftOver()
	if r := &fx.Reply; r.Status == Rejected || r.Duplicate {
		dup := r.Duplicate
		q.mu.Unlock()
		q.runLeft(dead, forget)
		if dup {
			finish(done, nil) // a dead letter this queue already took
			return Accepted
		}
		finish(done, ErrRejected)
		return Rejected
	}
	id := fx.Reply.ID
	async := flags != 0
	if async {
		q.write(msg, id, flags, deadline, offload, done)
	}
	cfg := &q.s.m.cfg
	// A message with a deadline may need the dispatcher's timer even with no consumer around.
	wake := len(q.consumers) > 0 || len(dead) > 0 || msg.ExpiresAt != 0 || cfg.MessageTTL >= 0
	// A message that is alone in the queue, with no timer to set, goes to a consumer from here
	// (when no one else is delivering): handing it to the dispatcher goroutine would cost a
	// thread wake-up, a good part of an idle broker's delivery latency.
	inline := wake && len(dead) == 0 && msg.ExpiresAt == 0 && cfg.MessageTTL < 0 && q.s.m.ready == 1
	throttle := q.flow.throttle(q.s.m.ready, len(q.consumers))
	q.mu.Unlock()
	q.runLeft(dead, forget)
	if !async {
		finish(done, nil)
	}
	switch {
	case inline && q.dmu.TryLock():
		q.deliverReady(false)
		q.dmu.Unlock()
	case wake:
		q.Kick()
	}
	if throttle != nil {
		q.flow.wait(throttle)
	}
	return Accepted
}

// write submits a new message's records (q.mu held); done runs from the commit.
func (q *Classic) write(msg *Message, id uint64, flags uint8, deadline int64, offload bool, done Done) {
	var b storage.Batch
	b.Set(q.recordKey(flags, id), encodeRecord(nil, msg, 0))
	if flags&flagMeta != 0 {
		b.Set(q.metaKey(id), encodeMeta(deadline, msg.Priority, 0))
	}
	if offload {
		q.pmu.Lock()
		if q.pending == nil {
			q.pending = make(map[uint64]*Message)
		}
		q.pending[id] = msg
		q.pmu.Unlock()
	}
	q.db.Commit(&b, func(err error) {
		if offload {
			q.pmu.Lock()
			delete(q.pending, id)
			q.pmu.Unlock()
		}
		finish(done, err)
	})
}

// Consume implements Queue. The global prefetch is left to the consumer's Reserve.
func (q *Classic) Consume(spec ConsumeSpec, c Consumer) error {
	var fx Effects
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrGone
	}
	cmd := Command{Type: CmdConsume, Consumer: spec.ID, Prefetch: spec.Prefetch, Priority: spec.Priority,
		NoAck: spec.NoAck, Exclusive: spec.Exclusive}
	q.s.Apply(&cmd, nowMs(), &fx)
	if fx.Reply.Refused {
		q.mu.Unlock()
		return ErrInExclusiveUse
	}
	if spec.OnAdded != nil {
		spec.OnAdded() // under the lock: no delivery can reach the consumer before it
	}
	q.consumers[spec.ID] = c
	q.hadConsumers = true
	q.mu.Unlock()
	q.Kick()
	return nil
}

// Cancel implements Queue.
func (q *Classic) Cancel(id ConsumerID) (autoDelete bool) {
	var fx Effects
	q.mu.Lock()
	defer q.Kick()
	defer q.mu.Unlock()
	if _, ok := q.consumers[id]; !ok {
		return false
	}
	delete(q.consumers, id)
	cmd := Command{Type: CmdCancel, Consumer: id}
	q.s.Apply(&cmd, nowMs(), &fx)
	if len(q.consumers) == 0 {
		q.lastUsed = nowMs()
		q.flow.release(q.s.m.ready, 0, q.closed)
	}
	return !q.closed && q.autoDelete && q.hadConsumers && len(q.consumers) == 0
}

// Touch implements Queue.
func (q *Classic) Touch() {
	q.mu.Lock()
	q.lastUsed = nowMs()
	q.mu.Unlock()
	q.Kick()
}

// settleCommands maps a SettleOp to its command.
var settleCommands = [...]CommandType{SettleAck: CmdSettle, SettleRequeue: CmdReturn, SettleDiscard: CmdDiscard}

// Settle implements Queue. A returned persistent message's new delivery count is stored, so the
// delivery limit holds across restarts.
func (q *Classic) Settle(_ ConsumerID, op SettleOp, tags []Tag) error {
	if int(op) >= len(settleCommands) {
		return fmt.Errorf("queue: unknown settle operation %d", op)
	}
	q.apply(settleCommands[op], tags)
	return nil
}

// apply runs a settlement command and its effects. Settlements take no time in a classic state
// (it is not Replicated), so the clock is not read: on the ack path that is a good part of the cost.
func (q *Classic) apply(t CommandType, tags []Tag) {
	q.mu.Lock()
	cmd, fx := &q.scmd, &q.fx
	cmd.Type, cmd.Tags = t, tags
	fx.Reset()
	q.s.Apply(cmd, 0, fx)
	cmd.Tags = nil
	q.rewriteLocked(fx)
	dead, forget := q.leftOver()
	// Freed prefetch room matters only if messages wait; otherwise the dispatcher's wake-up
	// would be wasted (its timers only move later when deliveries are settled).
	kick := q.s.m.ready > 0
	q.mu.Unlock()
	q.runLeft(dead, forget)
	if kick {
		q.Kick()
	}
}

// Get implements Queue (basic.get).
func (q *Classic) Get(noAck bool) (Delivery, int, bool, error) {
	for {
		var fx Effects
		now := nowMs()
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return Delivery{}, 0, false, ErrGone
		}
		q.lastUsed = now
		cmd := Command{Type: CmdGet, NoAck: noAck}
		q.s.Apply(&cmd, now, &fx)
		ready := q.s.m.ready
		q.mu.Unlock()
		d := fx.Reply.Delivery
		loaded := true
		if fx.Reply.OK && d.Msg == nil {
			d.Msg, loaded = q.load(d.ID, d.flags)
		}
		q.runEffects(&fx) // after the load: a no-ack get's record goes
		if !fx.Reply.OK {
			return Delivery{}, ready, false, nil
		}
		if loaded {
			return d, ready, true, nil
		}
		if !d.Settled {
			q.apply(CmdDiscard, []Tag{d.Tag()}) // unreadable: dropped
		}
	}
}

// Purge implements Queue.
func (q *Classic) Purge() (int, error) {
	var fx Effects
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return 0, ErrGone
	}
	cmd := Command{Type: CmdPurge}
	q.s.Apply(&cmd, nowMs(), &fx)
	q.flow.release(q.s.m.ready, len(q.consumers), q.closed)
	q.mu.Unlock()
	q.runEffects(&fx)
	return fx.Reply.Count, nil
}

// Stats implements Queue.
func (q *Classic) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return Stats{Ready: q.s.m.ready, Unacked: len(q.s.m.unacked), Consumers: len(q.consumers),
		ReadyBytes: int64(q.s.m.readyBytes)}
}

// stop marks the queue closed and stops the dispatcher; it returns the consumers that were
// attached and the ready count, or ok=false if it was already stopped.
func (q *Classic) stop() (consumers map[ConsumerID]Consumer, ready int, ok bool) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil, 0, false
	}
	q.closed = true
	q.flow.release(0, 0, true)
	consumers = q.consumers
	q.consumers = map[ConsumerID]Consumer{}
	ready = q.s.m.ready
	q.mu.Unlock()
	close(q.quit)
	<-q.done
	return consumers, ready, true
}

// Close implements Queue: it stops the dispatcher and releases throttled publishers; stored
// messages stay for the next Open.
func (q *Classic) Close() { q.stop() }

// Delete implements Queue: it stops the queue, tells its consumers (CancelDeleted) and deletes
// its stored records.
func (q *Classic) Delete() int {
	consumers, ready, _ := q.stop()
	q.mu.Lock()
	first := !q.deleted
	q.deleted = true
	q.mu.Unlock()
	if !first {
		return 0
	}
	ids := make([]ConsumerID, 0, len(consumers))
	for id := range consumers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		consumers[id].Cancelled(q, CancelDeleted)
	}
	if q.db != nil {
		for _, p := range [][]byte{storage.MessagePrefix(q.id), storage.U64Key(PrefixTransient, q.id), metaPrefix(q.id)} {
			if _, err := q.db.DeleteRange(p); err != nil {
				q.log.Error("cannot delete the records of a deleted queue", "queue", q.name, "err", err)
			}
		}
	}
	return ready
}

// Compile-time checks.
var (
	_ Queue = (*Classic)(nil)
	_ Type  = ClassicType{}
)

// Reconfigure changes the limits a policy sets while the queue runs (core.Reconfigurer): the
// length limits, overflow and delivery limit at once (drop-head trims the head now), a message
// TTL for the messages published from now on, x-expires and the consumer timeout.
func (q *Classic) Reconfigure(cfg OpenConfig) error {
	var fx Effects
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrGone
	}
	cmd := Command{Type: CmdConfigure, Limits: cfg.Lifecycle}
	q.s.Apply(&cmd, nowMs(), &fx)
	q.expires, q.consumerTimeout = cfg.Expires, cfg.ConsumerTimeout
	q.flow.release(q.s.m.ready, len(q.consumers), q.closed)
	q.mu.Unlock()
	q.runEffects(&fx)
	q.Kick() // timers may have moved
	return nil
}
