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
	"sync/atomic"
	"time"

	"warren/amqp"
	"warren/server/queue"
	"warren/stream"
	"warren/stream/replica"
)

// Type opens stream queues.
type Type struct{}

// Kind implements queue.Type.
func (Type) Kind() string { return "stream" }

// Replication is what Open needs to open a replicated stream: the core passes one in
// OpenConfig.Extra (its type is the core's; streamq reads it through this interface).
type Replication interface {
	ReplicaConfig() replica.Config
}

// Open implements queue.Type: it opens (or creates) the stream's log and this node's replica.
// Retention comes from the queue's arguments (x-max-length-bytes, x-max-age,
// x-stream-max-segment-size-bytes), which the core has validated. With cfg.Extra a Replication
// the stream is replicated; without, it is a stream of this node alone (streams declared before
// replication existed).
func (Type) Open(cfg queue.OpenConfig) (queue.Queue, error) {
	maxBytes, maxAge := retention(cfg)
	seg, _ := amqp.AsInt64(cfg.Args["x-stream-max-segment-size-bytes"])
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("stream", cfg.Name, "vhost", cfg.VHost)
	repl, replicated := cfg.Extra.(Replication)
	var rep atomic.Pointer[replica.Replica]
	opts := stream.Options{
		Name:            cfg.Name,
		MaxLengthBytes:  maxBytes,
		MaxAge:          maxAge,
		MaxSegmentBytes: seg,
		Logger:          logger,
		Replicated:      replicated,
	}
	if replicated {
		opts.OnRetention = func(first uint64) {
			if r := rep.Load(); r != nil {
				r.Retain(first)
			}
		}
	}
	l, err := stream.Open(cfg.DB, cfg.ID, opts)
	if err != nil {
		return nil, fmt.Errorf("open stream '%s' in vhost '%s': %w", cfg.Name, cfg.VHost, err)
	}
	rc := replica.Config{Logger: logger}
	if replicated {
		rc = repl.ReplicaConfig()
		rc.Logger = logger
	}
	rc.Log = l
	r := replica.New(rc)
	rep.Store(r)
	return &Queue{name: cfg.Name, vhost: cfg.VHost, log: l, rep: r, logger: logger, cursors: make(map[queue.ConsumerID]*cursor)}, nil
}

// retention is x-max-length-bytes and x-max-age of cfg (0: none), from the lifecycle settings and
// the arguments, where the core has merged a policy's settings.
func retention(cfg queue.OpenConfig) (maxBytes int64, maxAge time.Duration) {
	maxBytes = max(cfg.Lifecycle.MaxLengthBytes, 0) // the lifecycle config uses -1 for "none"; the log uses 0
	if s, ok := stringArg(cfg.Args["x-max-age"]); ok {
		if d, err := stream.ParseMaxAge(s); err == nil {
			maxAge = d
		}
	}
	return maxBytes, maxAge
}

// Reconfigure implements core.Reconfigurer: a policy's max-length-bytes and max-age reach the
// running stream (every replica gets them; the writing one applies them, so retention stays one
// decision replicated to all). A changed stream-max-segment-size-bytes applies only when the stream
// is next opened.
func (q *Queue) Reconfigure(cfg queue.OpenConfig) error {
	maxBytes, maxAge := retention(cfg)
	q.log.SetRetention(maxBytes, maxAge)
	return nil
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
	log         *stream.Log      // this node's copy
	rep         *replica.Replica // its replication: publishes, named offsets
	logger      *slog.Logger

	mu      sync.Mutex
	cursors map[queue.ConsumerID]*cursor // attached, and cancelled ones with deliveries unacked
	closed  bool
}

// Name implements queue.Queue.
func (q *Queue) Name() string { return q.name }

// Kind implements queue.Queue.
func (q *Queue) Kind() string { return "stream" }

// Log is this node's copy of the stream's log.
func (q *Queue) Log() *stream.Log { return q.log }

// Replica is this node's replica of the stream.
func (q *Queue) Replica() *replica.Replica { return q.rep }

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
	rec := stream.Record{Exchange: msg.Exchange, RoutingKey: msg.RoutingKey, Props: msg.Props, Body: msg.Body,
		FilterValue: msg.FilterValue, PublisherID: msg.PublisherID, PublishingID: msg.PublishingID}
	var cb func(error)
	if done != nil {
		cb = done.Done
	}
	q.rep.Publish([]stream.Record{rec}, cb)
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
	q.mu.Lock()
	cur := q.cursors[id]
	q.mu.Unlock()
	if op != queue.SettleAck {
		if cur != nil && cur.onIdle != nil {
			// A consumer group member's deliveries given back (its channel closed, or a nack that
			// closes its connection): they no longer count as held, nothing is committed.
			if cur.abandon(tags) {
				q.forget(id, cur)
			}
		}
		return q.errorf(amqp.NotImplemented, "basic.nack and basic.reject not supported by stream queues queue '%s' in vhost '%s'")
	}
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
	if err := q.rep.Delete(); err != nil {
		q.logger.Error("cannot delete stream data", "stream", q.name, "err", err)
	}
	return 0
}

