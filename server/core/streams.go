package core

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"warren/server/cluster"
	"warren/server/queue"
	"warren/stream/replica"
)

// Replicated streams (stream/replica): every durable stream has a small raft group, its
// coordination group, whose members are the stream's replicas (x-initial-cluster-size voters,
// every other node a non-voting replica, so a client of any node reads a local copy). The
// group's leader leads the stream; the group orders only epoch claims, named offsets and
// retention decisions. Chunks travel beside it, over the cluster port's stream service: a
// connection starts with the stream's id and a kind byte (fetch, fence, publish), and this file
// hands it to that stream's replica.

// internalWriterPrefix starts the writer ids of nodes (not publishers) in tracking tables.
const internalWriterPrefix = "\x00"

// svcStream is the cluster service of stream replication.
const svcStream byte = 's'

// StreamQueue is what the core needs of a stream queue type's queue to replicate it.
type StreamQueue interface {
	queue.Queue
	Replica() *replica.Replica
}

// StreamReplication is what a stream queue type gets in queue.OpenConfig.Extra for a replicated
// stream.
type StreamReplication struct {
	Self             string
	Voters, Learners []string
	Coord            replica.Coordinator
	Transport        replica.Transport
	WriterID         string
}

// startStreams registers the stream service on the cluster port.
func (b *Broker) startStreams() {
	var id [8]byte
	rand.Read(id[:])
	// The NUL keeps internal writers apart from publisher ids in the stream's tracking table.
	b.writerID = internalWriterPrefix + b.node.ID() + "-" + hex.EncodeToString(id[:])
	b.node.HandleService(svcStream, b.serveStream)
	b.node.HandleService(svcEndpoints, b.serveEndpoints)
}

// serveStream reads a stream connection's header and hands it to the stream's replica.
func (b *Broker) serveStream(c net.Conn, br *bufio.Reader) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var hdr [9]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return
	}
	id := binary.BigEndian.Uint64(hdr[:8])
	v, ok := b.streams.Load(id)
	if !ok {
		return // not (yet) opened here: the other side tries again
	}
	_ = c.SetReadDeadline(time.Time{})
	v.(StreamQueue).Replica().Serve(hdr[8], c, br)
}

// openStreamReplica opens this node's replica of a stream and starts its coordination group.
func (b *Broker) openStreamReplica(q *Queue, cfg queue.OpenConfig) error {
	t := b.types["stream"]
	if t == nil {
		return errUnknownType("stream")
	}
	coord := &streamCoord{}
	cfg.Extra = &StreamReplication{Self: b.node.ID(), Voters: q.voters, Learners: q.nonvoters, Coord: coord,
		Transport: &streamTransport{b: b, id: q.id}, WriterID: b.writerID}
	impl, err := t.Open(cfg)
	if err != nil {
		return err
	}
	sq, ok := impl.(StreamQueue)
	if !ok {
		impl.Close()
		return errors.New("the stream queue type does not replicate")
	}
	r := sq.Replica()
	b.streams.Store(q.id, sq)
	gc := clusterGroupConfig(q.id, fmt.Sprintf("stream '%s' in vhost '%s'", q.name, q.vhost.name),
		&streamFSM{r: r}, q.voters, q.nonvoters, true, r.LeaderChanged)
	gc.OnLeaderChange = b.streamLeaderTracker(q.vhost.name, q.name)
	g, err := b.node.StartGroup(gc)
	if err != nil {
		b.streams.Delete(q.id)
		impl.Close()
		return err
	}
	coord.g.Store(g)
	q.Queue, q.group = impl, g
	return nil
}

// forgetStream drops a stream from the service's table.
func (b *Broker) forgetStream(q *Queue) {
	if sq, ok := q.Queue.(StreamQueue); ok {
		b.streams.CompareAndDelete(q.id, sq)
	}
}

// streamCoord is a stream's coordination group as its replica uses it.
type streamCoord struct {
	g atomic.Pointer[cluster.Group]
}

func (c *streamCoord) Propose(cmd []byte, done func([]byte, error)) {
	g := c.g.Load()
	if g == nil {
		go done(nil, errors.New("stream coordination group not started"))
		return
	}
	g.ProposeAsync(cmd, metaTimeout, func(res cluster.Result, err error) { done(res.Data, err) })
}

func (c *streamCoord) Leader() string {
	if g := c.g.Load(); g != nil {
		return g.Leader()
	}
	return ""
}

// streamTransport dials the same stream's replica on another node.
type streamTransport struct {
	b  *Broker
	id uint64
}

func (t *streamTransport) Dial(ctx context.Context, node string, kind byte) (net.Conn, error) {
	c, err := t.b.node.DialService(ctx, node, svcStream)
	if err != nil {
		return nil, err
	}
	hdr := binary.BigEndian.AppendUint64(nil, t.id)
	if _, err := c.Write(append(hdr, kind)); err != nil {
		c.Close()
		return nil, fmt.Errorf("stream %d: dial %s: %w", t.id, node, err)
	}
	return c, nil
}

// streamFSM runs a stream replica's coordination state as its group's raft FSM.
type streamFSM struct{ r *replica.Replica }

func (f *streamFSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	if resp := f.r.Apply(l.Data); resp != nil {
		return resp
	}
	return nil
}

func (f *streamFSM) Snapshot() (raft.FSMSnapshot, error) {
	return &bytesSnapshot{data: f.r.Snapshot()}, nil
}

func (f *streamFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return wrap("read stream coordination snapshot", err)
	}
	return f.r.Restore(data)
}

// bytesSnapshot is a stream group's snapshot, already encoded (the coordination state is small:
// epochs, members, offsets; the chunks are replicated beside the group).
type bytesSnapshot struct{ data []byte }

func (s *bytesSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s.data); err != nil {
		sink.Cancel()
		return wrap("write snapshot", err)
	}
	return sink.Close()
}

func (s *bytesSnapshot) Release() {}

// ReplicaConfig implements streamq.Replication.
func (s *StreamReplication) ReplicaConfig() replica.Config {
	return replica.Config{Self: s.Self, Voters: s.Voters, Learners: s.Learners, Coord: s.Coord, Transport: s.Transport, WriterID: s.WriterID}
}
