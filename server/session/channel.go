package session

import (
	"crypto/rand"
	"encoding/base64"
	"sort"
	"sync"
	"sync/atomic"

	"warren/amqp"
	"warren/server/auth"
	"warren/server/core"
	"warren/server/queue"
	"warren/server/stats"
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

// channel is an AMQP channel. Reader-goroutine state is unguarded; fields under mu are shared
// with queue goroutines (deliveries, cancels) and with other connections (queue deletion).
//
// Lock order: mu -> outbound.mu; confirms.mu -> outbound.mu. No code holds mu while it calls
// into a queue (queues call Deliver and Cancelled with none of their locks held).
type channel struct {
	c  *conn
	id uint16

	// Reader-goroutine state.
	acl          *auth.Channel // the user's permissions when the channel opened
	hasTopics    bool          // the user has topic permissions in the vhost
	closing      bool
	gone         bool // closed by the client: no frame may follow close-ok
	pub          pendingPublish
	confirm      bool
	confirms     confirms
	confirmDirty bool
	tx           bool
	txPubs       []*txPublish
	txAcks       []txAck
	prefetch     uint32 // basic.qos global=false: applies to consumers created afterwards
	lastQueue    string
	replyKey     string
	routeNames   []string
	routeQueues  []*core.Queue
	settleBuf    []unackedEntry // reused by applySettle
	durable      sync.WaitGroup // replies waiting for their record writes (replyWhenDurable)
	tagBuf       []queue.Tag    // reused by applySettle
	counters     *stats.Object  // the channel's traffic (written by the reader and by queues' deliveries)

	// For the management API (read from other goroutines): modeConfirm|modeTx, and prefetch.
	mode          atomic.Uint32
	prefetchShown atomic.Uint32

	// globalLimit is basic.qos global=true: unacked deliveries across the channel's consumers.
	globalLimit    atomic.Uint32
	globalInflight atomic.Int64

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

// txPublish is a publish buffered inside a transaction.
type txPublish struct {
	msg       *queue.Message
	mandatory bool
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
// Confirms already due go out first: RabbitMQ acks the publishes that came before the one that
// failed, then closes.
func (ch *channel) closeWithError(e *amqp.Error) {
	ch.c.log.Debug("closing channel", "channel", ch.id, "code", e.Code, "text", e.Text)
	ch.confirms.flush(ch)
	ch.release()
	ch.closing = true
	ch.c.out.sendMethod(ch.id, &amqp.ChannelClose{ReplyCode: e.Code, ReplyText: e.Text, FailingClassID: e.ClassID, FailingMethodID: e.MethodID})
}

// release cancels the channel's consumers and requeues its unacked messages, as RabbitMQ does
// when a channel closes. Consumers go first so the requeued messages are not handed straight back
// to them.
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
	ch.confirms.close()

	sort.Slice(cons, func(i, j int) bool { return cons[i].id < cons[j].id })
	for _, cs := range cons {
		ch.detach(cs)
	}
	settleEntries(entries, queue.SettleRequeue, nil)
	ch.pub = pendingPublish{}
	ch.txPubs, ch.txAcks = nil, nil
	ch.routeQueues = nil
}

// detach removes a consumer from its queue, auto-deleting the queue if that was its last consumer.
func (ch *channel) detach(cs *consumer) {
	if cs.q == nil {
		if ch.replyKey != "" {
			ch.c.s.unregisterReplyTo(ch.replyKey)
			ch.replyKey = ""
		}
		return
	}
	if cs.q.Cancel(cs.id) {
		cs.q.AutoDeleteNow()
	}
}

// settleEntries settles unacked deliveries with op, one call per run of entries of the same
// queue and consumer, with their tags collected in scratch (reused; returned). The first error
// (a stream refusing a requeue) is returned.
func settleEntries(entries []unackedEntry, op queue.SettleOp, scratch []queue.Tag) ([]queue.Tag, error) {
	var first error
	for i := 0; i < len(entries); {
		q, cid := entries[i].q, entries[i].cid
		scratch = scratch[:0]
		for ; i < len(entries) && entries[i].q == q && entries[i].cid == cid; i++ {
			scratch = append(scratch, queue.Tag{ID: entries[i].id, Count: entries[i].count})
		}
		if err := q.Settle(cid, op, scratch); err != nil && first == nil {
			first = err
		}
	}
	return scratch, first
}

// serverCancel removes a consumer the server cancelled and tells the client with basic.cancel.
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

// consumer is a basic.consume subscription; it implements queue.Consumer.
type consumer struct {
	ch        *channel
	tag       string
	id        queue.ConsumerID
	q         *core.Queue // nil for the direct reply-to consumer
	noAck     bool
	exclusive bool       // for the management API
	prefetch  uint32     // for the management API
	args      amqp.Table // for the management API
	cancelled bool       // guarded by ch.mu
	// reserved counts global-prefetch reservations Reserve made that no delivery took yet.
	reserved atomic.Int64
}

// HasRoom implements queue.Consumer.
func (cs *consumer) HasRoom(k queue.Kicker) bool {
	o := cs.ch.c.out
	if o.full() {
		o.block(k)
		return false
	}
	return true
}

// Reserve implements queue.Consumer: it runs under the queue's lock.
func (cs *consumer) Reserve(k queue.Kicker) bool {
	if !cs.HasRoom(k) {
		return false
	}
	ch := cs.ch
	if !cs.noAck {
		if lim := ch.globalLimit.Load(); lim > 0 {
			if ch.globalInflight.Add(1) > int64(lim) {
				ch.globalInflight.Add(-1)
				return false
			}
			cs.reserved.Add(1)
		}
	}
	return true
}

// takeReservation reports whether a delivery is counted against the channel's global prefetch.
func (cs *consumer) takeReservation() bool {
	for {
		n := cs.reserved.Load()
		if n <= 0 {
			return false
		}
		if cs.reserved.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// Deliver implements queue.Consumer: it runs on a queue's goroutine.
func (cs *consumer) Deliver(q queue.Queue, d queue.Delivery) bool {
	ch := cs.ch
	global := cs.takeReservation()
	ch.mu.Lock()
	if ch.closed || cs.cancelled {
		ch.mu.Unlock()
		if global {
			ch.globalInflight.Add(-1)
		}
		return false
	}
	ch.nextTag++
	tag := ch.nextTag
	qc := cs.q.Counters()
	if !cs.noAck && !d.Settled {
		ch.unacked.push(unackedEntry{tag: tag, q: q, cid: cs.id, id: d.ID, count: d.DeliveryCount, cons: cs, global: global, qc: qc})
		ch.counters.Inc(stats.DeliveredAck)
		qc.Inc(stats.DeliveredAck)
	} else {
		if global {
			ch.globalInflight.Add(-1)
		}
		ch.counters.Inc(stats.DeliveredNoAck)
		qc.Inc(stats.DeliveredNoAck)
	}
	if d.Redelivered {
		ch.counters.Inc(stats.Redelivered)
		qc.Inc(stats.Redelivered)
	}
	msg := d.Msg
	if d.DeliveryCount > 0 {
		msg = withDeliveryCount(msg, d.DeliveryCount)
	}
	ch.writeDelivery(cs.tag, tag, d.Redelivered, msg)
	ch.mu.Unlock()
	return true
}

// Cancelled implements queue.Consumer.
func (cs *consumer) Cancelled(q queue.Queue, why queue.CancelReason) {
	if why == queue.CancelTimeout {
		cs.ch.timeoutConsumer(cs)
		return
	}
	cs.ch.serverCancel(cs)
}

// timeoutConsumer cancels a consumer after a delivery timeout: the client gets basic.cancel (when
// it supports it), the consumer's unacked messages go back to the queue, and acks for their old
// delivery tags are ignored rather than failing the channel. It runs on the queue's goroutine.
func (ch *channel) timeoutConsumer(cs *consumer) {
	ch.mu.Lock()
	if ch.closed || cs.cancelled {
		ch.mu.Unlock()
		return
	}
	cs.cancelled = true
	delete(ch.consumers, cs.tag)
	entries := ch.unacked.takeConsumer(nil, cs)
	for _, e := range entries {
		if ch.revoked == nil {
			ch.revoked = make(map[uint64]struct{})
		}
		ch.revoked[e.tag] = struct{}{}
	}
	if ch.c.capCancelNotify {
		ch.c.out.sendMethod(ch.id, &amqp.BasicCancel{ConsumerTag: cs.tag, NoWait: true})
	}
	ch.mu.Unlock()
	ch.c.log.Warn("consumer cancelled: delivery not acknowledged in time", "channel", ch.id, "consumer", cs.tag,
		"queue", cs.q.Name(), "requeued", len(entries))
	ch.releaseGlobal(entries)
	if cs.q.Cancel(cs.id) {
		cs.q.DeleteLater()
	}
	settleEntries(entries, queue.SettleRequeue, nil)
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
	cp.Props = amqp.WithHeader(m.Props, "x-delivery-count", int64(count))
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
	q      queue.Queue
	cid    queue.ConsumerID // 0 for basic.get
	id     uint64           // message id (a stream delivery's offset)
	count  uint32           // the message's delivery count at this delivery
	cons   *consumer        // nil for basic.get
	global bool             // counted against the channel's global prefetch
	done   bool
	qc     *stats.Object // the queue's counters (acks)
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
