package cluster

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// groupTransport is one group's raft.Transport on the node's mesh. Inbound RPCs are queued per
// group and fed to raft by a goroutine that exists only while the queue is not empty; heartbeats
// go straight to raft's heartbeat handler.
type groupTransport struct {
	m     *mesh
	gid   uint64
	epoch uint64 // random per instance: tells a peer that this group restarted (see peerLink)

	consumer chan raft.RPC
	hbFn     atomic.Pointer[func(raft.RPC)]
	// term is the term of this group's latest answer: a heartbeat of that term cannot make raft
	// write its term to disk, so it is handled inline on the connection's reader.
	term atomic.Uint64

	shutdown  chan struct{}
	closeOnce sync.Once

	// leader, set once raft runs, reports raft's current term and whether this node leads the group.
	leader atomic.Pointer[func() (term uint64, ok bool)]

	mu      sync.Mutex
	closed  bool
	inq     []inReq
	pumping bool
	links   map[raft.ServerAddress]*peerLink
	// Commit push (see committed): the highest applied index to push, and whether a push is due.
	pushIndex uint64
	pushTimer *time.Timer
	pushDue   bool
	wg        sync.WaitGroup // pumps, asynchronous heartbeats
}

var (
	_ raft.Transport   = (*groupTransport)(nil)
	_ raft.WithPreVote = (*groupTransport)(nil)
	_ raft.WithClose   = (*groupTransport)(nil)
)

// newTransport creates and registers group gid's transport.
func (m *mesh) newTransport(gid uint64) (*groupTransport, error) {
	t := &groupTransport{
		m:        m,
		gid:      gid,
		epoch:    rand.Uint64() | 1,
		consumer: make(chan raft.RPC),
		shutdown: make(chan struct{}),
		links:    make(map[raft.ServerAddress]*peerLink),
	}
	if err := m.register(t); err != nil {
		return nil, err
	}
	return t, nil
}

// Consumer implements raft.Transport.
func (t *groupTransport) Consumer() <-chan raft.RPC { return t.consumer }

// LocalAddr implements raft.Transport.
func (t *groupTransport) LocalAddr() raft.ServerAddress { return raft.ServerAddress(t.m.n.addr) }

// EncodePeer implements raft.Transport.
func (t *groupTransport) EncodePeer(_ raft.ServerID, addr raft.ServerAddress) []byte {
	return []byte(addr)
}

// DecodePeer implements raft.Transport.
func (t *groupTransport) DecodePeer(b []byte) raft.ServerAddress { return raft.ServerAddress(b) }

// SetHeartbeatHandler implements raft.Transport.
func (t *groupTransport) SetHeartbeatHandler(cb func(raft.RPC)) {
	if cb == nil {
		t.hbFn.Store(nil)
		return
	}
	t.hbFn.Store(&cb)
}

// stopCalls makes every call of this transport fail at once and new ones fail (raft is shutting
// down: its goroutines must not wait for peers).
func (t *groupTransport) stopCalls() {
	t.closeOnce.Do(func() { close(t.shutdown) })
}

// Close implements raft.WithClose: raft calls it once its goroutines have ended.
func (t *groupTransport) Close() error {
	t.stopCalls()
	t.m.unregister(t)
	t.mu.Lock()
	t.closed = true
	if t.pushTimer != nil {
		t.pushTimer.Stop()
	}
	q := t.inq
	t.inq = nil
	t.mu.Unlock()
	for _, r := range q {
		r.fail(raft.ErrTransportShutdown)
	}
	t.wg.Wait()
	return nil
}

func (t *groupTransport) isShut() bool {
	select {
	case <-t.shutdown:
		return true
	default:
		return false
	}
}

// link returns the state of this group's replication to target.
func (t *groupTransport) link(target raft.ServerAddress) *peerLink {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.links[target]
	if l == nil {
		l = &peerLink{}
		t.links[target] = l
	}
	return l
}

