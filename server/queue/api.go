package queue

import (
	"errors"
	"log/slog"

	"warren/amqp"
	"warren/storage"
)

// This file is the queue-type interface: what the broker core and the protocol sessions (AMQP
// 0-9-1 today, RabbitMQ's stream protocol next) call on a queue of any type. It has the shape of
// RabbitMQ's rabbit_queue_type: a session asks a queue to publish, consume, settle; it never asks
// what kind of queue it is. Classic, quorum and stream queues implement it (classic and quorum in
// this package on the shared Machine, streams in server/queue/streamq on stream.Log); a new type
// implements Queue and registers a Type with the core, and the session does not change.

// Queue is one declared queue, of any type. Every method is safe for concurrent use.
type Queue interface {
	// Name is the queue's name in its vhost.
	Name() string
	// Kind is the queue type as x-queue-type names it: "classic", "quorum" or "stream".
	Kind() string

	// Publish hands a routed message to the queue. The status is what is known at once: Accepted,
	// Rejected (x-overflow reject-publish refused it) or Gone (the queue was deleted). done, if not
	// nil, is called exactly once, whatever the status, with the outcome of the queue's write: nil
	// once the message is as safe as the queue type promises (on disk for a persistent message in a
	// durable classic queue or for every stream message, on a majority of replicas for a quorum
	// queue, in memory otherwise), or an error (ErrRejected, ErrNoQuorum, ErrGone, a storage
	// failure). It may be called before Publish returns, on the caller's goroutine, or later from
	// another goroutine; it must not block. A publisher confirm is sent from it and nothing else.
	Publish(msg *Message, done Done) PublishStatus

	// Consume attaches a consumer. spec.OnAdded, if not nil, runs once the consumer is accepted and
	// before any delivery to it (the AMQP session sends basic.consume-ok from it). Errors are
	// ErrInExclusiveUse, ErrGone, ErrNoQuorum, or an *amqp.Error with RabbitMQ's text for arguments
	// the queue type refuses (a stream consumer without prefetch, a bad x-stream-offset, ...).
	Consume(spec ConsumeSpec, c Consumer) error
	// Cancel detaches a consumer; its unacknowledged deliveries stay unacknowledged (the session
	// settles or returns them, as RabbitMQ does on basic.cancel). It reports whether the queue
	// should now be auto-deleted (auto-delete, had consumers, has none left); the caller deletes it.
	Cancel(id ConsumerID) (autoDelete bool)
	// Settle acknowledges (SettleAck), requeues (SettleRequeue) or drops/dead-letters
	// (SettleDiscard) deliveries made to consumer id (0 for basic.get). Tags name deliveries, not
	// only messages, so a settle that is applied twice (a retry after a lost leadership) can never
	// touch a later delivery of the same message. Streams refuse SettleRequeue and SettleDiscard
	// with an *amqp.Error (RabbitMQ's 540 text), which the session turns into a connection error.
	Settle(id ConsumerID, op SettleOp, tags []Tag) error
	// Get takes the next message (basic.get): the delivery, the number of messages still ready,
	// and whether there was one.
	Get(noAck bool) (d Delivery, remaining int, ok bool, err error)
	// Purge removes the ready messages and returns how many.
	Purge() (int, error)

	// Delete removes the queue and everything it stored. Attached consumers are told through
	// Consumer.Cancelled(CancelDeleted). It returns the number of ready messages that went with it.
	// It must not be called from the queue's own goroutines (Hooks.Expired hands deletion over).
	Delete() int
	// Close stops the queue's goroutines and keeps its stored data (broker shutdown).
	Close()

	// Stats reports the queue's counts, for queue.declare-ok, the management API and metrics.
	Stats() Stats
	// Kick wakes the queue's delivery. A consumer whose Reserve failed calls it (through the
	// Kicker it was given) once it has room again. It never blocks.
	Kick()
	// Touch records a use of the queue now (a redeclaration), for x-expires.
	Touch()
}

// Type creates the queues of one kind: the core keeps one per x-queue-type value and calls it to
// declare a new queue or to reopen a recovered one.
type Type interface {
	// Kind is the x-queue-type value the type serves.
	Kind() string
	// Open creates the queue described by cfg, or reopens it with its stored state when it was
	// declared before (cfg.Recovered). It starts whatever goroutines the queue needs.
	Open(cfg OpenConfig) (Queue, error)
}

// OpenConfig describes a queue to Type.Open. Fields a type does not use are ignored.
type OpenConfig struct {
	VHost, Name string
	Durable     bool
	Exclusive   bool
	AutoDelete  bool
	// ID names the queue in storage keys (and, for replicated queues, is its raft group id):
	// unique in the cluster, never reused.
	ID uint64
	// Args are the queue's x-arguments as declared.
	Args amqp.Table
	// Lifecycle is the machine configuration from the arguments (TTL, limits, priorities, ...).
	Lifecycle Config
	// Expires is x-expires in ms (<= 0: never); ConsumerTimeout is how long (ms) a consumer may
	// hold an unacknowledged delivery (<= 0: never).
	Expires, ConsumerTimeout int64
	// Recovered is set when the queue is reopened from its stored record (at boot).
	Recovered bool

	DB     *storage.DB
	Logger *slog.Logger
	Hooks  Hooks
	// Extra carries what one queue type needs and the others do not (a quorum queue's raft group,
	// a stream's retention settings); the type documents what it expects.
	Extra any
}

