package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"warren/amqp"
	"warren/exchange"
	"warren/server/cluster"
	"warren/server/queue"
)

// What is replicated through the metadata group: durable exchanges, quorum queues, durable classic
// queues declared in a cluster, and the bindings to them. Streams and exclusive, auto-delete or
// non-durable queues (and their bindings) stay on the node that declared them.

// metaTimeout bounds how long a declaration waits for the metadata group, and a quorum queue
// command for its group (after which a publish is nacked).
const metaTimeout = 10 * time.Second

// metaGroupID is the Raft group of the cluster metadata.
const metaGroupID = 0

// nodeTag is the 16-bit tag of a node in consumer ids (see queue.ConsumerNode).
func nodeTag(id string) uint16 {
	h := fnv.New32a()
	h.Write([]byte(id))
	v := h.Sum32()
	return uint16(v>>16) ^ uint16(v)
}

// startCluster starts the node's cluster layer; the metadata group starts after recovery.
func (s *Server) startCluster() error {
	id := s.cfg.NodeID
	if id == "" {
		id = "warren"
	}
	n, err := cluster.Start(cluster.Config{
		NodeID: id, Listen: s.cfg.ClusterListen, Peers: s.cfg.ClusterPeers, Join: s.cfg.ClusterJoin,
		DB: s.db, DataDir: s.cfg.DataDir, Logger: s.log, OnPeerChange: s.peerChanged,
	})
	if err != nil {
		return fmt.Errorf("start cluster node: %w", err)
	}
	s.node = n
	s.tag = nodeTag(id)
	var b [2]byte
	rand.Read(b[:])
	s.epoch = binary.BigEndian.Uint16(b[:])
	s.nextConsumerID.Store(uint64(s.tag)<<48 | uint64(s.epoch)<<32)
	return nil
}

// startMeta starts the metadata group (bootstrapping it with the initial peers on first start).
func (s *Server) startMeta() error {
	var voters []string
	for _, m := range s.node.Members() {
		voters = append(voters, m.ID)
	}
	if len(voters) == 0 {
		voters = []string{s.node.ID()}
	}
	g, err := s.node.StartGroup(cluster.GroupConfig{
		ID: metaGroupID, Name: "metadata", FSM: &metaFSM{s: s}, Voters: voters, Bootstrap: !s.cfg.ClusterJoin,
	})
	if err != nil {
		return fmt.Errorf("start metadata group: %w", err)
	}
	s.meta = g
	return nil
}

// proposeMeta replicates a metadata change and waits until this node has applied it.
func (s *Server) proposeMeta(op amqp.Table) *amqp.Error {
	ctx, cancel := context.WithTimeout(context.Background(), metaTimeout)
	defer cancel()
	res, err := s.meta.Propose(ctx, mustTable(op))
	if err == nil {
		err = s.meta.WaitApplied(ctx, res.Index)
	}
	if err != nil {
		s.log.Warn("metadata change not replicated", "op", op["op"], "err", err)
		return amqp.Errorf(amqp.InternalError, "cannot replicate the change to the cluster metadata (no majority of nodes?): %v", err)
	}
	return nil
}

// metaFSM applies metadata changes on every node.
type metaFSM struct{ s *Server }

// Apply implements raft.FSM.
func (f *metaFSM) Apply(l *raft.Log) any {
	if v := f.apply(l); v != nil {
		if err := v.syncMeta(); err != nil {
			f.s.log.Error("cannot store metadata", "err", err)
		}
	}
	return nil
}

// ApplyBatch implements raft.BatchingFSM: the metadata is stored once per batch of entries (one sync
// for a burst of declarations instead of one each).
func (f *metaFSM) ApplyBatch(logs []*raft.Log) []any {
	var dirty []*vhost
	for _, l := range logs {
		if v := f.apply(l); v != nil && !slices.Contains(dirty, v) {
			dirty = append(dirty, v)
		}
	}
	for _, v := range dirty {
		if err := v.syncMeta(); err != nil {
			f.s.log.Error("cannot store metadata", "err", err)
		}
	}
	return make([]any, len(logs))
}