// unary sends a one-off RPC on lane and waits for its answer into resp.
func (t *groupTransport) unary(target raft.ServerAddress, lane, kind byte, resp any, req *raft.AppendEntriesRequest,
	size int, body func([]byte) []byte) error {
	if t.isShut() {
		return raft.ErrTransportShutdown
	}
	oc, err := t.m.out(string(target), lane)
	if err != nil {
		return err
	}
	c := &call{t: t, kind: kind, resp: resp, req: req, done: make(chan error, 1),
		deadline: time.Now().Add(rpcCallTimeout)}
	if req != nil {
		c.link = t.link(target)
		c.link.sent(req)
	}
	if !oc.register(c) {
		return oc.deadErr()
	}
	return oc.roundTrip(c, requestFrame(kind, c.id, t.gid, size, body))
}

// AppendEntries implements raft.Transport. Heartbeats are coalesced per peer (see mesh).
func (t *groupTransport) AppendEntries(_ raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest,
	resp *raft.AppendEntriesResponse) error {
	if isHeartbeat(args) {
		return t.heartbeat(target, args, resp)
	}
	// An elided append counts as contact for raft's lease too: only while the follower's node
	// answers pings, as for local heartbeat answers (hbPeerFresh).
	if since, ok := t.m.n.live.answeredSince(string(target), hbPeerFresh); ok && t.link(target).elide(args, resp, since) {
		t.m.stats.appendsElided.Add(1)
		return nil
	}
	t.m.stats.appendsSent.Add(1)
	return t.unary(target, laneData, kindAppend, resp, args, maxAppendReqLen(args),
		func(b []byte) []byte { return appendAppendReq(b, args) })
}

// heartbeat sends raft's heartbeat to target in the peer's next batch, or answers it here with the
// follower's own latest answer (peerLink.answerHeartbeat) while that is younger than hbLocalFor and
// the follower's node answered a ping within hbPeerFresh, on the ping connection it had then.
func (t *groupTransport) heartbeat(target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if t.isShut() {
		return raft.ErrTransportShutdown
	}
	l := t.link(target)
	if since, ok := t.m.n.live.answeredSince(string(target), hbPeerFresh); ok && l.answerHeartbeat(args.Term, resp, since) {
		t.m.stats.hbLocal.Add(1)
		return nil
	}
	oc, err := t.m.out(string(target), laneControl)
	if err != nil {
		return err
	}
	hdr := args.RPCHeader
	if len(hdr.Addr) == 0 {
		hdr.Addr = args.Leader
	}
	c := &call{t: t, kind: kindHeartbeats, link: l, hbTerm: args.Term, hdr: hdr, resp: resp,
		done: make(chan error, 1), deadline: time.Now().Add(hbCallTimeout)}
	return oc.heartbeat(c)
}

// RequestVote implements raft.Transport.
func (t *groupTransport) RequestVote(_ raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest,
	resp *raft.RequestVoteResponse) error {
	return t.unary(target, laneControl, kindVote, resp, nil, 64+len(args.ID)+len(args.Addr)+len(args.Candidate),
		func(b []byte) []byte { return appendVoteReq(b, args) })
}

// RequestPreVote implements raft.WithPreVote.
func (t *groupTransport) RequestPreVote(_ raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest,
	resp *raft.RequestPreVoteResponse) error {
	return t.unary(target, laneControl, kindPreVote, resp, nil, 64+len(args.ID)+len(args.Addr),
		func(b []byte) []byte { return appendPreVoteReq(b, args) })
}

// TimeoutNow implements raft.Transport.
func (t *groupTransport) TimeoutNow(_ raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest,
	resp *raft.TimeoutNowResponse) error {
	return t.unary(target, laneControl, kindTimeoutNow, resp, nil, 32+len(args.ID)+len(args.Addr),
		func(b []byte) []byte { return appendTimeoutNowReq(b, args) })
}

