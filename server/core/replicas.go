package core

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"warren/server/cluster"
	"warren/server/queue"
)

// Replicated queues (quorum queues; in a cluster, durable named classic queues) are served by a
// raft group each: the queue type's replica is the group's state machine, and this file is the
// glue between the two (the queue package does not import raft).

// Replica is a queue type's replica of a replicated queue, as the core drives it (the quorum
// type's *queue.Quorum).
type Replica interface {
	queue.Queue
	// Apply applies one replicated command (raft's FSM Apply) and returns the leader's answer.
	Apply(index uint64, cmd []byte) []byte
	// CaptureSnapshot captures the replicated state between two Applies (nil: not worth a
	// snapshot yet, unless force); the snapshot streams itself (bodies from a storage view)
	// off the FSM goroutine. RestoreFrom replaces the state with a snapshot's.
	CaptureSnapshot(force bool) (*queue.ReplicaSnapshot, error)
	RestoreFrom(r io.Reader) error
	// ForceNextSnapshot makes the next CaptureSnapshot(false) capture whatever the schedule says.
	ForceNextSnapshot()
	// LeaderChanged tells the replica whether this node now leads its group (a new leader hands
	// over the dead letters still recorded).
	LeaderChanged(leader bool)
	// NodeDown gives back the deliveries of the consumers of node tag (run by the leader).
	NodeDown(node uint16)
	// Rejoin removes this node's consumers of earlier boots once the group runs.
	Rejoin()
	// ConsumerNodes lists the node tags of the consumers in the replicated state.
	ConsumerNodes() []uint16
	// Unavailable cancels the consumers attached through this node (home node down).
	Unavailable()
}

// clusterGroupConfig builds a raft group's configuration.
func clusterGroupConfig(id uint64, name string, fsm raft.FSM, voters, nonvoters []string, bootstrap bool, onLeader func(bool)) cluster.GroupConfig {
	return cluster.GroupConfig{ID: id, Name: name, FSM: fsm, Voters: voters, Nonvoters: nonvoters, Bootstrap: bootstrap, OnLeader: onLeader}
}

// openReplica opens this node's replica of q and starts its raft group.
func (b *Broker) openReplica(q *Queue, cfg queue.OpenConfig) error {
	t := b.types[q.kind]
	if t == nil {
		return errUnknownType(q.kind)
	}
	rep := &groupReplicator{}
	cfg.Extra = &queue.QuorumConfig{Replicator: rep, Node: b.tag, Epoch: b.epoch, Classic: q.kind == "classic"}
	impl, err := t.Open(cfg)
	if err != nil {
		return err
	}
	r, ok := impl.(Replica)
	if !ok {
		impl.Close()
		return fmt.Errorf("queue type %q cannot serve a replicated queue", q.kind)
	}
	g, err := b.node.StartGroup(clusterGroupConfig(q.id, fmt.Sprintf("queue '%s' in vhost '%s'", q.name, q.vhost.name),
		&replicaFSM{r: r}, q.voters, q.nonvoters, true, func(leader bool) {
			r.LeaderChanged(leader)
			if leader {
				b.reapConsumers(r)
			}
		}))
	if err != nil {
		r.Close()
		return err
	}
	rep.g.Store(g)
	q.Queue, q.group = r, g
	// Consumers this node had before a restart are gone: give their messages back.
	r.Rejoin()
	return nil
}

// groupReplicator adapts a cluster group to queue.Replicator. The group is set once it started.
type groupReplicator struct {
	g atomic.Pointer[cluster.Group]
}

func (r *groupReplicator) Propose(cmd []byte, done func(uint64, []byte, error)) {
	g := r.g.Load()
	if g == nil {
		go done(0, nil, errors.New("replicated queue group not started"))
		return
	}
	g.ProposeAsync(cmd, metaTimeout, func(res cluster.Result, err error) { done(res.Index, res.Data, err) })
}

// ProposeAsLeader implements queue.LeaderProposer.
func (r *groupReplicator) ProposeAsLeader(cmd []byte, done func(uint64, []byte, error)) {
	g := r.g.Load()
	if g == nil {
		go done(0, nil, errors.New("replicated queue group not started"))
		return
	}
	g.ProposeAsLeader(cmd, metaTimeout, func(res cluster.Result, err error) { done(res.Index, res.Data, err) })
}

func (r *groupReplicator) IsLeader() bool {
	g := r.g.Load()
	return g != nil && g.IsLeader()
}