// apply applies one metadata entry in memory and returns the vhost whose metadata must be stored
// (nil if nothing changed).
func (f *metaFSM) apply(l *raft.Log) *vhost {
	if l.Type != raft.LogCommand {
		return nil
	}
	v := f.s.vhosts["/"]
	if l.Index <= v.metaApplied.Load() {
		return nil // already in the metadata on disk
	}
	op, _, err := amqp.DecodeTable(l.Data)
	if err != nil {
		f.s.log.Error("malformed metadata command; skipped", "index", l.Index, "err", err)
		return nil
	}
	if name, _ := op["vhost"].(string); name != "" {
		if vv := f.s.vhosts[name]; vv != nil {
			v = vv
		}
	}
	f.s.applyMeta(v, op)
	v.metaApplied.Store(l.Index)
	return v
}

// applyMeta carries out one metadata change locally. Changes are idempotent: the node that proposed
// one has usually made it already.
func (s *Server) applyMeta(v *vhost, op amqp.Table) {
	str := func(k string) string { x, _ := op[k].(string); return x }
	bl := func(k string) bool { x, _ := op[k].(bool); return x }
	args, _ := op["arguments"].(amqp.Table)
	switch str("op") {
	case "exchange.declare":
		if _, _, err := v.exchanges.Declare(str("name"), str("type"), true, bl("auto_delete"), bl("internal"), false, args); err != nil {
			s.log.Warn("replicated exchange declaration not applied", "exchange", str("name"), "err", err.Text)
		}
	case "exchange.delete":
		if _, ok := v.exchanges.Get(str("name")); ok {
			v.exchanges.Delete(str("name"), false)
		}
	case "bind", "unbind":
		b := exchange.Binding{Source: str("source"), Dest: str("destination"), DestKind: exchange.ToQueue, Key: str("routing_key"), Args: args}
		if str("destination_type") == "exchange" {
			b.DestKind = exchange.ToExchange
		}
		if str("op") == "bind" {
			v.exchanges.Bind(b)
		} else {
			v.exchanges.Unbind(b)
		}
	case "queue.declare":
		gid, _ := amqp.AsInt64(op["group"])
		if e := v.lookupQueue(str("name")); e != nil {
			if e.group == uint64(gid) {
				return
			}
			if e.group == 0 {
				// A queue local to this node (a stream, an exclusive or transient queue) has the
				// name: it keeps it, and this node does not serve the replicated one.
				s.log.Error("a replicated queue has the name of a queue local to this node; this node will not serve it",
					"queue", str("name"))
				return
			}
			s.dropQueue(v, e)
		}
		st, err := parseQueueArgs(str("name"), v.name, args)
		if err != nil {
			s.log.Error("replicated quorum queue has invalid arguments", "queue", str("name"), "err", err.Text)
			return
		}
		if _, err := s.openQuorum(v, str("name"), args, st, uint64(gid), stringList(op["voters"]), stringList(op["nonvoters"])); err != nil {
			s.log.Error("cannot start quorum queue", "queue", str("name"), "err", err)
		}
	case "queue.delete":
		gid, _ := amqp.AsInt64(op["group"])
		if e := v.lookupQueue(str("name")); e != nil && e.group == uint64(gid) {
			s.dropQueue(v, e)
		}
	default:
		s.log.Error("unknown metadata command; skipped", "op", str("op"))
	}
}

