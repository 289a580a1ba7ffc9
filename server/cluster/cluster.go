// Package cluster manages Warren's raft groups on hashicorp/raft: one metadata group (id 0) and one group
// per quorum queue, all carried by ONE cluster TCP port per node.
//
// Every connection to the cluster port starts with a tag byte (mesh, snapshot, forward, ping, admin), a
// flags byte and the cluster fingerprint (a hash of the sorted initial peer list). Mesh connections carry
// the raft RPCs of every group between two nodes (mesh.go: two lanes per peer and direction, heartbeats
// coalesced or answered from the follower's latest answer, idle appends elided); snapshot connections
// stream one InstallSnapshot; forward connections carry pipelined proposals from followers to leaders
// (one connection per peer, request ids); ping connections carry a hello with the fingerprint and then
// liveness pings; admin connections carry one JSON request.
//
// Without a listen address the node is a one-node cluster on the same code path: every group has a single
// voter on an in-memory transport.
//
// Timings: raft heartbeat and election timeouts are 24 s (leader heartbeats every 2.4-4.8 s, of which
// one every 8-12.8 s is sent while the follower's node answers pings), leader lease 6 s. A dead leader's
// node is found by the node-level pings (suspectAfter) and its groups elect within about 2 s, forced by
// nodes that see a majority of the group's voters; raft's own timeout is the fallback. A group whose only voter is this node, or a new group of which this node is
// the first voter, starts its first election at once, so it has a leader within a round trip of
// StartGroup.
// Snapshots: SnapshotThreshold 8192, TrailingLogs 4096, checked every 30 s, 2 retained.
// Liveness: every PingInterval, a member that answered no ping for PeerDownAfter is down.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"warren/storage"
)

// Liveness timing.
const (
	// PingInterval is how often each member is pinged.
	PingInterval = 500 * time.Millisecond
	// PeerDownAfter is how long a member may go without answering a ping before it is reported down.
	PeerDownAfter = 3 * time.Second
	// suspectAfter is how long a member may go without answering a ping before the groups it leads are
	// made to elect another leader (failover.go). It is shorter than PeerDownAfter: a wrong suspicion
	// costs a leader change, a wrong "down" costs consumers.
	suspectAfter = 1500 * time.Millisecond
)

// Raft timing and log retention (see the package documentation).
const (
	// Raft's own failure detection is slow on purpose: a leader heartbeats each follower every
	// heartbeatTimeout/10..heartbeatTimeout/5, and an idle cluster's cost is mostly those heartbeats.
	// A dead leader's node is detected by the node-level pings instead (suspectAfter, failover.go);
	// raft's timeout only catches a group that lost its leader while the leader's node lives, and a
	// group recovered at start does not wait for it either (recoveredGrace). 12 s (lease kept at 3 s)
	// cut the idle CPU at 300 quorum queues from 16.8% to 12.6% of one core against 6 s; 24 s with a
	// 6 s lease (and hbLocalFor 6 s; 8 s since, see transport.go) took it from 10.0-12.2% to 7.2% (3 alternated runs each). Longer
	// timeouts had made a node cut off by a degraded link catch up only after 28-40 s (30 s: 2 of 4
	// partition tests; 24 s: 3 of 5): the cut-off node forced elections on itself (failover.go) and
	// its raised term deposed the majority's leader at the heal, which then waited for this timeout.
	// With that fixed, 6 of 6 partition tests caught up 0.4-2.8 s after the heals. The lease bounds
	// how long a leader cut off from its majority believes it leads; it commits nothing meanwhile.
	heartbeatTimeout   = 24 * time.Second
	electionTimeout    = 24 * time.Second
	leaderLeaseTimeout = 6 * time.Second
	// commitTimeout is hashicorp's idle-append period; the transport pushes commit indexes itself
	// (groupTransport.committed), so this is only the fallback and is long: idle groups then cost
	// almost nothing.
	commitTimeout     = 5 * time.Second
	maxAppendEntries  = 256
	snapshotThreshold = 8192
	trailingLogs      = 4096
	snapshotInterval  = 30 * time.Second
	snapshotsRetained = 2
	transportTimeout  = 10 * time.Second
	logCacheSize      = 512
)

// ErrNoLeader is returned when no leader was reachable before the deadline.
var ErrNoLeader = errors.New("no raft leader reachable")

// ErrClosed is returned for operations on a closed node or group.
var ErrClosed = errors.New("cluster: closed")

