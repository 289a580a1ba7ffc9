package server

import (
	"fmt"
	"sync"
	"time"

	"warren/amqp"
	"warren/server/queue"
	"warren/stream"
)

// streamQueue is a stream declared as a queue (x-queue-type=stream): publishing appends to its log
// and consuming is a read from an offset; nothing is removed on ack.
type streamQueue struct {
	s    *Server
	name string
	log  *stream.Log

	mu        sync.Mutex
	consumers map[*streamConsumer]struct{}
	closed    bool
}

func (s *Server) openStream(v *vhost, name string, id uint64, st queueSettings) (*streamQueue, error) {
	maxBytes := st.maxLengthBytes
	if maxBytes < 0 {
		maxBytes = 0 // parseQueueArgs uses -1 for "none"; the log uses 0
	}
	l, err := stream.Open(v.db, id, stream.Options{
		MaxLengthBytes:  maxBytes,
		MaxAge:          st.maxAge,
		MaxSegmentBytes: st.maxSegmentBytes,
		Logger:          s.log.With("stream", name),
	})
	if err != nil {
		return nil, err
	}
	return &streamQueue{s: s, name: name, log: l, consumers: make(map[*streamConsumer]struct{})}, nil
}

// filterValue is the x-stream-filter-value header of a publish.
func filterValue(h amqp.Table) string {
	switch v := h["x-stream-filter-value"].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// publish appends a message; done (if any) runs once the chunk holding it is written.
func (sq *streamQueue) publish(msg *queue.Message, fv string, done func(error)) (queue.PublishStatus, bool) {
	sq.mu.Lock()
	closed := sq.closed
	sq.mu.Unlock()
	if closed {
		return queue.Gone, false
	}
	rec := stream.Record{Exchange: msg.Exchange, RoutingKey: msg.RoutingKey, Props: msg.Props, Body: msg.Body, FilterValue: fv}
	var cb func(uint64, error)
	if done != nil {
		cb = func(_ uint64, err error) { done(err) }
	}
	sq.log.Append([]stream.Record{rec}, cb)
	return queue.Accepted, done != nil
}

func (sq *streamQueue) consumerCount() int {
	sq.mu.Lock()
	defer sq.mu.Unlock()
	return len(sq.consumers)
}

// close stops the consumers' readers and the log (broker shutdown).
func (sq *streamQueue) close() {
	cons := sq.stopAll()
	for _, c := range cons {
		c.stop()
	}
	sq.log.Close()
}

// delete removes the stream and its data; consumers get basic.cancel.
func (sq *streamQueue) delete() {
	cons := sq.stopAll()
	for _, c := range cons {
		c.stop()
		c.ch.serverCancelStream(c)
	}
	if err := sq.log.Delete(); err != nil {
		sq.s.log.Error("cannot delete stream data", "stream", sq.name, "err", err)
	}
}

func (sq *streamQueue) stopAll() []*streamConsumer {
	sq.mu.Lock()
	defer sq.mu.Unlock()
	sq.closed = true
	out := make([]*streamConsumer, 0, len(sq.consumers))
	for c := range sq.consumers {
		out = append(out, c)
	}
	clear(sq.consumers)
	return out
}

// streamConsumer reads a stream for one basic.consume. Its goroutine reads from the log while it has
// credit (prefetch minus unacked deliveries), so acks are credit as in RabbitMQ.
type streamConsumer struct {
	sq              *streamQueue
	ch              *channel
	tag             string
	name            string // x-stream-consumer-name: offsets stored under it
	prefetch        int64
	filters         map[string]bool
	matchUnfiltered bool

	mu        sync.Mutex
	next      uint64   // next offset to read
	inflight  int64    // delivered, not acked
	track     []uint64 // offsets handed out or skipped, oldest first, for the stored offset
	acked     map[uint64]bool
	committed uint64 // highest contiguous offset done (valid when hasCommit)
	hasCommit bool

	kick chan struct{}
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

func (c *streamConsumer) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *streamConsumer) stop() {
	c.once.Do(func() { close(c.quit) })
	<-c.done
}

// run is the consumer's reader goroutine.
func (c *streamConsumer) run() {
	defer close(c.done)
	var buf []stream.Entry
	for {
		c.mu.Lock()
		credit := c.prefetch - c.inflight
		from := c.next
		c.mu.Unlock()
		if credit <= 0 {
			select {
			case <-c.quit:
				return
			case <-c.kick:
			}
			continue
		}
		if o := c.ch.c.out; o.full() {
			select {
			case <-c.quit:
				return
			case <-o.drained():
			}
			continue
		}
		var err error
		buf, err = c.sq.log.Read(buf[:0], from, int(credit))
		if err != nil {
			c.sq.s.log.Error("stream read failed", "stream", c.sq.name, "offset", from, "err", err)
			select {
			case <-c.quit:
				return
			case <-time.After(time.Second):
			}
			continue
		}
		if len(buf) == 0 {
			if first := c.sq.log.First(); from < first {
				c.mu.Lock()
				c.next = first
				c.mu.Unlock()
				continue
			}
			select {
			case <-c.quit:
				return
			case <-c.sq.log.Wait(from):
			case <-c.kick:
			}
			continue
		}
		for i := range buf {
			e := &buf[i]
			pass := c.matches(e.FilterValue)
			c.mu.Lock()
			c.next = e.Offset + 1
			if c.name != "" {
				c.track = append(c.track, e.Offset)
				if !pass {
					c.acked[e.Offset] = true
				}
			}
			if pass {
				c.inflight++
			}
			c.mu.Unlock()
			if pass && !c.ch.deliverStream(c, e) {
				return
			}
			buf[i] = stream.Entry{}
		}
		c.commit()
	}
}

// matches applies x-stream-filter / x-stream-match-unfiltered (exactly, per message: RabbitMQ's
// chunk-level Bloom filter needs clients to filter again; Warren does not).
func (c *streamConsumer) matches(fv string) bool {
	if len(c.filters) == 0 {
		return true
	}
	if fv == "" {
		return c.matchUnfiltered
	}
	return c.filters[fv]
}

// acked marks deliveries acknowledged: credit returns and the stored offset may move.
func (c *streamConsumer) ack(offsets []uint64) {
	c.mu.Lock()
	c.inflight -= int64(len(offsets))
	if c.name != "" {
		for _, o := range offsets {
			c.acked[o] = true
		}
	}
	c.mu.Unlock()
	c.commit()
	c.wake()
}

// commit stores the highest contiguous acked offset under the consumer's name.
func (c *streamConsumer) commit() {
	if c.name == "" {
		return
	}
	c.mu.Lock()
	moved := false
	n := 0
	for n < len(c.track) && c.acked[c.track[n]] {
		delete(c.acked, c.track[n])
		c.committed, c.hasCommit = c.track[n], true
		moved = true
		n++
	}
	c.track = append(c.track[:0], c.track[n:]...)
	off := c.committed
	c.mu.Unlock()
	if moved {
		c.sq.log.StoreOffset(c.name, off)
	}
}

// consumeStream attaches a stream consumer: RabbitMQ's rules for streams over AMQP 0-9-1 plus named,
// server-side offsets (x-stream-consumer-name).
func (ch *channel) consumeStream(m *amqp.BasicConsume, e *queueEntry, tag string) *amqp.Error {
	c := ch.c
	sq := e.stream
	if m.NoAck {
		return amqp.Errorf(amqp.NotImplemented, "automatic acknowledgement not supported by stream queues queue '%s' in vhost '%s'", e.name, c.vhost.name)
	}
	if ch.prefetch == 0 {
		return amqp.Errorf(amqp.PreconditionFailed, "consumer prefetch count is not set for 'queue '%s' in vhost '%s''", e.name, c.vhost.name)
	}
	if ch.globalLimit.Load() > 0 {
		return amqp.Errorf(amqp.NotImplemented, "queue '%s' in vhost '%s' does not support global qos", e.name, c.vhost.name)
	}
	sc := &streamConsumer{sq: sq, ch: ch, tag: tag, prefetch: int64(ch.prefetch),
		acked: make(map[uint64]bool),
		kick:  make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	if v, ok := m.Arguments["x-stream-consumer-name"]; ok {
		switch v := v.(type) {
		case string:
			sc.name = v
		case []byte:
			sc.name = string(v)
		default:
			return amqp.Errorf(amqp.PreconditionFailed, "invalid arg 'x-stream-consumer-name' for queue '%s' in vhost '%s': must be a string", e.name, c.vhost.name)
		}
	}
	switch f := m.Arguments["x-stream-filter"].(type) {
	case nil:
	case string:
		sc.filters = map[string]bool{f: true}
	case []byte:
		sc.filters = map[string]bool{string(f): true}
	case []any:
		sc.filters = make(map[string]bool)
		for _, x := range f {
			switch x := x.(type) {
			case string:
				sc.filters[x] = true
			case []byte:
				sc.filters[string(x)] = true
			}
		}
	default:
		return amqp.Errorf(amqp.PreconditionFailed, "invalid arg 'x-stream-filter' for queue '%s' in vhost '%s'", e.name, c.vhost.name)
	}
	if b, ok := m.Arguments["x-stream-match-unfiltered"].(bool); ok {
		sc.matchUnfiltered = b
	}
	now := time.Now()
	spec, explicit := m.Arguments["x-stream-offset"]
	switch {
	case explicit:
		off, err := sq.log.ParseOffsetSpec(spec, now)
		if err != nil {
			return amqp.Errorf(amqp.PreconditionFailed, "invalid arg 'x-stream-offset' for queue '%s' in vhost '%s': {invalid_stream_offset_arg,{%s,%s}}",
				e.name, c.vhost.name, amqp.TypeName(spec), erlangValue(spec))
		}
		sc.next = off
	case sc.name != "":
		if stored, ok := sq.log.LoadOffset(sc.name); ok {
			sc.next = stored + 1
			sc.committed, sc.hasCommit = stored, true
			c.log.Info("named stream consumer resumes", "stream", e.name, "consumer", sc.name,
				"offset", sc.next, "lag", int64(sq.log.Next())-int64(sc.next))
		} else {
			sc.next = sq.log.Next()
		}
	default:
		sc.next = sq.log.Next()
	}
	if first := sq.log.First(); sc.next < first {
		sc.next = first
	}
	cs := &consumer{ch: ch, tag: tag, entry: e, stream: sc}
	ch.mu.Lock()
	ch.addConsumerLocked(tag, cs)
	ch.mu.Unlock()
	sq.mu.Lock()
	if sq.closed {
		sq.mu.Unlock()
		ch.mu.Lock()
		delete(ch.consumers, tag)
		ch.mu.Unlock()
		return ch.queueNotFound(e.name)
	}
	sq.consumers[sc] = struct{}{}
	sq.mu.Unlock()
	if !m.NoWait {
		c.out.sendMethod(ch.id, &amqp.BasicConsumeOk{ConsumerTag: tag})
	}
	go sc.run()
	return nil
}

// erlangValue renders a value as RabbitMQ's error texts do (<<"text">> for strings).
func erlangValue(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("<<%q>>", v)
	case []byte:
		return fmt.Sprintf("<<%q>>", string(v))
	}
	return fmt.Sprint(v)
}

// deliverStream writes one stream entry to the client, with its offset in the x-stream-offset header.
// It returns false when the channel or consumer is gone.
func (ch *channel) deliverStream(sc *streamConsumer, e *stream.Entry) bool {
	msg := &queue.Message{Exchange: e.Exchange, RoutingKey: e.RoutingKey, Props: withHeader(e.Props, "x-stream-offset", int64(e.Offset)), Body: e.Body}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	cs := ch.consumers[sc.tag]
	if ch.closed || cs == nil || cs.stream != sc {
		return false
	}
	ch.nextTag++
	ch.unacked.push(unackedEntry{tag: ch.nextTag, id: e.Offset, sc: sc})
	ch.writeDelivery(sc.tag, ch.nextTag, false, msg)
	return true
}

// detachStream stops a stream consumer (cancel or channel close).
func (sc *streamConsumer) detach() {
	sq := sc.sq
	sq.mu.Lock()
	delete(sq.consumers, sc)
	sq.mu.Unlock()
	sc.stop()
	sc.commit()
}

// serverCancelStream tells the client its stream consumer is gone (stream deleted).
func (ch *channel) serverCancelStream(sc *streamConsumer) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	cs := ch.consumers[sc.tag]
	if ch.closed || cs == nil || cs.stream != sc {
		return
	}
	cs.cancelled = true
	delete(ch.consumers, sc.tag)
	ch.notifyCancelLocked(sc.tag)
}

// settleStream takes the stream deliveries out of entries and acknowledges them (acks are credit).
// Streams refuse nack and reject, as RabbitMQ does, with a connection error.
func (ch *channel) settleStream(entries []unackedEntry, kind uint16) ([]unackedEntry, *amqp.Error) {
	rest := entries[:0]
	var byConsumer map[*streamConsumer][]uint64
	for _, e := range entries {
		if e.sc == nil {
			rest = append(rest, e)
			continue
		}
		if kind != 80 {
			return nil, amqp.Errorf(amqp.NotImplemented, "basic.nack and basic.reject not supported by stream queues queue '%s' in vhost '%s'",
				e.sc.sq.name, ch.c.vhost.name)
		}
		if byConsumer == nil {
			byConsumer = make(map[*streamConsumer][]uint64)
		}
		byConsumer[e.sc] = append(byConsumer[e.sc], e.id)
	}
	for sc, offs := range byConsumer {
		sc.ack(offs)
	}
	return rest, nil
}
