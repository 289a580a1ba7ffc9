package queue

import (
	"encoding/binary"
	"log/slog"
	"sync"
	"time"

	"warren/storage"
)

// PrefixTransient is the storage keyspace of transient messages paged out of long queues. Nothing in
// it survives a restart: the server clears it at boot.
const PrefixTransient byte = 0x04

// Flags the queue puts on machine entries (Delivery.Flags): where a message's record lives.
const (
	flagStored uint8 = 1 << iota // persistent message of a durable queue, under storage.PrefixMessage
	flagPaged                    // transient message paged out, under PrefixTransient
	flagMeta                     // a stored message that also has a side record (see metaSuffix)
)

// metaSuffix marks, under storage.PrefixQueueState, the small side record that keeps a stored
// message's deadline, priority and delivery count across restarts (keys only are scanned at boot).
const metaSuffix = 'm'

// Flow control between publishers and a queue's consumers: while a queue with consumers has more
// than flowHigh ready messages, each publish to it waits (at most flowMaxWait) until the consumers
// have brought it under flowLow. Like RabbitMQ's credit flow, this keeps a fast publisher from
// starving the consumers of CPU and from growing the queue without bound; with no consumers the
// queue simply grows (and pages to disk).
const (
	flowHigh    = 2048
	flowLow     = 1024
	flowMaxWait = 50 * time.Millisecond
)

// DefaultPageWindow is how many ready messages a queue keeps with their bodies in memory; messages
// enqueued beyond it (or beyond pageWindowBytes of bodies) keep only an index entry and are read back
// from disk when delivered. Publisher flow control (flowHigh) starts well before, so a queue whose
// consumers keep up never touches the disk for transient messages.
const DefaultPageWindow = 4096

// pageWindowBytes bounds the bodies a queue keeps in memory.
const pageWindowBytes = 8 << 20

// Consumer receives deliveries from a Queue. The server implements it for basic.consume consumers.
type Consumer interface {
	// Reserve is called with the queue lock held, once before each message is assigned to this consumer.
	// It is a try-acquire: true commits the assignment, false means the consumer cannot take anything now
	// (its connection's outbound buffer is full, or its channel's global prefetch is used up). It must
	// not block and must not call back into the queue.
	Reserve(q *Queue) bool
	// Deliver hands a checked-out message to the consumer. It is called by the queue's dispatcher
	// goroutine with no queue lock held, in checkout order. It must not block on network I/O.
	Deliver(q *Queue, d Delivery)
}

// Hooks are the server's side of a queue's lifecycle. They are called with no queue lock held, from
// the dispatcher or from whichever goroutine caused the event; they must not wait for the queue's
// dispatcher to stop (queue deletion has to happen elsewhere).
type Hooks interface {
	// DeadLetter receives messages that left the queue for a dead-lettering reason, bodies loaded.
	DeadLetter(q *Queue, dead []Dead)
	// ConsumerTimedOut reports a consumer holding an unacked message longer than its timeout.
	ConsumerTimedOut(q *Queue, c Consumer)
	// Expired reports a queue unused for longer than its x-expires.
	Expired(q *Queue)
}

// Options describe a queue as declared.
type Options struct {
	Name       string
	Durable    bool
	Exclusive  bool
	AutoDelete bool
	// ID names the queue in storage keys; unique per node, never reused.
	ID uint64
	// DB stores persistent messages of durable queues and pages of long queues; nil keeps
	// everything in memory.
	DB *storage.DB
	// PageWindow overrides DefaultPageWindow.
	PageWindow int
	Logger     *slog.Logger
	// Config is the lifecycle configuration; the zero value means DefaultConfig().
	Config *Config
	// Expires is x-expires in ms: the queue is reported Expired after that long unused (no
	// consumers, no basic.get, no redeclaration); <= 0 = never.
	Expires int64
	// ConsumerTimeout is how long (ms) a consumer may hold an unacked message; <= 0 = never.
	ConsumerTimeout int64
	Hooks           Hooks
}

