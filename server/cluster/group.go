package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"warren/storage"
	"warren/storage/raftstore"
)

// Proposal retry backoff bounds (a leader change retries at once).
const (
	retryBackoffMin = 10 * time.Millisecond
	retryBackoffMax = 250 * time.Millisecond
	// retrySweepInterval is how often queued proposals are checked for expiry.
	retrySweepInterval = 50 * time.Millisecond
)

// GroupConfig configures one raft group.
type GroupConfig struct {
	ID        uint64   // 0 = metadata group; others chosen by the caller, unique in the cluster
	Name      string   // human label shown in status, e.g. "metadata" or "queue 'q' in vhost '/'"
	FSM       raft.FSM // Apply returns nil, []byte or error (anything else is treated as nil)
	Voters    []string // node ids; used only when bootstrapping (no existing state for this group on this node)
	Nonvoters []string // idem (hashicorp Nonvoter suffrage)
	// Bootstrap bootstraps with Voters+Nonvoters if this node has no state for the group (every member may do
	// so with the identical configuration). The first of Voters then starts the group's first election at
	// once instead of after an election timeout, so a new group has a leader within a round trip of its
	// members having started it.
	Bootstrap bool
	// OnLeader, if set, is called on every leadership change of THIS node for this group, in order, from a
	// cluster goroutine that also runs the group's proposal callbacks (keep it short).
	OnLeader func(isLeader bool)
	// OnLeaderChange, if set, is called with the group's leader as this node learns it (a node id,
	// "" while it knows none), in order, from the same goroutine as OnLeader (keep it short). Every
	// member observes it, followers and non-voters too: the stream protocol tells its clients when
	// a stream's leader moved.
	OnLeaderChange func(leader string)
}

// Result is the outcome of a committed proposal: its log index and the []byte the FSM returned (nil if none).
type Result struct {
	Index uint64
	Data  []byte
}

// ApplyError carries an error returned by the FSM's Apply on the leader (also across forwarding).
type ApplyError struct{ Msg string }

// Error implements error.
func (e *ApplyError) Error() string { return e.Msg }

// Group is one running raft group on this node. An idle group has no goroutine of its own besides
// hashicorp/raft's: the goroutines that await proposals, retry them and run their callbacks start
// when there is work and end when it is done.
type Group struct {
	n       *Node
	id      uint64
	name    string
	cfg     GroupConfig
	raft    *raft.Raft
	store   *raftstore.Store
	trans   raft.Transport
	gt      *groupTransport // nil on the in-memory transport
	snapDir string          // "" with in-memory snapshots

	applied      atomic.Uint64
	commitNanos  atomic.Int64  // moving average of the time a local proposal takes to commit and apply
	restoreIndex atomic.Uint64 // index of the snapshot last opened for a restore
	waiters      atomic.Int32
	wmu          sync.Mutex
	wch          chan struct{} // closed when applied advances and someone waits

	submitMu sync.RWMutex
	closed   bool
	// outstanding counts proposals handed to raft.Apply whose futures are not answered yet.
	outstanding atomic.Int64

	// Futures of proposals applied on this node as leader (local or forwarded), awaited in log order
	// by the local waiter while lrunning.
	lmu      sync.Mutex
	lq       []localItem
	lrunning bool

	rmu          sync.Mutex
	retries      []*proposal
	rclosed      bool
	draining     bool          // the retry loop is resubmitting the head of retries
	retryRunning bool          // the retry loop runs
	retryKey     chan struct{} // capacity 1: wakes the retry loop

	dmu      sync.Mutex
	dones    []doneItem
	dclosed  bool
	drunning bool // the done runner runs

	forced atomic.Bool // forceFirstElection is under way (hclogAdapter.forced)

	emu       sync.Mutex
	wasLeader bool        // the leadership last reported to OnLeader
	kickTimer *time.Timer // a later turn at forcing an election (failover.go)
	kickArmed bool        // kickTimer is set and has not fired

	stop      chan struct{}
	wg        sync.WaitGroup // local waiter and retry loop
	dwg       sync.WaitGroup // done runner
	closeOnce sync.Once
	closeErr  error
}

// localItem is a future awaited by the local waiter: a local proposal's (p) or a forwarded one's
// (fwd gets the future once it is answered).
type localItem struct {
	p     *proposal
	fwd   func(raft.ApplyFuture)
	f     raft.ApplyFuture
	start time.Time // when it was handed to raft, for the commit latency
}

// doneItem is a callback for the done runner: a proposal's completion, or fn.
type doneItem struct {
	p   *proposal
	r   Result
	err error
	fn  func()
}

