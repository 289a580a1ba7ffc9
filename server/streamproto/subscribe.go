package streamproto

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"warren/server/auth"
	"warren/server/stats"
	"warren/server/streamproto/wire"
	"warren/stream"
	"warren/stream/osiris"
	"warren/stream/replica"
)

// subscription is one subscribe: a goroutine that reads committed chunks from the stream's log
// from its offset while it has credit (one credit, one chunk) and sends each as stored.
type subscription struct {
	c       *conn
	id      uint8
	stream  string
	log     *stream.Log
	rep     *replica.Replica
	filters [][]byte
	unfilt  bool // match-unfiltered
	name    string
	sac     *sacMember // single active consumer; nil for a plain subscription

	credit atomic.Int64
	active atomic.Bool // false while a single active consumer waits for its turn

	mu   sync.Mutex
	next uint64 // the next offset to read (set before the goroutine starts or while inactive)

	kick    chan struct{} // capacity 1
	quit    chan struct{}
	stopped atomic.Bool
	once    sync.Once
	started atomic.Bool
	hdr     []byte // deliver frame headers, reused (the writer may still hold older ones: see send)
}

func (s *subscription) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *subscription) stop() {
	s.once.Do(func() {
		s.stopped.Store(true)
		close(s.quit)
	})
}

// resolve turns an offset specification into the first offset to read.
func resolve(l *stream.Log, spec wire.OffsetSpec) uint64 {
	switch spec.Type {
	case wire.OffsetTypeFirst:
		return l.First()
	case wire.OffsetTypeLast:
		return l.LastChunk()
	case wire.OffsetTypeOffset:
		return max(spec.Value, l.First())
	case wire.OffsetTypeTimestamp:
		return l.OffsetAt(spec.Timestamp())
	}
	return l.Next()
}

func (c *conn) subscribe(frame []byte) error {
	var m wire.Subscribe
	if err := m.Decode(frame); err != nil {
		return err
	}
	code := c.subscribeCode(&m)
	var s *subscription
	if code == wire.ResponseCodeOK {
		c.mu.Lock()
		s = c.subs[m.SubscriptionID]
		c.mu.Unlock()
	}
	// A single active consumer joins its group before the answer, so that the member it takes
	// over from (on this node) is told to step down first, as RabbitMQ does.
	if s != nil && s.sac != nil && !c.joinGroup(s) {
		c.mu.Lock()
		delete(c.subs, m.SubscriptionID)
		c.mu.Unlock()
		s.stop()
		s, code = nil, wire.ResponseCodeInternalError
	}
	c.respond(wire.CommandSubscribe, m.CorrelationID, code)
	if s != nil {
		if s.sac != nil {
			s.sac.respondedOK()
		} else {
			c.startSubscription(s)
		}
	}
	return nil
}

// subscribeCode checks in RabbitMQ's order: read permission, the stream, the subscription id.
func (c *conn) subscribeCode(m *wire.Subscribe) wire.ResponseCode {
	sq, code := c.readableStream(m.Stream)
	if code != wire.ResponseCodeOK {
		return code
	}
	c.mu.Lock()
	_, dup := c.subs[m.SubscriptionID]
	c.mu.Unlock()
	if dup {
		return wire.ResponseCodeSubscriptionIDAlreadyExists
	}
	rep := sq.Replica()
	s := &subscription{c: c, id: m.SubscriptionID, stream: m.Stream, log: rep.Log(), rep: rep,
		kick: make(chan struct{}, 1), quit: make(chan struct{})}
	s.credit.Store(int64(m.Credit))
	var superStream string
	sacOn := false
	for _, p := range m.Properties {
		switch {
		case strings.HasPrefix(p.Key, "filter."):
			s.filters = append(s.filters, []byte(p.Value))
		case p.Key == "match-unfiltered":
			s.unfilt = p.Value == "true"
		case p.Key == "name":
			s.name = p.Value
		case p.Key == "single-active-consumer":
			sacOn = p.Value == "true"
		case p.Key == "super-stream":
			superStream = p.Value
		}
	}
	if sacOn {
		if s.name == "" {
			return wire.ResponseCodePreconditionFailed
		}
		s.sac = &sacMember{sub: s, superStream: superStream, start: -1}
	}
	s.next = resolve(s.log, m.Offset)
	c.mu.Lock()
	c.subs[m.SubscriptionID] = s
	c.mu.Unlock()
	return wire.ResponseCodeOK
}

