package streamproto

import (
	"bytes"
	"errors"
	"time"

	"warren/server/auth"
	"warren/server/core"
	"warren/server/stats"
	"warren/server/streamproto/wire"
	"warren/stream"
	"warren/stream/replica"
)

// publisher is a declared publisher: its id on the connection, its reference (deduplication:
// the same table as AMQP 0-9-1's x-publisher-id) and its stream.
type publisher struct {
	id     uint8
	ref    string
	stream string
	rep    *replica.Replica
}

// streamQueue returns the stream called name in the connection's vhost.
func (c *conn) streamQueue(name string) (core.StreamQueue, bool) {
	q := c.vhost.Queue(name)
	if q == nil {
		return nil, false
	}
	sq, ok := q.Queue.(core.StreamQueue)
	return sq, ok
}

// allowed reports whether the user may perm the resource name. It reads the user's permissions
// as they are now, as RabbitMQ's stream reader asks its permission store at each command, so a
// change of permissions reaches open connections (publishers and subscriptions already made are
// kept, as there); the grant from open serves a front-end without a core.
func (c *conn) allowed(perm auth.Perm, name string) bool {
	g := c.grant
	if c.s.core != nil {
		g = c.s.core.VHostGrant(*c.user.Load(), c.vhost.Name())
	}
	return g != nil && g.Allows(perm, name)
}

// readsOrWrites reports whether the user may read or write name: what RabbitMQ 4.x asks of the
// commands producers and consumers both use to learn the topology (metadata, partitions).
func (c *conn) readsOrWrites(name string) bool {
	return c.allowed(auth.Read, name) || c.allowed(auth.Write, name)
}

// readableStream looks up a stream the connection reads from: its queue and ResponseCodeOK, or
// access_refused without read permission on it, or stream_does_not_exist. The permission comes
// first, as in RabbitMQ's stream reader, so that a user learns nothing about the existence of a
// stream it may not read.
func (c *conn) readableStream(name string) (core.StreamQueue, wire.ResponseCode) {
	if !c.allowed(auth.Read, name) {
		return nil, wire.ResponseCodeAccessRefused
	}
	sq, ok := c.streamQueue(name)
	if !ok {
		return nil, wire.ResponseCodeStreamDoesNotExist
	}
	return sq, wire.ResponseCodeOK
}

func (c *conn) declarePublisher(frame []byte) error {
	var m wire.DeclarePublisher
	if err := m.Decode(frame); err != nil {
		return err
	}
	code := c.declarePublisherCode(&m)
	c.respond(wire.CommandDeclarePublisher, m.CorrelationID, code)
	return nil
}