// proposal is one command on its way to the leader.
type proposal struct {
	cmd       []byte
	deadline  time.Time
	cancel    <-chan struct{} // Propose's ctx.Done(); nil for ProposeAsync
	done      func(Result, error)
	finished  atomic.Bool
	attempts  int
	notBefore time.Time
	lastErr   error
	// leaderOnly: applied only while this node leads, never forwarded nor retried (ProposeAsLeader).
	leaderOnly bool
}

func (p *proposal) expired(now time.Time) bool {
	if now.After(p.deadline) {
		return true
	}
	if p.cancel != nil {
		select {
		case <-p.cancel:
			return true
		default:
		}
	}
	return false
}

// StartGroup starts group cfg.ID on this node. It is idempotent per ID while the group runs: it then returns
// the running group.
func (n *Node) StartGroup(cfg GroupConfig) (*Group, error) {
	if cfg.FSM == nil {
		return nil, fmt.Errorf("cluster: start group %d: nil FSM", cfg.ID)
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, fmt.Errorf("cluster: start group %d: %w", cfg.ID, ErrClosed)
	}
	if g := n.groups[cfg.ID]; g != nil {
		n.mu.Unlock()
		return g, nil
	}
	n.mu.Unlock()

	// Serialise starts so that one id is never started twice.
	n.startMu.Lock()
	defer n.startMu.Unlock()
	if g := n.Group(cfg.ID); g != nil {
		return g, nil
	}
	g, bootstrapped, err := n.newGroup(cfg)
	if err != nil {
		return nil, fmt.Errorf("cluster: start group %d (%s): %w", cfg.ID, cfg.Name, err)
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		_ = g.Close()
		return nil, fmt.Errorf("cluster: start group %d: %w", cfg.ID, ErrClosed)
	}
	n.groups[cfg.ID] = g
	n.mu.Unlock()
	g.forceFirstElection(bootstrapped)
	return g, nil
}

