package cluster

import (
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

// localQueueLen bounds the proposals applied on this node (as leader) whose futures are being awaited.
const localQueueLen = 4096

// GroupConfig configures one raft group.
type GroupConfig struct {
	ID        uint64   // 0 = metadata group; others chosen by the caller, unique in the cluster
	Name      string   // human label shown in status, e.g. "metadata" or "queue 'q' in vhost '/'"
	FSM       raft.FSM // Apply returns nil, []byte or error (anything else is treated as nil)
	Voters    []string // node ids; used only when bootstrapping (no existing state for this group on this node)
	Nonvoters []string // idem (hashicorp Nonvoter suffrage)
	// Bootstrap bootstraps with Voters+Nonvoters if this node has no state for the group (every member may do
	// so with the identical configuration).
	Bootstrap bool
	// OnLeader, if set, is called on every leadership change of THIS node for this group, from the group's
	// event goroutine (raft waits for it: keep it short).
	OnLeader func(isLeader bool)
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

// Group is one running raft group on this node.
type Group struct {
	n       *Node
	id      uint64
	name    string
	cfg     GroupConfig
	raft    *raft.Raft
	store   *raftstore.Store
	trans   raft.Transport
	sl      *streamLayer // nil on the in-memory transport
	snapDir string       // "" with in-memory snapshots

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
	localQ      chan localItem

	rmu      sync.Mutex
	retries  []*proposal
	rclosed  bool
	draining bool          // the retry loop is resubmitting the head of retries
	retryKey chan struct{} // capacity 1: wakes the retry loop

	dmu     sync.Mutex
	dones   []doneItem
	dclosed bool
	dwake   chan struct{} // capacity 1
	dstop   chan struct{}

	notifyCh chan bool
	obsCh    chan raft.Observation
	observer *raft.Observer

	stop      chan struct{}
	wg        sync.WaitGroup // event, retry and local-waiter goroutines
	dwg       sync.WaitGroup // done goroutine
	closeOnce sync.Once
	closeErr  error
}

type localItem struct {
	p     *proposal
	f     raft.ApplyFuture
	start time.Time // when it was handed to raft, for the commit latency
}

type doneItem struct {
	p   *proposal
	r   Result
	err error
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
	g, err := n.newGroup(cfg)
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
	g.forceFirstElection()
	return g, nil
}

func (n *Node) newGroup(cfg GroupConfig) (*Group, error) {
	g := &Group{
		n:        n,
		id:       cfg.ID,
		name:     cfg.Name,
		cfg:      cfg,
		localQ:   make(chan localItem, localQueueLen),
		retryKey: make(chan struct{}, 1),
		dwake:    make(chan struct{}, 1),
		dstop:    make(chan struct{}),
		notifyCh: make(chan bool, 8),
		obsCh:    make(chan raft.Observation, 8),
		stop:     make(chan struct{}),
	}
	hl := newHclog(n.log.With("group", cfg.ID), "raft")

	store, err := raftstore.New(n.cfg.DB, cfg.ID)
	if err != nil {
		return nil, err
	}
	g.store = store
	logs, err := raft.NewLogCache(logCacheSize, store)
	if err != nil {
		return nil, fmt.Errorf("log cache: %w", err)
	}

	var snaps raft.SnapshotStore
	if n.cfg.DataDir == "" {
		snaps = raft.NewInmemSnapshotStore()
	} else {
		g.snapDir = filepath.Join(n.cfg.DataDir, "raft", strconv.FormatUint(cfg.ID, 10))
		fss, err := raft.NewFileSnapshotStoreWithLogger(g.snapDir, snapshotsRetained, hl)
		if err != nil {
			return nil, fmt.Errorf("snapshot store: %w", err)
		}
		snaps = fss
	}
	snaps = &snapStore{SnapshotStore: snaps, g: g}

	if n.single() {
		_, g.trans = raft.NewInmemTransport(raft.ServerAddress(n.selfAddr()))
	} else {
		g.sl = newStreamLayer(n, cfg.ID)
		g.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream:  g.sl,
			MaxPool: transportMaxPool,
			Timeout: transportTimeout,
			Logger:  hl,
		})
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
	rc.NotifyCh = g.notifyCh
	rc.Logger = hl

	fail := func(err error) (*Group, error) {
		g.closeTransport()
		return nil, err
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
			if err := raft.BootstrapCluster(rc, logs, store, snaps, g.trans, conf); err != nil {
				return fail(fmt.Errorf("bootstrap: %w", err))
			}
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
	g.observer = raft.NewObserver(g.obsCh, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	r.RegisterObserver(g.observer)

	g.wg.Add(3)
	go g.eventLoop()
	go g.retryLoop()
	go g.localWaiter()
	g.dwg.Add(1)
	go g.doneLoop()
	return g, nil
}

// forceFirstElection makes a group whose only voter is this node elect itself at once instead of after a
// heartbeat timeout: lowering the heartbeat timeout wakes raft's follower loop, which, having never heard of
// a leader, starts an election; the timeout is then restored.
func (g *Group) forceFirstElection() {
	conf, err := g.configuration()
	if err != nil {
		return
	}
	voters := 0
	self := false
	for _, s := range conf.Servers {
		if s.Suffrage == raft.Voter {
			voters++
			self = self || s.ID == raft.ServerID(g.n.cfg.NodeID)
		}
	}
	if voters != 1 || !self {
		return
	}
	orig := g.raft.ReloadableConfig()
	fast := orig
	fast.HeartbeatTimeout = orig.HeartbeatTimeout - time.Millisecond
	if err := g.raft.ReloadConfig(fast); err != nil {
		return
	}
	_ = g.raft.ReloadConfig(orig)
}

func (g *Group) closeTransport() {
	if nt, ok := g.trans.(*raft.NetworkTransport); ok {
		nt.CloseStreams()
		_ = nt.Close()
	}
	if g.sl != nil {
		_ = g.sl.Close()
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

// submitNew submits a new proposal, behind the queued retries so that one proposer's commands keep their
// order while the leader is unknown.
func (g *Group) submitNew(p *proposal) {
	g.rmu.Lock()
	if (len(g.retries) > 0 || g.draining) && !g.rclosed {
		g.retries = append(g.retries, p)
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
		g.localQ <- localItem{p: p, f: f, start: time.Now()}
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

// localWaiter awaits, in log order, the futures of proposals applied on this node as leader.
func (g *Group) localWaiter() {
	defer g.wg.Done()
	for it := range g.localQ {
		err := it.f.Error()
		g.outstanding.Add(-1)
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
	g.rmu.Unlock()
	if first {
		g.wakeRetries()
	}
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
		if head == nil {
			g.draining = false
			if len(g.retries) == 0 {
				g.retries = nil
			}
		}
		g.rmu.Unlock()
		for _, p := range expired {
			g.finish(p, Result{}, g.noLeaderErr(p))
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
			rest := g.retries
			g.retries = nil
			g.rclosed = true
			g.rmu.Unlock()
			for _, p := range rest {
				g.finish(p, Result{}, fmt.Errorf("cluster: group %d (%s): propose: %w", g.id, g.name, ErrClosed))
			}
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

// leaderKnown reports whether a proposal can be sent: this node leads or knows another leader.
func (g *Group) leaderKnown() bool {
	if g.raft.State() == raft.Leader {
		return true
	}
	_, id := g.raft.LeaderWithID()
	return id != "" && string(id) != g.n.cfg.NodeID && !g.n.single()
}

// finish completes p exactly once; done runs on the group's done goroutine.
func (g *Group) finish(p *proposal, r Result, err error) {
	if p.finished.Swap(true) {
		return
	}
	g.dmu.Lock()
	if g.dclosed {
		g.dmu.Unlock()
		p.done(r, err)
		return
	}
	first := len(g.dones) == 0
	g.dones = append(g.dones, doneItem{p: p, r: r, err: err})
	g.dmu.Unlock()
	if first {
		select {
		case g.dwake <- struct{}{}:
		default:
		}
	}
}

// doneLoop runs the done callbacks in completion order.
func (g *Group) doneLoop() {
	defer g.dwg.Done()
	var spare []doneItem
	for {
		stopping := false
		select {
		case <-g.dwake:
		case <-g.dstop:
			stopping = true
		}
		g.dmu.Lock()
		items := g.dones
		g.dones = spare[:0]
		g.dmu.Unlock()
		for i := range items {
			items[i].p.done(items[i].r, items[i].err)
			items[i] = doneItem{}
		}
		spare = items
		if stopping {
			return
		}
	}
}

// eventLoop consumes leadership notifications and leader observations.
func (g *Group) eventLoop() {
	defer g.wg.Done()
	for {
		select {
		case isLeader := <-g.notifyCh:
			if g.cfg.OnLeader != nil {
				g.cfg.OnLeader(isLeader)
			}
			g.kickRetries()
		case <-g.obsCh:
			g.kickRetries()
		case <-g.stop:
			return
		}
	}
}

// closeDrainMax bounds how long Close waits for issued proposals to be answered.
const closeDrainMax = 5 * time.Second

// applyTracked is raft.Apply for proposals whose future someone waits for: it refuses once the group
// is closing (ok false) and counts the future in outstanding; the waiter decrements it once the
// future is answered.
func (g *Group) applyTracked(cmd []byte, timeout time.Duration) (f raft.ApplyFuture, ok bool) {
	g.submitMu.RLock()
	defer g.submitMu.RUnlock()
	if g.closed {
		return nil, false
	}
	g.outstanding.Add(1)
	return g.raft.Apply(cmd, timeout), true
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
			if err := g.raft.Shutdown().Error(); err != nil {
				errs = append(errs, fmt.Errorf("cluster: group %d: shutdown: %w", g.id, err))
			}
			g.raft.DeregisterObserver(g.observer)
			close(g.stop)
			close(g.localQ)
			g.n.cancelForwards(g)
			g.wg.Wait()
			g.dmu.Lock()
			g.dclosed = true
			g.dmu.Unlock()
			close(g.dstop)
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
