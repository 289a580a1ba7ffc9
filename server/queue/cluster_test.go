package queue

import (
	"errors"
	"fmt"
	"sync"
	"testing"
)

// memCluster is an in-memory Raft group for the quorum queue tests: proposals from any node go
// into one ordered log, which a single applier goroutine (the FSM goroutine) applies to every
// replica in order; the proposer's done gets the leader replica's answer. A test can change the
// leader, apply every command twice (a retry after a lost leadership), hold proposals until it
// flushes them, make a node's proposals fail (no quorum from there), or make a replica lag: it
// applies the log only when the test lets it catch up, after the proposers got their answers (as
// a follower does that applies a forwarded command after the leader answered it).
type memCluster struct {
	mu       sync.Mutex
	cond     *sync.Cond
	replicas []*Quorum
	leader   int
	log      []proposal
	index    uint64
	closed   bool
	held     bool // proposals wait until flush
	twice    bool // every command is applied twice, as a retry would be
	// fail, if set, fails a node's proposal (before it is applied) when it returns true.
	fail    func(node int, cmd *Command) bool
	applied []Command // every command applied, decoded (for assertions)
	// cut lists replicas that miss the log (a follower cut off); they catch up with a snapshot.
	cut map[int]bool
	// lag lists replicas that apply the log later: their entries wait in backlog until catchUp.
	lag     map[int]bool
	backlog map[int][]logEntry
	catchup []int // replicas to catch up, by the FSM goroutine
	done    chan struct{}
}

type proposal struct {
	cmd  []byte
	done func(uint64, []byte, error)
}

// logEntry is a command at its log index, waiting for a lagging replica.
type logEntry struct {
	index uint64
	cmd   []byte
}

var errNoQuorum = errors.New("test: no quorum")

func newCluster(t *testing.T) *memCluster {
	c := &memCluster{done: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	go c.run()
	t.Cleanup(c.stop)
	return c
}

// stop closes the replicas, then the applier.
func (c *memCluster) stop() {
	c.mu.Lock()
	rs := c.replicas
	c.mu.Unlock()
	for _, q := range rs {
		q.Close()
	}
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
	<-c.done
}

// add opens replica number len(replicas) as node tag len+1, epoch 1.
func (c *memCluster) add(t *testing.T, cfg OpenConfig, classic bool) *Quorum {
	c.mu.Lock()
	node := len(c.replicas)
	c.mu.Unlock()
	if cfg.Name == "" {
		cfg.Name = "qq"
	}
	if cfg.Lifecycle == (Config{}) {
		cfg.Lifecycle = DefaultConfig()
	}
	if cfg.ID == 0 {
		cfg.ID = 42
	}
	cfg.Logger = quiet
	cfg.Extra = &QuorumConfig{Replicator: &memRep{c: c, node: node}, Node: uint16(node + 1), Epoch: 1, Classic: classic}
	q, err := QuorumType{}.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.replicas = append(c.replicas, q.(*Quorum))
	c.mu.Unlock()
	return q.(*Quorum)
}

// setLeader makes node the leader and tells every replica, as raft's leadership notification does.
func (c *memCluster) setLeader(node int) {
	c.mu.Lock()
	c.leader = node
	rs := c.replicas
	c.mu.Unlock()
	for i, q := range rs {
		q.LeaderChanged(i == node)
	}
}

func (c *memCluster) propose(node int, cmd []byte, done func(uint64, []byte, error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail != nil {
		var dc Command
		if _, err := DecodeCommand(cmd, &dc); err == nil && c.fail(node, &dc) {
			go done(0, nil, errNoQuorum)
			return
		}
	}
	if c.closed {
		go done(0, nil, errors.New("test: cluster closed"))
		return
	}
	c.log = append(c.log, proposal{cmd, done})
	c.cond.Broadcast()
}

// flush lets held proposals be applied (and waits until they, and what they proposed in turn, are).
func (c *memCluster) flush(t *testing.T) {
	c.mu.Lock()
	c.held = false
	c.cond.Broadcast()
	c.mu.Unlock()
	waitFor(t, "log applied", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.log) == 0 })
	c.mu.Lock()
	c.held = true
	c.mu.Unlock()
}

// release stops holding proposals: each is applied as it comes, including those a replica's own
// goroutine proposes after an apply (a stale consumer's reaping), which a flush could leave held.
func (c *memCluster) release() {
	c.mu.Lock()
	c.held = false
	c.cond.Broadcast()
	c.mu.Unlock()
}

