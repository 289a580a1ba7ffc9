package core

import (
	"context"
	"strings"

	"warren/amqp"
	"warren/exchange"
	"warren/server/queue"
)

// What operators see of streams (the HTTP API's stream paths): stored offsets, deduplicating
// publishers, consumer groups with their lag; and moving a group's offsets.

// StreamTracking returns a stream's named offsets and the highest publishing id of each
// deduplicating publisher (x-publisher-id, the stream protocol's publisher reference). ok is
// false when name is not a stream.
func (v *VHost) StreamTracking(name string) (offsets, writers map[string]uint64, ok bool) {
	q := v.Queue(name)
	if q == nil {
		return nil, nil, false
	}
	sq, isStream := q.Queue.(StreamQueue)
	if !isStream {
		return nil, nil, false
	}
	l := sq.Replica().Log()
	writers = l.Writers()
	for id := range writers {
		if strings.HasPrefix(id, internalWriterPrefix) {
			delete(writers, id)
		}
	}
	return l.Offsets(), writers, true
}

// StreamStatus is a stream's replication as this node sees it.
type StreamStatus struct {
	Role               string // leader, recovering, follower
	Epoch              uint64
	First, Committed   uint64
	Written, Durable   uint64
	Followers          map[string]uint64 // the leader: each follower's acknowledged end
	Voters, Nonvoters  []string
	CoordinationLeader string
	Next               uint64 // the end of what local readers see
}

// StreamStatus returns stream name's replication status on this node.
func (v *VHost) StreamStatus(name string) (StreamStatus, bool) {
	q := v.Queue(name)
	if q == nil {
		return StreamStatus{}, false
	}
	sq, ok := q.Queue.(StreamQueue)
	if !ok {
		return StreamStatus{}, false
	}
	r := sq.Replica()
	l := r.Log()
	role, epoch := r.Role()
	st := StreamStatus{Role: role, Epoch: epoch, First: l.First(), Committed: l.Committed(), Written: l.Written(),
		Durable: l.Durable(), Followers: r.Acks(), Voters: q.voters, Nonvoters: q.nonvoters, Next: l.Next()}
	if q.group != nil {
		st.CoordinationLeader = q.group.Leader()
	}
	return st, true
}

// GroupMemberInfo is a member of a consumer group.
type GroupMemberInfo struct {
	ConsumerTag string
	Node        string
	ID          uint64
}

// GroupPartitionInfo is a consumer group's view of one partition.
type GroupPartitionInfo struct {
	Partition string
	Owner     *GroupMemberInfo // nil: none
	MovingTo  *GroupMemberInfo // nil: not moving
	// Committed is the group's committed offset on the partition (HasCommitted false: none);
	// Last is the partition's last offset (HasLast false: empty); Lag = Last - Committed (or the
	// records retained when nothing is committed).
	Committed    uint64
	HasCommitted bool
	Last         uint64
	HasLast      bool
	Lag          uint64
}

// GroupInfo is a consumer group of a (super) stream.
type GroupInfo struct {
	Name       string
	Members    []GroupMemberInfo
	Partitions []GroupPartitionInfo
}

// ConsumerGroupStreams lists the (super) streams of the vhost that have consumer groups, once
// each (for readers of every group: the Prometheus exporter).
func (v *VHost) ConsumerGroupStreams() []string {
	b := v.b
	seen := map[string]bool{}
	var out []string
	b.groups.mu.Lock()
	for k := range b.groups.byKey {
		if k.vhost == v.name && !seen[k.stream] {
			seen[k.stream] = true
			out = append(out, k.stream)
		}
	}
	b.groups.mu.Unlock()
	return out
}