// Queue is a classic queue: the pure Machine behind a mutex, plus one dispatcher goroutine that hands
// ready messages to consumers with room and runs the timers (TTL, consumer timeout, x-expires).
// Publishing runs on the publisher's goroutine.
type Queue struct {
	Options

	mu        sync.Mutex
	m         *Machine
	consumers map[ConsumerID]Consumer
	// exclusiveConsumer is set while a basic.consume exclusive=true consumer holds the queue.
	exclusiveConsumer ConsumerID
	hadConsumers      bool
	closed            bool
	lastUsed          int64 // Unix ms, for x-expires
	expiredReported   bool
	reserveFn         func(ConsumerID) bool
	timeoutFn         func(ConsumerID) int64
	flow              chan struct{} // closed when the queue drains under flowLow; nil when not throttling

	kick chan struct{}
	quit chan struct{}
	done chan struct{}

	// dmu is held while ready messages are checked out and handed to consumers, by the dispatcher
	// or by a publisher delivering inline, so that each consumer gets them in queue order. ds and
	// targets are the buffers of that work.
	dmu     sync.Mutex
	ds      []Delivery
	targets []Consumer

	// pending holds bodies of paged messages whose record is not yet committed.
	pmu     sync.Mutex
	pending map[uint64]*Message

	r *replState // set for a replicated (quorum) queue: see replicated.go
}

// New creates a queue and starts its dispatcher. Close stops it.
func New(opts Options) *Queue {
	q := newQueue(opts)
	q.reserveFn = q.reserve
	q.timeoutFn = func(ConsumerID) int64 { return q.ConsumerTimeout }
	if q.PageWindow <= 0 {
		q.PageWindow = DefaultPageWindow
	}
	go q.dispatch()
	return q
}

// newQueue builds a queue without starting its dispatcher.
func newQueue(opts Options) *Queue {
	cfg := DefaultConfig()
	if opts.Config != nil {
		cfg = *opts.Config
	}
	q := &Queue{
		Options:   opts,
		m:         NewMachineConfig(cfg),
		consumers: make(map[ConsumerID]Consumer),
		kick:      make(chan struct{}, 1),
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
		lastUsed:  nowMs(),
	}
	if q.Logger == nil {
		q.Logger = slog.Default()
	}
	return q
}

func nowMs() int64 { return time.Now().UnixMilli() }

func (q *Queue) recordKey(flags uint8, id uint64) []byte {
	if flags&flagStored != 0 {
		return storage.MessageKey(q.ID, id)
	}
	return binary.BigEndian.AppendUint64(storage.U64Key(PrefixTransient, q.ID), id)
}

func (q *Queue) metaKey(id uint64) []byte {
	return binary.BigEndian.AppendUint64(storage.QueueStateKey(q.ID, []byte{metaSuffix}), id)
}

// MetaPrefix is the prefix of a queue's per-message side records (see RestoreMeta).
func MetaPrefix(queueID uint64) []byte { return storage.QueueStateKey(queueID, []byte{metaSuffix}) }

// encodeMeta is the side record: deadline (Unix ms), priority, delivery count.
func encodeMeta(deadline int64, priority uint8, count uint32) []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(deadline))
	b = append(b, priority)
	return binary.BigEndian.AppendUint32(b, count)
}

// RestoredMeta is what a side record holds for a recovered message.
type RestoredMeta struct {
	Deadline int64
	Priority uint8
	Count    uint32
}

// ParseMeta decodes a side record's key and value.
func ParseMeta(key, val []byte) (id uint64, meta RestoredMeta, ok bool) {
	if len(key) < 8 || len(val) < 13 {
		return 0, meta, false
	}
	id = binary.BigEndian.Uint64(key[len(key)-8:])
	meta.Deadline = int64(binary.BigEndian.Uint64(val))
	meta.Priority = val[8]
	meta.Count = binary.BigEndian.Uint32(val[9:])
	return id, meta, true
}

