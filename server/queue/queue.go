package queue

import (
	"encoding/binary"
	"log/slog"
	"sync"

	"warren/storage"
)

// PrefixTransient is the storage keyspace of transient messages paged out of long queues. Nothing in
// it survives a restart: the server clears it at boot.
const PrefixTransient byte = 0x04

// Flags the queue puts on machine entries (Delivery.Flags): where a message's record lives.
const (
	flagStored uint8 = 1 << iota // persistent message of a durable queue, under storage.PrefixMessage
	flagPaged                    // transient message paged out, under PrefixTransient
)

// DefaultPageWindow is how many ready messages a queue keeps with their bodies in memory; messages
// enqueued beyond it keep only an index entry and are read back from disk when delivered.
const DefaultPageWindow = 1024

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
}

// Queue is a classic queue: the pure Machine behind a mutex, plus one dispatcher goroutine that hands
// ready messages to consumers with room. Publishing runs on the publisher's goroutine.
type Queue struct {
	Options

	mu        sync.Mutex
	m         *Machine
	consumers map[ConsumerID]Consumer
	// exclusiveConsumer is set while a basic.consume exclusive=true consumer holds the queue.
	exclusiveConsumer ConsumerID
	hadConsumers      bool
	closed            bool
	reserveFn         func(ConsumerID) bool

	kick chan struct{}
	quit chan struct{}
	done chan struct{}

	// pending holds bodies of paged messages whose record is not yet committed.
	pmu     sync.Mutex
	pending map[uint64]*Message
}

// New creates a queue and starts its dispatcher. Close stops it.
func New(opts Options) *Queue {
	q := &Queue{
		Options:   opts,
		m:         NewMachine(),
		consumers: make(map[ConsumerID]Consumer),
		kick:      make(chan struct{}, 1),
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	q.reserveFn = q.reserve
	if q.PageWindow <= 0 {
		q.PageWindow = DefaultPageWindow
	}
	if q.Logger == nil {
		q.Logger = slog.Default()
	}
	go q.dispatch()
	return q
}

func (q *Queue) recordKey(flags uint8, id uint64) []byte {
	if flags&flagStored != 0 {
		return storage.MessageKey(q.ID, id)
	}
	return binary.BigEndian.AppendUint64(storage.U64Key(PrefixTransient, q.ID), id)
}

// Restore adds a message recovered from storage at boot (its body stays on disk until delivered).
func (q *Queue) Restore(id uint64) {
	q.mu.Lock()
	q.m.Restore(id, nil, 0, flagStored, 0)
	q.mu.Unlock()
}

// load fills in the body of a paged-out delivery.
func (q *Queue) load(d *Delivery) bool {
	if d.Msg != nil {
		return true
	}
	q.pmu.Lock()
	m := q.pending[d.ID]
	q.pmu.Unlock()
	if m != nil {
		d.Msg = m
		return true
	}
	rec, err := q.DB.Get(q.recordKey(d.Flags, d.ID))
	if err == nil {
		var count uint32
		m, count, err = decodeRecord(rec)
		if err == nil {
			d.Msg = m
			if count > d.DeliveryCount {
				d.DeliveryCount = count
			}
			return true
		}
	}
	q.Logger.Error("cannot read a stored message; dropping it", "queue", q.Name, "id", d.ID, "err", err)
	return false
}

// forget deletes the stored records of messages that left the queue.
func (q *Queue) forget(ids []uint64, flags []uint8) {
	if q.DB == nil {
		return
	}
	var b storage.Batch
	for i, id := range ids {
		if flags[i] != 0 {
			b.Delete(q.recordKey(flags[i], id))
		}
	}
	if b.Len() > 0 {
		q.DB.Commit(&b, nil)
	}
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

func (q *Queue) dispatch() {
	defer close(q.done)
	var ds []Delivery
	var targets []Consumer
	for {
		select {
		case <-q.quit:
			return
		case <-q.kick:
		}
		for {
			q.mu.Lock()
			if q.closed {
				q.mu.Unlock()
				return
			}
			ds = q.m.Checkout(ds[:0], checkoutBatch, q.reserveFn)
			targets = targets[:0]
			for i := range ds {
				targets = append(targets, q.consumers[ds[i].Consumer])
			}
			q.mu.Unlock()
			if len(ds) == 0 {
				break
			}
			var gone []uint64
			var goneFlags []uint8
			for i := range ds {
				d := &ds[i]
				if d.Settled && d.Flags != 0 {
					gone = append(gone, d.ID)
					goneFlags = append(goneFlags, d.Flags)
				}
				if d.Msg == nil && !q.load(d) {
					if !d.Settled {
						q.mu.Lock()
						_, fl, _ := q.m.DiscardEntry(d.ID)
						q.mu.Unlock()
						q.forget([]uint64{d.ID}, []uint8{fl})
					}
				} else {
					targets[i].Deliver(q, *d)
				}
				ds[i] = Delivery{}
				targets[i] = nil
			}
			if len(gone) > 0 {
				q.forget(gone, goneFlags)
			}
			if len(ds) < checkoutBatch {
				break
			}
		}
	}
}

// Publish enqueues a message. It returns false if the queue was deleted. When the message has to
// be written to storage (persistent in a durable queue, or paged out of a long queue), the write is
// submitted before the message becomes visible, so a later ack's delete can never overtake it; done
// is then called once it is durable and Publish reports async=true. Otherwise done is not called.
func (q *Queue) Publish(msg *Message, done func(error)) (ok, async bool) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false, false
	}
	var flags uint8
	keep := msg
	if q.DB != nil {
		if q.Durable && msg.Persistent {
			flags = flagStored
		}
		if q.m.Ready() >= q.PageWindow {
			if flags == 0 {
				flags = flagPaged
			}
			keep = nil
		}
	}
	id := q.m.EnqueueEntry(keep, uint32(len(msg.Body)), flags)
	if flags != 0 {
		var b storage.Batch
		b.Set(q.recordKey(flags, id), encodeRecord(nil, msg, 0))
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
	wake := len(q.consumers) > 0
	q.mu.Unlock()
	if wake {
		q.Kick()
	}
	return true, flags != 0
}

// ErrExclusiveUse reports a consume refused because of an exclusive consumer.
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
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.consumers[id]; !ok {
		return false
	}
	delete(q.consumers, id)
	q.m.RemoveConsumer(id)
	if q.exclusiveConsumer == id {
		q.exclusiveConsumer = 0
	}
	return !q.closed && q.AutoDelete && q.hadConsumers && len(q.consumers) == 0
}