// Config configures a Node.
type Config struct {
	NodeID string            // this node's id (required; e.g. "n1")
	Listen string            // cluster listen address ("127.0.0.1:0" allowed); "" = single-node, no listener
	Peers  map[string]string // initial members id -> cluster address, INCLUDING this node; empty/nil = just this node
	Join   bool              // do not bootstrap the metadata group; wait to be added by `add` from a member
	DB     *storage.DB       // the node's shared badger DB (raft logs live here through raftstore)
	// DataDir holds snapshots under DataDir/raft/<group id>/; "" = in-memory snapshot stores (tests only: a
	// group restarted on a DB whose log was truncated after a snapshot cannot recover without DataDir).
	DataDir string
	Logger  *slog.Logger // nil = slog.Default(); raft's hclog output goes here
	// OnPeerChange, if set, is called (from a cluster goroutine, never concurrently for the same peer) when a
	// member is detected down (no successful ping for PeerDownAfter) or up again.
	OnPeerChange func(id string, up bool)
	// CountConnections, if set, reports this node's client connections to a vhost, for peers
	// that check a cluster-wide connection limit (CountPeerConnections).
	CountConnections func(vhost string) int

	// listener, if set (tests), is used instead of listening on Listen.
	listener net.Listener
}

// Member is one member of the cluster: a server of the metadata group's configuration.
type Member struct {
	ID    string `json:"id"`
	Addr  string `json:"addr"`
	Voter bool   `json:"voter"`
	Up    bool   `json:"up"`
}

// Node is this process's cluster membership: the cluster listener, the raft groups and liveness.
type Node struct {
	cfg       Config
	log       *slog.Logger
	fp        uint64
	peersText string
	ln        net.Listener
	addr      string    // actual listen address, "" in single-node mode
	started   time.Time // this process's start: its incarnation in pings (ping.go hello)

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	startMu  sync.Mutex // serialises StartGroup
	mu       sync.Mutex
	closed   bool
	groups   map[uint64]*Group
	conns    map[net.Conn]struct{} // accepted non-raft connections, closed by Close
	fwd      map[string]*fwdClient // by peer address
	errTimes map[string]time.Time  // rate limit of fingerprint error logs, by peer
	services map[byte]ServiceHandler

	live liveness
	// deferred are elections that wait for their time or for their voters to answer pings (under
	// mu; group.go runDeferredElections).
	deferred []deferredElection

	mesh *mesh // the groups' raft transport; nil in single-node mode

	// One raft observer for all groups (events.go); byRaft finds a group by its raft (under mu).
	obsCh    chan raft.Observation
	observer *raft.Observer
	byRaft   map[*raft.Raft]*Group
	evStop   chan struct{} // closed once every group is closed
	evwg     sync.WaitGroup

	wg sync.WaitGroup
}

// Start starts the node: it listens on Listen (unless single-node) and starts the liveness pings. It does
// not start any group.
func Start(cfg Config) (*Node, error) {
	if cfg.NodeID == "" {
		return nil, errors.New("cluster: start: empty node id")
	}
	if cfg.DB == nil {
		return nil, fmt.Errorf("cluster: start node %s: nil storage DB", cfg.NodeID)
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.Default()
	}
	n := &Node{
		cfg:      cfg,
		started:  time.Now(),
		log:      lg.With("node", cfg.NodeID),
		groups:   make(map[uint64]*Group),
		conns:    make(map[net.Conn]struct{}),
		fwd:      make(map[string]*fwdClient),
		errTimes: make(map[string]time.Time),
		obsCh:    make(chan raft.Observation, obsBuffer),
		byRaft:   make(map[*raft.Raft]*Group),
		evStop:   make(chan struct{}),
	}
	n.observer = newObserver(n.obsCh)
	n.fp, n.peersText = fingerprint(cfg.Peers)
	n.live.init()
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if cfg.listener != nil || cfg.Listen != "" {
		ln := cfg.listener
		if ln == nil {
			var err error
			ln, err = net.Listen("tcp", cfg.Listen)
			if err != nil {
				n.cancel()
				return nil, fmt.Errorf("cluster: start node %s: listen: %w", cfg.NodeID, err)
			}
		}
		n.ln = ln
		n.addr = ln.Addr().String()
		n.mesh = newMesh(n)
		n.wg.Add(2)
		go n.acceptLoop()
		go n.pingLoop()
	} else if len(cfg.Peers) > 1 {
		n.cancel()
		return nil, fmt.Errorf("cluster: start node %s: %d peers but no listen address", cfg.NodeID, len(cfg.Peers))
	}
	n.evwg.Add(1)
	go n.eventLoop()
	n.log.Debug("cluster node started", "addr", n.addr, "peers", n.peersText)
	return n, nil
}

