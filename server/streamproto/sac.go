package streamproto

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"warren/server/streamproto/wire"
)

// Single active consumer, as RabbitMQ's stream protocol has it: subscriptions with
// single-active-consumer=true and the same name on the same stream form a group in which one
// delivers; with super-stream=S on a partition of S, the group is S's and the subscription holds
// at most its partition. The group is the core's consumer group (server/core/groupsub.go): one
// across the cluster and shared with AMQP 0-9-1's x-stream-consumer-group of the same name, so
// the active member may be on another node or an AMQP consumer.
//
// A member that becomes active is told with consumer_update (active) and starts from the offset
// its answer names (none: the offset the group suggests, else where it subscribed); one that
// must step down is told with consumer_update (inactive), stops at once, and its partition moves
// once its client answered (or after stepDownWait).

// stepDownWait bounds how long a stepping-down member's answer is waited for.
const stepDownWait = 10 * time.Second

// sacMember is a subscription's membership.
type sacMember struct {
	sub         *subscription
	superStream string
	want        atomic.Bool // the group made it the active one

	mu        sync.Mutex
	gm        groupLeaver
	responded bool     // the subscribe response went out: consumer updates may follow
	pending   []func() // updates held until then
	start     int64    // the group's suggested start of the current activation (-1: none)
	stepDone  func()   // tells the group the step-down was answered (nil: none pending)
	stepTimer *time.Timer
}

// groupLeaver is the core's membership (core.GroupMembership).
type groupLeaver interface{ Leave() }

// joinGroup joins the subscription's group; it returns once the join is applied on this node.
func (c *conn) joinGroup(s *subscription) bool {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	tag := c.name + " #" + itoa(int(s.id))
	gm, err := c.vhost.JoinGroup(ctx, s.stream, s.sac.superStream, s.name, tag, s.sac)
	if err != nil {
		c.log.Warn("single active consumer cannot join its group", "stream", s.stream, "name", s.name, "err", err.Text)
		return false
	}
	s.sac.mu.Lock()
	s.sac.gm = gm
	s.sac.mu.Unlock()
	return true
}

// responded lets held consumer updates go out, after the subscribe response.
func (m *sacMember) respondedOK() {
	m.mu.Lock()
	m.responded = true
	pending := m.pending
	m.pending = nil
	m.mu.Unlock()
	for _, f := range pending {
		f()
	}
}

// later runs f now, or after the subscribe response if it has not gone out yet.
func (m *sacMember) later(f func()) {
	m.mu.Lock()
	if !m.responded {
		m.pending = append(m.pending, f)
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	f()
}

// Activate implements core.GroupSubscriber.
func (m *sacMember) Activate(start int64) {
	m.mu.Lock()
	m.start = start
	// A step-down still waiting for its answer is moot: the partition stays.
	m.stepDone = nil
	if m.stepTimer != nil {
		m.stepTimer.Stop()
		m.stepTimer = nil
	}
	m.mu.Unlock()
	m.want.Store(true)
	s := m.sub
	m.later(func() { s.c.sendConsumerUpdate(s, true) })
}

// Deactivate implements core.GroupSubscriber.
func (m *sacMember) Deactivate(done func()) {
	s := m.sub
	m.want.Store(false)
	s.active.Store(false)
	s.wake()
	m.mu.Lock()
	if m.gm == nil && m.responded {
		m.mu.Unlock()
		return // left already: leaving freed the partition
	}
	prev := m.stepDone
	if m.stepTimer != nil {
		m.stepTimer.Stop()
	}
	m.stepDone = done
	m.stepTimer = time.AfterFunc(stepDownWait, m.steppedDown)
	m.mu.Unlock()
	if prev != nil {
		prev()
	}
	m.later(func() { s.c.sendConsumerUpdate(s, false) })
}

// steppedDown tells the group that the step-down is over (answered, or waited for long enough).
func (m *sacMember) steppedDown() {
	m.mu.Lock()
	done := m.stepDone
	m.stepDone = nil
	if m.stepTimer != nil {
		m.stepTimer.Stop()
		m.stepTimer = nil
	}
	m.mu.Unlock()
	if done != nil {
		done()
	}
}

// leave ends the membership (unsubscribe, stream gone, connection closed).
func (m *sacMember) leave() {
	m.mu.Lock()
	gm := m.gm
	m.gm = nil
	m.stepDone = nil // leaving frees the partition by itself
	if m.stepTimer != nil {
		m.stepTimer.Stop()
		m.stepTimer = nil
	}
	m.mu.Unlock()
	m.want.Store(false)
	if gm != nil {
		gm.Leave()
	}
}

// sendConsumerUpdate asks the client of s to take over (active) or step down.
func (c *conn) sendConsumerUpdate(s *subscription, active bool) {
	if s.stopped.Load() {
		return
	}
	c.mu.Lock()
	if c.updates == nil {
		c.updates = make(map[uint32]pendingUpdate)
	}
	c.nextCorr++
	corr := c.nextCorr
	c.updates[corr] = pendingUpdate{s: s, active: active}
	c.mu.Unlock()
	b, err := (&wire.ConsumerUpdate{CorrelationID: corr, SubscriptionID: s.id, Active: active}).Append(nil)
	if err == nil {
		c.out.send(b)
	}
}

// pendingUpdate is a consumer update waiting for its answer.
type pendingUpdate struct {
	s      *subscription
	active bool
}

// consumerUpdateResponse starts a member that was made active from the offset the client
// names, or lets the partition of one that stepped down move.
func (c *conn) consumerUpdateResponse(frame []byte) error {
	var m wire.ConsumerUpdateResponse
	if err := m.Decode(frame); err != nil {
		return err
	}
	c.mu.Lock()
	u, ok := c.updates[m.CorrelationID]
	delete(c.updates, m.CorrelationID)
	c.mu.Unlock()
	s := u.s
	if !ok || s == nil || s.sac == nil || s.stopped.Load() {
		return nil
	}
	if !u.active {
		s.sac.steppedDown()
		return nil
	}
	if !s.sac.want.Load() {
		return nil
	}
	s.sac.mu.Lock()
	start := s.sac.start
	s.sac.mu.Unlock()
	switch {
	case m.Offset.Type != wire.OffsetTypeNone:
		off := resolve(s.log, m.Offset)
		s.mu.Lock()
		s.next = off
		s.mu.Unlock()
	case start >= 0:
		s.mu.Lock()
		s.next = max(uint64(start), s.log.First())
		s.mu.Unlock()
	}
	c.startSubscription(s)
	return nil
}