// Settle acknowledges messages.
func (q *Queue) Settle(ids []uint64) {
	var flags []uint8
	q.mu.Lock()
	for _, id := range ids {
		fl, _ := q.m.SettleEntry(id)
		flags = append(flags, fl)
	}
	q.mu.Unlock()
	q.forget(ids, flags)
	q.Kick()
}

// Return requeues messages at their original positions.
func (q *Queue) Return(ids []uint64) {
	q.mu.Lock()
	for _, id := range ids {
		q.m.Return(id)
	}
	q.mu.Unlock()
	q.Kick()
}

// Discard drops messages that were rejected without requeue.
func (q *Queue) Discard(ids []uint64) {
	var flags []uint8
	q.mu.Lock()
	for _, id := range ids {
		_, fl, _ := q.m.DiscardEntry(id)
		flags = append(flags, fl)
	}
	q.mu.Unlock()
	q.forget(ids, flags)
	q.Kick()
}

// Get implements basic.get. It returns the delivery, the number of messages still ready, and ok.
func (q *Queue) Get(noAck bool) (Delivery, int, bool) {
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return Delivery{}, 0, false
		}
		d, ok := q.m.Get(noAck)
		ready := q.m.Ready()
		q.mu.Unlock()
		if !ok {
			return d, ready, false
		}
		if d.Settled && d.Flags != 0 {
			q.forget([]uint64{d.ID}, []uint8{d.Flags})
		}
		if q.load(&d) {
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
	var ids []uint64
	var flags []uint8
	q.mu.Lock()
	n := q.m.PurgeEntries(func(id uint64, fl uint8) {
		if fl != 0 {
			ids = append(ids, id)
			flags = append(flags, fl)
		}
	})
	q.mu.Unlock()
	q.forget(ids, flags)
	return n
}

// Counts returns the number of ready messages and consumers.
func (q *Queue) Counts() (ready, consumers int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.m.Ready(), len(q.consumers)
}

// InUse reports whether the queue has consumers.
func (q *Queue) InUse() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.consumers) > 0
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
	if _, err := q.DB.DeleteRange(storage.MessagePrefix(q.ID)); err != nil {
		q.Logger.Error("cannot delete the messages of a deleted queue", "queue", q.Name, "err", err)
	}
	if _, err := q.DB.DeleteRange(storage.U64Key(PrefixTransient, q.ID)); err != nil {
		q.Logger.Error("cannot delete the pages of a deleted queue", "queue", q.Name, "err", err)
	}
}

// Closed reports whether the queue was deleted.
func (q *Queue) Closed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}