// Restore adds a message recovered from storage at boot (its body stays on disk until delivered);
// hasMeta says whether it has a side record.
func (q *Queue) Restore(id uint64, meta RestoredMeta, hasMeta bool) {
	flags := flagStored
	if hasMeta {
		flags |= flagMeta
	}
	q.mu.Lock()
	q.m.RestoreAt(id, nil, 0, flags, meta.Count, meta.Deadline, meta.Priority)
	q.mu.Unlock()
	if meta.Deadline != 0 {
		q.Kick() // the dispatcher's timer must learn about the deadline
	}
}

// load fills in the body of a paged-out message.
func (q *Queue) load(id uint64, flags uint8) (*Message, uint32, bool) {
	q.pmu.Lock()
	m := q.pending[id]
	q.pmu.Unlock()
	if m != nil {
		return m, 0, true
	}
	if q.DB == nil || flags == 0 {
		return nil, 0, false
	}
	rec, err := q.DB.Get(q.recordKey(flags, id))
	if err == nil {
		var count uint32
		m, count, err = decodeRecord(rec)
		if err == nil {
			return m, count, true
		}
	}
	q.Logger.Error("cannot read a stored message; dropping it", "queue", q.Name, "id", id, "err", err)
	return nil, 0, false
}

// forget deletes the stored records of messages that left the queue.
func (q *Queue) forget(ids []uint64, flags []uint8) {
	var b *storage.Batch
	for i, id := range ids {
		b = q.forgetInto(b, id, flags[i])
	}
	q.commitForget(b)
}

// forgetInto adds the deletes of one message's records to b (made on first need).
func (q *Queue) forgetInto(b *storage.Batch, id uint64, flags uint8) *storage.Batch {
	if q.DB == nil || flags == 0 {
		return b
	}
	if b == nil {
		b = new(storage.Batch)
	}
	b.Delete(q.recordKey(flags, id))
	if flags&flagMeta != 0 {
		b.Delete(q.metaKey(id))
	}
	return b
}

func (q *Queue) commitForget(b *storage.Batch) {
	if b != nil && b.Len() > 0 {
		q.DB.Commit(b, nil)
	}
}

// handleDead loads the bodies of dead messages, hands them to the dead-letter hook and then deletes
// their records. The hook's republishing is submitted to storage first, so a crash in between can
// duplicate a dead-lettered message but never lose it.
func (q *Queue) handleDead(dead []Dead) {
	if len(dead) == 0 {
		return
	}
	live := dead[:0]
	var ids []uint64
	var flags []uint8
	for _, d := range dead {
		if d.Msg == nil {
			m, _, ok := q.load(d.ID, d.Flags)
			if !ok {
				ids, flags = append(ids, d.ID), append(flags, d.Flags)
				continue
			}
			d.Msg = m
		}
		live = append(live, d)
		if d.ID != 0 {
			ids, flags = append(ids, d.ID), append(flags, d.Flags)
		}
	}
	if q.Hooks != nil && len(live) > 0 {
		q.Hooks.DeadLetter(q, live)
	}
	q.forget(ids, flags)
}

// reserve runs under q.mu (called from Machine.Checkout).
func (q *Queue) reserve(id ConsumerID) bool {
	c, ok := q.consumers[id]
	if !ok {
		return false
	}
	return c.Reserve(q)
}

// Kick wakes the dispatcher. It never blocks.
func (q *Queue) Kick() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

const checkoutBatch = 128

// nextDeadline returns when the dispatcher must wake up by itself (q.mu held).
func (q *Queue) nextDeadline() (int64, bool) {
	d, ok := q.m.NextExpiry()
	if q.ConsumerTimeout > 0 && len(q.consumers) > 0 {
		t, tok := q.m.NextTimeout(q.timeoutFn)
		if !tok {
			// No delivery is outstanding; one made from now on times out after this at the
			// earliest. Waking then lets Publish deliver inline without telling the dispatcher.
			t = nowMs() + q.ConsumerTimeout
		}
		if !ok || t < d {
			d, ok = t, true
		}
	}
	if q.Expires > 0 && len(q.consumers) == 0 && !q.expiredReported {
		if t := q.lastUsed + q.Expires; !ok || t < d {
			d, ok = t, true
		}
	}
	return d, ok
}