func stringList(v any) []string {
	arr, _ := v.([]any)
	out := make([]string, 0, len(arr))
	for _, x := range arr {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// dropQueue deletes a replicated queue on this node: its consumers are cancelled, and its group's
// log and snapshots go.
func (s *Server) dropQueue(v *vhost, e *queueEntry) {
	v.deleteQueue(e)
	if g := s.node.Group(e.group); g != nil {
		if err := g.Remove(); err != nil {
			s.log.Warn("cannot remove a replicated queue's group", "queue", e.name, "err", err)
		}
	}
}

// bytesSnapshot is an FSM snapshot already encoded (metadata or a quorum queue).
type bytesSnapshot struct{ data []byte }

func (m *bytesSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(m.data); err != nil {
		sink.Cancel()
		return fmt.Errorf("write metadata snapshot: %w", err)
	}
	return sink.Close()
}

func (m *bytesSnapshot) Release() {}

// Snapshot implements raft.FSM: the replicated part of the metadata, as records like those on disk.
func (f *metaFSM) Snapshot() (raft.FSMSnapshot, error) {
	v := f.s.vhosts["/"]
	recs := v.replicatedMeta()
	keys := make([]string, 0, len(recs))
	for k := range recs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	list := make([]any, 0, len(keys))
	for _, k := range keys {
		list = append(list, amqp.Table{"key": []byte(k), "value": recs[k]})
	}
	data := mustTable(amqp.Table{"applied": int64(v.metaApplied.Load()), "records": list})
	return &bytesSnapshot{data: data}, nil
}

// Restore implements raft.FSM: it makes the replicated metadata that of the snapshot, unless the
// metadata on disk is already newer.
func (f *metaFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("read metadata snapshot: %w", err)
	}
	t, _, err := amqp.DecodeTable(b)
	if err != nil {
		return fmt.Errorf("decode metadata snapshot: %w", err)
	}
	v := f.s.vhosts["/"]
	applied, _ := amqp.AsInt64(t["applied"])
	if uint64(applied) <= v.metaApplied.Load() {
		return nil
	}
	want := make(map[string][]byte)
	list, _ := t["records"].([]any)
	for _, x := range list {
		r, _ := x.(amqp.Table)
		k, _ := r["key"].([]byte)
		val, _ := r["value"].([]byte)
		want[string(k)] = val
	}
	f.s.reconcileMeta(v, want)
	v.metaApplied.Store(uint64(applied))
	if err := v.syncMeta(); err != nil {
		return fmt.Errorf("store restored metadata: %w", err)
	}
	return nil
}

// reconcileMeta makes the node's replicated metadata equal to want (records as replicatedMeta).
func (s *Server) reconcileMeta(v *vhost, want map[string][]byte) {
	have := v.replicatedMeta()
	for k := range have {
		if _, ok := want[k]; ok {
			continue
		}
		kind, name := k[1], k[2:]
		switch kind {
		case metaExchange:
			s.applyMeta(v, amqp.Table{"op": "exchange.delete", "name": name})
		case metaQueue:
			if e := v.lookupQueue(name); e != nil && e.group != 0 {
				s.dropQueue(v, e)
			}
		case metaBinding:
			if t, _, err := amqp.DecodeTable(have[k]); err == nil {
				t["op"] = "unbind"
				s.applyMeta(v, t)
			}
		}
	}
	// Exchanges first, then queues, then bindings.
	for _, kind := range []byte{metaExchange, metaQueue, metaBinding} {
		for k, val := range want {
			if k[1] != kind || string(have[k]) == string(val) {
				continue
			}
			t, _, err := amqp.DecodeTable(val)
			if err != nil {
				continue
			}
			switch kind {
			case metaExchange:
				t["op"], t["name"] = "exchange.declare", k[2:]
			case metaQueue:
				t["op"], t["name"] = "queue.declare", k[2:]
			case metaBinding:
				t["op"] = "bind"
			}
			s.applyMeta(v, t)
		}
	}
}

// replicatedMeta is the part of desiredMeta that the metadata group replicates.
func (v *vhost) replicatedMeta() map[string][]byte {
	all := v.desiredMeta()
	out := make(map[string][]byte)
	for k, val := range all {
		if len(k) < 2 {
			continue
		}
		switch k[1] {
		case metaExchange:
			out[k] = val
		case metaQueue:
			if t, _, err := amqp.DecodeTable(val); err == nil {
				if g, _ := amqp.AsInt64(t["group"]); g != 0 {
					out[k] = val
				}
			}
		case metaBinding:
			if t, _, err := amqp.DecodeTable(val); err == nil && v.replicatedBinding(t) {
				out[k] = val
			}
		}
	}
	return out
}

// replicatedBinding reports whether a binding record is replicated: its destination is an exchange or
// a quorum queue.
func (v *vhost) replicatedBinding(t amqp.Table) bool {
	if kind, _ := t["destination_type"].(string); kind == "exchange" {
		return true
	}
	name, _ := t["destination"].(string)
	e := v.lookupQueue(name)
	return e != nil && e.group != 0
}

// groupReplicator adapts a cluster group to queue.Replicator. The group is set once it has started.
type groupReplicator struct {
	g atomic.Pointer[cluster.Group]
}

func (r *groupReplicator) Propose(cmd []byte, done func([]byte, error)) {
	g := r.g.Load()
	if g == nil {
		go done(nil, errors.New("quorum queue group not started"))
		return
	}
	g.ProposeAsync(cmd, metaTimeout, func(res cluster.Result, err error) { done(res.Data, err) })
}

func (r *groupReplicator) IsLeader() bool {
	g := r.g.Load()
	return g != nil && g.IsLeader()
}

// queueFSM runs a quorum queue's state machine as its group's raft.FSM.
type queueFSM struct{ q *queue.Queue }

func (f *queueFSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	if resp := f.q.Apply(l.Index, l.Data); resp != nil {
		return resp
	}
	return nil
}

func (f *queueFSM) Snapshot() (raft.FSMSnapshot, error) {
	return &bytesSnapshot{data: f.q.Snapshot()}, nil
}

func (f *queueFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("read quorum queue snapshot: %w", err)
	}
	return f.q.RestoreSnapshot(b)
}