// startSubscription starts delivering.
func (c *conn) startSubscription(s *subscription) {
	s.active.Store(true)
	if s.started.Swap(true) {
		s.wake()
		return
	}
	c.s.net.Go(s.run)
}

// stopSubscription stops a subscription's goroutine (without waiting) and leaves its group.
func (c *conn) stopSubscription(s *subscription) {
	s.stop()
	c.out.kick()
	if s.sac != nil {
		s.sac.leave()
	}
}

func (c *conn) credit(frame []byte) error {
	var m wire.Credit
	if err := m.Decode(frame); err != nil {
		return err
	}
	c.mu.Lock()
	s := c.subs[m.SubscriptionID]
	c.mu.Unlock()
	if s == nil {
		c.write(&wire.CreditResponse{Code: wire.ResponseCodeSubscriptionIDDoesNotExist, SubscriptionID: m.SubscriptionID})
		return nil
	}
	s.credit.Add(int64(m.Credit))
	s.wake()
	return nil
}

func (c *conn) unsubscribe(frame []byte) error {
	var m wire.Unsubscribe
	if err := m.Decode(frame); err != nil {
		return err
	}
	c.mu.Lock()
	s := c.subs[m.SubscriptionID]
	delete(c.subs, m.SubscriptionID)
	c.mu.Unlock()
	if s == nil {
		c.respond(wire.CommandUnsubscribe, m.CorrelationID, wire.ResponseCodeSubscriptionIDDoesNotExist)
		return nil
	}
	c.stopSubscription(s)
	c.respond(wire.CommandUnsubscribe, m.CorrelationID, wire.ResponseCodeOK)
	return nil
}

// run is the subscription's goroutine.
func (s *subscription) run() {
	c := s.c
	limit := c.s.cfg.OutboundBytes
	for {
		if s.stopped.Load() {
			return
		}
		if s.credit.Load() <= 0 || !s.active.Load() {
			select {
			case <-s.quit:
				return
			case <-c.quit:
				return
			case <-s.kick:
			}
			continue
		}
		s.mu.Lock()
		from := s.next
		s.mu.Unlock()
		dc, ok, err := s.log.ReadDeliveryChunk(from, c.sendfile)
		if err != nil {
			if errors.Is(err, stream.ErrClosed) {
				c.streamGoneFromSub(s)
				return
			}
			c.log.Error("stream read failed", "stream", s.stream, "offset", from, "err", err)
			select {
			case <-s.quit:
				return
			case <-time.After(time.Second):
			}
			continue
		}
		if !ok {
			select {
			case <-s.quit:
				return
			case <-c.quit:
				return
			case <-s.kick:
			case <-s.log.Wait(from):
			}
			continue
		}
		s.mu.Lock()
		if s.next != from { // moved meanwhile (a consumer update)
			s.mu.Unlock()
			continue
		}
		s.next = dc.Next
		s.mu.Unlock()
		if len(s.filters) > 0 && !osiris.BloomMatch(dc.Bloom(), s.filters, s.unfilt) {
			dc.Release()
			continue
		}
		if !c.out.waitRoom(limit, s.stopped.Load) {
			dc.Release()
			return
		}
		if !s.active.Load() {
			// Stepped down while waiting: read this chunk again once active.
			dc.Release()
			s.mu.Lock()
			if s.next == dc.Next {
				s.next = from
			}
			s.mu.Unlock()
			continue
		}
		s.credit.Add(-1)
		s.send(&dc)
	}
}

