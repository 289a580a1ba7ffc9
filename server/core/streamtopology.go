package core

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Where a stream lives, for front-ends that send clients to the right node (the stream protocol's
// metadata and metadata_update): the leader of its coordination group appends, every other node
// holding a replica serves reads.

// StreamTopology is where a stream lives: the node of its leader ("" while it has none) and the
// other nodes that are up and hold a replica, in id order.
type StreamTopology struct {
	Leader   string
	Replicas []string
}

// StreamTopology returns where stream name lives (ok false: no such stream). A stream served
// by this node alone has this node as its leader.
func (v *VHost) StreamTopology(name string) (StreamTopology, bool) {
	q := v.Queue(name)
	if q == nil {
		return StreamTopology{}, false
	}
	if _, ok := q.Queue.(StreamQueue); !ok {
		return StreamTopology{}, false
	}
	b := v.b
	if q.group == nil {
		return StreamTopology{Leader: b.node.ID()}, true
	}
	t := StreamTopology{Leader: q.group.Leader()}
	members := append(q.group.Voters(), q.group.Nonvoters()...)
	if len(members) == 0 { // the configuration could not be read: the initial members
		members = append(slices.Clone(q.voters), q.nonvoters...)
	}
	slices.Sort(members)
	for _, n := range slices.Compact(members) {
		if n != t.Leader && b.node.PeerUp(n) {
			t.Replicas = append(t.Replicas, n)
		}
	}
	return t, true
}

// StreamEvent is a change front-ends tell their clients about: a stream's leader moved to
// another node (as this node learnt it), or the stream was deleted.
type StreamEvent struct {
	VHost, Stream string
	Leader        string // the new leader (moves only)
	Deleted       bool
}

// streamWatchers are the functions told of stream events.
type streamWatchers struct {
	mu  sync.Mutex
	fns []func(StreamEvent)
}

// WatchStreams registers f to be told of every stream event. f runs on a core or cluster
// goroutine, with no core lock held, and must not block.
func (b *Broker) WatchStreams(f func(StreamEvent)) {
	b.streamWatch.mu.Lock()
	b.streamWatch.fns = append(b.streamWatch.fns, f)
	b.streamWatch.mu.Unlock()
}

func (b *Broker) streamEvent(e StreamEvent) {
	b.streamWatch.mu.Lock()
	fns := slices.Clone(b.streamWatch.fns)
	b.streamWatch.mu.Unlock()
	for _, f := range fns {
		f(e)
	}
}

// streamLeaderTracker returns the OnLeaderChange of a stream's coordination group: it reports
// a move when a leader is learnt that differs from the last one known. A spell without a
// leader is not a move by itself: clients are sent to the new leader once there is one.
func (b *Broker) streamLeaderTracker(vhost, name string) func(string) {
	var mu sync.Mutex
	last := ""
	return func(leader string) {
		if leader == "" {
			return
		}
		mu.Lock()
		moved := last != "" && last != leader
		last = leader
		mu.Unlock()
		if moved {
			b.streamEvent(StreamEvent{VHost: vhost, Stream: name, Leader: leader})
		}
	}
}

// WaitStreamLeader waits, bounded by ctx, until stream name has a leader (a new stream's
// coordination group elects one within a round trip), so that a client told the stream was
// created finds its leader in the metadata, as RabbitMQ answers create_stream once the leader
// runs. It reports whether there is one.
func (v *VHost) WaitStreamLeader(ctx context.Context, name string) bool {
	for {
		t, ok := v.StreamTopology(name)
		if !ok {
			return false
		}
		if t.Leader != "" {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
}
