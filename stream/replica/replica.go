// Package replica replicates a stream log (stream.Log) across the nodes of a cluster: one leader
// writes chunks, the other replicas copy them byte for byte, and a record is committed (readable,
// confirmed) once a majority of the voting replicas have it fsynced.
//
// The design is osiris's and Kafka's (leader epochs), with a raft group (the Coordinator) for
// what must be agreed on: which node leads (the group's raft leader tries), the epoch numbers
// (a leader claims the next epoch through the group), named consumer offsets and retention. Chunks
// never go through raft: each replica writes a chunk once, with one fsync per batch.
//
// A new leader of epoch E:
//  1. claims E through the coordinator;
//  2. fences a majority of the voters: each promises, durably, to follow no leader of an older
//     epoch (a writing replica of an older epoch stops) and answers where its log ends (last
//     epoch of its history, end offset);
//  3. takes the most advanced of those logs (later last epoch first, then longer): every
//     committed chunk is in it, since a committed chunk is on a majority and any two majorities
//     meet; if another replica's log is ahead, it fetches the missing chunks from it first;
//  4. records "epoch E starts at offset X" in its epoch history and writes chunks of epoch E.
//
// A follower fetches from the leader. At the start of a fetch the leader compares its history
// with the follower's last epoch (as Kafka's OffsetForLeaderEpoch): a follower whose log ends
// with records the leader does not have truncates them (they were never committed) and asks
// again; a follower that misses records the leader no longer has (retention) starts over at the
// leader's first offset with the leader's deduplication table. The leader sends "epoch E starts
// at X" when the follower reaches X, so a follower's last epoch is E only once its log holds
// everything below X. The leader counts a follower's acknowledged end only when that follower's
// last epoch is E, and commits the offset a majority of voters (itself included) have durable:
// like raft's rule that a leader commits only entries of its own term, this keeps a chunk that
// an old leader replicated to a majority from being lost to a replica whose last epoch is later
// but whose log is shorter.
package replica

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"warren/stream"
)

// Coordinator is the stream's raft group as a replica uses it.
type Coordinator interface {
	// Propose replicates cmd; done runs once, from another goroutine, with what Apply answered on
	// the leader or an error if it could not be committed in time.
	Propose(cmd []byte, done func(resp []byte, err error))
	// Leader is the node id of the group's current leader ("" if unknown).
	Leader() string
}

// Transport opens connections to the replica of the same stream on another node.
type Transport interface {
	Dial(ctx context.Context, node string, kind byte) (net.Conn, error)
}

// Config describes a replica.
type Config struct {
	Log  *stream.Log // opened with Options.Replicated (a nil Coord: without)
	Self string      // this node's id
	// Voters are the nodes whose copies count towards a commit; Learners follow and never lead.
	Voters, Learners []string
	// Coord is the stream's coordination group; nil for a stream of one replica with no group.
	Coord     Coordinator
	Transport Transport
	Logger    *slog.Logger
	// WriterID names this node's publishes in the deduplication table (unique per node and
	// boot), so a publish retried on another leader is stored once.
	WriterID string
	// PublishTimeout bounds how long a publish waits for a leader (default 10 s).
	PublishTimeout time.Duration
	// ReadTimeout is how long either end of a fetch connection waits to hear from the other
	// before it drops the connection (default 10 s). The leader sends a heartbeat every third
	// of it when it has nothing new, and the follower answers each one.
	ReadTimeout time.Duration
}

// Errors of a replica.
var (
	// ErrClosed is returned once the replica is closed.
	ErrClosed = errors.New("replica: closed")
	// ErrNoLeader is the outcome of a publish that found no leader in time.
	ErrNoLeader = errors.New("replica: the stream has no leader (no majority of its replicas?)")
)

// Roles of a replica.
const (
	roleFollower = iota
	roleRecovering
	roleLeading
)

// Timing.
const (
	retryPause     = 100 * time.Millisecond
	fenceTimeout   = 3 * time.Second
	heartbeatEvery = time.Second
	readTimeout    = 10 * time.Second // Config.ReadTimeout's default
	fetchBytes     = 1 << 20
)

// ack is a follower's acknowledged position.
type ack struct {
	durable, lastEpoch uint64
}