// send writes one deliver frame: its header, then the chunk's header and data by reference (the
// chunk is released once written).
func (s *subscription) send(dc *stream.DeliveryChunk) {
	c := s.c
	version := wire.Version1
	var committed uint64
	if c.deliverV2 {
		version = wire.Version2
		committed = s.log.LastChunk()
	}
	c.s.counters.Add(stats.DeliveredNoAck, dc.Next-dc.First)
	// A new header slice per frame: the writer holds it until written.
	hdr := wire.AppendDeliverHeader(make([]byte, 0, wire.DeliverHeaderSize(version)), version, s.id, committed,
		uint32(osiris.HeaderSize+int(dc.Header.DataLength)))
	if dc.File != nil {
		c.out.sendFileThen(dc.Release, dc.File, dc.FileOffset, int(dc.Header.DataLength), hdr, dc.Chunk[:osiris.HeaderSize])
		return
	}
	c.out.sendPartsThen(dc.Release, hdr, dc.Chunk[:osiris.HeaderSize], dc.Data())
}

// streamGoneFromSub handles a subscription's stream closing under it (deleted).
func (c *conn) streamGoneFromSub(s *subscription) {
	if c.stepOpened() && !s.stopped.Load() {
		if v := c.vhostName.Load(); v != nil {
			c.streamGone(*v, s.stream)
		}
	}
}

// streamGone drops the publishers and subscriptions of a deleted stream and tells the client
// with metadata_update (stream_not_available), once.
func (c *conn) streamGone(vhost, name string) {
	if v := c.vhostName.Load(); v == nil || *v != vhost {
		return
	}
	c.mu.Lock()
	var subs []*subscription
	for id, s := range c.subs {
		if s.stream == name {
			subs = append(subs, s)
			delete(c.subs, id)
		}
	}
	found := len(subs) > 0
	for id, p := range c.publishers {
		if p.stream == name {
			delete(c.publishers, id)
			found = true
		}
	}
	c.mu.Unlock()
	for _, s := range subs {
		c.stopSubscription(s)
	}
	if found {
		b, err := (&wire.MetadataUpdate{Code: wire.ResponseCodeStreamNotAvailable, Stream: name}).Append(nil)
		if err == nil {
			c.out.send(b)
		}
	}
}

func (c *conn) storeOffset(frame []byte) error {
	var m wire.StoreOffset
	if err := m.Decode(frame); err != nil {
		return err
	}
	sq, ok := c.streamQueue(m.Stream)
	if !ok || m.Reference == "" || !c.allowed(auth.Read, m.Stream) {
		return nil // no response, as RabbitMQ
	}
	sq.Replica().StoreOffset(m.Reference, m.Offset)
	return nil
}

func (c *conn) queryOffset(frame []byte) error {
	var m wire.QueryOffset
	if err := m.Decode(frame); err != nil {
		return err
	}
	resp := &wire.QueryOffsetResponse{CorrelationID: m.CorrelationID, Code: wire.ResponseCodeOK}
	sq, code := c.readableStream(m.Stream)
	if code != wire.ResponseCodeOK {
		resp.Code = code
	} else {
		off, found := sq.Replica().LoadOffset(m.Reference)
		if !found {
			resp.Code = wire.ResponseCodeNoOffset
		}
		resp.Offset = off
	}
	c.write(resp)
	return nil
}

func (c *conn) resolveOffsetSpec(frame []byte) error {
	var m wire.ResolveOffsetSpec
	if err := m.Decode(frame); err != nil {
		return err
	}
	resp := &wire.ResolveOffsetSpecResponse{CorrelationID: m.CorrelationID, Code: wire.ResponseCodeOK, OffsetType: wire.OffsetTypeOffset}
	sq, code := c.readableStream(m.Stream)
	if code != wire.ResponseCodeOK {
		resp.Code = code
	} else {
		resp.Offset = resolve(sq.Replica().Log(), m.Offset)
	}
	c.write(resp)
	return nil
}