// newGroup creates the group's raft; bootstrapped reports that this node had no state for it and
// bootstrapped it now.
func (n *Node) newGroup(cfg GroupConfig) (g *Group, bootstrapped bool, err error) {
	g = &Group{
		n:        n,
		id:       cfg.ID,
		name:     cfg.Name,
		cfg:      cfg,
		retryKey: make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
	hl := newHclog(n.log.With("group", cfg.ID), "raft")
	hl.forced = &g.forced

	store, err := raftstore.New(n.cfg.DB, cfg.ID)
	if err != nil {
		return nil, false, err
	}
	g.store = store
	logs, err := raft.NewLogCache(logCacheSize, store)
	if err != nil {
		return nil, false, fmt.Errorf("log cache: %w", err)
	}

	var snaps raft.SnapshotStore
	if n.cfg.DataDir == "" {
		snaps = raft.NewInmemSnapshotStore()
	} else {
		g.snapDir = filepath.Join(n.cfg.DataDir, "raft", strconv.FormatUint(cfg.ID, 10))
		fss, err := raft.NewFileSnapshotStoreWithLogger(g.snapDir, snapshotsRetained, hl)
		if err != nil {
			return nil, false, fmt.Errorf("snapshot store: %w", err)
		}
		snaps = fss
	}
	snaps = &snapStore{SnapshotStore: snaps, g: g}

	if n.single() {
		_, g.trans = raft.NewInmemTransport(raft.ServerAddress(n.selfAddr()))
	} else {
		gt, err := n.mesh.newTransport(cfg.ID)
		if err != nil {
			return nil, false, err
		}
		g.gt, g.trans = gt, gt
	}

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(n.cfg.NodeID)
	rc.HeartbeatTimeout = heartbeatTimeout
	rc.ElectionTimeout = electionTimeout
	rc.LeaderLeaseTimeout = leaderLeaseTimeout
	rc.CommitTimeout = commitTimeout
	rc.MaxAppendEntries = maxAppendEntries
	// BatchApplyCh lets the leader take a whole batch of proposals per log write (without it a
	// quorum queue does ~2k msg/s instead of ~30k). Raft does not answer proposals left in that
	// buffer when it shuts down, so close waits for every proposal it issued first (applying).
	rc.BatchApplyCh = true
	rc.ShutdownOnRemove = false
	rc.TrailingLogs = trailingLogs
	rc.SnapshotThreshold = snapshotThreshold
	rc.SnapshotInterval = snapshotInterval
	rc.Logger = hl

	fail := func(err error) (*Group, bool, error) {
		g.closeTransport()
		return nil, false, err
	}
	if cfg.Bootstrap {
		has, err := raft.HasExistingState(logs, store, snaps)
		if err != nil {
			return fail(fmt.Errorf("check existing state: %w", err))
		}
		if !has {
			var conf raft.Configuration
			for _, ids := range []struct {
				list []string
				s    raft.ServerSuffrage
			}{{cfg.Voters, raft.Voter}, {cfg.Nonvoters, raft.Nonvoter}} {
				for _, id := range ids.list {
					addr, ok := n.addrOf(id)
					if !ok {
						return fail(fmt.Errorf("bootstrap: no address known for node %q", id))
					}
					conf.Servers = append(conf.Servers, raft.Server{
						Suffrage: ids.s, ID: raft.ServerID(id), Address: raft.ServerAddress(addr),
					})
				}
			}
			if len(conf.Servers) == 0 {
				conf.Servers = []raft.Server{{
					Suffrage: raft.Voter, ID: rc.LocalID, Address: raft.ServerAddress(n.selfAddr()),
				}}
			}
			// The term and the first entry in one batch, durable with the group's next synced write
			// (raftstore.Bootstrap): starting a group waits for no sync.
			bs := store.Bootstrap(func(err error) { n.log.Error("raft group bootstrap not stored", "group", cfg.ID, "err", err) })
			if err := raft.BootstrapCluster(rc, bs, bs, snaps, g.trans, conf); err != nil {
				return fail(fmt.Errorf("bootstrap: %w", err))
			}
			bootstrapped = true
		}
	}

	var fsm raft.FSM = &fsmWrapper{g: g, fsm: cfg.FSM}
	if b, ok := cfg.FSM.(raft.BatchingFSM); ok {
		fsm = &batchFSMWrapper{fsmWrapper: fsm.(*fsmWrapper), b: b}
	}
	r, err := raft.NewRaft(rc, fsm, logs, store, snaps, g.trans)
	if err != nil {
		return fail(fmt.Errorf("new raft: %w", err))
	}
	g.raft = r
	if g.gt != nil {
		lf := func() (uint64, bool) { return r.CurrentTerm(), r.State() == raft.Leader }
		g.gt.leader.Store(&lf)
	}
	n.watch(g)
	return g, bootstrapped, nil
}

// forceFirstElection starts this node's election at once, instead of after a heartbeat timeout, when
// the group's only voter is this node, or when this node just bootstrapped a new group of which it is
// the first voter. Any member may stand for election at any time without endangering safety (votes
// and terms decide); doing so early only matters for liveness, and only the first voter does it, so
// members of a new group do not split its first vote. Lowering the heartbeat timeout wakes raft's
// follower loop, which, having never heard of a leader (last contact zero), starts an election; the
// timeout is then restored.
//
// While a majority of the voters' nodes have not answered a ping yet (a cluster starting: the
// metadata group's case), the election waits for them (runDeferredElections): one into refused
// connections would be retried only after an election timeout.
//
// A group recovered from this node's store (a restart) that has heard from no leader after
// recoveredGrace stands for election too, the voters one after the other (kickOrder, kickStagger
// apart): after a restart of the whole cluster nobody else would for a whole heartbeat timeout. It
// is an ordinary election with a pre-vote, which voters that still follow a live leader refuse, so
// a node restarting in a running cluster deposes no one.
func (g *Group) forceFirstElection(bootstrapped bool) {
	conf, err := g.configuration()
	if err != nil {
		return
	}
	self := raft.ServerID(g.n.cfg.NodeID)
	var voters []string
	isVoter := false
	for _, s := range conf.Servers {
		if s.Suffrage == raft.Voter {
			voters = append(voters, string(s.ID))
			isVoter = isVoter || s.ID == self
		}
	}
	if !isVoter {
		return
	}
	first := bootstrapped && len(g.cfg.Voters) > 1 && raft.ServerID(g.cfg.Voters[0]) == self
	switch {
	case len(voters) == 1:
		g.electNow()
	case first:
		// Now if its voters answer pings (a new group in a running cluster: the common case).
		if !g.votesReachable(conf) {
			g.n.deferElection(g, time.Time{})
			return
		}
		g.electNow()
	case !bootstrapped:
		slices.SortFunc(voters, func(a, b string) int { return cmp.Compare(kickOrder(g.id, a), kickOrder(g.id, b)) })
		rank := slices.Index(voters, string(self))
		g.n.deferElection(g, time.Now().Add(recoveredGrace+time.Duration(rank)*kickStagger))
	}
}

// recoveredGrace is how long a group recovered at start waits to hear from a leader before it stands
// for election: longer than a live leader's heartbeat period (heartbeatTimeout/5 at most).
const recoveredGrace = heartbeatTimeout/5 + time.Second

// deferredElection is a group's election waiting for its time and its voters.
type deferredElection struct {
	g    *Group
	from time.Time // not before
}

func (n *Node) deferElection(g *Group, from time.Time) {
	n.mu.Lock()
	n.deferred = append(n.deferred, deferredElection{g: g, from: from})
	n.mu.Unlock()
}

// votesReachable reports whether enough of the group's voters have answered a ping for an election
// of this node to win: a majority of the voters, counting this node.
func (g *Group) votesReachable(conf raft.Configuration) bool {
	voters, reach := 0, 0
	for _, s := range conf.Servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		voters++
		if id := string(s.ID); id == g.n.cfg.NodeID || g.n.live.heard(id) {
			reach++
		}
	}
	return reach*2 > voters
}

