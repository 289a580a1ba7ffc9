package cluster

import (
	"cmp"
	"slices"
	"time"
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
	// CommitLatency is a moving average (1/8 weight to each new proposal) of the time from
	// handing a proposal to raft on this node, as leader, to its being applied; 0 before any.
	CommitLatency time.Duration
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
			Applied: g.AppliedIndex(), CommitLatency: time.Duration(g.commitNanos.Load()),
		})
	}
	slices.SortFunc(out, func(a, b GroupMetrics) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// observeCommit folds one proposal's commit time into the moving average: one atomic load and
// store on the group's waiter goroutine, its only writer.
func (g *Group) observeCommit(d time.Duration) {
	old := g.commitNanos.Load()
	if old == 0 {
		g.commitNanos.Store(int64(d))
		return
	}
	g.commitNanos.Store(old + (int64(d)-old)/8)
}
