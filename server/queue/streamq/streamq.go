// Package streamq is the stream queue type (x-queue-type=stream) behind the queue-type interface:
// publishing appends to the stream's log (stream.Log) and consuming is a read from an offset, with
// RabbitMQ's rules for streams over AMQP 0-9-1: manual acks only, a prefetch that acts as credit,
// x-stream-offset, filters, and server-side named offsets (x-stream-consumer-name). Nothing is
// removed on ack; retention removes whole old segments.
package streamq

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"warren/amqp"
	"warren/server/queue"
	"warren/stream"
)

// Type opens stream queues.
type Type struct{}

// Kind implements queue.Type.
func (Type) Kind() string { return "stream" }

// Open implements queue.Type: it opens (or creates) the stream's log. Retention comes from the
// queue's arguments (x-max-length-bytes, x-max-age, x-stream-max-segment-size-bytes), which the
// core has validated.
func (Type) Open(cfg queue.OpenConfig) (queue.Queue, error) {
	maxBytes := cfg.Lifecycle.MaxLengthBytes
	if maxBytes < 0 {
		maxBytes = 0 // the lifecycle config uses -1 for "none"; the log uses 0
	}
	var maxAge time.Duration
	if s, ok := stringArg(cfg.Args["x-max-age"]); ok {
		if d, err := stream.ParseMaxAge(s); err == nil {
			maxAge = d
		}
	}
	seg, _ := amqp.AsInt64(cfg.Args["x-stream-max-segment-size-bytes"])
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	l, err := stream.Open(cfg.DB, cfg.ID, stream.Options{
		MaxLengthBytes:  maxBytes,
		MaxAge:          maxAge,
		MaxSegmentBytes: seg,
		Logger:          logger.With("stream", cfg.Name),
	})
	if err != nil {
		return nil, fmt.Errorf("open stream '%s' in vhost '%s': %w", cfg.Name, cfg.VHost, err)
	}
	return &Queue{name: cfg.Name, vhost: cfg.VHost, log: l, logger: logger, cursors: make(map[queue.ConsumerID]*cursor)}, nil
}

func stringArg(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return "", false
}

// Queue is a stream queue.
type Queue struct {
	name, vhost string
	log         *stream.Log
	logger      *slog.Logger

	mu      sync.Mutex
	cursors map[queue.ConsumerID]*cursor // attached, and cancelled ones with deliveries unacked
	closed  bool
}

// Name implements queue.Queue.
func (q *Queue) Name() string { return q.name }

// Kind implements queue.Queue.
func (q *Queue) Kind() string { return "stream" }

// Log is the stream's log.
func (q *Queue) Log() *stream.Log { return q.log }

// Publish implements queue.Queue: the record is appended to the log's open chunk; done runs once
// the chunk holding it is written.
func (q *Queue) Publish(msg *queue.Message, done queue.Done) queue.PublishStatus {
	q.mu.Lock()
	closed := q.closed
	q.mu.Unlock()
	if closed {
		if done != nil {
			done.Done(queue.ErrGone)
		}
		return queue.Gone
	}
	rec := stream.Record{Exchange: msg.Exchange, RoutingKey: msg.RoutingKey, Props: msg.Props, Body: msg.Body, FilterValue: msg.FilterValue}
	var cb func(uint64, error)
	if done != nil {
		cb = func(_ uint64, err error) { done.Done(err) }
	}
	q.log.Append([]stream.Record{rec}, cb)
	return queue.Accepted
}

func (q *Queue) errorf(code uint16, format string) *amqp.Error {
	return amqp.Errorf(code, format, q.name, q.vhost)
}

