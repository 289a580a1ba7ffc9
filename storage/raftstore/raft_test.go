package raftstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"warren/storage"
)

// listFSM appends the uint64 carried by every command entry to a list.
type listFSM struct {
	mu   sync.Mutex
	vals []uint64
}

func (f *listFSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand || len(l.Data) != 8 {
		return fmt.Errorf("unexpected entry %+v", l)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vals = append(f.vals, binary.BigEndian.Uint64(l.Data))
	return len(f.vals)
}

func (f *listFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return listSnapshot(slices.Clone(f.vals)), nil
}

func (f *listFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	if len(data)%8 != 0 {
		return fmt.Errorf("snapshot of %d bytes", len(data))
	}
	vals := make([]uint64, 0, len(data)/8)
	for i := 0; i < len(data); i += 8 {
		vals = append(vals, binary.BigEndian.Uint64(data[i:]))
	}
	f.mu.Lock()
	f.vals = vals
	f.mu.Unlock()
	return nil
}

func (f *listFSM) list() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.vals)
}

type listSnapshot []uint64

func (s listSnapshot) Persist(sink raft.SnapshotSink) error {
	buf := make([]byte, 0, 8*len(s))
	for _, v := range s {
		buf = binary.BigEndian.AppendUint64(buf, v)
	}
	if _, err := sink.Write(buf); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (listSnapshot) Release() {}

// syncBuffer collects raft's log output, shown when a test fails.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// node is one cluster member: its own storage DB, Store, snapshot store, transport and raft.
type node struct {
	id    raft.ServerID
	dir   string
	db    *storage.DB
	store *Store
	snaps raft.SnapshotStore
	trans *raft.InmemTransport
	fsm   *listFSM
	raft  *raft.Raft

	stoppedFirst, stoppedLast uint64 // the Store's bounds when the node was last stopped
}

type cluster struct {
	t     *testing.T
	logs  *syncBuffer
	nodes []*node
}

const raftGroup = 42

func (c *cluster) config(id raft.ServerID) *raft.Config {
	conf := raft.DefaultConfig()
	conf.LocalID = id
	conf.HeartbeatTimeout = 300 * time.Millisecond
	conf.ElectionTimeout = 300 * time.Millisecond
	conf.LeaderLeaseTimeout = 300 * time.Millisecond
	conf.CommitTimeout = 5 * time.Millisecond
	// Snapshot and compact often, so that DeleteRange runs while the leader appends and a node that was
	// down long enough needs a snapshot.
	conf.SnapshotThreshold = 40
	conf.SnapshotInterval = 50 * time.Millisecond
	conf.TrailingLogs = 10
	conf.LogOutput = c.logs
	conf.LogLevel = "INFO"
	return conf
}

func newCluster(t *testing.T, n int) *cluster {
	c := &cluster{t: t, logs: &syncBuffer{}}
	var servers []raft.Server
	for i := range n {
		nd := &node{id: raft.ServerID(fmt.Sprintf("node%d", i+1)), dir: t.TempDir()}
		_, nd.trans = raft.NewInmemTransport(raft.ServerAddress(nd.id))
		c.nodes = append(c.nodes, nd)
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: nd.id, Address: nd.trans.LocalAddr()})
	}
	// Registered after t.TempDir, so it runs before the directories are removed. RAFTSTORE_DUMP=1 prints
	// raft's log even when the test passes.
	t.Cleanup(func() {
		c.shutdownAll()
		if t.Failed() || os.Getenv("RAFTSTORE_DUMP") != "" {
			t.Logf("raft log:\n%s", c.logs.String())
		}
	})
	for _, a := range c.nodes {
		for _, b := range c.nodes {
			if a != b {
				a.trans.Connect(b.trans.LocalAddr(), b.trans)
			}
		}
	}
	for _, nd := range c.nodes {
		c.openStorage(nd)
		err := raft.BootstrapCluster(c.config(nd.id), nd.store, nd.store, nd.snaps, nd.trans,
			raft.Configuration{Servers: servers})
		if err != nil {
			t.Fatalf("BootstrapCluster(%s): %v", nd.id, err)
		}
		c.startRaft(nd)
	}
	return c
}

