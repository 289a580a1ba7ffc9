package core

import (
	"context"
	"slices"
	"sync"

	"warren/amqp"
	"warren/exchange"
	"warren/server/queue"
	"warren/server/stats"
)

// The node side of consumer groups: a basic.consume with x-stream-consumer-group joins the
// group through the metadata group; this node then runs a reader of each partition the group
// assigns to the member, pauses it when the partition is to move, and proposes its release once
// its deliveries are settled.

// localMember is a member of a consumer group consuming through this node.
type localMember struct {
	b          *Broker
	v          *VHost
	key        groupKey
	id         uint64
	spec       queue.ConsumeSpec
	cons       queue.Consumer
	offsetSpec any // x-stream-offset (nil: next), for partitions the group never committed

	mu        sync.Mutex
	ready     bool // consume-ok went out: readers may start
	cancelled bool
	readers   map[int]*memberReader
	releasing map[int]uint64 // slot -> Gen+1 of the ownership whose release was proposed
	last      *groupState    // the latest state seen
}

// GroupQueue returns what basic.consume with x-stream-consumer-group attaches to: a handle on
// group g of super stream (or stream) name. It is 404 when name is neither.
func (v *VHost) GroupQueue(name string, g any) (*Queue, *amqp.Error) {
	group, ok := stringValue(g)
	if !ok || group == "" {
		return nil, amqp.Errorf(amqp.PreconditionFailed, "invalid arg 'x-stream-consumer-group' for queue '%s' in vhost '%s': must be a non-empty string", name, v.name)
	}
	var parts []string
	if x, ok := v.ex.Get(name); ok && x.Kind == exchange.SuperStream {
		parts = v.ex.Partitions(name)
	} else if q := v.Queue(name); q != nil && q.kind == "stream" {
		parts = []string{name}
	} else {
		return nil, v.QueueNotFound(name)
	}
	if len(parts) == 0 {
		return nil, amqp.Errorf(amqp.NotFound, "super stream '%s' in vhost '%s' has no partitions", name, v.name)
	}
	for _, p := range parts {
		q := v.Queue(p)
		if q == nil {
			return nil, v.QueueNotFound(p)
		}
		if _, ok := q.Queue.(queue.GroupPartition); !ok {
			return nil, amqp.Errorf(amqp.PreconditionFailed, "queue '%s' in vhost '%s' cannot be a partition of a consumer group", p, v.name)
		}
	}
	h := &groupHandle{v: v, key: groupKey{v.name, name, group}, parts: parts}
	// The handle's counters are its own and registered nowhere: deliveries through a group count
	// on the channel (and so in the node's totals), not on the partitions' queue objects.
	return &Queue{Queue: h, vhost: v, name: name, kind: "stream", durable: true, counters: new(stats.Object)}, nil
}

// GroupPartitions returns the partition streams of a queue GroupQueue returned (the stream itself
// for a plain stream's group), nil for any other queue: the session checks read access on each.
func (q *Queue) GroupPartitions() []string {
	if h, ok := q.Queue.(*groupHandle); ok {
		return append([]string(nil), h.parts...)
	}
	return nil
}

// groupHandle is a consumer group as a queue.Queue for the session: Consume joins, Cancel leaves.
// Deliveries name the partition queues, so settles go to them directly.
type groupHandle struct {
	v     *VHost
	key   groupKey
	parts []string
}

func (h *groupHandle) Name() string { return h.key.stream }
func (h *groupHandle) Kind() string { return "stream" }

func (h *groupHandle) errorf(code uint16, format string) *amqp.Error {
	return amqp.Errorf(code, format, h.key.stream, h.v.name)
}

// Publish implements queue.Queue; publishes reach the partitions through the exchange.
func (h *groupHandle) Publish(_ *queue.Message, done queue.Done) queue.PublishStatus {
	if done != nil {
		done.Done(queue.ErrGone)
	}
	return queue.Gone
}