// callDone completes call c: epoch is the answering transport's, err the failure (nil: c.resp is
// filled).
func (t *groupTransport) callDone(c *call, epoch uint64, err error) {
	switch {
	case c.kind == kindHeartbeats:
		c.link.heartbeat(c.hbTerm, nil, 0) // answers come through heartbeatAnswered: this is a failure
	case c.push:
		// A commit push (not raft's): its answer only tells the link what the follower knows.
		var r *raft.AppendEntriesResponse
		if err == nil {
			r, _ = c.resp.(*raft.AppendEntriesResponse)
		}
		c.link.pushed(c.req, r, epoch)
	case c.link != nil && c.req != nil:
		var r *raft.AppendEntriesResponse
		if err == nil {
			r, _ = c.resp.(*raft.AppendEntriesResponse)
		}
		if c.link.appended(c.req, r, epoch) < t.pushedIndex() {
			// A commit was pushed while this follower had not acknowledged its entry yet (the
			// majority was the others): push it again now that it has, or it would wait for the
			// next append or CommitTimeout.
			t.repush()
		}
	}
	if c.onDone != nil {
		c.onDone(err)
		return
	}
	if err == nil && c.kind == kindHeartbeats {
		err = errors.New("cluster: heartbeat answered out of its batch")
	}
	c.done <- err
}

// heartbeatAnswered completes heartbeat call c with its answer.
func (t *groupTransport) heartbeatAnswered(c *call, a *hbAnswer) {
	if a.err != "" {
		c.link.heartbeat(c.hbTerm, nil, 0)
		c.done <- fmt.Errorf("heartbeat to group %d: %s", t.gid, a.err)
		return
	}
	*c.resp.(*raft.AppendEntriesResponse) = a.resp
	c.link.heartbeat(c.hbTerm, &a.resp, a.epoch)
	c.done <- nil
}

// pushDelay is how long a commit push waits for raft's own replication to carry the new commit index
// (under load an append goes out at once and the push is not needed).
const pushDelay = 2 * time.Millisecond

// committed is told (on the leader) that the FSM applied index c, which is therefore committed.
//
// hashicorp/raft tells followers a new commit index only with the next AppendEntries: new entries,
// or the empty append its replication loop sends every CommitTimeout. A follower's FSM (and with it a
// quorum queue's consumers on that node, and a declaration waiting on a follower) would lag by up to
// twice CommitTimeout, and a short CommitTimeout costs every idle group a wake-up per follower every
// few tens of milliseconds. So the transport pushes the commit index itself, pushDelay after an apply
// that no append carried: it sends each follower the empty append raft's loop would send (this term,
// the follower's acknowledged last entry as the previous one), with the commit index capped at that
// entry. The push is only sent while this node leads in the term of the follower's acknowledgement;
// see docs/architecture.md for why a late one is harmless. CommitTimeout is then only the fallback.
func (t *groupTransport) committed(c uint64) {
	if lf := t.leader.Load(); lf == nil {
		return
	} else if _, ok := (*lf)(); !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || c <= t.pushIndex {
		return
	}
	t.pushIndex = c
	t.schedulePushLocked()
}

// schedulePushLocked arms the push timer unless a push is due already; t.mu is held.
func (t *groupTransport) schedulePushLocked() {
	if t.pushDue {
		return
	}
	t.pushDue = true
	if t.pushTimer == nil {
		t.pushTimer = time.AfterFunc(pushDelay, t.pushCommits)
	} else {
		t.pushTimer.Reset(pushDelay)
	}
}

// pushedIndex is the highest commit index the transport was told of (committed).
func (t *groupTransport) pushedIndex() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pushIndex
}

// repush schedules the pushes of the current commit index again (a follower that acknowledged its
// entry only after the push went out).
func (t *groupTransport) repush() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.schedulePushLocked()
	}
}

