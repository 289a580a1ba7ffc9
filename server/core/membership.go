package core

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"warren/server/cluster"
)

// Membership of quorum queues, as RabbitMQ's rabbitmq-queues add_member, delete_member, grow,
// shrink and rebalance (and the management API's /api/queues/quorum/... and /api/rebalance/queues).
//
// A queue's members are the voters of its raft group's configuration, which lives in the group's
// own log: a change is a raft configuration change made by the group's leader (forwarded to it
// from any node), and nothing in the metadata records changes. Every cluster node already runs a
// replica of every replicated queue (bootstrapped from the record's initial members, identically
// everywhere, or, on a node that joined later, waiting unconfigured), so adding a member promotes
// that replica to a voter, and the leader streams it the log or a snapshot. Removing a member
// demotes it to a non-voting replica: unlike RabbitMQ, whose clients on that node then reach the
// queue through another node, a Warren node serves its clients from its local replica, which it
// keeps (docs/differences.md).

// MemberError is a membership request refused for what it asked (the HTTP API answers 404 when
// NotFound, 400 otherwise, with Text as the reason).
type MemberError struct {
	NotFound bool
	Text     string
}

func (e *MemberError) Error() string { return e.Text }

func memberErrorf(format string, args ...any) error {
	return &MemberError{Text: fmt.Sprintf(format, args...)}
}

// memberChangeTimeout bounds one queue's configuration change or leadership transfer.
const memberChangeTimeout = 30 * time.Second

// QueueMembers describes a quorum queue's members as RabbitMQ's management API shows them.
type QueueMembers struct {
	Leader  string   // the node leading the queue's group; "" while none is known
	Members []string // voters of the group's configuration, sorted
	Online  []string // the members whose node is up, sorted
}

// Members reports a quorum queue's members (ok=false for any other queue).
func (q *Queue) Members() (QueueMembers, bool) {
	if q.kind != "quorum" || q.group == nil {
		return QueueMembers{}, false
	}
	n := q.vhost.b.node
	m := QueueMembers{Leader: q.group.Leader(), Members: q.group.Voters()}
	for _, id := range m.Members {
		if n.PeerUp(id) {
			m.Online = append(m.Online, id)
		}
	}
	return m, true
}

// quorumQueue finds a quorum queue for a membership request.
func (b *Broker) quorumQueue(vhost, name string) (*Queue, error) {
	v := b.VHost(vhost)
	if v == nil {
		return nil, &MemberError{NotFound: true, Text: fmt.Sprintf("vhost '%s' not found", vhost)}
	}
	q := v.Queue(name)
	if q == nil {
		return nil, &MemberError{NotFound: true, Text: fmt.Sprintf("queue '%s' in vhost '%s' not found", name, vhost)}
	}
	if q.kind != "quorum" || q.group == nil {
		return nil, memberErrorf("queue '%s' in vhost '%s' is not a quorum queue", name, vhost)
	}
	return q, nil
}

// memberAddr returns the cluster address of member node id, refusing nodes that are not members
// of the cluster or not up.
func (b *Broker) memberAddr(id string) (string, error) {
	for _, m := range b.node.Members() {
		if m.ID == id {
			if !b.node.PeerUp(id) {
				return "", memberErrorf("node '%s' is not running", id)
			}
			return m.Addr, nil
		}
	}
	return "", memberErrorf("node '%s' is not a member of the cluster", id)
}

// AddQueueMember makes node a member (voter) of quorum queue name in vhost.
func (b *Broker) AddQueueMember(ctx context.Context, vhost, name, node string) error {
	q, err := b.quorumQueue(vhost, name)
	if err != nil {
		return err
	}
	addr, err := b.memberAddr(node)
	if err != nil {
		return err
	}
	if slices.Contains(q.group.Voters(), node) {
		return memberErrorf("node '%s' is already a member of queue '%s' in vhost '%s'", node, name, vhost)
	}
	return b.addMember(ctx, q, node, addr)
}

func (b *Broker) addMember(ctx context.Context, q *Queue, node, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, memberChangeTimeout)
	defer cancel()
	if err := q.group.AddVoter(ctx, node, addr); err != nil {
		return fmt.Errorf("add %s to queue '%s' in vhost '%s': %w", node, q.name, q.vhost.name, err)
	}
	b.log.Info("quorum queue member added", "vhost", q.vhost.name, "queue", q.name, "node", node)
	return nil
}