// Consume implements queue.Queue: the consumer joins the group.
func (h *groupHandle) Consume(spec queue.ConsumeSpec, c queue.Consumer) error {
	if spec.NoAck {
		return h.errorf(amqp.NotImplemented, "automatic acknowledgement not supported by stream queues queue '%s' in vhost '%s'")
	}
	if spec.Prefetch == 0 {
		return h.errorf(amqp.PreconditionFailed, "consumer prefetch count is not set for 'queue '%s' in vhost '%s''")
	}
	if spec.GlobalPrefetch > 0 {
		return h.errorf(amqp.NotImplemented, "queue '%s' in vhost '%s' does not support global qos")
	}
	b := h.v.b
	offsetSpec := spec.Args["x-stream-offset"]
	if offsetSpec != nil {
		if p, ok := h.partition(0); ok {
			if _, err := p.ResolveOffset(offsetSpec); err != nil {
				return err
			}
		}
	}
	m := &localMember{b: b, v: h.v, key: h.key, id: uint64(spec.ID), spec: spec, cons: c, offsetSpec: offsetSpec,
		readers: make(map[int]*memberReader), releasing: make(map[int]uint64)}
	m.spec.OnAdded = nil
	b.groups.mu.Lock()
	if b.groups.closed {
		b.groups.mu.Unlock()
		return queue.ErrGone
	}
	b.groups.local[m.id] = m
	b.groups.mu.Unlock()
	cmd := &groupCmd{Op: "join", Key: h.key, Partitions: h.parts, Member: groupMember{ID: m.id, Node: b.node.ID(), Tag: spec.Tag}}
	if err := b.proposeGroup(context.Background(), cmd); err != nil {
		b.groups.mu.Lock()
		delete(b.groups.local, m.id)
		b.groups.mu.Unlock()
		return err
	}
	if spec.OnAdded != nil {
		spec.OnAdded() // consume-ok, before any delivery
	}
	m.mu.Lock()
	m.ready = true
	m.mu.Unlock()
	if g := b.groupState(h.key); g != nil {
		m.sync(g)
	}
	b.log.Debug("consumer group member joined", "vhost", h.v.name, "stream", h.key.stream, "group", h.key.group, "consumer", spec.Tag)
	return nil
}

// partition returns partition i's queue on this node.
func (h *groupHandle) partition(i int) (queue.GroupPartition, bool) {
	if i >= len(h.parts) {
		return nil, false
	}
	q := h.v.Queue(h.parts[i])
	if q == nil {
		return nil, false
	}
	p, ok := q.Queue.(queue.GroupPartition)
	return p, ok
}

// Cancel implements queue.Queue: the member stops taking deliveries and leaves the group; its
// partitions move once its deliveries are settled (or its channel closed).
func (h *groupHandle) Cancel(id queue.ConsumerID) bool {
	b := h.v.b
	b.groups.mu.Lock()
	m, _ := b.groups.local[uint64(id)].(*localMember)
	b.groups.mu.Unlock()
	if m == nil {
		return false
	}
	m.mu.Lock()
	m.cancelled = true
	for _, r := range m.readers {
		r.r.Pause()
	}
	m.mu.Unlock()
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		cmd := &groupCmd{Op: "leave", Key: h.key, Member: groupMember{ID: m.id}}
		if err := b.proposeGroup(context.Background(), cmd); err != nil {
			b.log.Warn("consumer group member could not leave (its node's restart or its node being down removes it)",
				"stream", h.key.stream, "group", h.key.group, "err", err.Text)
		}
	}()
	return false
}

// Settle implements queue.Queue (deliveries are settled on the partitions).
func (h *groupHandle) Settle(queue.ConsumerID, queue.SettleOp, []queue.Tag) error { return nil }

// Get implements queue.Queue.
func (h *groupHandle) Get(bool) (queue.Delivery, int, bool, error) {
	return queue.Delivery{}, 0, false, h.errorf(amqp.NotImplemented, "basic.get not supported by stream queues queue '%s' in vhost '%s'")
}

// Purge implements queue.Queue.
func (h *groupHandle) Purge() (int, error) {
	return 0, h.errorf(amqp.NotImplemented, "queue.purge not supported by stream queues queue '%s' in vhost '%s'")
}

func (h *groupHandle) Delete() int        { return 0 }
func (h *groupHandle) Close()             {}
func (h *groupHandle) Stats() queue.Stats { return queue.Stats{} }
func (h *groupHandle) Kick()              {}
func (h *groupHandle) Touch()             {}

// groupState returns a copy of a group's state (nil if none).
func (b *Broker) groupState(k groupKey) *groupState {
	b.groups.mu.Lock()
	defer b.groups.mu.Unlock()
	if g := b.groups.byKey[k]; g != nil {
		return g.clone()
	}
	return nil
}

// memberReader is a member's reader of one partition, for one ownership (the slot's Gen).
type memberReader struct {
	r   queue.GroupReader
	gen uint64
}

