package server

import (
	"crypto/rand"
	"encoding/base64"
	"sort"
	"sync"
	"sync/atomic"

	"warren/amqp"
	"warren/server/queue"
)

// publish assembly states.
const (
	pubIdle = iota
	pubWantHeader
	pubWantBody
)

// pendingPublish is a basic.publish whose content is still arriving.
type pendingPublish struct {
	state      int
	exchange   string
	routingKey string
	mandatory  bool
	bodySize   uint64
	props      []byte
	body       []byte
}

// interrupted is RabbitMQ's error for a frame other than the content this publish waits for.
func (p *pendingPublish) interrupted() *amqp.Error {
	if p.state == pubWantHeader {
		return amqp.Errorf(amqp.UnexpectedFrame, "expected content header for class 60, got non content header frame instead")
	}
	return amqp.Errorf(amqp.UnexpectedFrame, "expected content body, got non content body frame instead")
}

// txAck is an ack, nack or reject buffered inside a transaction.
type txAck struct {
	kind     uint16 // method id: 80 ack, 90 reject, 120 nack
	tag      uint64
	multiple bool
	requeue  bool
}

// channel is an AMQP channel. Reader-goroutine state is unguarded; fields under mu are shared with
// queue dispatchers (deliveries) and with other connections (queue deletion cancelling consumers).
type channel struct {
	c  *conn
	id uint16

	// Reader-goroutine state.
	closing      bool
	gone         bool // closed by the client: no frame may follow close-ok
	pub          pendingPublish
	confirm      bool
	publishSeq   uint64 // last publish sequence number handed out in confirm mode
	confirmed    uint64 // highest sequence ready to be confirmed
	acked        uint64 // highest sequence already confirmed to the client (confirmMu)
	confirmDirty bool
	tx           bool
	txPubs       []*txPublish
	txAcks       []txAck
	prefetch     uint32 // basic.qos global=false: applies to consumers created afterwards
	lastQueue    string
	replyKey     string
	routeNames   []string
	routeQueues  []*queueEntry

	// globalLimit is basic.qos global=true: unacked deliveries across the channel's consumers.
	globalLimit    atomic.Uint32
	globalInflight atomic.Int64

	asyncConfirms atomic.Int64 // confirms waiting for a commit callback
	confirmMu     sync.Mutex   // guards acked and waiting between the reader and commit callbacks
	// waiting lists the publishes whose confirm waits for a callback, in sequence order. Callbacks
	// may finish out of order (quorum queues commit through Raft, other queues through storage), so a
	// confirm goes out only when every earlier one has finished.
	waiting []pendingConfirm

	rejected  bool           // the publish being routed was refused by a queue (x-overflow reject-publish)
	settleBuf []unackedEntry // reused by applySettle
	idBuf     []uint64       // reused by applySettle

	mu        sync.Mutex
	revoked   map[uint64]struct{} // delivery tags taken back by a consumer timeout
	closed    bool
	nextTag   uint64
	unacked   unackedList
	consumers map[string]*consumer

	// While holdCancels is set, basic.cancel notifications wait in heldCancels (consumer tags):
	// see holdServerCancels. Guarded by mu.
	holdCancels bool
	heldCancels []string
}

// pendingConfirm is a publish waiting for its queues' callbacks (see channel.waiting).
type pendingConfirm struct {
	seq  uint64
	done bool
	err  error
}

// txPublish is a publish buffered inside a transaction.
type txPublish struct {
	msg       *queue.Message
	mandatory bool
}

// consumer is a basic.consume subscription; it implements queue.Consumer.
type consumer struct {
	ch        *channel
	tag       string
	id        queue.ConsumerID
	entry     *queueEntry     // nil for the direct reply-to consumer
	stream    *streamConsumer // set for a stream consumer
	noAck     bool
	cancelled bool // guarded by ch.mu
	// perConsumerGlobal: the queue applies a global prefetch per consumer (replicated queues), so
	// deliveries are not counted against the channel's global limit.
	perConsumerGlobal bool
}

func newChannel(c *conn, id uint16) *channel {
	return &channel{c: c, id: id}
}

// addConsumerLocked registers a consumer by tag (ch.mu held); the map is made on first use, so
// channels that only publish stay small.
func (ch *channel) addConsumerLocked(tag string, cs *consumer) {
	if ch.consumers == nil {
		ch.consumers = make(map[string]*consumer)
	}
	ch.consumers[tag] = cs
}

// closeWithError sends channel.close for a soft error and frees the channel's resources at once.
func (ch *channel) closeWithError(e *amqp.Error) {
	ch.c.log.Debug("closing channel", "channel", ch.id, "code", e.Code, "text", e.Text)
	ch.release()
	ch.closing = true
	ch.c.out.sendMethod(ch.id, &amqp.ChannelClose{ReplyCode: e.Code, ReplyText: e.Text, FailingClassID: e.ClassID, FailingMethodID: e.MethodID})
}