func (q *Queue) dispatch() {
	defer close(q.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		q.mu.Lock()
		deadline, timed := q.nextDeadline()
		q.mu.Unlock()
		var wake <-chan time.Time
		if timed {
			d := time.Until(time.UnixMilli(deadline))
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
func (q *Queue) deliverReady(all bool) (closed bool) {
	for {
		now := nowMs()
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return true
		}
		var dead []Dead
		q.ds, dead = q.m.CheckoutAt(q.ds[:0], checkoutBatch, q.reserveFn, now)
		q.releaseFlow()
		ds := q.ds
		q.targets = q.targets[:0]
		for i := range ds {
			q.targets = append(q.targets, q.consumers[ds[i].Consumer])
		}
		targets := q.targets
		q.mu.Unlock()
		q.handleDead(dead)
		if len(ds) == 0 {
			return false
		}
		var gone []uint64
		var goneFlags []uint8
		for i := range ds {
			d := &ds[i]
			if d.Settled && d.Flags != 0 {
				gone = append(gone, d.ID)
				goneFlags = append(goneFlags, d.Flags)
			}
			if d.Msg == nil {
				m, count, ok := q.load(d.ID, d.Flags)
				if !ok {
					if !d.Settled {
						q.mu.Lock()
						_, fl, _ := q.m.DiscardEntry(d.ID)
						q.mu.Unlock()
						q.forget([]uint64{d.ID}, []uint8{fl})
					}
					ds[i], targets[i] = Delivery{}, nil
					continue
				}
				d.Msg = m
				if count > d.DeliveryCount {
					d.DeliveryCount = count
				}
			}
			targets[i].Deliver(q, *d)
			ds[i], targets[i] = Delivery{}, nil
		}
		if len(gone) > 0 {
			q.forget(gone, goneFlags)
		}
		if len(ds) < checkoutBatch || !all {
			return false
		}
	}
}

// tick runs the timers: message expiry, consumer timeouts and x-expires. It reports false once the
// queue is closed.
func (q *Queue) tick() bool {
	now := nowMs()
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false
	}
	dead := q.m.Expire(now)
	var timedOut []Consumer
	if q.ConsumerTimeout > 0 && len(q.consumers) > 0 {
		for _, id := range q.m.TimedOut(now, q.timeoutFn) {
			if c := q.consumers[id]; c != nil {
				timedOut = append(timedOut, c)
			}
		}
	}
	expired := false
	if q.Expires > 0 && len(q.consumers) == 0 && !q.expiredReported && now >= q.lastUsed+q.Expires {
		q.expiredReported = true
		expired = true
	}
	q.mu.Unlock()
	q.handleDead(dead)
	if q.Hooks != nil {
		for _, c := range timedOut {
			q.Hooks.ConsumerTimedOut(q, c)
		}
		if expired {
			q.Hooks.Expired(q)
		}
	}
	return true
}

// PublishStatus says what became of a published message.
type PublishStatus uint8

// Publish outcomes.
const (
	Accepted PublishStatus = iota // enqueued (or dead-lettered at once by its TTL)
	Rejected                      // refused by x-overflow reject-publish(-dlx): nack the publisher
	Gone                          // the queue was deleted
)

// Publish enqueues a message. When the message has to be written to storage (persistent in a
// durable queue, or paged out of a long queue), the write is submitted before the message becomes
// visible, so a later ack's delete can never overtake it; done is then called once it is durable and
// async is true. Otherwise done is not called.
func (q *Queue) Publish(msg *Message, done func(error)) (status PublishStatus, async bool) {
	if q.r != nil {
		return q.rPublish(msg, done)
	}
	now := nowMs()
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return Gone, false
	}
	var flags uint8
	keep := msg
	if q.DB != nil {
		if q.Durable && msg.Persistent {
			flags = flagStored
		}
		if q.m.Ready() >= q.PageWindow || q.m.ReadyBytes() >= pageWindowBytes {
			if flags == 0 {
				flags = flagPaged
			}
			keep = nil
		}
	}
	var deadline int64
	if flags&flagStored != 0 {
		if deadline = q.m.DeadlineFor(msg.ExpiresAt, now); deadline != 0 || msg.Priority != 0 {
			flags |= flagMeta
		}
	}
	id, accepted, dead := q.m.PublishEntry(keep, uint32(len(msg.Body)), flags, msg.Priority, msg.ExpiresAt, now)
	if !accepted {
		q.mu.Unlock()
		for i := range dead {
			dead[i].Msg = msg
		}
		q.handleDead(dead)
		return Rejected, false
	}
	if flags != 0 {
		var b storage.Batch
		b.Set(q.recordKey(flags, id), encodeRecord(nil, msg, 0))
		if flags&flagMeta != 0 {
			b.Set(q.metaKey(id), encodeMeta(deadline, msg.Priority, 0))
		}
		if keep == nil {
			q.pmu.Lock()
			if q.pending == nil {
				q.pending = make(map[uint64]*Message)
			}
			q.pending[id] = msg
			q.pmu.Unlock()
		}
		paged := keep == nil
		q.DB.Commit(&b, func(err error) {
			if paged {
				q.pmu.Lock()
				delete(q.pending, id)
				q.pmu.Unlock()
			}
			if done != nil {
				done(err)
			}
		})
	}
	// A message with a deadline may need the dispatcher's timer even with no consumer around.
	wake := len(q.consumers) > 0 || len(dead) > 0 || msg.ExpiresAt != 0 || q.m.cfg.MessageTTL >= 0
	// A message that is alone in the queue, with no timer to set, goes to a consumer from here
	// (when no one else is delivering): handing it to the dispatcher goroutine would cost a
	// thread wake-up, a good part of an idle broker's delivery latency.
	inline := wake && len(dead) == 0 && msg.ExpiresAt == 0 && q.m.cfg.MessageTTL < 0 && q.m.Ready() == 1
	var throttle chan struct{}
	if len(q.consumers) > 0 && q.m.Ready() > flowHigh {
		if q.flow == nil {
			q.flow = make(chan struct{})
		}
		throttle = q.flow
	}
	q.mu.Unlock()
	for i := range dead {
		if dead[i].ID == id && dead[i].Msg == nil {
			dead[i].Msg = msg
		}
	}
	q.handleDead(dead)
	switch {
	case inline && q.dmu.TryLock():
		q.deliverReady(false)
		q.dmu.Unlock()
	case wake:
		q.Kick()
	}
	if throttle != nil {
		t := time.NewTimer(flowMaxWait)
		select {
		case <-throttle:
		case <-t.C:
		}
		t.Stop()
	}
	return Accepted, flags != 0
}