// ID returns this node's id.
func (n *Node) ID() string { return n.cfg.NodeID }

// Addr returns the actual cluster listen address ("" in single-node mode).
func (n *Node) Addr() string { return n.addr }

// selfAddr is this node's raft ServerAddress: the listen address, or the node id on the in-memory transport.
func (n *Node) selfAddr() string {
	if n.ln == nil {
		return n.cfg.NodeID
	}
	return n.addr
}

// single reports single-node mode (no listener).
func (n *Node) single() bool { return n.ln == nil }

// Group returns the running group id, nil if it is not running.
func (n *Node) Group(id uint64) *Group {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.groups[id]
}

// Members returns the current members: the metadata group's latest configuration (the initial Peers before it
// exists), sorted by ID.
func (n *Node) Members() []Member {
	var out []Member
	if g := n.Group(0); g != nil {
		if conf, err := g.configuration(); err == nil && len(conf.Servers) > 0 {
			for _, s := range conf.Servers {
				out = append(out, Member{ID: string(s.ID), Addr: string(s.Address), Voter: s.Suffrage == raft.Voter})
			}
		}
	}
	if out == nil {
		for id, addr := range n.initialPeers() {
			out = append(out, Member{ID: id, Addr: addr, Voter: true})
		}
	}
	for i := range out {
		out[i].Up = n.PeerUp(out[i].ID)
	}
	slices.SortFunc(out, func(a, b Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// initialPeers returns Config.Peers with this node's actual address (it is added when missing).
func (n *Node) initialPeers() map[string]string {
	m := make(map[string]string, len(n.cfg.Peers)+1)
	for id, addr := range n.cfg.Peers {
		m[id] = addr
	}
	if _, ok := m[n.cfg.NodeID]; !ok || n.single() {
		m[n.cfg.NodeID] = n.selfAddr()
	}
	return m
}

// addrOf returns the cluster address of node id: from the metadata group's configuration, else Config.Peers.
func (n *Node) addrOf(id string) (string, bool) {
	if id == n.cfg.NodeID {
		return n.selfAddr(), true
	}
	if g := n.Group(0); g != nil {
		if conf, err := g.configuration(); err == nil {
			for _, s := range conf.Servers {
				if string(s.ID) == id {
					return string(s.Address), true
				}
			}
		}
	}
	addr, ok := n.cfg.Peers[id]
	return addr, ok
}

// PeerUp reports liveness of member id from pings; always true for this node.
func (n *Node) PeerUp(id string) bool {
	if id == n.cfg.NodeID {
		return true
	}
	return n.live.up(id)
}

// Close stops every group (keeping their data), the listener and all goroutines.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	conns := make([]net.Conn, 0, len(n.conns))
	for c := range n.conns {
		conns = append(conns, c)
	}
	groups := make([]*Group, 0, len(n.groups))
	for _, g := range n.groups {
		groups = append(groups, g)
	}
	clients := make([]*fwdClient, 0, len(n.fwd))
	for _, c := range n.fwd {
		clients = append(clients, c)
	}
	n.mu.Unlock()

	n.cancel()
	var errs []error
	if n.ln != nil {
		if err := n.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("cluster: close listener: %w", err))
		}
	}
	for _, c := range conns {
		_ = c.Close()
	}
	for _, g := range groups {
		if err := g.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, c := range clients {
		c.close()
	}
	if n.mesh != nil {
		n.mesh.close()
	}
	close(n.evStop)
	n.evwg.Wait()
	n.wg.Wait()
	return errors.Join(errs...)
}

// trackConn registers an accepted connection to be closed by Close; false if the node is closing.
func (n *Node) trackConn(c net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.conns[c] = struct{}{}
	return true
}

func (n *Node) untrackConn(c net.Conn) {
	n.mu.Lock()
	delete(n.conns, c)
	n.mu.Unlock()
}

// goTracked runs f in a goroutine owned by the node, unless the node is closing.
func (n *Node) goTracked(f func()) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		f()
	}()
	return true
}