// ConsumerGroups lists the consumer groups of super stream (or stream) name. ok is false when
// name is neither.
func (v *VHost) ConsumerGroups(name string) ([]GroupInfo, bool) {
	if !v.isGroupable(name) {
		return nil, false
	}
	b := v.b
	b.groups.mu.Lock()
	var gs []*groupState
	for k, g := range b.groups.byKey {
		if k.vhost == v.name && k.stream == name {
			gs = append(gs, g.clone())
		}
	}
	b.groups.mu.Unlock()
	out := make([]GroupInfo, 0, len(gs))
	for _, g := range gs {
		gi := GroupInfo{Name: g.key.group}
		members := make(map[uint64]GroupMemberInfo)
		for _, m := range g.Members {
			mi := GroupMemberInfo{ConsumerTag: m.Tag, Node: m.Node, ID: m.ID}
			members[m.ID] = mi
			gi.Members = append(gi.Members, mi)
		}
		who := func(id uint64) *GroupMemberInfo {
			if id == 0 {
				return nil
			}
			if m, ok := members[id]; ok {
				return &m
			}
			return &GroupMemberInfo{ID: id, ConsumerTag: "(left)"}
		}
		for i, s := range g.Slots {
			pi := GroupPartitionInfo{Partition: g.Partitions[i], Owner: who(s.Owner), MovingTo: who(s.Target)}
			if q := v.Queue(g.Partitions[i]); q != nil {
				if sq, ok := q.Queue.(StreamQueue); ok {
					l := sq.Replica().Log()
					first, next := l.First(), l.Next()
					if next > first {
						pi.Last, pi.HasLast = next-1, true
					}
					pi.Committed, pi.HasCommitted = l.LoadOffset(g.key.group)
					switch {
					case pi.HasCommitted && pi.HasLast && pi.Last > pi.Committed:
						pi.Lag = pi.Last - pi.Committed
					case !pi.HasCommitted:
						pi.Lag = next - first
					}
				}
			}
			gi.Partitions = append(gi.Partitions, pi)
		}
		out = append(out, gi)
	}
	return out, true
}

func (v *VHost) isGroupable(name string) bool {
	if x, ok := v.ex.Get(name); ok && x.Kind == exchange.SuperStream {
		return true
	}
	q := v.Queue(name)
	return q != nil && q.kind == "stream"
}

// ErrGroupHasMembers refuses moving the offsets of a group that has members.
var ErrGroupHasMembers = amqp.Errorf(amqp.PreconditionFailed, "the consumer group has members")

// ResetGroupOffsets moves group's offsets on every partition of super stream (or stream) name to
// where spec points (an x-stream-offset value: "first", "last", "next", an offset, a time): the
// next member starts there. The group must have no members.
func (v *VHost) ResetGroupOffsets(ctx context.Context, name, group string, spec any) *amqp.Error {
	h, err := v.GroupQueue(name, group)
	if err != nil {
		return err
	}
	gh := h.Queue.(*groupHandle)
	if g := v.b.groupState(gh.key); g != nil && len(g.Members) > 0 {
		return ErrGroupHasMembers
	}
	starts := make([]int64, len(gh.parts))
	parts := make([]queue.GroupPartition, len(gh.parts))
	for i := range gh.parts {
		p, ok := gh.partition(i)
		if !ok {
			return v.QueueNotFound(gh.parts[i])
		}
		off, rerr := p.ResolveOffset(spec)
		if rerr != nil {
			if ae, ok := rerr.(*amqp.Error); ok {
				return ae
			}
			return amqp.Errorf(amqp.PreconditionFailed, "%v", rerr)
		}
		starts[i], parts[i] = int64(off), p
	}
	if aerr := v.b.proposeGroup(ctx, &groupCmd{Op: "reset", Key: gh.key, Partitions: gh.parts, Starts: starts}); aerr != nil {
		return aerr
	}
	g := v.b.groupState(gh.key)
	if g == nil || len(g.Members) > 0 {
		return ErrGroupHasMembers
	}
	for i, s := range g.Slots {
		if !s.Exact || s.Start != starts[i] {
			return ErrGroupHasMembers // a member joined first
		}
	}
	for i, p := range parts {
		if starts[i] > 0 {
			p.StoreCommitted(group, uint64(starts[i]-1))
		}
	}
	return nil
}

// StreamConsumers lists the consumers of stream name on this node (nil, false if it is not a
// stream).
func (v *VHost) StreamConsumers(name string) ([]queue.ConsumerInfo, bool) {
	q := v.Queue(name)
	if q == nil || q.kind != "stream" {
		return nil, false
	}
	cl, ok := q.Queue.(queue.ConsumerLister)
	if !ok {
		return nil, true
	}
	return cl.ConsumerInfos(), true
}