// releaseFlow lets throttled publishers go once the queue is short again (q.mu held).
func (q *Queue) releaseFlow() {
	if q.flow != nil && (q.m.Ready() < flowLow || len(q.consumers) == 0 || q.closed) {
		close(q.flow)
		q.flow = nil
	}
}

// consumeError is the error type of AddConsumer's refusals.
type consumeError string

func (e consumeError) Error() string { return string(e) }

// ErrInExclusiveUse is returned by AddConsumer when an exclusive consumer holds the queue, or when an
// exclusive consumer is requested while others exist.
const ErrInExclusiveUse = consumeError("queue in exclusive use")

// ErrQueueDeleted is returned when operating on a deleted queue.
const ErrQueueDeleted = consumeError("queue deleted")

// AddConsumer attaches a consumer. onAdded, if not nil, runs under the queue lock once the consumer is
// accepted and before any delivery to it (the server sends basic.consume-ok from it).
func (q *Queue) AddConsumer(spec ConsumerSpec, exclusive bool, c Consumer, onAdded func()) error {
	if q.r != nil {
		return q.rAddConsumer(spec, exclusive, c, onAdded)
	}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrQueueDeleted
	}
	if q.exclusiveConsumer != 0 || (exclusive && len(q.consumers) > 0) {
		q.mu.Unlock()
		return ErrInExclusiveUse
	}
	if exclusive {
		q.exclusiveConsumer = spec.ID
	}
	if onAdded != nil {
		onAdded()
	}
	q.consumers[spec.ID] = c
	q.hadConsumers = true
	q.m.AddConsumer(spec)
	q.mu.Unlock()
	q.Kick()
	return nil
}