// openQuorum creates this node's replica of a quorum queue and starts its group.
func (s *Server) openQuorum(v *vhost, name string, args amqp.Table, st queueSettings, gid uint64, voters, nonvoters []string) (*queueEntry, error) {
	id := s.nextQueueID.Add(1)
	opts, hooks := s.newQueueOptions(v, name, true, false, false, st, id)
	rep := &groupReplicator{}
	q := queue.NewReplicated(opts, rep, s.tag, s.epoch)
	e := &queueEntry{q: q, args: args, v: v, settings: st, hooks: hooks, name: name, durable: true, id: id,
		group: gid, voters: voters, nonvoters: nonvoters, rep: rep}
	hooks.e.Store(e)
	g, err := s.node.StartGroup(cluster.GroupConfig{
		ID: gid, Name: fmt.Sprintf("queue '%s' in vhost '%s'", name, v.name), FSM: &queueFSM{q: q},
		Voters: voters, Nonvoters: nonvoters, Bootstrap: true,
		OnLeader: func(leader bool) {
			if leader {
				s.reapConsumers(q)
			}
		},
	})
	if err != nil {
		q.Close()
		return nil, err
	}
	rep.g.Store(g)
	v.mu.Lock()
	v.queues[name] = e
	v.mu.Unlock()
	// Consumers this node had before a restart are gone: give their messages back.
	q.NodeReset(s.tag, s.epoch, false)
	return e, nil
}

// reapConsumers returns the messages of consumers on nodes that are down (run by a queue's leader).
func (s *Server) reapConsumers(q *queue.Queue) {
	up := make(map[uint16]bool)
	for _, m := range s.node.Members() {
		if s.node.PeerUp(m.ID) {
			up[nodeTag(m.ID)] = true
		}
	}
	for _, t := range q.ConsumerNodes() {
		if !up[t] {
			q.NodeReset(t, 0, true)
		}
	}
}