// pushCommits sends the commit pushes due.
func (t *groupTransport) pushCommits() {
	t.mu.Lock()
	t.pushDue = false
	c := t.pushIndex
	links := make(map[raft.ServerAddress]*peerLink, len(t.links))
	for a, l := range t.links {
		links[a] = l
	}
	closed := t.closed
	t.mu.Unlock()
	lf := t.leader.Load()
	if closed || lf == nil {
		return
	}
	term, ok := (*lf)()
	if !ok {
		return
	}
	for target, l := range links {
		req := l.pushFor(c, term)
		if req == nil {
			continue
		}
		oc, err := t.m.out(string(target), laneData)
		if err != nil {
			continue
		}
		resp := &raft.AppendEntriesResponse{}
		cl := &call{t: t, kind: kindAppend, link: l, req: req, resp: resp, push: true,
			onDone: func(error) {}, deadline: time.Now().Add(rpcCallTimeout)}
		if !oc.register(cl) {
			continue
		}
		t.m.stats.pushes.Add(1)
		if !oc.w.send(requestFrame(kindAppend, cl.id, t.gid, maxAppendReqLen(req), func(b []byte) []byte {
			return appendAppendReq(b, req)
		})) {
			oc.unregister(cl.id)
		}
	}
}

// InstallSnapshot implements raft.Transport: the snapshot goes on a connection of its own.
func (t *groupTransport) InstallSnapshot(_ raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest,
	resp *raft.InstallSnapshotResponse, data io.Reader) error {
	if t.isShut() {
		return raft.ErrTransportShutdown
	}
	c, err := t.m.n.dialPeer(string(target), tagSnapshot, binary.AppendUvarint(nil, t.gid), dialTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-t.shutdown:
			_ = c.Close()
		case <-stop:
		}
	}()
	_ = c.SetDeadline(time.Now().Add(rpcCallTimeout + time.Duration(args.Size/snapshotMinRate)*time.Second))
	bw := bufio.NewWriterSize(c, 64<<10)
	frame := requestFrame(kindSnapshot, 1, t.gid, 256, func(b []byte) []byte { return appendSnapshotReq(b, args) })
	if _, err := bw.Write(appendFrame(nil, frame)); err != nil {
		return fmt.Errorf("cluster: send snapshot to %s: %w", target, err)
	}
	if _, err := io.Copy(bw, data); err != nil {
		return fmt.Errorf("cluster: send snapshot to %s: %w", target, err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("cluster: send snapshot to %s: %w", target, err)
	}
	body, err := readFrame(bufio.NewReader(c))
	if err != nil {
		return fmt.Errorf("cluster: snapshot answer from %s: %w", target, err)
	}
	if len(body) == 0 || body[0] != kindSnapshot|respFlag {
		return fmt.Errorf("cluster: snapshot answer from %s: %w", target, errShortFrame)
	}
	d := decoder{b: body[1:]}
	_ = d.uvarint()
	if d.byte() == statusErr {
		return fmt.Errorf("cluster: node at %s: %s", target, d.bytes())
	}
	_ = d.uvarint()
	if d.err != nil {
		return d.err
	}
	return decodeSnapshotResp(&d, resp)
}

// serveSnapshot serves an accepted snapshot connection for group gid.
func (m *mesh) serveSnapshot(c net.Conn, br *bufio.Reader, gid uint64) {
	body, err := readFrame(br)
	if err != nil || len(body) == 0 || body[0] != kindSnapshot {
		return
	}
	d := decoder{b: body[1:]}
	id := d.uvarint()
	_ = d.uvarint()
	req, err := decodeSnapshotReq(&d)
	if err != nil {
		return
	}
	_ = c.SetDeadline(time.Now().Add(rpcCallTimeout + time.Duration(req.Size/snapshotMinRate)*time.Second))
	t := m.lookup(gid)
	var out []byte
	if t == nil {
		out = errorFrame(kindSnapshot, id, fmt.Sprintf("group %d is not running on node %s", gid, m.n.cfg.NodeID))
	} else {
		ch := make(chan raft.RPCResponse, 1)
		select {
		case t.consumer <- raft.RPC{Command: req, Reader: io.LimitReader(br, req.Size), RespChan: ch}:
			select {
			case r := <-ch:
				if r.Error != nil {
					out = errorFrame(kindSnapshot, id, r.Error.Error())
				} else if sr, ok := r.Response.(*raft.InstallSnapshotResponse); ok {
					out = responseFrame(kindSnapshot, id, t.epoch, 64, func(b []byte) []byte { return appendSnapshotResp(b, sr) })
				}
			case <-t.shutdown:
			}
		case <-t.shutdown:
		}
		if out == nil {
			out = errorFrame(kindSnapshot, id, raft.ErrTransportShutdown.Error())
		}
	}
	_, _ = c.Write(appendFrame(nil, out))
}