// handOverLeadership moves the leadership of q's group away from node before node is demoted: a
// leader that demotes itself steps down, and the group then has no leader for raft's election
// timeout (12-24 s), during which nodes that are not voters do not even learn the new membership.
// It tries each other voter that is up, and again every handOverRetry while the leader is node
// or unknown (a leader being elected), for at most handOverFor; it returns nil once another node
// leads.
func (b *Broker) handOverLeadership(ctx context.Context, q *Queue, node string, voters []string) error {
	ctx, cancel := context.WithTimeout(ctx, handOverFor)
	defer cancel()
	var last error
	for {
		switch leader := q.group.Leader(); leader {
		case node:
			for _, v := range voters {
				if v == node || !b.node.PeerUp(v) {
					continue
				}
				addr, err := b.memberAddr(v)
				if err == nil {
					err = q.group.TransferLeadership(ctx, v, addr)
				}
				if err != nil {
					last = err
					continue
				}
				break
			}
		case "":
			last = errors.New("the queue has no leader at the moment")
		default:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("hand over the leadership first: %w", errors.Join(ctx.Err(), last))
		case <-time.After(handOverRetry):
		}
	}
}

// handOverRetry is how often handOverLeadership looks at the leader again, and handOverFor how
// long it tries: a transfer that cannot happen within a few seconds (no other voter caught up)
// is not worth holding the request for.
const (
	handOverRetry = 100 * time.Millisecond
	handOverFor   = 5 * time.Second
)

// DeleteQueueMember makes node a non-voting replica of quorum queue name in vhost; the last
// member cannot go.
func (b *Broker) DeleteQueueMember(ctx context.Context, vhost, name, node string) error {
	q, err := b.quorumQueue(vhost, name)
	if err != nil {
		return err
	}
	return b.deleteMember(ctx, q, node)
}

func (b *Broker) deleteMember(ctx context.Context, q *Queue, node string) error {
	voters := q.group.Voters()
	if !slices.Contains(voters, node) {
		return memberErrorf("node '%s' is not a member of queue '%s' in vhost '%s'", node, q.name, q.vhost.name)
	}
	if len(voters) == 1 {
		return memberErrorf("node '%s' is the last member of queue '%s' in vhost '%s'", node, q.name, q.vhost.name)
	}
	ctx, cancel := context.WithTimeout(ctx, memberChangeTimeout)
	defer cancel()
	if err := b.handOverLeadership(ctx, q, node, voters); err != nil {
		// Demote all the same: the leader's answer is the authority (this node's view of the
		// voters may lag behind it), and a group that is only slow gets a leader again by itself.
		b.log.Warn("quorum queue leadership not handed over before removing a member", "vhost", q.vhost.name,
			"queue", q.name, "node", node, "err", err)
	}
	if err := q.group.DemoteVoter(ctx, node); err != nil {
		return fmt.Errorf("remove %s from queue '%s' in vhost '%s': %w", node, q.name, q.vhost.name, err)
	}
	b.log.Info("quorum queue member removed (its replica stays, without a vote)", "vhost", q.vhost.name, "queue", q.name, "node", node)
	return nil
}

// GrowStrategy selects the queues grow adds a member to: GrowAll every matching queue, GrowEven
// only those with an even number of members (as rabbitmq-queues grow all|even).
type GrowStrategy string

// The grow strategies.
const (
	GrowAll  GrowStrategy = "all"
	GrowEven GrowStrategy = "even"
)

// MemberChange is one queue a grow or shrink changed or failed to change.
type MemberChange struct {
	VHost, Queue string
	Err          error // nil: changed
}

// matchingQuorumQueues lists the quorum queues whose vhost and name match the patterns (nil: any).
func (b *Broker) matchingQuorumQueues(vhostPattern, queuePattern *regexp.Regexp) []*Queue {
	var out []*Queue
	for _, v := range b.VHosts() {
		if vhostPattern != nil && !vhostPattern.MatchString(v.name) {
			continue
		}
		for _, q := range v.Queues() {
			if q.kind != "quorum" || q.group == nil {
				continue
			}
			if queuePattern != nil && !queuePattern.MatchString(q.name) {
				continue
			}
			out = append(out, q)
		}
	}
	return out
}