// peerChanged is told by the cluster layer when a node goes down or comes back. The leader of each
// quorum queue gives the messages of that node's consumers back to the queue.
func (s *Server) peerChanged(id string, up bool) {
	if !up {
		s.log.Warn("cluster node down", "node", id)
	} else {
		s.log.Info("cluster node up", "node", id)
		return
	}
	tag := nodeTag(id)
	for _, v := range s.vhosts {
		v.mu.RLock()
		var qs []*queueEntry
		for _, e := range v.queues {
			if e.rep != nil {
				qs = append(qs, e)
			}
		}
		v.mu.RUnlock()
		for _, e := range qs {
			if e.rep.IsLeader() {
				e.q.NodeReset(tag, 0, true)
			}
			if len(e.voters) == 1 && e.voters[0] == id {
				// A classic queue whose home node is gone is unavailable: as RabbitMQ does, its
				// consumers here get basic.cancel.
				for cid, c := range e.q.LocalConsumers() {
					if cs, ok := c.(*consumer); ok {
						cs.ch.serverCancel(cs)
						e.q.RemoveConsumer(cid)
					}
				}
			}
		}
	}
}

// quorumMembers picks a new quorum queue's voters: this node first, then the next live members in
// id order, up to size; every other member gets a non-voting replica so it can serve the queue.
func (s *Server) quorumMembers(size int) (voters, nonvoters []string, err error) {
	if size <= 0 {
		size = 3
	}
	members := s.node.Members()
	ids := make([]string, 0, len(members))
	live := 0
	for _, m := range members {
		ids = append(ids, m.ID)
		if s.node.PeerUp(m.ID) {
			live++
		}
	}
	if len(ids) == 0 {
		ids = []string{s.node.ID()}
		live = 1
	}
	if live*2 <= len(ids) {
		return nil, nil, fmt.Errorf("only %d of %d cluster nodes are up", live, len(ids))
	}
	start := slices.Index(ids, s.node.ID())
	if start < 0 {
		start = 0
	}
	for i := range ids {
		id := ids[(start+i)%len(ids)]
		if len(voters) < size && (s.node.PeerUp(id) || len(voters) == 0) {
			voters = append(voters, id)
		} else {
			nonvoters = append(nonvoters, id)
		}
	}
	return voters, nonvoters, nil
}

// clustered reports whether this node has peers (then durable classic queues are replicated too).
func (s *Server) clustered() bool { return len(s.node.Members()) > 1 }

// declareReplicated replicates a new quorum queue's declaration (or, in a cluster, a durable
// classic queue's, with this node as its only voter) and returns this node's entry.
func (ch *channel) declareReplicated(name string, args amqp.Table, st queueSettings) (*queueEntry, *amqp.Error) {
	s, v := ch.c.s, ch.c.vhost
	size, kind := st.groupSize, "quorum queue"
	if !st.quorum {
		size, kind = 1, "queue"
	}
	voters, nonvoters, err := s.quorumMembers(size)
	if err != nil {
		return nil, amqp.Errorf(amqp.InternalError, "cannot declare %s '%s' in vhost '%s': %v", kind, name, v.name, err)
	}
	var b [8]byte
	rand.Read(b[:])
	gid := binary.BigEndian.Uint64(b[:])>>2 | 1
	if aerr := s.proposeMeta(amqp.Table{"op": "queue.declare", "vhost": v.name, "name": name, "arguments": args,
		"group": int64(gid), "voters": anys(voters), "nonvoters": anys(nonvoters)}); aerr != nil {
		return nil, aerr
	}
	e := v.lookupQueue(name)
	if e == nil || e.group != gid {
		if e != nil {
			return e, nil // someone else's declaration won
		}
		return nil, amqp.Errorf(amqp.InternalError, "cannot start quorum queue '%s' in vhost '%s'", name, v.name)
	}
	return e, nil
}

// ClusterAddr returns the node's cluster port address ("" for a one-node cluster without a port).
func (s *Server) ClusterAddr() string { return s.node.Addr() }

// ClusterStatus reports the node's view of its cluster: members and Raft groups with their leaders.
func (s *Server) ClusterStatus() cluster.Status { return s.node.Status() }