// Replica is this node's replica of a stream.
type Replica struct {
	cfg    Config
	log    *stream.Log
	logger *slog.Logger
	fsm    fsmState

	mu         sync.Mutex
	closed     bool
	wantLead   bool // the coordinator says this node leads
	role       int
	epoch      uint64 // the epoch being led
	epochStart uint64
	acks       map[string]ack
	roleCh     chan struct{} // closed and replaced on every role change
	commitCh   chan struct{} // closed and replaced when the leader's commit moves
	kick       chan struct{} // capacity 1: wakes the manager
	conns      map[net.Conn]struct{}

	pub pipeline
	off offsetWriter

	stop chan struct{}
	wg   sync.WaitGroup
}

// New starts a replica: as a follower until the coordinator makes this node leader
// (LeaderChanged), or, without a coordinator, as the only replica.
func New(cfg Config) *Replica {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = 10 * time.Second
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = readTimeout
	}
	r := &Replica{
		cfg:      cfg,
		log:      cfg.Log,
		logger:   cfg.Logger,
		acks:     make(map[string]ack),
		roleCh:   make(chan struct{}),
		commitCh: make(chan struct{}),
		kick:     make(chan struct{}, 1),
		conns:    make(map[net.Conn]struct{}),
		stop:     make(chan struct{}),
	}
	r.pub.init(r)
	r.off.r = r
	if cfg.Coord == nil {
		r.role = roleLeading
		_, r.epoch = r.log.Writing()
		return r
	}
	r.wg.Add(2)
	go r.manage()
	go r.pub.run()
	return r
}

// Log is the replica's log.
func (r *Replica) Log() *stream.Log { return r.log }

// Voter reports whether this node's copy counts towards commits.
func (r *Replica) Voter() bool { return slices.Contains(r.cfg.Voters, r.cfg.Self) }

// Leading reports whether this replica is the stream's writer now.
func (r *Replica) Leading() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.role == roleLeading
}

// Role describes the replica for status output: "leader", "recovering" or "follower", and the
// epoch it leads.
func (r *Replica) Role() (string, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.role {
	case roleLeading:
		return "leader", r.epoch
	case roleRecovering:
		return "recovering", 0
	}
	return "follower", 0
}

// Acks returns the durable end acknowledged by each follower of this leader (nil if not leading).
func (r *Replica) Acks() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.role != roleLeading {
		return nil
	}
	out := make(map[string]uint64, len(r.acks))
	for n, a := range r.acks {
		out[n] = a.durable
	}
	return out
}

// LeaderChanged tells the replica whether this node now leads the stream's coordination group.
func (r *Replica) LeaderChanged(leader bool) {
	r.mu.Lock()
	r.wantLead = leader
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *Replica) setRole(role int, epoch uint64) {
	r.mu.Lock()
	r.role, r.epoch = role, epoch
	if role != roleLeading {
		clear(r.acks)
	}
	close(r.roleCh)
	r.roleCh = make(chan struct{})
	r.mu.Unlock()
	r.pub.wake()
}

// manage runs the replica's role: leading while the coordinator says so, following otherwise.
func (r *Replica) manage() {
	defer r.wg.Done()
	for {
		r.mu.Lock()
		lead, closed := r.wantLead, r.closed
		r.mu.Unlock()
		if closed {
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if lead {
				r.lead(ctx)
			} else {
				r.follow(ctx)
			}
		}()
		for changed := false; !changed; {
			select {
			case <-r.stop:
				changed = true
			case <-r.kick:
				r.mu.Lock()
				changed = r.wantLead != lead
				r.mu.Unlock()
			case <-done:
				// The role ended by itself (a failed recovery): start again after a pause.
				select {
				case <-time.After(retryPause):
				case <-r.stop:
				}
				changed = true
			}
		}
		cancel()
		<-done
	}
}