// inReq is an inbound RPC waiting for its group's raft.
type inReq struct {
	ic   *inConn
	kind byte
	id   uint64
	cmd  any
	// reply, if set, replaces the frame answer (heartbeats that went through the queue).
	reply func(raft.RPCResponse)
}

func (r inReq) fail(err error) {
	if r.reply != nil {
		r.reply(raft.RPCResponse{Error: err})
		return
	}
	r.ic.w.send(errorFrame(r.kind, r.id, err.Error()))
}

// enqueue queues an inbound RPC for raft, starting the pump if it is not running.
func (t *groupTransport) enqueue(r inReq) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		r.fail(raft.ErrTransportShutdown)
		return
	}
	t.inq = append(t.inq, r)
	start := !t.pumping
	if start {
		t.pumping = true
		t.wg.Add(1)
	}
	t.mu.Unlock()
	if start {
		go t.pump()
	}
}

// pump hands queued RPCs to raft one at a time (raft's main loop takes them one at a time anyway)
// and sends the answers; it ends when the queue is empty.
func (t *groupTransport) pump() {
	defer t.wg.Done()
	for {
		t.mu.Lock()
		if len(t.inq) == 0 || t.closed {
			t.pumping = false
			t.mu.Unlock()
			return
		}
		r := t.inq[0]
		t.inq[0] = inReq{}
		t.inq = t.inq[1:]
		if len(t.inq) == 0 {
			t.inq = nil
		}
		t.mu.Unlock()
		ch := make(chan raft.RPCResponse, 1)
		select {
		case t.consumer <- raft.RPC{Command: r.cmd, RespChan: ch}:
		case <-t.shutdown:
			r.fail(raft.ErrTransportShutdown)
			continue
		}
		select {
		case resp := <-ch:
			t.answer(r, resp)
		case <-t.shutdown:
			r.fail(raft.ErrTransportShutdown)
		}
	}
}

// answer sends raft's answer to an inbound RPC.
func (t *groupTransport) answer(r inReq, resp raft.RPCResponse) {
	if resp.Error == nil {
		switch v := resp.Response.(type) {
		case *raft.AppendEntriesResponse:
			t.term.Store(v.Term)
		case *raft.RequestVoteResponse:
			t.term.Store(v.Term)
		case *raft.RequestPreVoteResponse:
			// A pre-vote does not change the term: nothing learnt.
		}
	}
	if r.reply != nil {
		r.reply(resp)
		return
	}
	if resp.Error != nil {
		r.ic.w.send(errorFrame(r.kind, r.id, resp.Error.Error()))
		return
	}
	var frame []byte
	switch v := resp.Response.(type) {
	case *raft.AppendEntriesResponse:
		frame = responseFrame(r.kind, r.id, t.epoch, 64+len(v.ID)+len(v.Addr), func(b []byte) []byte { return appendAppendResp(b, v) })
	case *raft.RequestVoteResponse:
		frame = responseFrame(r.kind, r.id, t.epoch, 64+len(v.ID)+len(v.Addr)+len(v.Peers), func(b []byte) []byte { return appendVoteResp(b, v) })
	case *raft.RequestPreVoteResponse:
		frame = responseFrame(r.kind, r.id, t.epoch, 64+len(v.ID)+len(v.Addr), func(b []byte) []byte { return appendPreVoteResp(b, v) })
	case *raft.TimeoutNowResponse:
		frame = responseFrame(r.kind, r.id, t.epoch, 32+len(v.ID)+len(v.Addr), func(b []byte) []byte { return appendTimeoutNowResp(b, v) })
	default:
		frame = errorFrame(r.kind, r.id, fmt.Sprintf("unexpected raft answer %T", resp.Response))
	}
	r.ic.w.send(frame)
}