// RemoveConsumer detaches a consumer; its unacked messages stay unacked. It reports whether the queue
// should now be auto-deleted (auto-delete queue that had consumers and has none left).
func (q *Queue) RemoveConsumer(id ConsumerID) (autoDelete bool) {
	if q.r != nil {
		return q.rRemoveConsumer(id)
	}
	q.mu.Lock()
	defer q.Kick()
	defer q.mu.Unlock()
	if _, ok := q.consumers[id]; !ok {
		return false
	}
	delete(q.consumers, id)
	q.m.RemoveConsumer(id)
	if q.exclusiveConsumer == id {
		q.exclusiveConsumer = 0
	}
	if len(q.consumers) == 0 {
		q.lastUsed = nowMs()
		q.releaseFlow()
	}
	return !q.closed && q.AutoDelete && q.hadConsumers && len(q.consumers) == 0
}

// Touch marks the queue as used now (a redeclaration or basic.get), for x-expires.
func (q *Queue) Touch() {
	q.mu.Lock()
	q.lastUsed = nowMs()
	q.mu.Unlock()
	q.Kick()
}

// Settle acknowledges messages.
func (q *Queue) Settle(ids []uint64) {
	if q.r != nil {
		q.propose(idsCmd(cmdSettle, ids))
		return
	}
	var b *storage.Batch
	q.mu.Lock()
	for _, id := range ids {
		fl, _ := q.m.SettleEntry(id)
		b = q.forgetInto(b, id, fl)
	}
	// The freed prefetch room matters only if messages wait; otherwise the dispatcher's wake-up
	// would be wasted (its timers only move later when deliveries are settled).
	kick := q.m.Ready() > 0
	q.mu.Unlock()
	q.commitForget(b)
	if kick {
		q.Kick()
	}
}

// Return requeues messages at their original positions; those over the delivery limit are
// dead-lettered instead. A persistent message's new delivery count is stored, so the limit holds
// across restarts.
func (q *Queue) Return(ids []uint64) {
	if q.r != nil {
		q.propose(idsCmd(cmdReturn, ids))
		return
	}
	var dead []Dead
	var b storage.Batch
	q.mu.Lock()
	for _, id := range ids {
		info, had := q.m.UnackedInfo(id)
		if had && info.Flags&flagStored != 0 && info.Flags&flagMeta == 0 {
			q.m.SetUnackedFlags(id, info.Flags|flagMeta) // the new delivery count gets a side record below
		}
		d, ok := q.m.ReturnAt(id)
		if !ok {
			continue
		}
		if d != nil {
			dead = append(dead, *d)
		} else if had && info.Flags&flagStored != 0 {
			b.Set(q.metaKey(id), encodeMeta(info.ExpiresAt, info.Priority, info.DeliveryCount+1))
		}
	}
	dead = append(dead, q.m.Trim()...)
	if b.Len() > 0 {
		b.UseReserve() // a delivery count: requeues must work on a nearly full disk
		q.DB.Commit(&b, nil)
	}
	q.mu.Unlock()
	q.handleDead(dead)
	q.Kick()
}