// runDeferredElections runs the deferred elections that are due and whose voters answer pings, for
// the groups that still have heard of no leader; the others wait. The ping loop calls it each tick
// (the list is empty but after a start or a new group).
func (n *Node) runDeferredElections() {
	n.mu.Lock()
	pending := n.deferred
	n.deferred = nil
	n.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	// Raft's configuration is read without n.mu: raft's goroutines report to the event loop, which
	// takes n.mu.
	now := time.Now()
	var keep []deferredElection
	for _, d := range pending {
		g := d.g
		if n.Group(g.id) != g || g.Leader() != "" || g.raft.State() != raft.Follower {
			continue // closed, led, or an election under way
		}
		if now.Before(d.from) {
			keep = append(keep, d)
			continue
		}
		conf, err := g.configuration()
		switch {
		case err != nil:
		case !g.votesReachable(conf):
			keep = append(keep, d)
		default:
			g.electNow()
		}
	}
	if len(keep) > 0 {
		n.mu.Lock()
		n.deferred = append(n.deferred, keep...)
		n.mu.Unlock()
	}
}

// electNow makes this node's raft, a follower that never heard of a leader, stand for election now.
func (g *Group) electNow() {
	g.forced.Store(true)
	orig := g.raft.ReloadableConfig()
	fast := orig
	fast.HeartbeatTimeout = orig.HeartbeatTimeout - time.Millisecond
	if err := g.raft.ReloadConfig(fast); err != nil {
		return
	}
	_ = g.raft.ReloadConfig(orig)
}

func (g *Group) closeTransport() {
	if g.gt != nil {
		_ = g.gt.Close()
	}
}

// ID returns the group id.
func (g *Group) ID() uint64 { return g.id }

// AppliedIndex returns the index of the last entry this node's FSM applied.
func (g *Group) AppliedIndex() uint64 { return g.applied.Load() }

// IsLeader reports whether this node is the group's leader.
func (g *Group) IsLeader() bool { return g.raft.State() == raft.Leader }

// Leader returns the leader's node id, "" if unknown.
func (g *Group) Leader() string {
	_, id := g.raft.LeaderWithID()
	return string(id)
}

func (g *Group) configuration() (raft.Configuration, error) {
	f := g.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return raft.Configuration{}, err
	}
	return f.Configuration(), nil
}

func (g *Group) servers(s raft.ServerSuffrage) []string {
	conf, err := g.configuration()
	if err != nil {
		return nil
	}
	var out []string
	for _, srv := range conf.Servers {
		if srv.Suffrage == s {
			out = append(out, string(srv.ID))
		}
	}
	slices.Sort(out)
	return out
}

// Voters returns the voters of the current configuration, sorted.
func (g *Group) Voters() []string { return g.servers(raft.Voter) }

// Nonvoters returns the nonvoters of the current configuration, sorted.
func (g *Group) Nonvoters() []string { return g.servers(raft.Nonvoter) }

// setApplied records that the FSM applied index and wakes WaitApplied.
func (g *Group) setApplied(index uint64) {
	g.applied.Store(index)
	if g.gt != nil {
		g.gt.committed(index) // a no-op unless this node leads (checked when the push is due)
	}
	if g.waiters.Load() > 0 {
		g.wmu.Lock()
		if g.wch != nil {
			close(g.wch)
			g.wch = nil
		}
		g.wmu.Unlock()
	}
}

// WaitApplied waits until THIS node's FSM has applied index.
func (g *Group) WaitApplied(ctx context.Context, index uint64) error {
	for {
		if g.applied.Load() >= index {
			return nil
		}
		g.waiters.Add(1)
		g.wmu.Lock()
		if g.wch == nil {
			g.wch = make(chan struct{})
		}
		ch := g.wch
		g.wmu.Unlock()
		if g.applied.Load() >= index {
			g.waiters.Add(-1)
			return nil
		}
		select {
		case <-ch:
			g.waiters.Add(-1)
		case <-ctx.Done():
			g.waiters.Add(-1)
			return fmt.Errorf("cluster: group %d: wait for index %d (applied %d): %w",
				g.id, index, g.applied.Load(), ctx.Err())
		case <-g.stop:
			g.waiters.Add(-1)
			return fmt.Errorf("cluster: group %d: wait for index %d: %w", g.id, index, ErrClosed)
		}
	}
}