// Hooks are the broker core's side of a queue's lifecycle. They are called with no queue lock
// held and must not wait for the queue's goroutines to stop.
type Hooks interface {
	// DeadLetter republishes messages that left the queue for a dead-lettering reason (bodies
	// loaded) to its dead-letter exchange, as RabbitMQ does. done, if not nil, is called once
	// every target has the messages (their publish outcomes): a quorum queue removes its
	// dead-letter records only then, so dead-lettering is at least once. Each Dead carries a
	// dedupe key; targets drop a message whose key they have already taken.
	DeadLetter(q Queue, dead []Dead, done func(error))
	// Expired reports a queue unused for longer than its x-expires: the core deletes it.
	Expired(q Queue)
}

// Consumer receives deliveries from a queue. The AMQP session implements it for basic.consume.
type Consumer interface {
	// Reserve is a try-acquire of room for one more delivery (the connection's outbound buffer
	// under its high-water mark, the channel's global prefetch). It is called with the queue's lock
	// held, before a message is assigned to the consumer; it must not block nor call into the
	// queue. When it returns false, the consumer calls k.Kick() once it has room again. Queues
	// whose assignment is decided by a replicated log (quorum) do not call it: they give their
	// consumers credit that the consumer's node grants as its outbound drains.
	Reserve(k Kicker) bool
	// HasRoom reports whether the consumer's connection can take more deliveries now (its
	// outbound buffer is under the high-water mark), without reserving anything; when it cannot,
	// the consumer calls k.Kick() once it can. A quorum queue's node asks it before granting its
	// consumer more credit in the replicated state.
	HasRoom(k Kicker) bool
	// Deliver hands one delivery to the consumer, in the queue's order for that consumer, with no
	// queue lock held. It must not block on network I/O. It returns false if the consumer is gone
	// (channel closed); the queue then takes the delivery back.
	Deliver(q Queue, d Delivery) bool
	// Cancelled tells the consumer that the queue dropped it: the queue was deleted
	// (CancelDeleted), the consumer held a delivery longer than its timeout (CancelTimeout), or the
	// queue is unavailable on this node (CancelUnavailable). The session tells the client with
	// basic.cancel; for CancelTimeout it also returns the consumer's unacknowledged deliveries.
	Cancelled(q Queue, why CancelReason)
}

// DeclareCounter is implemented by queue types whose queue.declare-ok counts differ from their
// Stats: RabbitMQ reports 0 messages and 0 consumers for a stream.
type DeclareCounter interface {
	DeclareCounts() (messages, consumers int)
}

// DeclareCounts returns what queue.declare-ok reports for q.
func DeclareCounts(q Queue) (messages, consumers int) {
	if dc, ok := q.(DeclareCounter); ok {
		return dc.DeclareCounts()
	}
	st := q.Stats()
	return st.Ready, st.Consumers
}

// Kicker is something that can be woken when a consumer has room again.
type Kicker interface{ Kick() }

// Done receives the outcome of one publish's write to one queue (see Queue.Publish).
type Done interface{ Done(err error) }

// ConsumeSpec describes a basic.consume to Queue.Consume.
type ConsumeSpec struct {
	ID  ConsumerID // unique in the cluster (node tag | boot epoch | counter: see ConsumerNode)
	Tag string     // the consumer tag, for logs and for the management API
	// Prefetch is the channel's basic.qos (global=false) when the consumer was created; 0 = none.
	Prefetch uint32
	// GlobalPrefetch is the channel's basic.qos global=true limit (0 = none). Classic queues
	// leave it to the session's Reserve; queue types that cannot count across a channel apply it
	// per consumer or refuse it (quorum queues and streams, as RabbitMQ).
	GlobalPrefetch uint32
	Priority       int32 // x-priority
	NoAck          bool
	Exclusive      bool
	Args           amqp.Table // basic.consume arguments (x-stream-offset, x-stream-filter, ...)
	OnAdded        func()
}

// SettleOp says what Settle does with deliveries.
type SettleOp uint8

// The settle operations: basic.ack, basic.nack/reject with requeue, without requeue.
const (
	SettleAck SettleOp = iota
	SettleRequeue
	SettleDiscard
)

// Tag names one delivery: the message id and its delivery count at that delivery (a returned
// message delivered again has a higher count). Stream deliveries carry the offset as ID.
type Tag struct {
	ID    uint64
	Count uint32
}

// CancelReason says why a queue cancelled a consumer.
type CancelReason uint8

// The cancel reasons.
const (
	CancelDeleted CancelReason = iota
	CancelTimeout
	CancelUnavailable
)

// Stats are a queue's counts. Streams report Ready 0, as RabbitMQ's queue counters do, and fill
// the stream fields.
type Stats struct {
	Ready, Unacked, Consumers int
	ReadyBytes                int64
	// Streams: records in the log, first and last offset, segments and bytes on disk.
	Messages                uint64
	FirstOffset, LastOffset uint64
	Segments                int
	Bytes                   int64
}

// Errors of the queue types.
var (
	// ErrGone is returned for operations on a deleted queue.
	ErrGone = errors.New("queue: deleted")
	// ErrInExclusiveUse refuses a consumer while an exclusive consumer holds the queue, or an
	// exclusive consumer while others exist.
	ErrInExclusiveUse = errors.New("queue: in exclusive use")
	// ErrNoQuorum is the error of operations a replicated queue could not commit.
	ErrNoQuorum = errors.New("queue: no quorum (the queue has no leader)")
	// ErrRejected is the outcome of a publish refused by x-overflow reject-publish(-dlx).
	ErrRejected = errors.New("queue: message rejected by the queue's length limit")
)