// hold makes proposals wait for the next flush again.
func (c *memCluster) hold() {
	c.mu.Lock()
	c.held = true
	c.mu.Unlock()
}

// setLag makes replica i lag (catchUp ends it).
func (c *memCluster) setLag(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lag == nil {
		c.lag, c.backlog = make(map[int]bool), make(map[int][]logEntry)
	}
	c.lag[i] = true
}

// catchUp makes lagging replica i apply its backlog (on the FSM goroutine) and waits for it.
func (c *memCluster) catchUp(t *testing.T, i int) {
	c.mu.Lock()
	c.catchup = append(c.catchup, i)
	c.cond.Broadcast()
	c.mu.Unlock()
	waitFor(t, "replica caught up", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return !c.lag[i] })
}

// run is the FSM goroutine.
func (c *memCluster) run() {
	defer close(c.done)
	for {
		c.mu.Lock()
		for !c.closed && len(c.catchup) == 0 && (len(c.log) == 0 || c.held) {
			c.cond.Wait()
		}
		if c.closed {
			for _, p := range c.log {
				go p.done(0, nil, errors.New("test: cluster closed"))
			}
			c.mu.Unlock()
			return
		}
		if len(c.catchup) > 0 {
			i := c.catchup[0]
			c.catchup = c.catchup[1:]
			backlog, q := c.backlog[i], c.replicas[i]
			delete(c.backlog, i)
			c.mu.Unlock()
			for _, e := range backlog {
				q.Apply(e.index, e.cmd)
			}
			c.mu.Lock()
			delete(c.lag, i)
			c.mu.Unlock()
			continue
		}
		p := c.log[0]
		rs, leader, twice, cut := c.replicas, c.leader, c.twice, c.cut
		c.mu.Unlock()
		var resp []byte
		var idx uint64
		for n := 0; n < 1+boolInt(twice); n++ {
			c.mu.Lock()
			c.index++
			idx = c.index
			var dc Command
			if _, err := DecodeCommand(p.cmd, &dc); err == nil {
				dc.Tags, dc.Epochs, dc.Seqs = append([]Tag(nil), dc.Tags...), append([]uint16(nil), dc.Epochs...), append([]uint64(nil), dc.Seqs...)
				c.applied = append(c.applied, dc)
			}
			lagging := make(map[int]bool, len(c.lag))
			for i := range c.lag {
				lagging[i] = true
				c.backlog[i] = append(c.backlog[i], logEntry{idx, p.cmd})
			}
			c.mu.Unlock()
			for i, q := range rs {
				if cut[i] || lagging[i] {
					continue
				}
				// With twice, the proposer gets the retry's answer, as after a lost leadership.
				if out := q.Apply(idx, p.cmd); i == leader {
					resp = out
				}
			}
		}
		c.mu.Lock()
		c.log = c.log[1:]
		c.mu.Unlock()
		p.done(idx, resp, nil) // the cluster layer's goroutine, not the FSM's: no replica lock is held
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// count returns how many applied commands of type t satisfy f (nil: all).
func (c *memCluster) count(t CommandType, f func(*Command) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for i := range c.applied {
		if c.applied[i].Type == t && (f == nil || f(&c.applied[i])) {
			n++
		}
	}
	return n
}

// memRep is one node's Replicator.
type memRep struct {
	c    *memCluster
	node int
}

func (r *memRep) Propose(cmd []byte, done func(uint64, []byte, error)) {
	r.c.propose(r.node, cmd, done)
}

func (r *memRep) IsLeader() bool {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.c.leader == r.node
}

// cid is a consumer id of a node (tag node+1) in epoch 1.
func cid(node int, n uint32) ConsumerID {
	return ConsumerID(uint64(node+1)<<48 | 1<<32 | uint64(n))
}

func publishOK(t testing.TB, q Queue, m *Message) {
	t.Helper()
	d := newDone(t)
	q.Publish(m, d)
	if err := d.wait(); err != nil {
		t.Fatalf("publish %q: %v", m.Body, err)
	}
}

func fmtStats(q Queue) string {
	st := q.Stats()
	return fmt.Sprintf("ready %d unacked %d consumers %d", st.Ready, st.Unacked, st.Consumers)
}