// Close implements queue.Queue.
func (q *Queue) Close() {
	for _, cur := range q.stopAll() {
		cur.stop()
	}
	q.rep.Close()
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
// RabbitMQ. Once it has used its credit it waits until acks return a quarter of the prefetch
// (refill), so that a consumer acking one message at a time gets its next deliveries in runs
// rather than one per ack: one wakeup of the cursor and one write to the socket per run. The
// consumer still holds the other three quarters meanwhile. RabbitMQ is coarser: it delivers a
// stream to an AMQP 0-9-1 consumer a whole chunk at a time.
type cursor struct {
	q               *Queue
	c               queue.Consumer
	id              queue.ConsumerID
	tag             string
	name            string // x-stream-consumer-name: offsets stored under it
	prefetch        int64
	filters         map[string]bool
	matchUnfiltered bool
	partition       string      // consumer groups: the x-stream-partition header ("" = none)
	onIdle          func(int64) // consumer groups: once paused and settled (committed offset, -1 none)
	start           uint64      // the first offset delivered

	mu        sync.Mutex
	next      uint64   // next offset to read
	inflight  int64    // delivered, not acked
	track     []uint64 // offsets handed out or skipped, oldest first, for the stored offset
	acked     map[uint64]bool
	committed uint64 // highest contiguous offset done (valid when hasCommit)
	hasCommit bool
	stopped   bool
	paused    bool // consumer groups: deliver nothing more (the partition is moving)
	idleFired bool

	kick chan struct{}
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

// refill is the credit a cursor that used all of its credit waits for (see cursor): a quarter of
// the prefetch, and 1 for a prefetch under 8, where runs would save little and a client may
// expect each ack to release the next message.
func (c *cursor) refill() int64 {
	if c.prefetch < 8 {
		return 1
	}
	return c.prefetch / 4
}

// hungry reports whether the cursor should read: it has at least refill credit, or nothing in
// flight (c.mu held).
func (c *cursor) hungry() bool {
	credit := c.prefetch - c.inflight
	return credit > 0 && (credit >= c.refill() || c.inflight <= 0)
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
		hungry := c.hungry()
		from := c.next
		paused := c.paused
		c.mu.Unlock()
		if paused || !hungry || !c.c.HasRoom(c) {
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
			if c.paused {
				c.mu.Unlock()
				break // the rest of the batch goes to the partition's next owner
			}
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
				props := amqp.WithHeader(e.Props, "x-stream-offset", int64(e.Offset))
				if c.partition != "" {
					props = amqp.WithHeader(props, "x-stream-partition", c.partition)
				}
				msg := &queue.Message{Exchange: e.Exchange, RoutingKey: e.RoutingKey, Props: props, Body: e.Body}
				if !c.c.Deliver(c.q, queue.Delivery{Consumer: c.id, ID: e.Offset, Msg: msg}) {
					return
				}
			}
			buf[i] = stream.Entry{}
		}
		clear(buf)
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

// forget drops a cursor that has nothing left unacknowledged.
func (q *Queue) forget(id queue.ConsumerID, cur *cursor) {
	q.mu.Lock()
	if q.cursors[id] == cur {
		delete(q.cursors, id)
	}
	q.mu.Unlock()
}

// abandon counts deliveries as no longer held without committing them (consumer groups). It
// reports whether a stopped cursor has nothing left unacknowledged.
func (c *cursor) abandon(tags []queue.Tag) bool {
	c.mu.Lock()
	c.inflight -= int64(len(tags)) // their offsets stay unacked: the committed offset stops before them
	done := c.stopped && c.inflight <= 0
	c.mu.Unlock()
	c.checkIdle()
	return done
}

// checkIdle calls onIdle once when a paused group cursor holds no delivery.
func (c *cursor) checkIdle() {
	if c.onIdle == nil {
		return
	}
	c.mu.Lock()
	fire := (c.paused || c.stopped) && c.inflight <= 0 && !c.idleFired
	if fire {
		c.idleFired = true
	}
	committed := int64(c.start) - 1
	if c.hasCommit {
		committed = int64(c.committed)
	}
	c.mu.Unlock()
	if fire {
		c.onIdle(committed)
	}
}

// ack marks deliveries acknowledged: credit returns and the stored offset may move. It reports
// whether a cancelled cursor has nothing left unacknowledged.
func (c *cursor) ack(tags []queue.Tag) bool {
	c.mu.Lock()
	was := c.hungry()
	c.inflight -= int64(len(tags))
	if c.name != "" {
		for _, t := range tags {
			c.acked[t.ID] = true
		}
	}
	wake := !was && c.hungry() // the cursor sleeps until then
	done := c.stopped && c.inflight <= 0
	c.mu.Unlock()
	c.commit()
	if wake {
		c.Kick()
	}
	c.checkIdle()
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
	// Drop the committed ones from the front without moving the rest: appends reallocate (and copy
	// only what is still tracked) when the array's end is reached, so an ack costs O(1) amortized
	// instead of a copy of up to the prefetch's offsets.
	c.track = c.track[n:]
	off := c.committed
	c.mu.Unlock()
	if moved {
		c.q.rep.StoreOffset(c.name, off)
	}
}

// GroupReader is a consumer group member's reader of one partition.
type GroupReader struct {
	q   *Queue
	cur *cursor
}

// ConsumeGroup reads the stream for a consumer group's member from g.Start: deliveries carry
// x-stream-partition (this stream's name) and x-stream-offset, and acks commit the named offset
// g.Group. spec.ID names the member (its deliveries are settled on this queue with it).
func (q *Queue) ConsumeGroup(spec queue.ConsumeSpec, c queue.Consumer, g queue.GroupSpec) (queue.GroupReader, error) {
	if spec.NoAck {
		return nil, q.errorf(amqp.NotImplemented, "automatic acknowledgement not supported by stream queues queue '%s' in vhost '%s'")
	}
	if spec.Prefetch == 0 {
		return nil, q.errorf(amqp.PreconditionFailed, "consumer prefetch count is not set for 'queue '%s' in vhost '%s''")
	}
	onIdle := g.OnIdle
	if onIdle == nil {
		onIdle = func(int64) {}
	}
	cur := &cursor{q: q, c: c, id: spec.ID, tag: spec.Tag, name: g.Group, prefetch: int64(spec.Prefetch), acked: make(map[uint64]bool),
		partition: q.name, onIdle: onIdle, start: g.Start, next: max(g.Start, q.log.First()),
		kick: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil, queue.ErrGone
	}
	if old := q.cursors[spec.ID]; old != nil {
		q.mu.Unlock()
		return nil, fmt.Errorf("stream '%s': consumer %d already reads it", q.name, spec.ID)
	}
	q.cursors[spec.ID] = cur
	q.mu.Unlock()
	go cur.run()
	return &GroupReader{q: q, cur: cur}, nil
}

// Pause stops delivering (the partition moves to another member); OnIdle follows once every
// delivery made is settled.
func (g *GroupReader) Pause() {
	g.cur.mu.Lock()
	g.cur.paused = true
	g.cur.mu.Unlock()
	g.cur.Kick()
	g.cur.checkIdle()
}

// Stop removes the reader: it reads no more; its unacknowledged deliveries still commit when
// acked.
func (g *GroupReader) Stop() {
	g.q.Cancel(g.cur.id)
	g.cur.checkIdle()
}

// Unacked is the number of deliveries not acknowledged yet.
func (g *GroupReader) Unacked() int64 {
	g.cur.mu.Lock()
	defer g.cur.mu.Unlock()
	return g.cur.inflight
}

// ResolveOffset implements queue.GroupPartition.
func (q *Queue) ResolveOffset(spec any) (uint64, error) {
	if spec == nil {
		return q.log.Next(), nil
	}
	off, err := q.log.ParseOffsetSpec(spec, time.Now())
	if err != nil {
		return 0, amqp.Errorf(amqp.PreconditionFailed, "invalid arg 'x-stream-offset' for queue '%s' in vhost '%s': {invalid_stream_offset_arg,{%s,%s}}",
			q.name, q.vhost, amqp.TypeName(spec), erlangValue(spec))
	}
	return off, nil
}

// CommittedOffset implements queue.GroupPartition.
func (q *Queue) CommittedOffset(name string) (uint64, bool) { return q.log.LoadOffset(name) }

// StoreCommitted implements queue.GroupPartition.
func (q *Queue) StoreCommitted(name string, offset uint64) { q.rep.StoreOffset(name, offset) }

// Committed is the highest contiguous acknowledged offset (Start-1 if none).
func (g *GroupReader) Committed() int64 {
	g.cur.mu.Lock()
	defer g.cur.mu.Unlock()
	if g.cur.hasCommit {
		return int64(g.cur.committed)
	}
	return int64(g.cur.start) - 1
}

// ConsumerInfos implements queue.ConsumerLister.
func (q *Queue) ConsumerInfos() []queue.ConsumerInfo {
	q.mu.Lock()
	curs := make([]*cursor, 0, len(q.cursors))
	for _, c := range q.cursors {
		curs = append(curs, c)
	}
	q.mu.Unlock()
	out := make([]queue.ConsumerInfo, 0, len(curs))
	for _, c := range curs {
		c.mu.Lock()
		out = append(out, queue.ConsumerInfo{Tag: c.tag, ID: c.id, Name: c.name, Offset: c.next, Unacked: c.inflight,
			Prefetch: c.prefetch, Active: !c.stopped && !c.paused})
		c.mu.Unlock()
	}
	return out
}