// follow fetches from the current leader until ctx ends.
func (r *Replica) follow(ctx context.Context) {
	r.setRole(roleFollower, 0)
	for ctx.Err() == nil {
		leader := r.cfg.Coord.Leader()
		if leader != "" && leader != r.cfg.Self {
			err := r.fetch(ctx, leader, 0, nil)
			if err != nil && ctx.Err() == nil {
				r.logger.Debug("stream fetch ended", "leader", leader, "err", err)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(retryPause):
		}
	}
}

// lead recovers the log as the leader of a new epoch, then leads until ctx ends.
func (r *Replica) lead(ctx context.Context) {
	r.setRole(roleRecovering, 0)
	epoch, err := r.claim(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.logger.Warn("stream leader: cannot claim an epoch", "err", err)
		}
		return
	}
	if err := r.recover(ctx, epoch); err != nil {
		if ctx.Err() == nil {
			r.logger.Warn("stream leader: recovery failed", "epoch", epoch, "err", err)
		}
		return
	}
	if err := r.log.StartWriting(epoch); err != nil {
		r.logger.Warn("stream leader: cannot start writing", "epoch", epoch, "err", err)
		return
	}
	start := r.log.Written()
	single := len(r.cfg.Voters) <= 1
	r.mu.Lock()
	r.epochStart = start
	r.mu.Unlock()
	r.log.SetDurableHook(func(uint64) { r.recompute() })
	r.setRole(roleLeading, epoch)
	if single {
		r.log.SetAutoCommit(true)
	} else {
		r.recompute()
	}
	r.logger.Info("stream leader", "epoch", epoch, "offset", start, "committed", r.log.Committed())
	select {
	case <-ctx.Done():
	case <-r.fencedCh(epoch):
	}
	r.setRole(roleFollower, 0) // publishes now wait for the next leader
	r.log.SetDurableHook(nil)
	r.log.SetAutoCommit(false)
	r.log.StopWriting()
	r.logger.Info("stream leader stepped down", "epoch", epoch)
}

// fencedCh returns a channel closed once the log is fenced above epoch (another leader started).
func (r *Replica) fencedCh(epoch uint64) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		for {
			r.mu.Lock()
			rc, role := r.roleCh, r.role
			r.mu.Unlock()
			if role != roleLeading || r.log.Fenced() > epoch {
				return
			}
			w, _ := r.log.Writing()
			if !w {
				return
			}
			select {
			case <-rc:
			case <-r.stop:
				return
			case <-time.After(heartbeatEvery):
			}
		}
	}()
	return ch
}

// claim takes the next epoch through the coordinator, retrying until ctx ends.
func (r *Replica) claim(ctx context.Context) (uint64, error) {
	for {
		type res struct {
			b   []byte
			err error
		}
		ch := make(chan res, 1)
		r.cfg.Coord.Propose(encodeClaim(r.cfg.Self), func(b []byte, err error) { ch <- res{b, err} })
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case x := <-ch:
			if x.err == nil && len(x.b) == 8 {
				return beU64(x.b), nil
			}
			if x.err == nil {
				x.err = errors.New("malformed claim answer")
			}
			r.logger.Debug("stream epoch claim failed; retrying", "err", x.err)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(retryPause):
		}
	}
}

func beU64(b []byte) uint64 {
	var v uint64
	for _, c := range b[:8] {
		v = v<<8 | uint64(c)
	}
	return v
}

// fenceReply is a voter's answer to a fence.
type fenceReply struct {
	node  string
	tail  stream.Tail
	fence uint64
	err   error
}

// recover fences a majority of the voters for epoch and brings this replica's log to the most
// advanced of theirs.
func (r *Replica) recover(ctx context.Context, epoch uint64) error {
	majority := len(r.cfg.Voters)/2 + 1
	for ctx.Err() == nil {
		replies := r.fenceRound(ctx, epoch)
		var ok []fenceReply
		for _, rep := range replies {
			if rep.err != nil {
				continue
			}
			if rep.fence > epoch {
				return fmt.Errorf("node %s follows epoch %d, later than %d", rep.node, rep.fence, epoch)
			}
			ok = append(ok, rep)
		}
		if len(ok) < majority {
			r.logger.Debug("stream leader: no majority fenced yet", "epoch", epoch, "answers", len(ok), "majority", majority)
			select {
			case <-ctx.Done():
			case <-time.After(retryPause):
			}
			continue
		}
		best := ok[0]
		for _, rep := range ok[1:] {
			if best.tail.Less(rep.tail) {
				best = rep
			}
		}
		self := r.log.Tail()
		if !self.Less(best.tail) {
			return nil
		}
		r.logger.Info("stream leader: fetching what a replica has beyond this one", "from", best.node,
			"epoch", epoch, "their_end", best.tail.Written, "their_epoch", best.tail.LastEpoch, "own_end", self.Written)
		target := best.tail
		if err := r.fetch(ctx, best.node, epoch, &target); err != nil {
			return fmt.Errorf("catch up from %s: %w", best.node, err)
		}
		if t := r.log.Tail(); t.Written != target.Written || t.LastEpoch != target.LastEpoch {
			return fmt.Errorf("catch up from %s ended at %+v, want %+v", best.node, t, target)
		}
		return nil
	}
	return ctx.Err()
}

