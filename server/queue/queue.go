package queue

import (
	"sync"
)

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
	go q.dispatch()
	return q
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
			for i := range ds {
				targets[i].Deliver(q, ds[i])
				ds[i] = Delivery{}
				targets[i] = nil
			}
			if len(ds) < checkoutBatch {
				break
			}
		}
	}
}

// Publish enqueues a message. It returns false if the queue was deleted.
func (q *Queue) Publish(msg *Message) bool {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false
	}
	q.m.Enqueue(msg)
	wake := len(q.consumers) > 0
	q.mu.Unlock()
	if wake {
		q.Kick()
	}
	return true
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
	q.mu.Lock()
	for _, id := range ids {
		q.m.Settle(id)
	}
	q.mu.Unlock()
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
	q.mu.Lock()
	for _, id := range ids {
		q.m.Discard(id)
	}
	q.mu.Unlock()
	q.Kick()
}

// Get implements basic.get. It returns the delivery, the number of messages still ready, and ok.
func (q *Queue) Get(noAck bool) (Delivery, int, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return Delivery{}, 0, false
	}
	d, ok := q.m.Get(noAck)
	return d, q.m.Ready(), ok
}

// Purge removes ready messages and returns how many.
func (q *Queue) Purge() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.m.Purge()
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

// Closed reports whether the queue was deleted.
func (q *Queue) Closed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}