// Consume implements queue.Queue.
func (q *Queue) Consume(spec queue.ConsumeSpec, c queue.Consumer) error {
	if spec.NoAck {
		return q.errorf(amqp.NotImplemented, "automatic acknowledgement not supported by stream queues queue '%s' in vhost '%s'")
	}
	if spec.Prefetch == 0 {
		return q.errorf(amqp.PreconditionFailed, "consumer prefetch count is not set for 'queue '%s' in vhost '%s''")
	}
	if spec.GlobalPrefetch > 0 {
		return q.errorf(amqp.NotImplemented, "queue '%s' in vhost '%s' does not support global qos")
	}
	cur := &cursor{q: q, c: c, id: spec.ID, tag: spec.Tag, prefetch: int64(spec.Prefetch), acked: make(map[uint64]bool),
		kick: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	args := spec.Args
	if v, ok := args["x-stream-consumer-name"]; ok {
		name, isStr := stringArg(v)
		if !isStr {
			return q.errorf(amqp.PreconditionFailed, "invalid arg 'x-stream-consumer-name' for queue '%s' in vhost '%s': must be a string")
		}
		cur.name = name
	}
	switch f := args["x-stream-filter"].(type) {
	case nil:
	case string:
		cur.filters = map[string]bool{f: true}
	case []byte:
		cur.filters = map[string]bool{string(f): true}
	case []any:
		cur.filters = make(map[string]bool)
		for _, x := range f {
			if s, ok := stringArg(x); ok {
				cur.filters[s] = true
			}
		}
	default:
		return q.errorf(amqp.PreconditionFailed, "invalid arg 'x-stream-filter' for queue '%s' in vhost '%s'")
	}
	if b, ok := args["x-stream-match-unfiltered"].(bool); ok {
		cur.matchUnfiltered = b
	}
	l := q.log
	spec0, explicit := args["x-stream-offset"]
	switch {
	case explicit:
		off, err := l.ParseOffsetSpec(spec0, time.Now())
		if err != nil {
			return amqp.Errorf(amqp.PreconditionFailed, "invalid arg 'x-stream-offset' for queue '%s' in vhost '%s': {invalid_stream_offset_arg,{%s,%s}}",
				q.name, q.vhost, amqp.TypeName(spec0), erlangValue(spec0))
		}
		cur.next = off
	case cur.name != "":
		if stored, ok := l.LoadOffset(cur.name); ok {
			cur.next = stored + 1
			cur.committed, cur.hasCommit = stored, true
			q.logger.Info("named stream consumer resumes", "stream", q.name, "consumer", cur.name,
				"offset", cur.next, "lag", int64(l.Next())-int64(cur.next))
		} else {
			cur.next = l.Next()
		}
	default:
		cur.next = l.Next()
	}
	if first := l.First(); cur.next < first {
		cur.next = first
	}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return queue.ErrGone
	}
	q.cursors[spec.ID] = cur
	q.mu.Unlock()
	if spec.OnAdded != nil {
		spec.OnAdded()
	}
	go cur.run()
	return nil
}

// erlangValue renders a value as RabbitMQ's error texts do (<<"text">> for strings).
func erlangValue(v any) string {
	if s, ok := stringArg(v); ok {
		return fmt.Sprintf("<<%q>>", s)
	}
	return fmt.Sprint(v)
}

// Cancel implements queue.Queue: the cursor stops reading; it stays known until its deliveries
// are acknowledged, so their acks still move its stored offset.
func (q *Queue) Cancel(id queue.ConsumerID) bool {
	q.mu.Lock()
	cur := q.cursors[id]
	if cur != nil && cur.idle() {
		delete(q.cursors, id)
	}
	q.mu.Unlock()
	if cur != nil {
		cur.stop()
		cur.commit()
	}
	return false
}

// Settle implements queue.Queue: acks are credit and move the named offset. Streams refuse nack
// and reject, as RabbitMQ does, with a connection error.
func (q *Queue) Settle(id queue.ConsumerID, op queue.SettleOp, tags []queue.Tag) error {
	if op != queue.SettleAck {
		return q.errorf(amqp.NotImplemented, "basic.nack and basic.reject not supported by stream queues queue '%s' in vhost '%s'")
	}
	q.mu.Lock()
	cur := q.cursors[id]
	q.mu.Unlock()
	if cur == nil {
		return nil
	}
	if cur.ack(tags) {
		q.mu.Lock()
		if q.cursors[id] == cur {
			delete(q.cursors, id)
		}
		q.mu.Unlock()
	}
	return nil
}

// Get implements queue.Queue: streams have no basic.get.
func (q *Queue) Get(bool) (queue.Delivery, int, bool, error) {
	return queue.Delivery{}, 0, false, q.errorf(amqp.NotImplemented, "basic.get not supported by stream queues queue '%s' in vhost '%s'")
}

// Purge implements queue.Queue: streams cannot be purged.
func (q *Queue) Purge() (int, error) {
	return 0, q.errorf(amqp.NotImplemented, "queue.purge not supported by stream queues queue '%s' in vhost '%s'")
}

// Delete implements queue.Queue: the log and its data go; consumers are told.
func (q *Queue) Delete() int {
	for _, cur := range q.stopAll() {
		cancelled := cur.cancelled()
		cur.stop()
		if !cancelled {
			cur.c.Cancelled(q, queue.CancelDeleted)
		}
	}
	if err := q.log.Delete(); err != nil {
		q.logger.Error("cannot delete stream data", "stream", q.name, "err", err)
	}
	return 0
}

// Close implements queue.Queue.
func (q *Queue) Close() {
	for _, cur := range q.stopAll() {
		cur.stop()
	}
	q.log.Close()
}