// Propose replicates cmd and returns when it is committed and applied on the leader. On a follower it is
// forwarded to the leader. Transient failures are retried against the current leader until ctx ends, so
// delivery is at-least-once.
func (g *Group) Propose(ctx context.Context, cmd []byte) (Result, error) {
	type outcome struct {
		r   Result
		err error
	}
	ch := make(chan outcome, 1)
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(100 * 365 * 24 * time.Hour)
	}
	p := &proposal{cmd: cmd, deadline: deadline, cancel: ctx.Done(),
		done: func(r Result, err error) { ch <- outcome{r, err} }}
	g.submitNew(p)
	select {
	case o := <-ch:
		return o.r, o.err
	case <-ctx.Done():
		return Result{}, fmt.Errorf("cluster: group %d (%s): propose: %w (%w)", g.id, g.name, ErrNoLeader, ctx.Err())
	}
}

// ProposeAsync is Propose without blocking the caller (beyond back-pressure): done is called exactly once,
// from a cluster goroutine, after at most about timeout.
func (g *Group) ProposeAsync(cmd []byte, timeout time.Duration, done func(Result, error)) {
	p := &proposal{cmd: cmd, deadline: time.Now().Add(timeout), done: done}
	g.submitNew(p)
}

// ProposeAsLeader is ProposeAsync for a decision only this node's leadership entitles it to make
// (a leader's verdict that a member is down, say): it is applied only if this node leads the group
// now, and fails (ErrNotLeader, or the lost leadership) instead of being forwarded or retried. A
// leader cut off from its group must not have such a command committed by the next leader after the
// partition heals, when the verdict is stale.
func (g *Group) ProposeAsLeader(cmd []byte, timeout time.Duration, done func(Result, error)) {
	p := &proposal{cmd: cmd, deadline: time.Now().Add(timeout), done: done, leaderOnly: true}
	g.submit(p)
}

// submitNew submits a new proposal, behind the queued retries so that one proposer's commands keep their
// order while the leader is unknown.
func (g *Group) submitNew(p *proposal) {
	g.rmu.Lock()
	if (len(g.retries) > 0 || g.draining) && !g.rclosed {
		g.retries = append(g.retries, p)
		g.ensureRetryLoopLocked()
		g.rmu.Unlock()
		g.wakeRetries()
		return
	}
	g.rmu.Unlock()
	g.submit(p)
}

// submit sends p to the leader: raft.Apply here, or forwarding; otherwise it queues p for a retry.
func (g *Group) submit(p *proposal) {
	g.submitMu.RLock()
	defer g.submitMu.RUnlock()
	if g.closed {
		g.finish(p, Result{}, fmt.Errorf("cluster: group %d (%s): propose: %w", g.id, g.name, ErrClosed))
		return
	}
	now := time.Now()
	if p.expired(now) {
		g.finish(p, Result{}, g.noLeaderErr(p))
		return
	}
	p.attempts++
	if g.raft.State() == raft.Leader {
		g.outstanding.Add(1) // under submitMu, with closed checked: see Close
		f := g.raft.Apply(p.cmd, p.deadline.Sub(now))
		g.awaitLocal(localItem{p: p, f: f, start: time.Now()})
		return
	}
	if p.leaderOnly {
		g.finish(p, Result{}, fmt.Errorf("cluster: group %d (%s): propose as leader: %w", g.id, g.name, raft.ErrNotLeader))
		return
	}
	addr, id := g.raft.LeaderWithID()
	if id == "" || string(id) == g.n.cfg.NodeID || g.n.single() {
		p.lastErr = errors.New("no leader known")
		g.retryLater(p)
		return
	}
	if err := g.n.client(string(addr)).propose(g, p); err != nil {
		p.lastErr = err
		g.retryLater(p)
	}
}

func (g *Group) noLeaderErr(p *proposal) error {
	if p.lastErr != nil {
		return fmt.Errorf("cluster: group %d (%s): propose: %w (last error: %v)", g.id, g.name, ErrNoLeader, p.lastErr)
	}
	return fmt.Errorf("cluster: group %d (%s): propose: %w", g.id, g.name, ErrNoLeader)
}

// awaitLocal queues a future for the local waiter, starting it if needed. The caller holds submitMu
// (read) and has checked that the group is not closed.
func (g *Group) awaitLocal(it localItem) {
	g.lmu.Lock()
	g.lq = append(g.lq, it)
	start := !g.lrunning
	if start {
		g.lrunning = true
		g.wg.Add(1)
	}
	g.lmu.Unlock()
	if start {
		go g.localWaiter()
	}
}

