package core

import (
	"context"
	"slices"
	"sync"

	"warren/amqp"
	"warren/server/queue"
)

// Stream-protocol single active consumers in consumer groups. A subscription with
// single-active-consumer=true and name G on stream P is a member of group G of P, or, when it
// names super-stream S and P is a partition of S, of group G of S restricted to P's slot: the
// same group as AMQP 0-9-1's x-stream-consumer-group G on P (or S), in the metadata raft group,
// so one member is active across every node and both protocols. The subscription is told to
// start (Activate) when its slot becomes its own, and to step down (Deactivate) when the slot is
// to move; once its client has answered the step-down, the slot is released to the next member,
// which starts from the offset its own client names (the stream protocol's consumer_update
// exchange), or from where an AMQP member's release left the group.

// GroupSubscriber is a stream-protocol subscription as a consumer-group member. Its methods run
// on core goroutines (the metadata group's apply among them) and must not block.
type GroupSubscriber interface {
	// Activate makes the subscription the active consumer of its partition. start is where the
	// group suggests it starts when its client names no offset (-1: none; the subscription's
	// own offset).
	Activate(start int64)
	// Deactivate makes it stop delivering at once; done (which may be called on any goroutine)
	// tells the group, once the client answered or gave up, that the partition may move.
	Deactivate(done func())
}

// GroupMembership is a subscription's membership of a consumer group.
type GroupMembership struct{ m *subMember }

// subMember is a stream-protocol member consuming through this node.
type subMember struct {
	b    *Broker
	v    *VHost
	key  groupKey
	id   uint64
	slot int
	sub  GroupSubscriber

	mu        sync.Mutex
	joined    bool // the group had it as a member (a state before its join does not end it)
	left      bool
	activeGen uint64 // 1 + the slot's Gen it is active for; 0: not active
	stepping  uint64 // 1 + the Gen whose step-down is being answered
	releasing uint64 // 1 + the Gen whose release was proposed
}

// JoinGroup makes sub a member of consumer group `group` reading stream: the group of super
// stream superStream when stream is one of its partitions, else the group of stream itself. It
// returns once this node applied the join (so a member that must step down for it has been told,
// when it is on this node).
func (v *VHost) JoinGroup(ctx context.Context, stream, superStream, group, tag string, sub GroupSubscriber) (*GroupMembership, *amqp.Error) {
	key, parts, slot := groupKey{v.name, stream, group}, []string{stream}, 0
	if superStream != "" {
		if ps := v.ex.Partitions(superStream); len(ps) > 0 {
			if i := slices.Index(ps, stream); i >= 0 {
				key.stream, parts, slot = superStream, ps, i
			}
		}
	}
	q := v.Queue(stream)
	if q == nil {
		return nil, v.QueueNotFound(stream)
	}
	if _, ok := q.Queue.(queue.GroupPartition); !ok {
		return nil, amqp.Errorf(amqp.PreconditionFailed, "queue '%s' in vhost '%s' cannot be a partition of a consumer group", stream, v.name)
	}
	b := v.b
	m := &subMember{b: b, v: v, key: key, id: uint64(b.NextConsumerID()), slot: slot, sub: sub}
	b.groups.mu.Lock()
	if b.groups.closed {
		b.groups.mu.Unlock()
		return nil, amqp.Errorf(amqp.InternalError, "the broker is shutting down")
	}
	b.groups.local[m.id] = m
	b.groups.mu.Unlock()
	cmd := &groupCmd{Op: "join", Key: key, Partitions: parts,
		Member: groupMember{ID: m.id, Node: b.node.ID(), Tag: tag, Only: slot + 1}}
	if err := b.proposeGroup(ctx, cmd); err != nil {
		b.groups.mu.Lock()
		delete(b.groups.local, m.id)
		b.groups.mu.Unlock()
		return nil, err
	}
	if g := b.groupState(key); g != nil {
		m.sync(g)
	}
	return &GroupMembership{m: m}, nil
}

