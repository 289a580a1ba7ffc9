package streamproto

import (
	"slices"
	"sync"
	"sync/atomic"

	"warren/server/streamproto/wire"
)

// Single active consumer, as RabbitMQ's stream protocol has it: subscriptions with
// single-active-consumer=true and the same name on the same stream form a group in which one
// delivers. On a plain stream that is the oldest member; on a partition of a super stream
// (super-stream=S) it is member i mod n, i being the partition's index in S, so a super stream's
// partitions spread over the group. A member that becomes active is told with consumer_update
// (active) and starts from the offset its answer names (none: where it subscribed); one that
// steps down is told with consumer_update (inactive) and stops at once.
//
// Groups are kept per node: members connected to different nodes of a cluster form different
// groups (docs/differences.md).

type sacKey struct{ vhost, stream, name string }

type sacGroup struct {
	members   []*sacMember
	active    *sacMember
	partition int // index of the stream in its super stream; -1 for a plain stream
}

// sacMember is a subscription's membership.
type sacMember struct {
	sub         *subscription
	superStream string
	want        atomic.Bool // the group made it the active one
}

// sacGroups is the node's groups. Its lock is a leaf: consumer updates are sent after it is
// released.
type sacGroups struct {
	mu     sync.Mutex
	groups map[sacKey]*sacGroup
}

func (g *sacGroups) init() { g.groups = make(map[sacKey]*sacGroup) }

type sacChange struct {
	m      *sacMember
	active bool
}

func keyOf(s *subscription) sacKey {
	vh := ""
	if v := s.c.vhostName.Load(); v != nil {
		vh = *v
	}
	return sacKey{vhost: vh, stream: s.stream, name: s.name}
}

// join adds a subscription to its group.
func (g *sacGroups) join(s *subscription) {
	partition := -1
	if s.sac.superStream != "" {
		if parts, ok := s.c.vhost.SuperStreamPartitions(s.sac.superStream); ok {
			partition = slices.Index(parts, s.stream)
		}
	}
	k := keyOf(s)
	g.mu.Lock()
	grp := g.groups[k]
	if grp == nil {
		grp = &sacGroup{partition: partition}
		g.groups[k] = grp
	}
	grp.members = append(grp.members, s.sac)
	changes := grp.rebalance()
	g.mu.Unlock()
	apply(changes)
}

// leave removes a subscription from its group.
func (g *sacGroups) leave(s *subscription) {
	k := keyOf(s)
	g.mu.Lock()
	grp := g.groups[k]
	if grp == nil {
		g.mu.Unlock()
		return
	}
	i := slices.Index(grp.members, s.sac)
	if i < 0 {
		g.mu.Unlock()
		return
	}
	grp.members = slices.Delete(grp.members, i, i+1)
	if grp.active == s.sac {
		grp.active = nil
		s.sac.want.Store(false)
	}
	var changes []sacChange
	if len(grp.members) == 0 {
		delete(g.groups, k)
	} else {
		changes = grp.rebalance()
	}
	g.mu.Unlock()
	apply(changes)
}

// rebalance picks the member that should be active (group lock held) and returns the updates
// to send.
func (grp *sacGroup) rebalance() []sacChange {
	var want *sacMember
	if n := len(grp.members); n > 0 {
		i := 0
		if grp.partition >= 0 {
			i = grp.partition % n
		}
		want = grp.members[i]
	}
	if want == grp.active {
		return nil
	}
	var out []sacChange
	if grp.active != nil {
		grp.active.want.Store(false)
		out = append(out, sacChange{m: grp.active, active: false})
	}
	grp.active = want
	if want != nil {
		want.want.Store(true)
		out = append(out, sacChange{m: want, active: true})
	}
	return out
}

func apply(changes []sacChange) {
	for _, ch := range changes {
		s := ch.m.sub
		if !ch.active {
			s.active.Store(false)
			s.wake()
		}
		s.c.sendConsumerUpdate(s, ch.active)
	}
}

// sendConsumerUpdate asks the client of s to take over (active) or step down.
func (c *conn) sendConsumerUpdate(s *subscription, active bool) {
	if s.stopped.Load() {
		return
	}
	c.mu.Lock()
	if c.updates == nil {
		c.updates = make(map[uint32]*subscription)
	}
	c.nextCorr++
	corr := c.nextCorr
	c.updates[corr] = s
	c.mu.Unlock()
	b, err := (&wire.ConsumerUpdate{CorrelationID: corr, SubscriptionID: s.id, Active: active}).Append(nil)
	if err == nil {
		c.out.send(b)
	}
}

// consumerUpdateResponse starts a member that was made active from the offset the client names.
func (c *conn) consumerUpdateResponse(frame []byte) error {
	var m wire.ConsumerUpdateResponse
	if err := m.Decode(frame); err != nil {
		return err
	}
	c.mu.Lock()
	s := c.updates[m.CorrelationID]
	delete(c.updates, m.CorrelationID)
	c.mu.Unlock()
	if s == nil || s.sac == nil || s.stopped.Load() || !s.sac.want.Load() {
		return nil
	}
	if m.Offset.Type != wire.OffsetTypeNone {
		off := resolve(s.log, m.Offset)
		s.mu.Lock()
		s.next = off
		s.mu.Unlock()
	}
	c.startSubscription(s)
	return nil
}