// heartbeatInline runs heartbeat e on the calling goroutine when that cannot block: raft's handler is
// set and the term is the group's current one (a newer term would be written to disk first).
func (t *groupTransport) heartbeatInline(h raft.RPCHeader, e hbEntry) (hbAnswer, bool) {
	fn := t.hbFn.Load()
	if fn == nil || e.term != t.term.Load() || t.isShut() {
		return hbAnswer{}, false
	}
	return t.runHeartbeat(*fn, h, e), true
}

func (t *groupTransport) runHeartbeat(fn func(raft.RPC), h raft.RPCHeader, e hbEntry) hbAnswer {
	ch := make(chan raft.RPCResponse, 1)
	fn(raft.RPC{Command: &raft.AppendEntriesRequest{RPCHeader: h, Term: e.term, Leader: h.Addr}, RespChan: ch})
	select {
	case r := <-ch:
		return t.heartbeatResult(e.id, r)
	default:
		// raft is shutting down: its handler returned without answering.
		return hbAnswer{id: e.id, err: raft.ErrRaftShutdown.Error()}
	}
}

func (t *groupTransport) heartbeatResult(id uint64, r raft.RPCResponse) hbAnswer {
	if r.Error != nil {
		return hbAnswer{id: id, err: r.Error.Error()}
	}
	resp, ok := r.Response.(*raft.AppendEntriesResponse)
	if !ok {
		return hbAnswer{id: id, err: fmt.Sprintf("unexpected raft answer %T", r.Response)}
	}
	t.term.Store(resp.Term)
	return hbAnswer{id: id, epoch: t.epoch, resp: *resp}
}

// heartbeatAsync runs heartbeat e off the connection's reader (it may write the term to disk), or
// through the queue while raft has not set its handler yet.
func (t *groupTransport) heartbeatAsync(ic *inConn, h raft.RPCHeader, e hbEntry) {
	send := func(a hbAnswer) { ic.sendHeartbeatAnswers([]hbAnswer{a}) }
	fn := t.hbFn.Load()
	if fn == nil {
		t.enqueue(inReq{ic: ic, kind: kindHeartbeats, id: e.id,
			cmd:   &raft.AppendEntriesRequest{RPCHeader: h, Term: e.term, Leader: h.Addr},
			reply: func(r raft.RPCResponse) { send(t.heartbeatResult(e.id, r)) }})
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		send(hbAnswer{id: e.id, err: raft.ErrTransportShutdown.Error()})
		return
	}
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		send(t.runHeartbeat(*fn, h, e))
	}()
}

// AppendEntriesPipeline implements raft.Transport: it declines, so raft replicates with one-off
// AppendEntries (which loop until the follower has caught up). A pipeline would cost two more
// goroutines per follower of every group this node leads, for little: the follower handles a group's
// appends one at a time anyway, and the mesh already overlaps the groups' round trips.
func (t *groupTransport) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

// peerLink is what the leader side of one group knows about one follower: what it acknowledged, to
// answer idle appends, and what was sent, for commit pushes (committed).
//
// hashicorp's replication loop sends an AppendEntries without entries every CommitTimeout so that
// a follower learns the commit index when writes stop. Such an append is answered here, without
// being sent, when the follower has acknowledged, in this leader's term and to this transport
// instance of its group, a real append that left it exactly where this one would (same last index
// and term, same commit index), and the group's latest heartbeat to it succeeded recently in the same
// term and instance. The answer is the one the follower would give: success, this term, its last
// index. Its term is this one (the heartbeat says so), and its log and commit index are what it
// acknowledged, because in this term only this leader changes them and it sent nothing since; a
// restart shows as another instance. What the append would have done on the follower besides (note
// the leader's contact) the heartbeats do, and they are never elided. Anything else goes out:
// entries, a new commit index, a follower that restarted or rejected a heartbeat (a newer term,
// which the real append then reports so that the leader steps down).
type peerLink struct {
	mu        sync.Mutex
	ackValid  bool
	ackTerm   uint64
	ackLast   uint64
	ackLTerm  uint64
	ackCommit uint64
	ackHdr    raft.RPCHeader // the follower's header on that acknowledgement
	epoch     uint64         // the follower's group transport instance, 0 = unknown
	hbOK      bool           // the latest heartbeat succeeded, in term hbTerm, answered at hbAt with hbResp
	hbTerm    uint64
	hbAt      time.Time
	hbResp    raft.AppendEntriesResponse
	// What raft sent in sentTerm: the highest commit index, and the RPC header (for pushes).
	sentTerm   uint64
	sentCommit uint64
	hdr        raft.RPCHeader
}