// Leave ends the membership: the subscription's partition moves to the next member at once
// (a stream-protocol consumer has nothing to settle).
func (gm *GroupMembership) Leave() {
	m := gm.m
	m.mu.Lock()
	if m.left {
		m.mu.Unlock()
		return
	}
	m.left = true
	m.mu.Unlock()
	// Leaving frees the slot in the same command: nothing is left for this node to do (and the
	// group may be gone with its stream).
	m.b.groups.mu.Lock()
	if m.b.groups.local[m.id] == groupLocal(m) {
		delete(m.b.groups.local, m.id)
	}
	m.b.groups.mu.Unlock()
	m.b.proposeGroupLater(&groupCmd{Op: "leave", Key: m.key, Member: groupMember{ID: m.id}, Free: true}, "leave")
}

func (m *subMember) groupKey() groupKey { return m.key }
func (m *subMember) close()             {}

// sync activates or deactivates the subscription as the group's state g says.
func (m *subMember) sync(g *groupState) {
	if m.slot >= len(g.Slots) {
		return
	}
	s := g.Slots[m.slot]
	_, member := g.member(m.id)
	mine := s.Owner == m.id
	gen := s.Gen + 1
	var activate, deactivate, release bool
	var start int64 = -1
	m.mu.Lock()
	if member {
		m.joined = true
	}
	ended := m.joined && !member && !mine
	switch {
	case mine && s.Target == 0 && member && !m.left:
		if m.activeGen != gen {
			m.activeGen, m.stepping, activate = gen, 0, true
			start = m.suggestedStart(g, s)
		}
	case mine:
		// The slot moves (or the member left): step down, then release.
		switch {
		case m.activeGen != 0:
			m.activeGen, m.stepping, deactivate = 0, gen, true
		case m.stepping != gen && m.releasing != gen:
			m.releasing, release = gen, true
		}
	case m.activeGen != 0:
		m.activeGen, deactivate = 0, true // lost without a release (its node was reset)
	}
	left := m.left
	m.mu.Unlock()
	switch {
	case activate:
		m.sub.Activate(start)
	case deactivate && mine:
		var once sync.Once
		m.sub.Deactivate(func() { once.Do(func() { m.release(s.Gen) }) })
	case deactivate:
		m.sub.Deactivate(func() {})
	case release && !left:
		m.release(s.Gen)
	}
	if ended {
		m.b.groups.mu.Lock()
		if m.b.groups.local[m.id] == groupLocal(m) {
			delete(m.b.groups.local, m.id)
		}
		m.b.groups.mu.Unlock()
	}
}

// suggestedStart is where an AMQP 0-9-1 member's release (or an operator) left the slot: the
// next member starts there unless its client names an offset (-1: nothing to suggest).
func (m *subMember) suggestedStart(g *groupState, s groupSlot) int64 {
	if s.Start < 0 {
		return -1
	}
	if s.Exact {
		return s.Start
	}
	if q := m.v.Queue(g.Partitions[m.slot]); q != nil {
		if p, ok := q.Queue.(queue.GroupPartition); ok {
			if c, has := p.CommittedOffset(m.key.group); has && int64(c)+1 > s.Start {
				return int64(c) + 1
			}
		}
	}
	return s.Start
}

// release proposes the release of the slot's ownership gen (the subscription stepped down).
func (m *subMember) release(gen uint64) {
	m.mu.Lock()
	m.releasing = gen + 1
	m.mu.Unlock()
	m.b.proposeGroupLater(&groupCmd{Op: "release", Key: m.key, Member: groupMember{ID: m.id}, Slot: m.slot, Gen: gen, Committed: -1}, "release")
}

// proposeGroupLater proposes a consumer-group command on its own goroutine, giving up at broker
// shutdown (the group forgets this node's members at its next boot, or when it is seen down).
func (b *Broker) proposeGroupLater(cmd *groupCmd, what string) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
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
				return
			default:
			}
			b.log.Warn("consumer group: change not replicated", "change", what, "stream", cmd.Key.stream, "group", cmd.Key.group, "err", err.Text)
		}
	}()
}