// localWaiter awaits, in log order, the futures of proposals applied on this node as leader, and ends
// when none is left.
func (g *Group) localWaiter() {
	defer g.wg.Done()
	for {
		g.lmu.Lock()
		if len(g.lq) == 0 {
			g.lq = nil
			g.lrunning = false
			g.lmu.Unlock()
			return
		}
		it := g.lq[0]
		g.lq[0] = localItem{}
		g.lq = g.lq[1:]
		g.lmu.Unlock()
		err := it.f.Error()
		g.outstanding.Add(-1)
		if it.fwd != nil {
			it.fwd(it.f)
			continue
		}
		if err == nil {
			g.observeCommit(time.Since(it.start))
			res := Result{Index: it.f.Index()}
			switch v := it.f.Response().(type) {
			case []byte:
				res.Data = v
			case error:
				g.finish(it.p, res, &ApplyError{Msg: v.Error()})
				continue
			}
			g.finish(it.p, res, nil)
			continue
		}
		if it.p.leaderOnly {
			g.finish(it.p, Result{}, fmt.Errorf("cluster: group %d (%s): propose as leader: %w", g.id, g.name, err))
			continue
		}
		it.p.lastErr = err
		g.retryLater(it.p)
	}
}

// retryLater queues p for another attempt after a backoff (or at the next leader change).
func (g *Group) retryLater(p *proposal) {
	b := retryBackoffMin << min(p.attempts, 6)
	if b > retryBackoffMax {
		b = retryBackoffMax
	}
	p.notBefore = time.Now().Add(b)
	g.rmu.Lock()
	if g.rclosed {
		g.rmu.Unlock()
		g.finish(p, Result{}, fmt.Errorf("cluster: group %d (%s): propose: %w", g.id, g.name, ErrClosed))
		return
	}
	first := len(g.retries) == 0
	g.retries = append(g.retries, p)
	g.ensureRetryLoopLocked()
	g.rmu.Unlock()
	if first {
		g.wakeRetries()
	}
}

// ensureRetryLoopLocked starts the retry loop if it is not running (rmu held).
func (g *Group) ensureRetryLoopLocked() {
	if g.retryRunning || g.rclosed {
		return
	}
	g.retryRunning = true
	g.wg.Add(1)
	go g.retryLoop()
}

func (g *Group) wakeRetries() {
	select {
	case g.retryKey <- struct{}{}:
	default:
	}
}

// kickRetries makes every queued proposal due now (the leader changed).
func (g *Group) kickRetries() {
	g.rmu.Lock()
	for _, p := range g.retries {
		p.notBefore = time.Time{}
	}
	n := len(g.retries)
	g.rmu.Unlock()
	if n > 0 {
		g.wakeRetries()
	}
}

