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
		term, leader := g.termAndLeader()
		out = append(out, GroupMetrics{
			ID: g.id, Name: g.name, Leader: leader,
			Term: term, CommitIndex: g.raft.CommitIndex(), LastIndex: g.raft.LastIndex(),
			Applied: g.AppliedIndex(), CommitLatency: time.Duration(g.commitNanos.Load()),
		})
	}
	slices.SortFunc(out, func(a, b GroupMetrics) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// termAndLeader reads the group's term and whether this node leads it as one consistent pair,
// so that a scrape never shows a node leading a term it does not lead (a partition test looks
// for two leaders of one term). Raft's term and state are separate atomics; a leader keeps its
// term for as long as it leads, and raft leaves the leader state before it takes a newer term,
// so the state read between two equal term reads is the state of that term. The term changes
// only at elections: a second try almost always agrees.
func (g *Group) termAndLeader() (uint64, bool) {
	for {
		term := g.raft.CurrentTerm()
		leader := g.IsLeader()
		if g.raft.CurrentTerm() == term {
			return term, leader
		}
	}
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