// Discard drops messages that were rejected without requeue (dead-lettering them).
func (q *Queue) Discard(ids []uint64) {
	if q.r != nil {
		q.propose(idsCmd(cmdDiscard, ids))
		return
	}
	var dead []Dead
	q.mu.Lock()
	for _, id := range ids {
		if d, ok := q.m.DiscardDead(id); ok {
			dead = append(dead, d)
		}
	}
	kick := q.m.Ready() > 0 // as in Settle
	q.mu.Unlock()
	q.handleDead(dead)
	if kick {
		q.Kick()
	}
}

// Get implements basic.get. It returns the delivery, the number of messages still ready, and ok.
func (q *Queue) Get(noAck bool) (Delivery, int, bool) {
	if q.r != nil {
		d, n, ok, _ := q.rGet(noAck, 0)
		return d, n, ok
	}
	for {
		now := nowMs()
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return Delivery{}, 0, false
		}
		q.lastUsed = now
		d, ok, dead := q.m.GetAt(noAck, now)
		ready := q.m.Ready()
		q.mu.Unlock()
		q.handleDead(dead)
		if !ok {
			return d, ready, false
		}
		loaded := d.Msg != nil
		if !loaded {
			var count uint32
			if d.Msg, count, loaded = q.load(d.ID, d.Flags); loaded && count > d.DeliveryCount {
				d.DeliveryCount = count
			}
		}
		if d.Settled && d.Flags != 0 {
			// Taken without ack: its record goes, after the body was read.
			q.forget([]uint64{d.ID}, []uint8{d.Flags})
		}
		if loaded {
			return d, ready, true
		}
		if !d.Settled {
			q.mu.Lock()
			_, fl, _ := q.m.DiscardEntry(d.ID)
			q.mu.Unlock()
			q.forget([]uint64{d.ID}, []uint8{fl})
		}
	}
}

// Purge removes ready messages and returns how many.
func (q *Queue) Purge() int {
	if q.r != nil {
		n, _ := q.PurgeErr()
		return n
	}
	var ids []uint64
	var flags []uint8
	q.mu.Lock()
	n := q.m.PurgeEntries(func(id uint64, fl uint8) {
		if fl != 0 {
			ids = append(ids, id)
			flags = append(flags, fl)
		}
	})
	q.releaseFlow()
	q.mu.Unlock()
	q.forget(ids, flags)
	return n
}

// Counts returns the number of ready messages and consumers.
func (q *Queue) Counts() (ready, consumers int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.r != nil {
		return q.m.Ready(), q.m.Consumers() // every node's consumers
	}
	return q.m.Ready(), len(q.consumers)
}

// Stats returns the numbers of ready and unacknowledged messages and of consumers (on every
// node, for a replicated queue).
func (q *Queue) Stats() (ready, unacked, consumers int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.r != nil {
		return q.m.Ready(), q.m.Unacked(), q.m.Consumers()
	}
	return q.m.Ready(), q.m.Unacked(), len(q.consumers)
}

// Close deletes the queue: it stops the dispatcher and returns the consumers that were attached, so the
// caller can tell them (basic.cancel). It returns the number of ready messages dropped.
func (q *Queue) Close() (consumers map[ConsumerID]Consumer, ready int) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil, 0
	}
	q.closed = true
	q.releaseFlow()
	consumers = q.consumers
	q.consumers = map[ConsumerID]Consumer{}
	ready = q.m.Ready()
	q.mu.Unlock()
	close(q.quit)
	<-q.done
	return consumers, ready
}

// Drop deletes the stored records of a deleted queue.
func (q *Queue) Drop() {
	if q.DB == nil {
		return
	}
	for _, p := range [][]byte{storage.MessagePrefix(q.ID), storage.U64Key(PrefixTransient, q.ID), MetaPrefix(q.ID)} {
		if _, err := q.DB.DeleteRange(p); err != nil {
			q.Logger.Error("cannot delete the records of a deleted queue", "queue", q.Name, "err", err)
		}
	}
}