// replicaFSM runs a replica as its group's raft.FSM.
type replicaFSM struct{ r Replica }

func (f *replicaFSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	if resp := f.r.Apply(l.Index, l.Data); resp != nil {
		return resp
	}
	return nil
}

// Snapshot implements raft.FSM. A replica that declines (too few entries since its last
// snapshot for what writing one costs) answers raft.ErrNothingNewToSnapshot, which raft takes
// quietly and asks again at its next interval.
func (f *replicaFSM) Snapshot() (raft.FSMSnapshot, error) {
	s, err := f.r.CaptureSnapshot(false)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, raft.ErrNothingNewToSnapshot
	}
	return &replicaSnapshot{s: s}, nil
}

func (f *replicaFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if err := f.r.RestoreFrom(rc); err != nil {
		return wrap("restore replicated queue snapshot", err)
	}
	return nil
}

// replicaSnapshot persists a captured replica snapshot by streaming it into raft's sink.
type replicaSnapshot struct{ s *queue.ReplicaSnapshot }

func (s *replicaSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := s.s.WriteTo(sink); err != nil {
		sink.Cancel()
		return wrap("write snapshot", err)
	}
	return sink.Close()
}

func (s *replicaSnapshot) Release() { s.s.Release() }

// reapConsumers returns the messages of consumers on nodes that are down (run by a queue's leader).
func (b *Broker) reapConsumers(r Replica) {
	up := make(map[uint16]bool)
	for _, m := range b.node.Members() {
		if b.node.PeerUp(m.ID) {
			up[nodeTag(m.ID)] = true
		}
	}
	for _, t := range r.ConsumerNodes() {
		if !up[t] {
			r.NodeDown(t)
		}
	}
}

// PeerChanged is told by the cluster layer when a node goes down or comes back. The leader of
// each replicated queue gives the messages of that node's consumers back; a classic queue whose
// home node is gone cancels its consumers here, as RabbitMQ does.
func (b *Broker) PeerChanged(id string, up bool) {
	if up {
		b.log.Info("cluster node up", "node", id)
		return
	}
	b.log.Warn("cluster node down", "node", id)
	b.groupNodeGone(id)
	tag := nodeTag(id)
	for _, v := range b.VHosts() {
		for _, q := range v.Queues() {
			r, ok := q.Queue.(Replica)
			if !ok || q.group == nil {
				continue
			}
			if q.group.IsLeader() {
				r.NodeDown(tag)
			}
			if len(q.voters) == 1 && q.voters[0] == id {
				r.Unavailable()
			}
		}
	}
}

// quorumMembers picks a new replicated queue's voters: this node first, then the next live
// members in id order, up to size; every other member gets a non-voting replica so it can serve
// the queue.
func (b *Broker) quorumMembers(size int) (voters, nonvoters []string, err error) {
	return b.quorumMembersFrom(size, 0)
}

// quorumMembersFrom is quorumMembers starting shift nodes after this one (a super stream's
// partition i starts at the i-th node, so the partitions' leaders spread over the cluster).
func (b *Broker) quorumMembersFrom(size, shift int) (voters, nonvoters []string, err error) {
	if size <= 0 {
		size = 3
	}
	members := b.node.Members()
	ids := make([]string, 0, len(members))
	live := 0
	for _, m := range members {
		ids = append(ids, m.ID)
		if b.node.PeerUp(m.ID) {
			live++
		}
	}
	if len(ids) == 0 {
		ids = []string{b.node.ID()}
		live = 1
	}
	if live*2 <= len(ids) {
		return nil, nil, fmt.Errorf("only %d of %d cluster nodes are up", live, len(ids))
	}
	start := slices.Index(ids, b.node.ID())
	if start < 0 {
		start = 0
	}
	start = (start + shift) % len(ids)
	for i := range ids {
		id := ids[(start+i)%len(ids)]
		if len(voters) < size && (b.node.PeerUp(id) || len(voters) == 0) {
			voters = append(voters, id)
		} else {
			nonvoters = append(nonvoters, id)
		}
	}
	return voters, nonvoters, nil
}

// clustered reports whether this node has peers (then durable classic queues are replicated too).
func (b *Broker) clustered() bool { return len(b.node.Members()) > 1 }

// ClusterStatus reports the node's view of its cluster: members and raft groups with leaders.
func (b *Broker) ClusterStatus() cluster.Status { return b.node.Status() }