func (c *cluster) openStorage(nd *node) {
	t := c.t
	db, err := storage.Open(storage.Options{Dir: filepath.Join(nd.dir, "db"), GCInterval: -1,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("storage.Open(%s): %v", nd.id, err)
	}
	nd.db = db
	if nd.store, err = New(db, raftGroup); err != nil {
		t.Fatalf("New(%s): %v", nd.id, err)
	}
	if nd.snaps, err = raft.NewFileSnapshotStore(filepath.Join(nd.dir, "snaps"), 2, c.logs); err != nil {
		t.Fatalf("NewFileSnapshotStore(%s): %v", nd.id, err)
	}
}

func (c *cluster) startRaft(nd *node) {
	nd.fsm = &listFSM{}
	r, err := raft.NewRaft(c.config(nd.id), nd.fsm, nd.store, nd.store, nd.snaps, nd.trans)
	if err != nil {
		c.t.Fatalf("NewRaft(%s): %v", nd.id, err)
	}
	nd.raft = r
}

// stop shuts nd's raft down, cuts it off from the others and closes its storage DB.
func (c *cluster) stop(nd *node) {
	if nd.raft != nil {
		if err := nd.raft.Shutdown().Error(); err != nil {
			c.t.Errorf("Shutdown(%s): %v", nd.id, err)
		}
		nd.raft = nil
	}
	if nd.store != nil {
		nd.stoppedFirst, _ = nd.store.FirstIndex()
		nd.stoppedLast, _ = nd.store.LastIndex()
	}
	for _, o := range c.nodes {
		if o != nd {
			o.trans.Disconnect(nd.trans.LocalAddr())
		}
	}
	if nd.db != nil {
		if err := nd.db.Close(); err != nil {
			c.t.Errorf("Close DB of %s: %v", nd.id, err)
		}
		nd.db = nil
	}
}

// reopen reopens nd's storage DB and Store and gives it a fresh transport; startRaft starts it again.
func (c *cluster) reopen(nd *node) {
	c.openStorage(nd)
	_, nd.trans = raft.NewInmemTransport(raft.ServerAddress(nd.id))
	for _, o := range c.nodes {
		if o != nd {
			o.trans.Connect(nd.trans.LocalAddr(), nd.trans)
			nd.trans.Connect(o.trans.LocalAddr(), o.trans)
		}
	}
}

func (c *cluster) shutdownAll() {
	for _, nd := range c.nodes {
		c.stop(nd)
	}
}

func (c *cluster) running() []*node {
	var out []*node
	for _, nd := range c.nodes {
		if nd.raft != nil {
			out = append(out, nd)
		}
	}
	return out
}

// waitFor polls cond until it holds or the deadline passes.
func (c *cluster) waitFor(what string, timeout time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leader waits until exactly one running node is leader and all running nodes agree on it.
func (c *cluster) leader() *node {
	c.t.Helper()
	var ld *node
	c.waitFor("a leader", 15*time.Second, func() bool {
		ld = nil
		for _, nd := range c.running() {
			if nd.raft.State() == raft.Leader {
				if ld != nil {
					return false
				}
				ld = nd
			}
		}
		if ld == nil {
			return false
		}
		for _, nd := range c.running() {
			if _, id := nd.raft.LeaderWithID(); id != ld.id {
				return false
			}
		}
		return true
	})
	return ld
}

// apply sends the values from..to through the leader, pipelined, and waits for every one to commit.
func (c *cluster) apply(ld *node, from, to uint64) {
	c.t.Helper()
	var futures []raft.ApplyFuture
	for v := from; v <= to; v++ {
		futures = append(futures, ld.raft.Apply(binary.BigEndian.AppendUint64(nil, v), 10*time.Second))
	}
	for i, f := range futures {
		if err := f.Error(); err != nil {
			c.t.Fatalf("Apply(%d) on %s: %v", from+uint64(i), ld.id, err)
		}
		if n, ok := f.Response().(int); !ok || n != int(from)+i {
			c.t.Fatalf("Apply(%d) on %s: the FSM answered %v", from+uint64(i), ld.id, f.Response())
		}
	}
}

// converge waits until every running node's FSM holds exactly 1..n.
func (c *cluster) converge(n uint64) {
	c.t.Helper()
	want := make([]uint64, 0, n)
	for v := uint64(1); v <= n; v++ {
		want = append(want, v)
	}
	c.waitFor(fmt.Sprintf("every FSM to hold 1..%d", n), 20*time.Second, func() bool {
		for _, nd := range c.running() {
			if !slices.Equal(nd.fsm.list(), want) {
				return false
			}
		}
		return true
	})
}

func TestRaftClusterOnStore(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node raft cluster")
	}
	c := newCluster(t, 3)

	ld := c.leader()
	c.apply(ld, 1, 100)
	c.converge(100)

	// The leader goes away; the other two elect a new one and go on.
	old := ld
	c.stop(old)
	ld = c.leader()
	if ld == old {
		t.Fatal("the stopped node is still leader")
	}
	c.apply(ld, 101, 200)
	c.converge(200)

	// The live nodes compacted their logs (threshold 40, 10 trailing entries) while appending.
	c.waitFor("log compaction on the leader", 10*time.Second, func() bool {
		first, _ := ld.store.FirstIndex()
		return first > old.stoppedLast
	})

	// The old leader restarts on its Store: its log is as it left it, and it catches up (by snapshot:
	// the others no longer have the entries it misses).
	c.reopen(old)
	wantBounds(t, old.store, old.stoppedFirst, old.stoppedLast)
	c.startRaft(old)
	c.converge(200)
	ld = c.leader()
	c.apply(ld, 201, 220)
	c.converge(220)

	// A follower misses a few entries and catches up from the leader's log.
	var follower *node
	for _, nd := range c.running() {
		if nd != ld {
			follower = nd
			break
		}
	}
	c.stop(follower)
	c.apply(ld, 221, 225)
	c.reopen(follower)
	wantBounds(t, follower.store, follower.stoppedFirst, follower.stoppedLast)
	c.startRaft(follower)
	c.converge(225)

	// Every node's stored log ends at the same index with the same entry.
	ld = c.leader()
	c.apply(ld, 226, 226)
	c.converge(226)
	c.waitFor("equal logs", 10*time.Second, func() bool {
		var want raft.Log
		for i, nd := range c.running() {
			last, _ := nd.store.LastIndex()
			var l raft.Log
			if err := nd.store.GetLog(last, &l); err != nil {
				return false
			}
			if i > 0 && (l.Index != want.Index || l.Term != want.Term || !bytes.Equal(l.Data, want.Data)) {
				return false
			}
			want = l
		}
		return true
	})
}