func (q *Queue) stopAll() []*cursor {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	out := make([]*cursor, 0, len(q.cursors))
	for _, c := range q.cursors {
		out = append(out, c)
	}
	clear(q.cursors)
	return out
}

// Stats implements queue.Queue: a stream reports no ready messages (as RabbitMQ's queue counters)
// and its log's figures.
func (q *Queue) Stats() queue.Stats {
	q.mu.Lock()
	n := 0
	for _, c := range q.cursors {
		if !c.cancelled() {
			n++
		}
	}
	q.mu.Unlock()
	records, bytes, segs := q.log.Stats()
	st := queue.Stats{Consumers: n, Messages: records, Segments: segs, Bytes: bytes, FirstOffset: q.log.First()}
	if next := q.log.Next(); next > 0 {
		st.LastOffset = next - 1
	}
	return st
}

// DeclareCounts implements queue.DeclareCounter: 0 and 0, as RabbitMQ answers for a stream.
func (q *Queue) DeclareCounts() (int, int) { return 0, 0 }

// Kick implements queue.Queue: every cursor looks for room again.
func (q *Queue) Kick() {
	q.mu.Lock()
	for _, c := range q.cursors {
		c.Kick()
	}
	q.mu.Unlock()
}

// Touch implements queue.Queue (streams have no x-expires).
func (q *Queue) Touch() {}

// cursor reads a stream for one consumer. Its goroutine reads from the log while it has credit
// (prefetch minus unacknowledged deliveries) and its connection has room, so acks are credit as in
// RabbitMQ.
type cursor struct {
	q               *Queue
	c               queue.Consumer
	id              queue.ConsumerID
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
	stopped   bool

	kick chan struct{}
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

// Kick implements queue.Kicker: the consumer has room again.
func (c *cursor) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *cursor) stop() {
	c.once.Do(func() {
		c.mu.Lock()
		c.stopped = true
		c.mu.Unlock()
		close(c.quit)
	})
	<-c.done
}

func (c *cursor) cancelled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopped
}

// idle reports whether the cursor has nothing unacknowledged (q.mu held; c.mu is taken).
func (c *cursor) idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inflight == 0
}

// run is the cursor's reader goroutine.
func (c *cursor) run() {
	defer close(c.done)
	l := c.q.log
	var buf []stream.Entry
	for {
		c.mu.Lock()
		credit := c.prefetch - c.inflight
		from := c.next
		c.mu.Unlock()
		if credit <= 0 || !c.c.HasRoom(c) {
			select {
			case <-c.quit:
				return
			case <-c.kick:
			}
			continue
		}
		var err error
		buf, err = l.Read(buf[:0], from, int(credit))
		if err != nil {
			c.q.logger.Error("stream read failed", "stream", c.q.name, "offset", from, "err", err)
			select {
			case <-c.quit:
				return
			case <-time.After(time.Second):
			}
			continue
		}
		if len(buf) == 0 {
			if first := l.First(); from < first {
				c.mu.Lock()
				c.next = first
				c.mu.Unlock()
				continue
			}
			select {
			case <-c.quit:
				return
			case <-l.Wait(from):
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
			if pass {
				msg := &queue.Message{Exchange: e.Exchange, RoutingKey: e.RoutingKey,
					Props: amqp.WithHeader(e.Props, "x-stream-offset", int64(e.Offset)), Body: e.Body}
				if !c.c.Deliver(c.q, queue.Delivery{Consumer: c.id, ID: e.Offset, Msg: msg}) {
					return
				}
			}
			buf[i] = stream.Entry{}
		}
		c.commit()
	}
}

// matches applies x-stream-filter / x-stream-match-unfiltered (exactly, per message: RabbitMQ's
// chunk-level Bloom filter needs clients to filter again; Warren does not).
func (c *cursor) matches(fv string) bool {
	if len(c.filters) == 0 {
		return true
	}
	if fv == "" {
		return c.matchUnfiltered
	}
	return c.filters[fv]
}

// ack marks deliveries acknowledged: credit returns and the stored offset may move. It reports
// whether a cancelled cursor has nothing left unacknowledged.
func (c *cursor) ack(tags []queue.Tag) bool {
	c.mu.Lock()
	c.inflight -= int64(len(tags))
	if c.name != "" {
		for _, t := range tags {
			c.acked[t.ID] = true
		}
	}
	done := c.stopped && c.inflight <= 0
	c.mu.Unlock()
	c.commit()
	c.Kick()
	return done
}

// commit stores the highest contiguous acked offset under the consumer's name.
func (c *cursor) commit() {
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
		c.q.log.StoreOffset(c.name, off)
	}
}
