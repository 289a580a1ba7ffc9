package cluster

import (
	"cmp"
	"slices"
)

// GroupMetrics are one raft group's numbers for the Prometheus exporter
// (rabbitmq_raft_*). Reading them takes no lock of the group's hot path: raft's term,
// commit and applied indexes are atomics, its last index a short leaf lock of raft's own.
type GroupMetrics struct {
	ID          uint64
	Name        string
	Leader      bool   // this node leads the group
	Term        uint64 // current raft term
	CommitIndex uint64 // highest index known committed
	LastIndex   uint64 // last index written to this node's log (or its snapshot)
	Applied     uint64 // last index this node's state machine applied
}

// GroupMetrics lists the groups running on this node, by id. The node's group map is locked
// only to copy it.
func (n *Node) GroupMetrics() []GroupMetrics {
	n.mu.Lock()
	groups := make([]*Group, 0, len(n.groups))
	for _, g := range n.groups {
		groups = append(groups, g)
	}
	n.mu.Unlock()
	out := make([]GroupMetrics, 0, len(groups))
	for _, g := range groups {
		out = append(out, GroupMetrics{
			ID: g.id, Name: g.name, Leader: g.IsLeader(),
			Term: g.raft.CurrentTerm(), CommitIndex: g.raft.CommitIndex(), LastIndex: g.raft.LastIndex(),
			Applied: g.AppliedIndex(),
		})
	}
	slices.SortFunc(out, func(a, b GroupMetrics) int { return cmp.Compare(a.ID, b.ID) })
	return out
}