// declarePublisherCode checks in RabbitMQ's order: write permission (access_refused, whether
// the stream exists or not), a publisher id or reference already in use (precondition_failed),
// then the stream (stream_does_not_exist).
func (c *conn) declarePublisherCode(m *wire.DeclarePublisher) wire.ResponseCode {
	if !c.allowed(auth.Write, m.Stream) {
		return wire.ResponseCodeAccessRefused
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.publishers[m.PublisherID]; dup {
		return wire.ResponseCodePreconditionFailed
	}
	if m.Reference != "" {
		for _, p := range c.publishers {
			if p.stream == m.Stream && p.ref == m.Reference {
				return wire.ResponseCodePreconditionFailed
			}
		}
	}
	sq, ok := c.streamQueue(m.Stream)
	if !ok {
		return wire.ResponseCodeStreamDoesNotExist
	}
	c.publishers[m.PublisherID] = &publisher{id: m.PublisherID, ref: m.Reference, stream: m.Stream, rep: sq.Replica()}
	return wire.ResponseCodeOK
}

func (c *conn) deletePublisher(frame []byte) error {
	var m wire.DeletePublisher
	if err := m.Decode(frame); err != nil {
		return err
	}
	c.mu.Lock()
	_, ok := c.publishers[m.PublisherID]
	delete(c.publishers, m.PublisherID)
	c.mu.Unlock()
	code := wire.ResponseCodeOK
	if !ok {
		code = wire.ResponseCodePublisherDoesNotExist
	}
	c.respond(wire.CommandDeletePublisher, m.CorrelationID, code)
	return nil
}

// queryPublisherSequence answers a deduplicating publisher's last publishing id. RabbitMQ asks
// for read permission here (not write, although publishers ask), before looking the stream up.
func (c *conn) queryPublisherSequence(frame []byte) error {
	var m wire.QueryPublisherSequence
	if err := m.Decode(frame); err != nil {
		return err
	}
	resp := &wire.QueryPublisherSequenceResponse{CorrelationID: m.CorrelationID, Code: wire.ResponseCodeOK}
	sq, code := c.readableStream(m.Stream)
	switch {
	case code != wire.ResponseCodeOK:
		resp.Code = code
	case m.Reference != "":
		resp.Sequence = sq.Replica().Log().WriterSequence(m.Reference)
	}
	c.write(resp)
	return nil
}

// publish appends a publish frame's messages to the publisher's stream as one batch: they land
// in one chunk (or a few, for a large batch) and are confirmed together.
func (c *conn) publish(frame []byte) error {
	// One copy of the frame, made before decoding it: the reader reuses the frame's buffer for
	// the next frame, and the stream keeps the records (slices of the copy) until they are
	// stored. bytes.Clone does not clear the memory it is about to fill, as make would.
	frame = bytes.Clone(frame)
	m := &c.pub
	if err := m.Decode(frame); err != nil {
		return err
	}
	if len(m.Messages) == 0 {
		return nil
	}
	c.mu.Lock()
	p := c.publishers[m.PublisherID]
	c.mu.Unlock()
	if p == nil {
		c.publishError(m.PublisherID, m.Messages, wire.ResponseCodePublisherDoesNotExist)
		return nil
	}
	recs := make([]stream.Record, len(m.Messages))
	ids := make([]uint64, len(m.Messages))
	var bad []wire.PublishingError
	n := 0
	for i := range m.Messages {
		pm := &m.Messages[i]
		if pm.SubBatch && (pm.Records == 0 || pm.Compression > wire.MaxKnownCompression ||
			pm.Compression == wire.CompressionNone && uint32(len(pm.Data)) != pm.UncompressedSize) {
			bad = append(bad, wire.PublishingError{PublishingID: pm.PublishingID, Code: wire.ResponseCodePreconditionFailed})
			continue
		}
		ids[n] = pm.PublishingID
		r := &recs[n]
		n++
		r.Raw = pm.Data
		if pm.SubBatch {
			// A sub-entry batch's Raw is the frame's encoding of it: flags and compression,
			// record count, uncompressed and stored sizes, body (the chunk builder writes the
			// flags byte again without the frame's reserved bits).
			r.Raw = pm.Entry
		}
		if len(pm.FilterValue) > 0 {
			r.FilterValue = string(pm.FilterValue)
		}
		if p.ref != "" {
			r.PublisherID, r.PublishingID = p.ref, pm.PublishingID
		}
	}
	if len(bad) > 0 {
		c.write(&wire.PublishError{PublisherID: m.PublisherID, Errors: bad})
	}
	recs, ids = recs[:n], ids[:n]
	if n == 0 {
		return nil
	}
	// Every stream-protocol publish expects a confirm.
	c.s.counters.Add(stats.Published, uint64(n))
	c.s.counters.Add(stats.PublishedConfirm, uint64(n))
	// At an idle stream (nothing being written) a large frame's first idleFirst messages go
	// alone and the reader waits (at most idleFirstWait) until the writer has made them a chunk:
	// RabbitMQ's osiris writer receives a frame's messages one by one and writes what it has at
	// once, so a small batch arriving at an idle stream is one chunk there and a large one
	// several, and clients rely on both (stream stats, consumers with little credit). Under load
	// the writer is busy and the frame's messages are appended in slices of appendSlice that
	// merge into full chunks.
	l := p.rep.Log()
	if len(recs) > idleFirst {
		if w := l.Written(); w == l.Durable() && w == l.Committed() {
			c.appendSlice(p, m.PublisherID, recs[:idleFirst], ids[:idleFirst])
			recs, ids = recs[idleFirst:], ids[idleFirst:]
			t := time.NewTimer(idleFirstWait)
			select {
			case <-l.WaitWritten(w):
			case <-t.C:
			}
			t.Stop()
		}
	}
	for len(recs) > 0 {
		n := min(len(recs), appendSlice)
		c.appendSlice(p, m.PublisherID, recs[:n], ids[:n])
		recs, ids = recs[n:], ids[n:]
	}
	return nil
}

// idleFirst is how many messages of a large frame an idle stream writes first, alone.
const idleFirst = 32

// idleFirstWait bounds the wait for an idle stream's writer to take a frame's first message
// (a stream just declared may still be electing its leader).
const idleFirstWait = 250 * time.Millisecond

// appendSlice is the most messages of a publish frame handed to the stream in one append.
const appendSlice = 128

// appendSlice appends records and confirms (or refuses) their publishing ids once stored.
func (c *conn) appendSlice(p *publisher, pid uint8, recs []stream.Record, ids []uint64) {
	size := 0
	for i := range recs {
		size += len(recs[i].Raw)
	}
	credit := int64(size) + int64(len(recs))*64
	c.pubBytes.acquire(credit)
	out := c.out
	p.rep.Publish(recs, func(err error) {
		c.pubBytes.release(credit)
		if err != nil {
			code := wire.ResponseCodeInternalError
			if errors.Is(err, stream.ErrClosed) || errors.Is(err, replica.ErrClosed) {
				code = wire.ResponseCodeStreamNotAvailable
			}
			errs := make([]wire.PublishingError, len(ids))
			for i, id := range ids {
				errs[i] = wire.PublishingError{PublishingID: id, Code: code}
			}
			if b, e := (&wire.PublishError{PublisherID: pid, Errors: errs}).Append(nil); e == nil {
				out.send(b)
			}
			return
		}
		c.s.counters.Add(stats.Routed, uint64(len(ids)))
		c.s.counters.Add(stats.Confirmed, uint64(len(ids)))
		if b, e := wire.AppendPublishConfirm(nil, pid, ids); e == nil {
			out.send(b)
		}
	})
}

// publishError refuses every message of a publish frame with code.
func (c *conn) publishError(pid uint8, msgs []wire.PublishedMessage, code wire.ResponseCode) {
	errs := make([]wire.PublishingError, len(msgs))
	for i := range msgs {
		errs[i] = wire.PublishingError{PublishingID: msgs[i].PublishingID, Code: code}
	}
	c.write(&wire.PublishError{PublisherID: pid, Errors: errs})
}