// sent records a real append about to go out.
func (l *peerLink) sent(req *raft.AppendEntriesRequest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if req.Term > l.sentTerm {
		l.sentTerm, l.sentCommit = req.Term, 0
	}
	if req.Term == l.sentTerm {
		l.sentCommit = max(l.sentCommit, req.LeaderCommitIndex)
		l.hdr = req.RPCHeader
	}
}

// pushFor returns the commit push for applied index c in term (nil if none is needed or possible):
// the follower must have acknowledged an append of this term, and nothing sent in this term may
// already carry the commit index.
func (l *peerLink) pushFor(c, term uint64) *raft.AppendEntriesRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	commit := min(c, l.ackLast)
	if !l.ackValid || l.ackTerm != term || l.sentTerm != term || commit <= l.sentCommit || len(l.hdr.Addr) == 0 {
		return nil
	}
	l.sentCommit = commit
	return &raft.AppendEntriesRequest{RPCHeader: l.hdr, Term: term, Leader: l.hdr.Addr,
		PrevLogEntry: l.ackLast, PrevLogTerm: l.ackLTerm, LeaderCommitIndex: commit}
}

// pushed records the answer to a commit push (resp nil: it failed).
func (l *peerLink) pushed(req *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse, epoch uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case resp == nil:
	case !resp.Success || resp.Term != req.Term || epoch != l.epoch:
		l.ackValid = false // let raft's own appends sort it out
	case l.ackValid && l.ackTerm == req.Term && l.ackLast == req.PrevLogEntry && l.ackLTerm == req.PrevLogTerm:
		l.ackCommit = max(l.ackCommit, req.LeaderCommitIndex)
	}
}

// hbFresh bounds the age of the heartbeat answer elision relies on: a real heartbeat goes at least
// every hbLocalFor plus one heartbeat period (heartbeatTimeout/10-heartbeatTimeout/5), and a second
// more keeps elision on between two of them.
const hbFresh = hbLocalFor + heartbeatTimeout/5 + time.Second

// elide answers the empty append req from what the follower acknowledged, without sending it, when
// that is what the follower would answer (see peerLink); false: req must be sent. peerSince is when
// the follower's node began answering pings on its current connection: a heartbeat answered before
// then may come from a process that has restarted since.
func (l *peerLink) elide(req *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse, peerSince time.Time) bool {
	if len(req.Entries) > 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !(l.ackValid && l.hbValidLocked(req.Term, hbFresh, peerSince) && req.Term == l.ackTerm &&
		req.PrevLogEntry == l.ackLast && req.PrevLogTerm == l.ackLTerm && req.LeaderCommitIndex == l.ackCommit) {
		return false
	}
	*resp = raft.AppendEntriesResponse{RPCHeader: l.ackHdr, Term: req.Term, LastLog: l.ackLast, Success: true}
	return true
}