// GrowQueues adds node as a member of the matching quorum queues that do not have it (a node
// that joined the cluster after they were declared gets their replicas this way).
func (b *Broker) GrowQueues(ctx context.Context, node string, strategy GrowStrategy, vhostPattern, queuePattern *regexp.Regexp) ([]MemberChange, error) {
	if strategy != GrowAll && strategy != GrowEven {
		return nil, memberErrorf("unknown grow strategy '%s' (all or even)", strategy)
	}
	addr, err := b.memberAddr(node)
	if err != nil {
		return nil, err
	}
	var out []MemberChange
	for _, q := range b.matchingQuorumQueues(vhostPattern, queuePattern) {
		voters := q.group.Voters()
		if slices.Contains(voters, node) || strategy == GrowEven && len(voters)%2 != 0 {
			continue
		}
		out = append(out, MemberChange{VHost: q.vhost.name, Queue: q.name, Err: b.addMember(ctx, q, node, addr)})
		if ctx.Err() != nil {
			break
		}
	}
	return out, ctx.Err()
}

// ShrinkQueues removes node from the members of every quorum queue that has it, except where it
// is the last member.
func (b *Broker) ShrinkQueues(ctx context.Context, node string) ([]MemberChange, error) {
	if !slices.ContainsFunc(b.node.Members(), func(m cluster.Member) bool { return m.ID == node }) {
		return nil, memberErrorf("node '%s' is not a member of the cluster", node)
	}
	var out []MemberChange
	for _, q := range b.matchingQuorumQueues(nil, nil) {
		voters := q.group.Voters()
		if !slices.Contains(voters, node) {
			continue
		}
		var err error
		if len(voters) == 1 {
			err = memberErrorf("node '%s' is the last member of queue '%s' in vhost '%s'", node, q.name, q.vhost.name)
		} else {
			err = b.deleteMember(ctx, q, node)
		}
		out = append(out, MemberChange{VHost: q.vhost.name, Queue: q.name, Err: err})
		if ctx.Err() != nil {
			break
		}
	}
	return out, ctx.Err()
}

// RebalanceLeaders moves quorum queue leaders from the nodes that lead more than their share
// (the queues over the number of up nodes, rounded up) to the up members that lead fewer, as
// rabbitmq-queues rebalance quorum does. It returns how many leaderships moved.
func (b *Broker) RebalanceLeaders(ctx context.Context) (int, error) {
	queues := b.matchingQuorumQueues(nil, nil)
	led := make(map[string][]*Queue)
	var up []string
	addrs := make(map[string]string)
	for _, m := range b.node.Members() {
		if b.node.PeerUp(m.ID) {
			up = append(up, m.ID)
			addrs[m.ID] = m.Addr
		}
	}
	if len(up) < 2 {
		return 0, nil
	}
	counted := 0
	for _, q := range queues {
		if l := q.group.Leader(); l != "" {
			led[l] = append(led[l], q)
			counted++
		}
	}
	share := (counted + len(up) - 1) / len(up)
	moved := 0
	var errs []error
	for _, from := range up {
		for len(led[from]) > share && ctx.Err() == nil {
			q := led[from][len(led[from])-1]
			led[from] = led[from][:len(led[from])-1]
			// The up voter of this queue that leads the fewest, if it leads fewer than its share.
			to := ""
			for _, v := range q.group.Voters() {
				if _, ok := addrs[v]; ok && v != from && len(led[v]) < share && (to == "" || len(led[v]) < len(led[to])) {
					to = v
				}
			}
			if to == "" {
				led[from] = append([]*Queue{q}, led[from]...) // stays; try the next one
				if allStuck(led[from], from, addrs, led, share) {
					break
				}
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, memberChangeTimeout)
			err := q.group.TransferLeadership(cctx, to, addrs[to])
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("queue '%s' in vhost '%s': %w", q.name, q.vhost.name, err))
				continue
			}
			led[to] = append(led[to], q)
			moved++
		}
	}
	if moved > 0 {
		b.log.Info("quorum queue leaders rebalanced", "moved", moved, "queues", counted, "nodes", len(up))
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return moved, errors.Join(errs...)
}

// allStuck reports whether none of the queues from leads has an up voter below share.
func allStuck(qs []*Queue, from string, addrs map[string]string, led map[string][]*Queue, share int) bool {
	for _, q := range qs {
		for _, v := range q.group.Voters() {
			if _, ok := addrs[v]; ok && v != from && len(led[v]) < share {
				return false
			}
		}
	}
	return true
}