// sync brings the member's readers in line with the group's state g: read the partitions it
// owns, pause those that move (and release each once its deliveries are settled), stop reading
// those it no longer owns.
func (m *localMember) sync(g *groupState) {
	m.mu.Lock()
	m.last = g
	if !m.ready {
		m.mu.Unlock()
		return
	}
	_, member := g.member(m.id)
	holds := false
	type release struct {
		slot      int
		gen       uint64
		committed int64
	}
	var releases []release
	var stops []queue.GroupReader
	for i, s := range g.Slots {
		mine := s.Owner == m.id
		mr := m.readers[i]
		if mr != nil && (!mine || mr.gen != s.Gen) {
			stops = append(stops, mr.r)
			delete(m.readers, i)
			mr = nil
		}
		if !mine {
			delete(m.releasing, i)
			continue
		}
		holds = true
		if s.Target == 0 && member {
			if mr == nil && !m.cancelled {
				m.startLocked(g, i)
			}
			continue
		}
		// The partition moves (or the member left): release it once nothing is unacked.
		committed := s.Start - 1
		if mr != nil {
			mr.r.Pause()
			if mr.r.Unacked() > 0 {
				continue // OnIdle comes back here
			}
			committed = mr.r.Committed()
		}
		if m.releasing[i] != s.Gen+1 {
			m.releasing[i] = s.Gen + 1
			releases = append(releases, release{i, s.Gen, committed})
		}
	}
	m.mu.Unlock()
	for _, r := range stops {
		r.Stop()
	}
	for _, r := range releases {
		m.proposeRelease(r.slot, r.gen, r.committed)
	}
	if !member && !holds {
		m.b.groups.mu.Lock()
		if m.b.groups.local[m.id] == groupLocal(m) {
			delete(m.b.groups.local, m.id)
		}
		m.b.groups.mu.Unlock()
	}
}

// startLocked starts the member's reader of slot i (m.mu held).
func (m *localMember) startLocked(g *groupState, i int) {
	q := m.v.Queue(g.Partitions[i])
	if q == nil {
		m.b.log.Warn("consumer group partition missing on this node", "partition", g.Partitions[i])
		return
	}
	p, ok := q.Queue.(queue.GroupPartition)
	if !ok {
		return
	}
	s := g.Slots[i]
	var start uint64
	committed, hasCommitted := p.CommittedOffset(m.key.group)
	switch {
	case s.Start >= 0 && s.Exact:
		start = uint64(s.Start)
	case s.Start >= 0 && hasCommitted:
		start = max(uint64(s.Start), committed+1)
	case s.Start >= 0:
		start = uint64(s.Start)
	case hasCommitted:
		start = committed + 1
	default:
		off, err := p.ResolveOffset(m.offsetSpec)
		if err != nil {
			m.b.log.Warn("consumer group member: bad x-stream-offset", "err", err)
			off, _ = p.ResolveOffset(nil)
		}
		start = off
	}
	r, err := p.ConsumeGroup(m.spec, m.cons, queue.GroupSpec{Group: m.key.group, Start: start, OnIdle: func(int64) { m.resync() }})
	if err != nil {
		m.b.log.Warn("consumer group member cannot read its partition", "partition", g.Partitions[i], "err", err)
		return
	}
	m.readers[i] = &memberReader{r: r, gen: s.Gen}
	m.b.log.Debug("consumer group member reads a partition", "group", m.key.group, "partition", g.Partitions[i],
		"consumer", m.spec.Tag, "offset", start)
}

// resync runs sync again with the group's current state, on a goroutine (OnIdle may be called
// with the member's lock held).
func (m *localMember) resync() {
	b := m.b
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		if g := b.groupState(m.key); g != nil {
			m.sync(g)
		}
	}()
}

// proposeRelease proposes the release of slot's ownership gen with the committed offset.
func (m *localMember) proposeRelease(slot int, gen uint64, committed int64) {
	b := m.b
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		cmd := &groupCmd{Op: "release", Key: m.key, Member: groupMember{ID: m.id}, Slot: slot, Gen: gen, Committed: committed}
		// The broker's shutdown ends the wait: Close waits for this goroutine, and without a
		// majority the proposal would only time out, be retried by resync, and so on.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-b.quit:
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := b.proposeGroup(ctx, cmd); err != nil {
			select {
			case <-b.quit:
				return // shutting down: the group forgets this node's members when it is next up
			default:
			}
			b.log.Warn("consumer group: cannot release a partition", "group", m.key.group, "slot", slot, "err", err.Text)
			m.mu.Lock()
			delete(m.releasing, slot)
			m.mu.Unlock()
			m.resync()
		}
	}()
}

// closeGroups stops the local members' readers (broker shutdown).
func (b *Broker) closeGroups() {
	b.groups.mu.Lock()
	b.groups.closed = true
	ms := make([]groupLocal, 0, len(b.groups.local))
	for _, m := range b.groups.local {
		ms = append(ms, m)
	}
	clear(b.groups.local)
	b.groups.mu.Unlock()
	for _, m := range ms {
		m.close()
	}
}

func (m *localMember) groupKey() groupKey { return m.key }

// close stops the member's readers.
func (m *localMember) close() {
	m.mu.Lock()
	rs := slices.Collect(mapValues(m.readers))
	clear(m.readers)
	m.mu.Unlock()
	for _, r := range rs {
		r.r.Stop()
	}
}

func mapValues[K comparable, V any](m map[K]V) func(func(V) bool) {
	return func(yield func(V) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}
