package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/goleak"

	"warren/storage"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// listFSM appends every command to a list. A command "err:..." makes Apply return an error; every other
// command returns the list length as []byte.
type listFSM struct {
	mu   sync.Mutex
	list []string
}

func (f *listFSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	s := string(l.Data)
	if strings.HasPrefix(s, "err:") {
		return errors.New(strings.TrimPrefix(s, "err:"))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = append(f.list, s)
	return []byte(fmt.Sprint(len(f.list)))
}

func (f *listFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return listSnap(slices.Clone(f.list)), nil
}

func (f *listFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var list []string
	if err := json.NewDecoder(rc).Decode(&list); err != nil {
		return err
	}
	f.mu.Lock()
	f.list = list
	f.mu.Unlock()
	return nil
}

func (f *listFSM) items() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.list)
}

func (f *listFSM) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.list)
}

type listSnap []string

func (s listSnap) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode([]string(s)); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (listSnap) Release() {}

// logBuf collects log output.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func openDB(t testing.TB) *storage.DB {
	t.Helper()
	db, err := storage.Open(storage.Options{InMemory: true, Logger: quietLogger(), GCInterval: -1})
	if err != nil {
		t.Fatalf("storage.Open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tnode is one node of a test cluster.
type tnode struct {
	id      string
	addr    string
	db      *storage.DB
	dataDir string
	node    *Node
	fsms    map[uint64]*listFSM
	logs    *logBuf
}

// tcluster is a set of nodes on real TCP listeners on 127.0.0.1.
type tcluster struct {
	t     *testing.T
	peers map[string]string
	nodes []*tnode
}

func newCluster(t *testing.T, n int, withDataDir bool) *tcluster {
	t.Helper()
	return newClusterStarting(t, n, n, withDataDir)
}

// newClusterStarting makes an n-node cluster of which only the first running nodes are started:
// the others' addresses are reserved (and closed) for a later c.start(tn, nil, false).
func newClusterStarting(t *testing.T, n, running int, withDataDir bool) *tcluster {
	t.Helper()
	c := &tcluster{t: t, peers: make(map[string]string)}
	lns := make([]net.Listener, n)
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
		c.peers[fmt.Sprintf("n%d", i+1)] = ln.Addr().String()
	}
	for i := range n {
		tn := &tnode{id: fmt.Sprintf("n%d", i+1), addr: lns[i].Addr().String(), db: openDB(t), logs: &logBuf{}}
		if withDataDir {
			tn.dataDir = t.TempDir()
		}
		c.nodes = append(c.nodes, tn)
		if i < running {
			c.start(tn, lns[i], false)
		} else {
			_ = lns[i].Close()
		}
	}
	t.Cleanup(c.closeAll)
	return c
}

func (c *tcluster) start(tn *tnode, ln net.Listener, join bool) {
	c.t.Helper()
	if ln == nil {
		var err error
		// Restart on the same address (raft configurations name it).
		deadline := time.Now().Add(5 * time.Second)
		for {
			ln, err = net.Listen("tcp", tn.addr)
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			c.t.Fatal(err)
		}
	}
	logger := slog.New(slog.NewTextHandler(tn.logs, &slog.HandlerOptions{Level: slog.LevelError}))
	nd, err := Start(Config{
		NodeID: tn.id, Listen: tn.addr, Peers: c.peers, Join: join, DB: tn.db, DataDir: tn.dataDir,
		Logger: logger, listener: ln,
	})
	if err != nil {
		c.t.Fatalf("Start %s: %v", tn.id, err)
	}
	tn.node = nd
	tn.fsms = make(map[uint64]*listFSM)
}

func (c *tcluster) closeAll() {
	for _, tn := range c.nodes {
		if tn.node != nil {
			if err := tn.node.Close(); err != nil {
				c.t.Errorf("close %s: %v", tn.id, err)
			}
			tn.node = nil
		}
	}
}

func (c *tcluster) ids() []string {
	var ids []string
	for _, tn := range c.nodes {
		ids = append(ids, tn.id)
	}
	return ids
}

// startGroup starts group id on every running node, bootstrapped with every node as a voter.
func (c *tcluster) startGroup(id uint64) {
	c.t.Helper()
	for _, tn := range c.nodes {
		if tn.node != nil {
			c.startGroupOn(tn, id, c.ids(), true)
		}
	}
}

func (c *tcluster) startGroupOn(tn *tnode, id uint64, voters []string, bootstrap bool) *Group {
	c.t.Helper()
	f := &listFSM{}
	g, err := tn.node.StartGroup(GroupConfig{ID: id, Name: fmt.Sprintf("group %d", id), FSM: f, Voters: voters, Bootstrap: bootstrap})
	if err != nil {
		c.t.Fatalf("StartGroup %d on %s: %v", id, tn.id, err)
	}
	tn.fsms[id] = f
	return g
}

// leader waits for a leader of group id among the running nodes.
func (c *tcluster) leader(id uint64, timeout time.Duration) *tnode {
	c.t.Helper()
	var ld *tnode
	waitFor(c.t, timeout, fmt.Sprintf("a leader of group %d", id), func() bool {
		for _, tn := range c.nodes {
			if tn.node == nil {
				continue
			}
			if g := tn.node.Group(id); g != nil && g.IsLeader() {
				ld = tn
				return true
			}
		}
		return false
	})
	return ld
}

func (c *tcluster) follower(id uint64, ld *tnode) *tnode {
	for _, tn := range c.nodes {
		if tn != ld && tn.node != nil {
			return tn
		}
	}
	c.t.Fatal("no follower")
	return nil
}

// converge waits until every running node's FSM of group id holds want.
func (c *tcluster) converge(id uint64, want []string, timeout time.Duration) {
	c.t.Helper()
	waitFor(c.t, timeout, fmt.Sprintf("group %d to converge on %d entries", id, len(want)), func() bool {
		for _, tn := range c.nodes {
			if tn.node == nil {
				continue
			}
			if !slices.Equal(tn.fsms[id].items(), want) {
				return false
			}
		}
		return true
	})
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestSingleNode(t *testing.T) {
	db := openDB(t)
	n, err := Start(Config{NodeID: "n1", DB: db, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Addr() != "" {
		t.Errorf("Addr() = %q in single-node mode, want empty", n.Addr())
	}
	f := &listFSM{}
	began := time.Now()
	leaderCh := make(chan bool, 4)
	g, err := n.StartGroup(GroupConfig{ID: 0, Name: "metadata", FSM: f, Voters: []string{"n1"}, Bootstrap: true,
		OnLeader: func(b bool) { leaderCh <- b }})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "a leader", g.IsLeader)
	t.Logf("single-voter leader after %v", time.Since(began))
	if got := <-leaderCh; !got {
		t.Errorf("OnLeader(%v), want true", got)
	}
	if g2, _ := n.StartGroup(GroupConfig{ID: 0, FSM: &listFSM{}}); g2 != g {
		t.Error("StartGroup of a running id did not return the running group")
	}
	res, err := g.Propose(ctxT(t, 5*time.Second), []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Data) != "1" || res.Index == 0 {
		t.Errorf("Propose = %+v, want data 1 and an index", res)
	}
	if err := g.WaitApplied(ctxT(t, time.Second), res.Index); err != nil {
		t.Fatal(err)
	}
	if g.AppliedIndex() < res.Index {
		t.Errorf("AppliedIndex %d < %d", g.AppliedIndex(), res.Index)
	}
	_, err = g.Propose(ctxT(t, 5*time.Second), []byte("err:bad thing"))
	var ae *ApplyError
	if !errors.As(err, &ae) || ae.Msg != "bad thing" {
		t.Errorf("Propose(err) = %v, want ApplyError 'bad thing'", err)
	}
	if g.Leader() != "n1" || !slices.Equal(g.Voters(), []string{"n1"}) {
		t.Errorf("Leader %q Voters %v", g.Leader(), g.Voters())
	}
	if m := n.Members(); len(m) != 1 || m[0].ID != "n1" || !m[0].Up || !m[0].Voter {
		t.Errorf("Members = %+v", m)
	}

	// Many one-voter groups each get a leader quickly.
	for i := uint64(1); i <= 10; i++ {
		began := time.Now()
		gi, err := n.StartGroup(GroupConfig{ID: i, FSM: &listFSM{}, Voters: []string{"n1"}, Bootstrap: true})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Second, "a leader", gi.IsLeader)
		if d := time.Since(began); d > 500*time.Millisecond {
			t.Errorf("group %d: leader after %v", i, d)
		}
	}
	// Remove deletes the log: a restart of the group starts empty.
	g5 := n.Group(5)
	if _, err := g5.Propose(ctxT(t, 5*time.Second), []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := g5.Remove(); err != nil {
		t.Fatal(err)
	}
	if n.Group(5) != nil {
		t.Error("group 5 still running after Remove")
	}
	f5 := &listFSM{}
	g5, err = n.StartGroup(GroupConfig{ID: 5, FSM: f5, Voters: []string{"n1"}, Bootstrap: true})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "a leader", g5.IsLeader)
	if f5.len() != 0 {
		t.Errorf("removed group replayed %v", f5.items())
	}

	// Restart of the node: the group keeps its log (same DB) and replays it.
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Propose(ctxT(t, time.Second), []byte("late")); !errors.Is(err, ErrClosed) {
		t.Errorf("Propose after Close = %v, want ErrClosed", err)
	}
	n, err = Start(Config{NodeID: "n1", DB: db, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	f = &listFSM{}
	g, err = n.StartGroup(GroupConfig{ID: 0, Name: "metadata", FSM: f, Voters: []string{"n1"}, Bootstrap: true})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "a leader after restart", g.IsLeader)
	if _, err := g.Propose(ctxT(t, 5*time.Second), []byte("b")); err != nil {
		t.Fatal(err)
	}
	if got := f.items(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("after restart FSM = %v, want [a b]", got)
	}
}

func TestThreeNodes(t *testing.T) {
	c := newCluster(t, 3, false)
	c.startGroup(0)
	ld := c.leader(0, 10*time.Second)
	fo := c.follower(0, ld)

	res, err := fo.node.Group(0).Propose(ctxT(t, 10*time.Second), []byte("from-follower"))
	if err != nil {
		t.Fatalf("Propose on follower: %v", err)
	}
	if string(res.Data) != "1" {
		t.Errorf("forwarded result %q, want 1", res.Data)
	}
	// The entry is applied on the leader when Propose returns.
	if got := ld.fsms[0].items(); !slices.Equal(got, []string{"from-follower"}) {
		t.Errorf("leader FSM = %v right after Propose", got)
	}
	if err := fo.node.Group(0).WaitApplied(ctxT(t, 5*time.Second), res.Index); err != nil {
		t.Fatal(err)
	}
	if _, err := ld.node.Group(0).Propose(ctxT(t, 10*time.Second), []byte("from-leader")); err != nil {
		t.Fatalf("Propose on leader: %v", err)
	}
	_, err = fo.node.Group(0).Propose(ctxT(t, 10*time.Second), []byte("err:refused"))
	var ae *ApplyError
	if !errors.As(err, &ae) || ae.Msg != "refused" {
		t.Errorf("forwarded FSM error = %v, want ApplyError refused", err)
	}
	c.converge(0, []string{"from-follower", "from-leader"}, 10*time.Second)

	for _, tn := range c.nodes {
		m := tn.node.Members()
		if len(m) != 3 {
			t.Fatalf("%s: Members = %+v", tn.id, m)
		}
		for i, mm := range m {
			if mm.ID != c.ids()[i] || mm.Addr != c.peers[mm.ID] || !mm.Voter || !mm.Up {
				t.Errorf("%s: member %+v", tn.id, mm)
			}
		}
		if g := tn.node.Group(0); g.Leader() != ld.id {
			t.Errorf("%s: Leader() = %q, want %q", tn.id, g.Leader(), ld.id)
		}
	}
	st := fo.node.Status()
	if st.Node != fo.id || st.Addr != fo.addr || len(st.Groups) != 1 || st.Groups[0].Leader != ld.id ||
		len(st.Groups[0].Voters) != 3 || st.Groups[0].Applied == 0 {
		t.Errorf("Status = %+v", st)
	}
}

// A group bootstrapped while its other voters' nodes are still starting (a cluster coming up: the
// metadata group's case) gets its first leader as soon as they answer pings. Its first voter does
// not stand for election into refused connections and then wait a whole election timeout.
func TestFirstElectionWaitsForVoters(t *testing.T) {
	c := newClusterStarting(t, 3, 1, false)
	c.startGroupOn(c.nodes[0], 5, c.ids(), true)
	// Long enough for an election that did not wait to have failed (refused connections fail at once).
	time.Sleep(300 * time.Millisecond)
	if g := c.nodes[0].node.Group(5); g.Leader() != "" {
		t.Fatalf("group has leader %q with one of three voters running", g.Leader())
	}
	up := time.Now()
	for _, tn := range c.nodes[1:] {
		c.start(tn, nil, false)
		c.startGroupOn(tn, 5, c.ids(), true)
	}
	ld := c.leader(5, 2*electionTimeout)
	// Without the wait the first voter's failed election is retried only after an election timeout.
	if took := time.Since(up); took >= min(electionTimeout-time.Second, 5*time.Second) {
		t.Errorf("first leader (%s) elected %v after the voters started; want well under the election timeout %v",
			ld.id, took.Round(time.Millisecond), electionTimeout)
	}
	if ld != c.nodes[0] {
		t.Errorf("first leader is %s, want the first voter n1", ld.id)
	}
	if _, err := c.nodes[2].node.Group(5).Propose(ctxT(t, 10*time.Second), []byte("x")); err != nil {
		t.Fatalf("Propose: %v", err)
	}
	c.converge(5, []string{"x"}, 10*time.Second)
}

// After a restart of the whole cluster a group elects a leader soon after recoveredGrace, not after
// raft's own heartbeat timeout (nobody has a leader to hear from), and keeps its entries.
func TestRestartedClusterElects(t *testing.T) {
	c := newCluster(t, 3, true)
	c.startGroup(9)
	c.leader(9, 10*time.Second)
	if _, err := c.nodes[1].node.Group(9).Propose(ctxT(t, 10*time.Second), []byte("before")); err != nil {
		t.Fatalf("Propose: %v", err)
	}
	c.converge(9, []string{"before"}, 10*time.Second)
	c.closeAll()
	up := time.Now()
	for _, tn := range c.nodes {
		c.start(tn, nil, false)
		c.startGroupOn(tn, 9, c.ids(), true)
	}
	ld := c.leader(9, 2*heartbeatTimeout)
	if took, most := time.Since(up), heartbeatTimeout-time.Second; took >= most || recoveredGrace >= most {
		t.Errorf("leader (%s) elected %v after the restart; want under %v (raft's own timeout: %v)",
			ld.id, took.Round(time.Millisecond), most, heartbeatTimeout)
	}
	if _, err := c.nodes[2].node.Group(9).Propose(ctxT(t, 10*time.Second), []byte("after")); err != nil {
		t.Fatalf("Propose after the restart: %v", err)
	}
	c.converge(9, []string{"before", "after"}, 10*time.Second)
}

func TestProposeAsyncThroughput(t *testing.T) {
	c := newCluster(t, 3, false)
	c.startGroup(7)
	ld := c.leader(7, 10*time.Second)
	fo := c.follower(7, ld)
	g := fo.node.Group(7)

	const total = 20000
	var mu sync.Mutex
	var order []int
	var lastIndex uint64
	var failures []error
	var wg sync.WaitGroup
	wg.Add(total)
	began := time.Now()
	for i := range total {
		g.ProposeAsync([]byte(fmt.Sprint(i)), 30*time.Second, func(r Result, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, err)
				return
			}
			if r.Index <= lastIndex {
				failures = append(failures, fmt.Errorf("proposal %d: index %d after %d", i, r.Index, lastIndex))
			}
			lastIndex = r.Index
			order = append(order, i)
		})
	}
	wg.Wait()
	t.Logf("%d forwarded proposals in %v", total, time.Since(began))
	if len(failures) > 0 {
		t.Fatalf("%d failures, first: %v", len(failures), failures[0])
	}
	for i, v := range order {
		if v != i {
			t.Fatalf("completion %d was proposal %d", i, v)
		}
	}
	want := make([]string, total)
	for i := range want {
		want[i] = fmt.Sprint(i)
	}
	c.converge(7, want, 20*time.Second)
}

func TestFailover(t *testing.T) {
	c := newCluster(t, 3, false)
	c.startGroup(0)
	ld := c.leader(0, 10*time.Second)
	if _, err := ld.node.Group(0).Propose(ctxT(t, 10*time.Second), []byte("before")); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := ld.node.Close(); err != nil {
		t.Fatal(err)
	}
	ld.node = nil
	nl := c.leader(0, 10*time.Second)
	t.Logf("new leader %s after %v", nl.id, time.Since(began))
	for _, tn := range c.nodes {
		if tn.node == nil {
			continue
		}
		if _, err := tn.node.Group(0).Propose(ctxT(t, 10*time.Second), []byte("after-"+tn.id)); err != nil {
			t.Fatalf("Propose on %s after failover: %v", tn.id, err)
		}
	}
	var want []string
	want = append(want, "before")
	for _, tn := range c.nodes {
		if tn.node != nil {
			want = append(want, "after-"+tn.id)
		}
	}
	c.converge(0, want, 10*time.Second)
	// The survivors see the closed node go down.
	for _, tn := range c.nodes {
		if tn.node != nil {
			waitFor(t, 2*PeerDownAfter, ld.id+" down on "+tn.id, func() bool { return !tn.node.PeerUp(ld.id) })
		}
	}
}

func TestFailoverDuringProposals(t *testing.T) {
	c := newCluster(t, 3, false)
	c.startGroup(3)
	ld := c.leader(3, 10*time.Second)
	fo := c.follower(3, ld)
	g := fo.node.Group(3)
	const total = 2000
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	wg.Add(total)
	for i := range total {
		g.ProposeAsync([]byte(fmt.Sprint(i)), 20*time.Second, func(_ Result, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
		if i == total/4 {
			if err := ld.node.Close(); err != nil {
				t.Fatal(err)
			}
			ld.node = nil
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d proposals failed, first: %v", len(errs), errs[0])
	}
	// At-least-once: every proposal is in the survivors' FSMs.
	for _, tn := range c.nodes {
		if tn.node == nil {
			continue
		}
		waitFor(t, 10*time.Second, "all proposals on "+tn.id, func() bool {
			seen := map[string]bool{}
			for _, s := range tn.fsms[3].items() {
				seen[s] = true
			}
			return len(seen) == total
		})
	}
}

func TestCatchUpWithSnapshot(t *testing.T) {
	c := newCluster(t, 3, true)
	c.startGroup(0)
	ld := c.leader(0, 10*time.Second)
	var lag *tnode
	for _, tn := range c.nodes {
		if tn != ld {
			lag = tn
		}
	}
	var want []string
	propose := func(from, to int) {
		t.Helper()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		g := ld.node.Group(0)
		for i := from; i < to; i++ {
			want = append(want, fmt.Sprint(i))
			wg.Add(1)
			g.ProposeAsync([]byte(fmt.Sprint(i)), 20*time.Second, func(_ Result, err error) {
				defer wg.Done()
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("%d proposals failed: %v", len(errs), errs[0])
		}
	}
	propose(0, 100)
	c.converge(0, want, 10*time.Second)

	// Plain catch-up from the log.
	if err := lag.node.Close(); err != nil {
		t.Fatal(err)
	}
	lag.node = nil
	propose(100, 200)
	c.start(lag, nil, false)
	c.startGroupOn(lag, 0, c.ids(), true)
	c.converge(0, want, 15*time.Second)

	// Catch-up through a snapshot: the leader's log no longer holds what the lagging node misses.
	lagLast, _ := lag.node.Group(0).store.LastIndex()
	if err := lag.node.Close(); err != nil {
		t.Fatal(err)
	}
	lag.node = nil
	propose(200, 500)
	ld = c.leader(0, 10*time.Second)
	g := ld.node.Group(0)
	rc := g.raft.ReloadableConfig()
	rc.TrailingLogs = 10
	if err := g.raft.ReloadConfig(rc); err != nil {
		t.Fatal(err)
	}
	if err := g.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	propose(500, 520)
	if first, _ := g.store.FirstIndex(); first <= lagLast {
		t.Fatalf("leader log starts at %d, the lagging node has up to %d: no snapshot needed", first, lagLast)
	}
	c.start(lag, nil, false)
	c.startGroupOn(lag, 0, c.ids(), true)
	c.converge(0, want, 15*time.Second)
	lg := lag.node.Group(0)
	if lg.raft.Stats()["last_snapshot_index"] == "0" {
		t.Error("the lagging node caught up without installing a snapshot")
	}
	waitFor(t, 5*time.Second, "the applied index to follow the snapshot", func() bool {
		return lg.AppliedIndex() == g.AppliedIndex()
	})
	// A restart restores the installed snapshot from DataDir and replays the rest.
	if err := lag.node.Close(); err != nil {
		t.Fatal(err)
	}
	lag.node = nil
	propose(520, 530)
	c.start(lag, nil, false)
	c.startGroupOn(lag, 0, c.ids(), true)
	c.converge(0, want, 15*time.Second)
}

func TestManyGroups(t *testing.T) {
	c := newCluster(t, 3, false)
	const groups = 20
	for id := uint64(1); id <= groups; id++ {
		c.startGroup(id)
	}
	var wg sync.WaitGroup
	errs := make(chan error, groups*3)
	for id := uint64(1); id <= groups; id++ {
		for _, tn := range c.nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if _, err := tn.node.Group(id).Propose(ctx, []byte(tn.id)); err != nil {
					errs <- fmt.Errorf("group %d on %s: %w", id, tn.id, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitFor(t, 20*time.Second, "all groups converged", func() bool {
		for id := uint64(1); id <= groups; id++ {
			for _, tn := range c.nodes {
				got := tn.fsms[id].items()
				slices.Sort(got)
				if !slices.Equal(got, []string{"n1", "n2", "n3"}) {
					return false
				}
			}
		}
		return true
	})
	if st := c.nodes[0].node.Status(); len(st.Groups) != groups {
		t.Errorf("status lists %d groups", len(st.Groups))
	}
}

func TestFingerprintMismatch(t *testing.T) {
	ln1, _ := net.Listen("tcp", "127.0.0.1:0")
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	a1, a2 := ln1.Addr().String(), ln2.Addr().String()
	logs1, logs2 := &logBuf{}, &logBuf{}
	mk := func(id string, ln net.Listener, peers map[string]string, logs *logBuf) *Node {
		n, err := Start(Config{NodeID: id, Listen: ln.Addr().String(), Peers: peers, DB: openDB(t), listener: ln,
			Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelError}))})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n1 := mk("n1", ln1, map[string]string{"n1": a1, "n2": a2}, logs1)
	defer n1.Close()
	n2 := mk("n2", ln2, map[string]string{"n1": a1, "n2": a2, "n3": "127.0.0.1:1"}, logs2)
	defer n2.Close()
	for _, x := range []struct {
		name string
		logs *logBuf
		peer string
	}{{"n1", logs1, "n2"}, {"n2", logs2, "n1"}} {
		waitFor(t, 5*time.Second, x.name+" to log the disagreement", func() bool {
			s := x.logs.String()
			return strings.Contains(s, "level=ERROR") &&
				strings.Contains(s, "cluster peers disagree: node "+x.peer+" was started with [")
		})
	}
	s := logs1.String()
	if !strings.Contains(s, "n3=127.0.0.1:1") || !strings.Contains(s, "this node with [n1="+a1+", n2="+a2+"]") {
		t.Errorf("n1's error does not name both peer lists: %s", s)
	}
	// The groups never form: n2's raft connections are refused.
	for _, n := range []*Node{n1, n2} {
		if _, err := n.StartGroup(GroupConfig{ID: 0, FSM: &listFSM{}, Voters: []string{"n1", "n2"}, Bootstrap: true}); err != nil {
			t.Fatal(err)
		}
	}
	// A peer counts as up for PeerDownAfter from the start (a grace period, no answer yet); one
	// whose pings are refused for its peer list must then be reported down, and no leader may be
	// elected meanwhile (the first voter's election is due at once, were its voter reachable).
	waitFor(t, PeerDownAfter+3*PingInterval+2*time.Second, "mismatched peers reported down", func() bool {
		return !n1.PeerUp("n2") && !n2.PeerUp("n1")
	})
	if n1.Group(0).Leader() != "" || n2.Group(0).Leader() != "" {
		t.Errorf("a leader was elected across mismatched nodes")
	}
}

func TestAdminAddRemove(t *testing.T) {
	c := newCluster(t, 3, false)
	c.startGroup(0)
	ld := c.leader(0, 10*time.Second)
	if _, err := ld.node.Group(0).Propose(ctxT(t, 10*time.Second), []byte("m1")); err != nil {
		t.Fatal(err)
	}

	// A fourth node started with Join, knowing only itself.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	n4 := &tnode{id: "n4", addr: ln.Addr().String(), db: openDB(t), logs: &logBuf{}}
	n4nd, err := Start(Config{NodeID: "n4", Listen: n4.addr, Peers: map[string]string{"n4": n4.addr}, Join: true,
		DB: n4.db, Logger: quietLogger(), listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	n4.node = n4nd
	n4.fsms = map[uint64]*listFSM{}
	c.nodes = append(c.nodes, n4)
	g4 := c.startGroupOn(n4, 0, nil, false)
	if g4.IsLeader() {
		t.Fatal("joining node leads")
	}

	// "add" sent to a follower is forwarded to the leader.
	fo := c.follower(0, ld)
	resp, err := Admin(ctxT(t, 30*time.Second), fo.addr, AdminRequest{Op: "add", ID: "n4", Addr: n4.addr})
	if err != nil || resp.Error != "" {
		t.Fatalf("admin add: %v %q", err, resp.Error)
	}
	if _, err := ld.node.Group(0).Propose(ctxT(t, 10*time.Second), []byte("m2")); err != nil {
		t.Fatal(err)
	}
	c.converge(0, []string{"m1", "m2"}, 15*time.Second)
	waitFor(t, 5*time.Second, "n4 is a voter everywhere", func() bool {
		for _, tn := range c.nodes {
			if !slices.Contains(tn.node.Group(0).Voters(), "n4") {
				return false
			}
		}
		return true
	})
	// n4 can propose too (forwarded).
	if _, err := g4.Propose(ctxT(t, 10*time.Second), []byte("m3")); err != nil {
		t.Fatal(err)
	}
	c.converge(0, []string{"m1", "m2", "m3"}, 15*time.Second)

	resp, err = Admin(ctxT(t, 10*time.Second), n4.addr, AdminRequest{Op: "status"})
	if err != nil || resp.Error != "" || resp.Status == nil {
		t.Fatalf("admin status: %v %+v", err, resp)
	}
	st := resp.Status
	if st.Node != "n4" || len(st.Members) != 4 || st.Members[3].ID != "n4" || st.Members[3].Addr != n4.addr ||
		len(st.Groups) != 1 || st.Groups[0].Leader != ld.id || st.Groups[0].Applied == 0 {
		t.Errorf("status = %+v", st)
	}
	js, _ := json.Marshal(st)
	if !strings.Contains(string(js), `"members":[{"id":"n1","addr":`) || !strings.Contains(string(js), `"voter":true,"up":true`) {
		t.Errorf("status JSON = %s", js)
	}

	resp, err = Admin(ctxT(t, 30*time.Second), ld.addr, AdminRequest{Op: "remove", ID: "n4"})
	if err != nil || resp.Error != "" {
		t.Fatalf("admin remove: %v %q", err, resp.Error)
	}
	waitFor(t, 5*time.Second, "n4 gone from the members", func() bool {
		for _, m := range ld.node.Members() {
			if m.ID == "n4" {
				return false
			}
		}
		return true
	})
	resp, err = Admin(ctxT(t, 5*time.Second), ld.addr, AdminRequest{Op: "bogus"})
	if err != nil || !strings.Contains(resp.Error, "unknown admin operation") {
		t.Errorf("bogus op: %v %+v", err, resp)
	}
}

func TestPeerChangeCallback(t *testing.T) {
	c := newCluster(t, 2, false)
	var mu sync.Mutex
	var events []string
	// Restart n1 with a callback.
	n1 := c.nodes[0]
	if err := n1.node.Close(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", n1.addr)
	if err != nil {
		t.Fatal(err)
	}
	nd, err := Start(Config{NodeID: "n1", Listen: n1.addr, Peers: c.peers, DB: n1.db, Logger: quietLogger(), listener: ln,
		OnPeerChange: func(id string, up bool) {
			mu.Lock()
			events = append(events, fmt.Sprintf("%s:%v", id, up))
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	n1.node = nd
	waitFor(t, 3*time.Second, "n2 up", func() bool { return nd.PeerUp("n2") })
	if err := c.nodes[1].node.Close(); err != nil {
		t.Fatal(err)
	}
	c.nodes[1].node = nil
	waitFor(t, 3*PeerDownAfter, "n2 down", func() bool { return !nd.PeerUp("n2") })
	c.start(c.nodes[1], nil, false)
	waitFor(t, 3*PeerDownAfter, "n2 up again", func() bool { return nd.PeerUp("n2") })
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(events, []string{"n2:false", "n2:true"}) {
		t.Errorf("OnPeerChange events %v", events)
	}
}