// retryLoop resubmits queued proposals in FIFO order when the head is due and a leader is known.
func (g *Group) retryLoop() {
	defer g.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var lastSweep time.Time
	for {
		now := time.Now()
		var expired []*proposal
		var wait time.Duration // 0 = until woken
		g.rmu.Lock()
		if now.Sub(lastSweep) >= retrySweepInterval {
			lastSweep = now
			keep := g.retries[:0]
			for _, p := range g.retries {
				if p.expired(now) {
					expired = append(expired, p)
				} else {
					keep = append(keep, p)
				}
			}
			clear(g.retries[len(keep):])
			g.retries = keep
		}
		var head *proposal
		if len(g.retries) > 0 {
			p := g.retries[0]
			switch {
			case p.expired(now):
				head = p
			case p.notBefore.After(now):
				wait = p.notBefore.Sub(now)
			case !g.leaderKnown():
				wait = retryBackoffMin * 2
			default:
				head = p
			}
			if head != nil {
				g.retries[0] = nil
				g.retries = g.retries[1:]
				g.draining = true
			}
		}
		exit := false
		if head == nil {
			g.draining = false
			if len(g.retries) == 0 {
				// Nothing left: the loop ends (retryLater starts another when needed).
				g.retries = nil
				g.retryRunning = false
				exit = true
			}
		}
		g.rmu.Unlock()
		for _, p := range expired {
			g.finish(p, Result{}, g.noLeaderErr(p))
		}
		if exit {
			timer.Stop()
			return
		}
		if head != nil {
			g.submit(head)
			continue
		}
		if len(expired) > 0 {
			continue
		}
		var tc <-chan time.Time
		if wait > 0 {
			timer.Reset(wait)
			tc = timer.C
		}
		select {
		case <-g.stop:
			timer.Stop()
			g.rmu.Lock()
			g.retryRunning = false
			g.rmu.Unlock()
			g.failRetries()
			return
		case <-g.retryKey:
		case <-tc:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// failRetries closes the retry queue and fails what it holds (the group is closing).
func (g *Group) failRetries() {
	g.rmu.Lock()
	rest := g.retries
	g.retries = nil
	g.rclosed = true
	g.rmu.Unlock()
	for _, p := range rest {
		g.finish(p, Result{}, fmt.Errorf("cluster: group %d (%s): propose: %w", g.id, g.name, ErrClosed))
	}
}

// leaderKnown reports whether a proposal can be sent: this node leads or knows another leader.
func (g *Group) leaderKnown() bool {
	if g.raft.State() == raft.Leader {
		return true
	}
	_, id := g.raft.LeaderWithID()
	return id != "" && string(id) != g.n.cfg.NodeID && !g.n.single()
}

// finish completes p exactly once; done runs on the group's done runner.
func (g *Group) finish(p *proposal, r Result, err error) {
	if p.finished.Swap(true) {
		return
	}
	g.runDone(doneItem{p: p, r: r, err: err})
}

// runDone queues a callback for the done runner, starting it if needed; once the group is closed it
// runs the callback on the calling goroutine.
func (g *Group) runDone(it doneItem) {
	g.dmu.Lock()
	if g.dclosed {
		g.dmu.Unlock()
		it.run()
		return
	}
	g.dones = append(g.dones, it)
	start := !g.drunning
	if start {
		g.drunning = true
		g.dwg.Add(1)
	}
	g.dmu.Unlock()
	if start {
		go g.doneLoop()
	}
}

func (it *doneItem) run() {
	if it.fn != nil {
		it.fn()
		return
	}
	it.p.done(it.r, it.err)
}

// doneLoop runs the done callbacks in completion order and ends when none is left.
func (g *Group) doneLoop() {
	defer g.dwg.Done()
	var spare []doneItem
	for {
		g.dmu.Lock()
		items := g.dones
		if len(items) == 0 {
			g.dones = nil
			g.drunning = false
			g.dmu.Unlock()
			return
		}
		g.dones = spare[:0]
		g.dmu.Unlock()
		for i := range items {
			items[i].run()
			items[i] = doneItem{}
		}
		spare = items
	}
}

// leadership is told of this node's raft state for the group (by the node's observer): it reports
// every change to OnLeader, in order, and resubmits queued proposals.
func (g *Group) leadership(leader bool) {
	if leader {
		g.forced.Store(false)
	}
	g.emu.Lock()
	changed := leader != g.wasLeader
	g.wasLeader = leader
	if changed && g.cfg.OnLeader != nil {
		// Queued under emu so that the callbacks keep the order of the changes.
		g.runDone(doneItem{fn: func() { g.cfg.OnLeader(leader) }})
	}
	g.emu.Unlock()
	g.kickRetries()
}

// leaderObserved is told of a leader change the node's observer saw for the group.
func (g *Group) leaderObserved(leader string) {
	if g.cfg.OnLeaderChange == nil {
		return
	}
	g.emu.Lock()
	g.runDone(doneItem{fn: func() { g.cfg.OnLeaderChange(leader) }})
	g.emu.Unlock()
}

// closeDrainMax bounds how long Close waits for issued proposals to be answered.
const closeDrainMax = 5 * time.Second

// applyForwarded is raft.Apply for a proposal forwarded by another node: done gets the answered future
// from the group's local waiter. It refuses once the group is closing (false; done is not called).
func (g *Group) applyForwarded(cmd []byte, timeout time.Duration, done func(raft.ApplyFuture)) bool {
	g.submitMu.RLock()
	defer g.submitMu.RUnlock()
	if g.closed {
		return false
	}
	g.outstanding.Add(1)
	g.awaitLocal(localItem{fwd: done, f: g.raft.Apply(cmd, timeout)})
	return true
}

// Close stops the group and keeps its data (node shutdown).
func (g *Group) Close() error {
	g.closeOnce.Do(func() {
		g.submitMu.Lock()
		g.closed = true
		g.submitMu.Unlock()
		var errs []error
		if g.raft != nil {
			// Raft drops the proposals still in its apply buffer when it shuts down, without
			// answering them; let the running raft answer every proposal issued first.
			for deadline := time.Now().Add(closeDrainMax); g.outstanding.Load() > 0 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			if n := g.outstanding.Load(); n > 0 {
				g.n.log.Warn("closing a raft group with proposals still unanswered", "group", g.id, "proposals", n)
			}
			sf := g.raft.Shutdown()
			if g.gt != nil {
				g.gt.stopCalls() // raft's replication goroutines must not wait for peers' answers
			}
			if err := sf.Error(); err != nil {
				errs = append(errs, fmt.Errorf("cluster: group %d: shutdown: %w", g.id, err))
			}
			g.n.unwatch(g)
			g.emu.Lock()
			if g.kickTimer != nil {
				g.kickTimer.Stop()
			}
			g.emu.Unlock()
			close(g.stop)
			g.failRetries()
			g.n.cancelForwards(g)
			g.wg.Wait()
			g.dmu.Lock()
			g.dclosed = true
			g.dmu.Unlock()
			g.dwg.Wait()
		}
		g.closeTransport()
		g.n.mu.Lock()
		if g.n.groups[g.id] == g {
			delete(g.n.groups, g.id)
		}
		g.n.mu.Unlock()
		g.closeErr = errors.Join(errs...)
	})
	return g.closeErr
}

// Remove stops the group and deletes its raft log and snapshots (the queue was deleted).
func (g *Group) Remove() error {
	err := g.Close()
	if derr := g.store.Drop(); derr != nil {
		err = errors.Join(err, fmt.Errorf("cluster: group %d: remove: %w", g.id, derr))
	}
	if g.snapDir != "" {
		if rerr := os.RemoveAll(g.snapDir); rerr != nil {
			err = errors.Join(err, fmt.Errorf("cluster: group %d: remove snapshots: %w", g.id, rerr))
		}
	}
	return err
}

// fsmWrapper tracks the applied index and normalises Apply's result.
type fsmWrapper struct {
	g   *Group
	fsm raft.FSM
}

func normalise(v any) any {
	switch v.(type) {
	case nil, []byte, error:
		return v
	}
	return nil
}

// Apply implements raft.FSM.
func (w *fsmWrapper) Apply(l *raft.Log) any {
	res := normalise(w.fsm.Apply(l))
	w.g.setApplied(l.Index)
	return res
}

// Snapshot implements raft.FSM.
func (w *fsmWrapper) Snapshot() (raft.FSMSnapshot, error) { return w.fsm.Snapshot() }

// Restore implements raft.FSM.
func (w *fsmWrapper) Restore(rc io.ReadCloser) error {
	if err := w.fsm.Restore(rc); err != nil {
		return err
	}
	w.g.setApplied(w.g.restoreIndex.Load())
	return nil
}

// batchFSMWrapper is fsmWrapper for a raft.BatchingFSM.
type batchFSMWrapper struct {
	*fsmWrapper
	b raft.BatchingFSM
}

// ApplyBatch implements raft.BatchingFSM.
func (w *batchFSMWrapper) ApplyBatch(logs []*raft.Log) []any {
	res := w.b.ApplyBatch(logs)
	for i := range res {
		res[i] = normalise(res[i])
	}
	var last uint64
	for _, l := range logs {
		last = max(last, l.Index)
	}
	if last > 0 {
		w.g.setApplied(last)
	}
	return res
}

// snapStore records the index of the snapshot opened for a restore, so that the applied index follows.
type snapStore struct {
	raft.SnapshotStore
	g *Group
}

// Create implements raft.SnapshotStore. Snapshot files are written next to the store, outside badger:
// their bytes are charged to the store's disk-space accounting as they are written, so that a
// snapshot cannot take the room badger needs (storage/space.go); a snapshot that does not fit fails,
// and raft tries again later.
func (s *snapStore) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	sink, err := s.SnapshotStore.Create(version, index, term, configuration, configurationIndex, trans)
	if err != nil || s.g.snapDir == "" {
		return sink, err
	}
	return &chargedSink{SnapshotSink: sink, db: s.g.n.cfg.DB}, nil
}

// chargedSink charges what it writes with storage.DB.ReserveSpace.
type chargedSink struct {
	raft.SnapshotSink
	db *storage.DB
}

func (c *chargedSink) Write(p []byte) (int, error) {
	if err := c.db.ReserveSpace(int64(len(p))); err != nil {
		return 0, fmt.Errorf("raft snapshot: %w", err)
	}
	return c.SnapshotSink.Write(p)
}

// Open implements raft.SnapshotStore.
func (s *snapStore) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	m, rc, err := s.SnapshotStore.Open(id)
	if err == nil {
		s.g.restoreIndex.Store(m.Index)
	}
	return m, rc, err
}

// Snapshot takes a snapshot of the group now and truncates its log behind it (raft's
// TrailingLogs kept), as raft does by itself every SnapshotInterval once SnapshotThreshold
// entries were applied. Operators' tools and tests use it.
func (g *Group) Snapshot() error {
	if err := g.raft.Snapshot().Error(); err != nil {
		return fmt.Errorf("cluster: group %d: snapshot: %w", g.id, err)
	}
	return nil
}
