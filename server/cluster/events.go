package cluster

import "github.com/hashicorp/raft"

// obsBuffer is the capacity of the node's observation channel. Raft blocks on it (a dropped
// leadership change would leave OnLeader wrong), and the node's event loop only hands each
// observation to its group, so it is drained as fast as raft fills it.
const obsBuffer = 1024

// newObserver returns the node's one raft observer, registered with every group: leadership
// changes of all groups reach one goroutine instead of one goroutine per group.
func newObserver(ch chan raft.Observation) *raft.Observer {
	return raft.NewObserver(ch, true, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.RaftState, raft.LeaderObservation:
			return true
		}
		return false
	})
}

// watch registers g's raft with the node's observer.
func (n *Node) watch(g *Group) {
	n.mu.Lock()
	n.byRaft[g.raft] = g
	n.mu.Unlock()
	g.raft.RegisterObserver(n.observer)
	// A change before the registration went unseen: report the state now (a no-op if unchanged).
	g.leadership(g.raft.State() == raft.Leader)
	if _, id := g.raft.LeaderWithID(); id != "" {
		g.leaderObserved(string(id))
	}
}

// unwatch deregisters g's raft (after its shutdown).
func (n *Node) unwatch(g *Group) {
	g.raft.DeregisterObserver(n.observer)
	n.mu.Lock()
	delete(n.byRaft, g.raft)
	n.mu.Unlock()
}

// eventLoop hands raft observations to their groups until the node's groups are all closed.
func (n *Node) eventLoop() {
	defer n.evwg.Done()
	for {
		select {
		case o := <-n.obsCh:
			n.mu.Lock()
			g := n.byRaft[o.Raft]
			n.mu.Unlock()
			if g == nil {
				continue
			}
			switch d := o.Data.(type) {
			case raft.RaftState:
				g.leadership(d == raft.Leader)
			case raft.LeaderObservation:
				g.leaderObserved(string(d.LeaderID))
				g.kickRetries()
			}
		case <-n.evStop:
			return
		}
	}
}