// release cancels the channel's consumers and requeues its unacked messages, as RabbitMQ does when a
// channel closes. Consumers go first so the requeued messages are not handed straight back to them.
func (ch *channel) release() {
	ch.mu.Lock()
	if ch.closed {
		ch.mu.Unlock()
		return
	}
	ch.closed = true
	cons := make([]*consumer, 0, len(ch.consumers))
	for _, cs := range ch.consumers {
		cs.cancelled = true
		cons = append(cons, cs)
	}
	clear(ch.consumers)
	entries := ch.unacked.takeAll(nil)
	ch.mu.Unlock()

	sort.Slice(cons, func(i, j int) bool { return cons[i].id < cons[j].id })
	for _, cs := range cons {
		ch.detach(cs)
	}
	returnEntries(entries, true)
	ch.pub = pendingPublish{}
	ch.txPubs, ch.txAcks = nil, nil
	ch.routeQueues = nil
}

// detach removes a consumer from its queue (auto-deleting the queue if that was its last consumer).
func (ch *channel) detach(cs *consumer) {
	if cs.stream != nil {
		cs.stream.detach()
		return
	}
	if cs.entry == nil {
		if ch.replyKey != "" {
			ch.c.s.unregisterReplyTo(ch.replyKey)
			ch.replyKey = ""
		}
		return
	}
	if cs.entry.q.RemoveConsumer(cs.id) {
		ch.c.deleteQueue(cs.entry)
	}
}

// returnEntries hands unacked deliveries back to their queues: requeue or discard.
func returnEntries(entries []unackedEntry, requeue bool) {
	forEachQueue(entries, nil, func(q *queue.Queue, ids []uint64) {
		if requeue {
			q.Return(ids)
		} else {
			q.Discard(ids)
		}
	})
}

// forEachQueue calls fn once per run of entries from the same queue, with their message ids
// collected in scratch (reused between runs; fn must not keep it). Stream deliveries have no
// queue and are skipped. It returns scratch for reuse.
func forEachQueue(entries []unackedEntry, scratch []uint64, fn func(q *queue.Queue, ids []uint64)) []uint64 {
	for i := 0; i < len(entries); {
		q := entries[i].q
		if q == nil {
			i++
			continue
		}
		scratch = scratch[:0]
		for ; i < len(entries) && entries[i].q == q; i++ {
			scratch = append(scratch, entries[i].id)
		}
		fn(q, scratch)
	}
	return scratch
}

// serverCancel removes a consumer whose queue was deleted and tells the client with basic.cancel.
func (ch *channel) serverCancel(cs *consumer) {
	ch.mu.Lock()
	if ch.closed || cs.cancelled {
		ch.mu.Unlock()
		return
	}
	cs.cancelled = true
	delete(ch.consumers, cs.tag)
	ch.notifyCancelLocked(cs.tag)
	ch.mu.Unlock()
}

// notifyCancelLocked tells the client the server cancelled its consumer tag (if it asked to be
// told), now or, while held, once the channel's own reply has gone out. ch.mu is held.
func (ch *channel) notifyCancelLocked(tag string) {
	switch {
	case !ch.c.capCancelNotify:
	case ch.holdCancels:
		ch.heldCancels = append(ch.heldCancels, tag)
	default:
		ch.c.out.sendMethod(ch.id, &amqp.BasicCancel{ConsumerTag: tag, NoWait: true})
	}
}

// holdServerCancels makes the channel's basic.cancel notifications wait until the function it
// returns runs. queue.delete runs it after its reply: RabbitMQ sends queue.delete-ok before the
// cancel of a consumer on the deleting channel, and clients rely on that order (amqplib resolves
// the delete on its reply, and a client that closes on the cancel must not leave it pending).
func (ch *channel) holdServerCancels() (release func()) {
	ch.mu.Lock()
	ch.holdCancels = true
	ch.mu.Unlock()
	return func() {
		ch.mu.Lock()
		defer ch.mu.Unlock()
		ch.holdCancels = false
		if !ch.closed {
			for _, tag := range ch.heldCancels {
				ch.notifyCancelLocked(tag)
			}
		}
		ch.heldCancels = ch.heldCancels[:0]
	}
}

// Reserve implements queue.Consumer: it runs under the queue's lock.
func (cs *consumer) Reserve(q *queue.Queue) bool {
	ch := cs.ch
	if ch.c.out.full() {
		ch.c.out.block(q)
		return false
	}
	if !cs.noAck {
		if lim := ch.globalLimit.Load(); lim > 0 {
			if ch.globalInflight.Add(1) > int64(lim) {
				ch.globalInflight.Add(-1)
				return false
			}
		}
	}
	return true
}

// Deliver implements queue.Consumer: it runs on the queue's dispatcher goroutine.
func (cs *consumer) Deliver(q *queue.Queue, d queue.Delivery) {
	ch := cs.ch
	ch.mu.Lock()
	if ch.closed || cs.cancelled {
		ch.mu.Unlock()
		if !cs.noAck {
			if !cs.perConsumerGlobal && ch.globalLimit.Load() > 0 {
				ch.globalInflight.Add(-1)
			}
			q.Return([]uint64{d.ID})
		}
		return
	}
	ch.nextTag++
	tag := ch.nextTag
	if !cs.noAck {
		ch.unacked.push(unackedEntry{tag: tag, q: q, id: d.ID, cons: cs, global: !cs.perConsumerGlobal && ch.globalLimit.Load() > 0})
	}
	msg := d.Msg
	if d.DeliveryCount > 0 {
		msg = withDeliveryCount(msg, d.DeliveryCount)
	}
	ch.writeDelivery(cs.tag, tag, d.Redelivered, msg)
	ch.mu.Unlock()
}