// appended records the answer to a real append (resp nil: it failed).
//
// It returns the commit index the follower was last told (by raft or by a push) when that is below
// what it now acknowledges, and the maximum uint64 otherwise: then no push is missing.
func (l *peerLink) appended(req *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse, epoch uint64) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if resp == nil || !resp.Success || resp.Term != req.Term {
		l.ackValid = false
		return math.MaxUint64
	}
	if epoch != l.epoch {
		l.epoch = epoch
		l.hbOK = false // the heartbeats seen so far were answered by another instance
	}
	l.ackValid = true
	l.ackTerm = req.Term
	l.ackLast, l.ackLTerm = req.PrevLogEntry, req.PrevLogTerm
	if n := len(req.Entries); n > 0 {
		l.ackLast, l.ackLTerm = req.Entries[n-1].Index, req.Entries[n-1].Term
	}
	l.ackCommit = req.LeaderCommitIndex
	l.ackHdr = resp.RPCHeader
	if told := max(l.ackCommit, l.sentCommit); told < l.ackLast {
		return told
	}
	return math.MaxUint64
}

// heartbeat records the answer to a heartbeat of term (resp nil: it failed).
func (l *peerLink) heartbeat(term uint64, resp *raft.AppendEntriesResponse, epoch uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if resp == nil || !resp.Success || resp.Term != term {
		l.hbOK = false
		return
	}
	if epoch != l.epoch {
		// Another instance of the follower's group answered than the one that acknowledged the
		// last append: it may have lost its commit index (a restart).
		l.epoch = epoch
		l.ackValid = false
	}
	l.hbOK, l.hbTerm, l.hbAt, l.hbResp = true, term, time.Now(), *resp
}

// Local heartbeat answers.
//
// hashicorp/raft's leader heartbeats every follower of every group every heartbeatTimeout/10 to
// heartbeatTimeout/5: at hundreds of groups, hundreds of round trips a second on an idle cluster (at
// 300 queues answering most of them here cut the idle CPU by about a tenth; at 3,000 the groups' own
// timers dominate, docs/benchmarks.md).
// A heartbeat does two things: the follower notes that the leader lives (its election timer, 24-48 s
// here), and the leader learns that the follower lives in its term (the lease: it steps down after
// leaderLeaseTimeout without a majority's answer) or that it has moved to a newer term. So a
// heartbeat of term T is answered here, not sent, while the follower answered a real one of term T
// less than hbLocalFor ago, its node answered a ping less than hbPeerFresh ago, and that node has
// answered on the same ping connection since that real answer (a restarted node opens a new one, so
// a restarted follower hears from its leader at the next heartbeat). The follower then
// still hears from the leader every hbLocalFor plus one heartbeat period (at most 12.8 s, against its
// 24 s timeout, and under hbFresh so that empty appends stay elided); a follower whose node stops
// answering pings stops counting towards the lease within hbPeerFresh (elided appends, which raft
// counts as contact too, are held to the same condition), so a leader cut off from its
// majority steps down at most that much later than with every heartbeat sent; and a follower that
// moved to a newer term tells the leader with its vote requests (which make the leader step down) or
// at the next real heartbeat. Raft's safety does not rest on heartbeats (a commit needs a majority's
// real append acknowledgements). This transport must therefore not be used with raft's VerifyLeader
// (whose forced heartbeats would be answered here too); Warren does not use it. With heartbeats
// every 2.4-4.8 s, 8 s answers about two of three locally; 6 s answered only about half
// (TestIdleGroupsSendNoAppends: 129 local against 130 sent in one run).
const (
	hbLocalFor  = 8 * time.Second
	hbPeerFresh = 2 * PingInterval
)

// answerHeartbeat fills resp with the follower's latest answer when a heartbeat of term may be
// answered from it (see hbLocalFor).
func (l *peerLink) answerHeartbeat(term uint64, resp *raft.AppendEntriesResponse, peerSince time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.hbValidLocked(term, hbLocalFor, peerSince) {
		return false
	}
	*resp = l.hbResp
	return true
}

// hbValidLocked reports whether the follower's latest heartbeat answer may stand for it now: it
// succeeded in term, less than within ago, and not before peerSince (when the follower's node began
// answering pings on its current connection). l.mu is held.
func (l *peerLink) hbValidLocked(term uint64, within time.Duration, peerSince time.Time) bool {
	return l.hbOK && l.hbTerm == term && time.Since(l.hbAt) < within && !l.hbAt.Before(peerSince)
}