// fenceRound asks every voter (this node directly) to fence epoch and collects the answers that
// arrive within fenceTimeout.
func (r *Replica) fenceRound(ctx context.Context, epoch uint64) []fenceReply {
	ctx, cancel := context.WithTimeout(ctx, fenceTimeout)
	defer cancel()
	ch := make(chan fenceReply, len(r.cfg.Voters))
	for _, v := range r.cfg.Voters {
		go func() {
			if v == r.cfg.Self {
				t, f, err := r.log.Fence(epoch)
				ch <- fenceReply{node: v, tail: t, fence: f, err: err}
				return
			}
			ch <- r.remoteFence(ctx, v, epoch)
		}()
	}
	out := make([]fenceReply, 0, len(r.cfg.Voters))
	for range r.cfg.Voters {
		out = append(out, <-ch)
	}
	return out
}

func (r *Replica) remoteFence(ctx context.Context, node string, epoch uint64) fenceReply {
	rep := fenceReply{node: node}
	c, err := r.cfg.Transport.Dial(ctx, node, KindFence)
	if err != nil {
		rep.err = err
		return rep
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	var e enc
	e.u64(epoch)
	if _, err := c.Write(appendFrame(nil, frFence, e.b)); err != nil {
		rep.err = err
		return rep
	}
	typ, body, err := readFrame(bufio.NewReader(c))
	if err != nil {
		rep.err = err
		return rep
	}
	if typ != frTail {
		rep.err = fmt.Errorf("%w: fence answered with frame %d", errFrame, typ)
		return rep
	}
	d := dec{b: body}
	rep.tail = stream.Tail{LastEpoch: d.u64(), Written: d.u64(), First: d.u64()}
	rep.fence = d.u64()
	rep.err = d.done()
	return rep
}

// recompute moves the leader's commit to what a majority of the voters have durable.
func (r *Replica) recompute() {
	r.mu.Lock()
	if r.role != roleLeading {
		r.mu.Unlock()
		return
	}
	majority := len(r.cfg.Voters)/2 + 1
	vals := make([]uint64, 0, len(r.cfg.Voters))
	for _, v := range r.cfg.Voters {
		if v == r.cfg.Self {
			vals = append(vals, r.log.Durable())
			continue
		}
		if a, ok := r.acks[v]; ok && a.lastEpoch == r.epoch {
			vals = append(vals, a.durable)
		}
	}
	if len(vals) < majority {
		r.mu.Unlock()
		return
	}
	slices.Sort(vals)
	c := vals[len(vals)-majority]
	start := r.epochStart
	r.mu.Unlock()
	if c < start {
		return
	}
	before := r.log.Committed()
	r.log.SetCommitted(c)
	if c > before {
		r.mu.Lock()
		close(r.commitCh)
		r.commitCh = make(chan struct{})
		r.mu.Unlock()
	}
}

// Close stops the replica's goroutines and connections, and closes its log (keeping its data).
// Publishes still waiting fail with ErrClosed.
func (r *Replica) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	conns := make([]net.Conn, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	r.mu.Unlock()
	close(r.stop)
	for _, c := range conns {
		_ = c.Close()
	}
	r.wg.Wait()
	r.pub.close()
	r.log.Close()
}

// Delete closes the replica and deletes its log's data.
func (r *Replica) Delete() error {
	r.Close()
	return r.log.Delete()
}

// track registers a connection to close at Close; false if the replica is closed.
func (r *Replica) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Replica) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}