// writeDelivery appends basic.deliver and the content frames.
func (ch *channel) writeDelivery(ctag string, tag uint64, redelivered bool, m *queue.Message) {
	o := ch.c.out
	if !o.lockAppend() {
		return
	}
	o.buf = amqp.AppendBasicDeliver(o.buf, ch.id, ctag, tag, redelivered, m.Exchange, m.RoutingKey)
	o.buf = amqp.AppendContentHeaderFrame(o.buf, ch.id, amqp.ClassBasic, uint64(len(m.Body)), m.Props)
	o.buf = amqp.AppendBodyFrames(o.buf, ch.id, m.Body, o.frameMax)
	o.unlockAppendDelivery()
}

// withDeliveryCount returns a copy of m whose headers carry x-delivery-count (redeliveries).
func withDeliveryCount(m *queue.Message, count uint32) *queue.Message {
	cp := *m
	cp.Props = withHeader(m.Props, "x-delivery-count", int64(count))
	return &cp
}

// newName returns prefix + 22 characters of random base64url, like RabbitMQ's generated names.
func newName(prefix string) string {
	var b [16]byte
	rand.Read(b[:])
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// unackedEntry is a delivery awaiting ack on this channel.
type unackedEntry struct {
	tag    uint64
	q      *queue.Queue
	id     uint64
	cons   *consumer       // nil for basic.get
	sc     *streamConsumer // stream delivery: id is the offset
	global bool            // counted against the channel's global prefetch
	done   bool
}

// unackedList keeps unacked deliveries in delivery-tag order: tags only grow, so appends keep it
// sorted, single acks binary-search, and multiple acks pop from the front.
type unackedList struct {
	entries []unackedEntry
	head    int
	live    int
}

func (l *unackedList) push(e unackedEntry) {
	l.entries = append(l.entries, e)
	l.live++
}

func (l *unackedList) find(tag uint64) int {
	es := l.entries[l.head:]
	i := sort.Search(len(es), func(i int) bool { return es[i].tag >= tag })
	if i < len(es) && es[i].tag == tag && !es[i].done {
		return l.head + i
	}
	return -1
}

// take removes one entry by tag.
func (l *unackedList) take(tag uint64) (unackedEntry, bool) {
	i := l.find(tag)
	if i < 0 {
		return unackedEntry{}, false
	}
	e := l.entries[i]
	l.entries[i].done = true
	l.entries[i].q = nil
	l.entries[i].cons = nil
	l.live--
	l.compact()
	return e, true
}

// takeUpTo removes every entry with tag <= tag, appending them to dst.
func (l *unackedList) takeUpTo(dst []unackedEntry, tag uint64) []unackedEntry {
	for l.head < len(l.entries) && l.entries[l.head].tag <= tag {
		e := l.entries[l.head]
		if !e.done {
			dst = append(dst, e)
			l.live--
		}
		l.entries[l.head] = unackedEntry{}
		l.head++
	}
	l.compact()
	return dst
}

// takeConsumer removes every entry delivered to cs.
func (l *unackedList) takeConsumer(dst []unackedEntry, cs *consumer) []unackedEntry {
	for i := l.head; i < len(l.entries); i++ {
		e := &l.entries[i]
		if !e.done && e.cons == cs {
			dst = append(dst, *e)
			e.done, e.q, e.cons = true, nil, nil
			l.live--
		}
	}
	l.compact()
	return dst
}

func (l *unackedList) takeAll(dst []unackedEntry) []unackedEntry {
	for _, e := range l.entries[l.head:] {
		if !e.done {
			dst = append(dst, e)
		}
	}
	l.entries = l.entries[:0]
	l.head = 0
	l.live = 0
	return dst
}

func (l *unackedList) compact() {
	for l.head < len(l.entries) && l.entries[l.head].done {
		l.entries[l.head] = unackedEntry{}
		l.head++
	}
	if l.head == len(l.entries) {
		l.entries = l.entries[:0]
		l.head = 0
		return
	}
	if l.head > 1024 && l.head*2 > len(l.entries) {
		n := copy(l.entries, l.entries[l.head:])
		clear(l.entries[n:])
		l.entries = l.entries[:n]
		l.head = 0
	}
}

// flushConfirm sends one basic.ack covering every publish confirmed since the last one.
func (ch *channel) flushConfirm() {
	ch.confirmMu.Lock()
	defer ch.confirmMu.Unlock()
	if ch.confirmed <= ch.acked {
		return
	}
	multiple := ch.confirmed-ch.acked > 1
	ch.acked = ch.confirmed
	o := ch.c.out
	if o.lockAppend() {
		o.buf = amqp.AppendBasicAck(o.buf, ch.id, ch.confirmed, multiple)
		o.unlockAppend()
	}
}
