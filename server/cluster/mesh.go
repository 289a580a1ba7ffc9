package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// The mesh is the node's raft transport: every group's RPCs to a peer share that peer's connections,
// instead of hashicorp's NetworkTransport, which gives every group its own connections (each with
// 256 KB buffers and a goroutine per connection) and msgpack-encodes every RPC.
//
// Per peer address there are two outbound connections ("lanes"), each multiplexing request frames of
// all groups and carrying their answers back: the control lane has heartbeats, votes and TimeoutNow,
// the data lane AppendEntries, so that a heartbeat never waits behind log entries in a TCP buffer
// (hashicorp's transport keeps heartbeats on their own connection for the same reason). A snapshot is
// streamed on a connection of its own. Heartbeats to one peer are coalesced: those raised within
// hbCoalesce travel in one frame, and the peer answers them in one frame; each sent heartbeat is handled
// by its group's raft on the peer (the heartbeat fast path). A heartbeat whose follower answered one of
// the same term less than hbLocalFor ago, while the follower's node answers pings on the connection
// it answered them on then, is answered from that answer and not sent at all (peerLink.answerHeartbeat).
//
// Empty AppendEntries that hashicorp's replication loop sends every CommitTimeout to carry the commit
// index are elided when the follower provably knows everything they carry (see peerLink.elide).
//
// An RPC for a group not running on the receiving node yet (a group being created: the metadata
// entry that creates it is applied on the nodes at slightly different times) is parked for up to
// parkTimeout and delivered when the group starts, so that a new group's first election does not
// wait for a retry.
//
// Lock order: mesh.mu before laneClient.mu before outConn.mu; groupTransport.mu is never held while
// taking any of them.

// Mesh timing and limits.
const (
	laneControl byte = 0 // heartbeats, votes, TimeoutNow
	laneData    byte = 1 // AppendEntries

	hbCoalesce      = 50 * time.Millisecond // heartbeats raised within this window share a frame
	hbCallTimeout   = leaderLeaseTimeout    // a heartbeat not answered by then failed
	rpcCallTimeout  = transportTimeout      // any other RPC
	sweepEvery      = 250 * time.Millisecond
	parkTimeout     = 3 * time.Second
	maxParked       = 16384
	maxBuffered     = 32 << 20 // bytes queued for a connection's writer before senders wait
	redialAfter     = 100 * time.Millisecond
	snapshotMinRate = 1 << 20 // bytes per second a snapshot stream must at least achieve
)

var errConnClosed = errors.New("cluster: mesh connection closed")

// mesh is the node's raft transport (one per Node with a listener).
type mesh struct {
	n *Node

	mu      sync.Mutex
	closed  bool
	groups  map[uint64]*groupTransport
	parked  map[uint64]*parkedList
	nparked int
	clients map[laneKey]*laneClient
	outs    map[*outConn]struct{}
	ins     map[*inConn]struct{}

	stats meshStats

	stop chan struct{}
	wg   sync.WaitGroup // connection goroutines, the sweeper
}

// meshStats counts the mesh's traffic (tests read it to check what an idle cluster sends).
type meshStats struct {
	appendsSent     atomic.Uint64 // AppendEntries sent (raft's, not heartbeats)
	appendsElided   atomic.Uint64 // empty appends answered without sending (peerLink)
	appendsReceived atomic.Uint64 // AppendEntries received (not heartbeats)
	heartbeats      atomic.Uint64 // heartbeats sent
	hbLocal         atomic.Uint64 // heartbeats answered without sending (peerLink.answerHeartbeat)
	hbFrames        atomic.Uint64 // frames the sent heartbeats took
	pushes          atomic.Uint64 // commit pushes sent
}

type laneKey struct {
	addr string
	lane byte
}

// laneClient holds the current outbound connection of one lane to one peer.
type laneClient struct {
	mu     sync.Mutex
	conn   *outConn
	lastAt time.Time
	last   error
}

func newMesh(n *Node) *mesh {
	m := &mesh{
		n:       n,
		groups:  make(map[uint64]*groupTransport),
		parked:  make(map[uint64]*parkedList),
		clients: make(map[laneKey]*laneClient),
		outs:    make(map[*outConn]struct{}),
		ins:     make(map[*inConn]struct{}),
		stop:    make(chan struct{}),
	}
	m.wg.Add(1)
	go m.sweeper()
	return m
}

// close tears down every connection and fails everything parked; groups must be closed first.
func (m *mesh) close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	close(m.stop)
	outs := make([]*outConn, 0, len(m.outs))
	for oc := range m.outs {
		outs = append(outs, oc)
	}
	ins := make([]*inConn, 0, len(m.ins))
	for ic := range m.ins {
		ins = append(ins, ic)
	}
	parked := m.parked
	m.parked = make(map[uint64]*parkedList)
	m.nparked = 0
	m.mu.Unlock()
	for _, oc := range outs {
		oc.teardown(ErrClosed)
	}
	for _, ic := range ins {
		_ = ic.c.Close()
	}
	for gid, pl := range parked {
		pl.timer.Stop()
		for _, p := range pl.items {
			p.fail(fmt.Sprintf("group %d is not running on node %s (node closing)", gid, m.n.cfg.NodeID))
		}
	}
	m.wg.Wait()
}

// goTracked runs f on a goroutine the mesh waits for in close; false if the mesh is closed.
func (m *mesh) goTracked(f func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
	return true
}

// register makes t the receiver of its group's RPCs and delivers those parked for it.
func (m *mesh) register(t *groupTransport) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	if old := m.groups[t.gid]; old != nil {
		m.mu.Unlock()
		return fmt.Errorf("cluster: group %d already has a transport on node %s", t.gid, m.n.cfg.NodeID)
	}
	m.groups[t.gid] = t
	pl := m.parked[t.gid]
	if pl != nil {
		delete(m.parked, t.gid)
		m.nparked -= len(pl.items)
	}
	m.mu.Unlock()
	if pl != nil {
		pl.timer.Stop()
		for _, p := range pl.items {
			p.deliver(t)
		}
	}
	return nil
}

func (m *mesh) unregister(t *groupTransport) {
	m.mu.Lock()
	if m.groups[t.gid] == t {
		delete(m.groups, t.gid)
	}
	m.mu.Unlock()
}

func (m *mesh) lookup(gid uint64) *groupTransport {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.groups[gid]
}

// parkedReq is an inbound RPC for a group that is not running here (yet).
type parkedReq struct {
	deliver func(t *groupTransport)
	fail    func(msg string)
}

type parkedList struct {
	items []parkedReq
	timer *time.Timer
}

// dispatch delivers an inbound RPC to its group, or parks it until the group starts.
func (m *mesh) dispatch(gid uint64, p parkedReq) {
	m.mu.Lock()
	if t := m.groups[gid]; t != nil {
		m.mu.Unlock()
		p.deliver(t)
		return
	}
	if m.closed || m.nparked >= maxParked {
		m.mu.Unlock()
		p.fail(fmt.Sprintf("group %d is not running on node %s", gid, m.n.cfg.NodeID))
		return
	}
	pl := m.parked[gid]
	if pl == nil {
		pl = &parkedList{}
		pl.timer = time.AfterFunc(parkTimeout, func() { m.expireParked(gid, pl) })
		m.parked[gid] = pl
	}
	pl.items = append(pl.items, p)
	m.nparked++
	m.mu.Unlock()
}

func (m *mesh) expireParked(gid uint64, pl *parkedList) {
	m.mu.Lock()
	if m.parked[gid] != pl {
		m.mu.Unlock()
		return
	}
	delete(m.parked, gid)
	m.nparked -= len(pl.items)
	m.mu.Unlock()
	for _, p := range pl.items {
		p.fail(fmt.Sprintf("group %d is not running on node %s", gid, m.n.cfg.NodeID))
	}
}

// out returns the live outbound connection of lane to addr, dialling if needed (at most every
// redialAfter after a failure: meanwhile calls fail at once).
func (m *mesh) out(addr string, lane byte) (*outConn, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, raft.ErrTransportShutdown
	}
	k := laneKey{addr, lane}
	lc := m.clients[k]
	if lc == nil {
		lc = &laneClient{}
		m.clients[k] = lc
	}
	m.mu.Unlock()

	lc.mu.Lock()
	defer lc.mu.Unlock()
	if oc := lc.conn; oc != nil && !oc.isDead() {
		return oc, nil
	}
	lc.conn = nil
	if lc.last != nil && time.Since(lc.lastAt) < redialAfter {
		return nil, lc.last
	}
	c, err := m.n.dialPeer(addr, tagMux, []byte{lane}, dialTimeout)
	lc.lastAt, lc.last = time.Now(), err
	if err != nil {
		return nil, err
	}
	oc := newOutConn(m, addr, lane, c)
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		_ = c.Close()
		return nil, raft.ErrTransportShutdown
	}
	m.outs[oc] = struct{}{}
	m.wg.Add(2)
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		oc.w.loop()
	}()
	go func() {
		defer m.wg.Done()
		oc.readLoop()
	}()
	lc.conn = oc
	return oc, nil
}

// sweeper fails calls that waited too long and tears down connections that answer nothing.
func (m *mesh) sweeper() {
	defer m.wg.Done()
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case now := <-t.C:
			m.mu.Lock()
			outs := make([]*outConn, 0, len(m.outs))
			for oc := range m.outs {
				outs = append(outs, oc)
			}
			m.mu.Unlock()
			for _, oc := range outs {
				oc.sweep(now)
			}
		}
	}
}

// connWriter is the write side of a mesh connection: frames are appended to a buffer that one
// goroutine writes out, so that many groups' small frames go out in few system calls.
type connWriter struct {
	c     net.Conn
	onErr func(error)
	wake  chan struct{} // capacity 1
	done  chan struct{} // closed by stop

	mu     sync.Mutex
	cond   sync.Cond // signalled when the buffer drains or the writer stops
	buf    []byte
	spare  []byte
	closed bool
}

func newConnWriter(c net.Conn, onErr func(error)) *connWriter {
	w := &connWriter{c: c, onErr: onErr, wake: make(chan struct{}, 1), done: make(chan struct{})}
	w.cond.L = &w.mu
	return w
}

// send queues one frame body; false if the writer has stopped.
func (w *connWriter) send(body []byte) bool {
	w.mu.Lock()
	for !w.closed && len(w.buf) > maxBuffered {
		w.cond.Wait()
	}
	if w.closed {
		w.mu.Unlock()
		return false
	}
	w.buf = appendFrame(w.buf, body)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return true
}

// stop makes further sends fail and ends loop.
func (w *connWriter) stop() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		w.buf = nil
		close(w.done)
		w.cond.Broadcast()
	}
	w.mu.Unlock()
}

func (w *connWriter) loop() {
	for {
		select {
		case <-w.wake:
		case <-w.done:
			return
		}
		for {
			w.mu.Lock()
			buf := w.buf
			if len(buf) == 0 || w.closed {
				w.mu.Unlock()
				break
			}
			w.buf, w.spare = w.spare[:0], nil
			w.cond.Broadcast()
			w.mu.Unlock()
			_ = w.c.SetWriteDeadline(time.Now().Add(rpcCallTimeout))
			if _, err := w.c.Write(buf); err != nil {
				w.stop()
				w.onErr(err)
				return
			}
			if cap(buf) <= 1<<20 {
				w.mu.Lock()
				w.spare = buf[:0]
				w.mu.Unlock()
			}
		}
	}
}

// call is one outbound RPC awaiting its answer.
type call struct {
	t        *groupTransport
	kind     byte
	id       uint64
	deadline time.Time
	link     *peerLink                  // appends and heartbeats: the (group, peer) state
	req      *raft.AppendEntriesRequest // appends: what was sent (for the link's bookkeeping)
	hbTerm   uint64                     // heartbeats: the term sent
	hdr      raft.RPCHeader             // heartbeats: the header sent
	resp     any                        // the response to fill
	done     chan error                 // calls raft waits for: capacity 1
	onDone   func(error)                // asynchronous calls (commit pushes) instead of done
	push     bool                       // a commit push (groupTransport.committed)
}

// outConn is one outbound lane connection to a peer.
type outConn struct {
	m        *mesh
	addr     string
	lane     byte
	c        net.Conn
	w        *connWriter
	lastRecv atomic.Int64 // UnixNano of the last frame received

	mu          sync.Mutex
	dead        bool
	cause       error
	nextID      uint64
	calls       map[uint64]*call
	hbQueue     []*call
	hbTimer     *time.Timer
	hbScheduled bool
}

func newOutConn(m *mesh, addr string, lane byte, c net.Conn) *outConn {
	oc := &outConn{m: m, addr: addr, lane: lane, c: c, calls: make(map[uint64]*call)}
	oc.w = newConnWriter(c, func(err error) { oc.teardown(err) })
	oc.lastRecv.Store(time.Now().UnixNano())
	return oc
}

func (oc *outConn) isDead() bool {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	return oc.dead
}

func (oc *outConn) deadErr() error {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	if oc.cause != nil {
		return fmt.Errorf("%w: %v", errConnClosed, oc.cause)
	}
	return errConnClosed
}

// register gives c an id and records it; false if the connection is dead.
func (oc *outConn) register(c *call) bool {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	if oc.dead {
		return false
	}
	oc.nextID++
	c.id = oc.nextID
	oc.calls[c.id] = c
	return true
}

func (oc *outConn) unregister(id uint64) *call {
	oc.mu.Lock()
	defer oc.mu.Unlock()
	c := oc.calls[id]
	delete(oc.calls, id)
	return c
}

// roundTrip sends a registered one-off call's frame and waits for its answer.
func (oc *outConn) roundTrip(c *call, frame []byte) error {
	if !oc.w.send(frame) {
		oc.unregister(c.id)
		return oc.deadErr()
	}
	select {
	case err := <-c.done:
		return err
	case <-c.t.shutdown:
		return oc.abandon(c)
	}
}

// abandon gives up call c because its transport shut down. If the reader (or a sweep) has taken c
// already, it is writing c's answer into c.resp: wait for it to finish (it completes every call it
// takes; the bound only covers a peer's protocol error), or raft would reuse the response while it
// is written.
func (oc *outConn) abandon(c *call) error {
	if oc.unregister(c.id) == nil {
		select {
		case err := <-c.done:
			return err
		case <-time.After(rpcCallTimeout):
		}
	}
	return raft.ErrTransportShutdown
}

// heartbeat queues heartbeat c for the next batch and waits for its answer.
func (oc *outConn) heartbeat(c *call) error {
	oc.mu.Lock()
	if oc.dead {
		oc.mu.Unlock()
		return oc.deadErr()
	}
	oc.nextID++
	c.id = oc.nextID
	oc.calls[c.id] = c
	oc.hbQueue = append(oc.hbQueue, c)
	if !oc.hbScheduled {
		oc.hbScheduled = true
		if oc.hbTimer == nil {
			oc.hbTimer = time.AfterFunc(hbCoalesce, oc.flushHeartbeats)
		} else {
			oc.hbTimer.Reset(hbCoalesce)
		}
	}
	oc.mu.Unlock()
	select {
	case err := <-c.done:
		return err
	case <-c.t.shutdown:
		return oc.abandon(c)
	}
}

// flushHeartbeats sends the queued heartbeats, one frame per run of equal RPC headers (in practice
// every heartbeat of a node has the same header).
func (oc *outConn) flushHeartbeats() {
	oc.mu.Lock()
	q := oc.hbQueue
	oc.hbQueue = nil
	oc.hbScheduled = false
	dead := oc.dead
	oc.mu.Unlock()
	if dead {
		return
	}
	for len(q) > 0 {
		h := q[0].hdr
		n := 1
		for n < len(q) && sameHeader(q[n].hdr, h) {
			n++
		}
		entries := make([]hbEntry, n)
		for i, c := range q[:n] {
			entries[i] = hbEntry{id: c.id, group: c.t.gid, term: c.hbTerm}
		}
		if !oc.w.send(appendHeartbeats(nil, h, entries)) {
			return // teardown fails them
		}
		oc.m.stats.heartbeats.Add(uint64(n))
		oc.m.stats.hbFrames.Add(1)
		q = q[n:]
	}
}

func sameHeader(a, b raft.RPCHeader) bool {
	return a.ProtocolVersion == b.ProtocolVersion && string(a.ID) == string(b.ID) && string(a.Addr) == string(b.Addr)
}

// readLoop reads the answers of the connection's calls.
func (oc *outConn) readLoop() {
	br := bufio.NewReaderSize(oc.c, 64<<10)
	for {
		body, err := readFrame(br)
		if err != nil {
			oc.teardown(err)
			return
		}
		oc.lastRecv.Store(time.Now().UnixNano())
		if err := oc.answer(body); err != nil {
			oc.teardown(err)
			return
		}
	}
}

// answer completes the calls a frame answers.
func (oc *outConn) answer(body []byte) error {
	if len(body) == 0 || body[0]&respFlag == 0 {
		return errShortFrame
	}
	kind := body[0] &^ respFlag
	d := decoder{b: body[1:]}
	if kind == kindHeartbeats {
		answers, err := decodeHeartbeatAnswers(&d)
		if err != nil {
			return err
		}
		for i := range answers {
			if c := oc.unregister(answers[i].id); c != nil && c.kind == kindHeartbeats {
				c.t.heartbeatAnswered(c, &answers[i])
			}
		}
		return nil
	}
	id := d.uvarint()
	status := d.byte()
	if d.err != nil {
		return d.err
	}
	c := oc.unregister(id)
	if status == statusErr {
		msg := string(d.bytes())
		if c != nil {
			c.t.callDone(c, 0, fmt.Errorf("node at %s: %s", oc.addr, msg))
		}
		return nil
	}
	epoch := d.uvarint()
	if d.err != nil {
		return d.err
	}
	if c == nil {
		return nil // abandoned (timed out, transport closed)
	}
	if c.kind != kind {
		err := fmt.Errorf("cluster: answer of kind %d to a call of kind %d", kind, c.kind)
		c.t.callDone(c, 0, err)
		return err
	}
	var err error
	switch r := c.resp.(type) {
	case *raft.AppendEntriesResponse:
		err = decodeAppendResp(&d, r)
	case *raft.RequestVoteResponse:
		err = decodeVoteResp(&d, r)
	case *raft.RequestPreVoteResponse:
		err = decodePreVoteResp(&d, r)
	case *raft.TimeoutNowResponse:
		err = decodeTimeoutNowResp(&d, r)
	default:
		err = fmt.Errorf("cluster: no response type for kind %d", kind)
	}
	if err != nil {
		c.t.callDone(c, 0, err)
		return err
	}
	c.t.callDone(c, epoch, nil)
	return nil
}

// teardown closes the connection once and fails every call on it.
func (oc *outConn) teardown(cause error) {
	oc.mu.Lock()
	if oc.dead {
		oc.mu.Unlock()
		return
	}
	oc.dead = true
	oc.cause = cause
	calls := oc.calls
	oc.calls = nil
	oc.hbQueue = nil
	if oc.hbTimer != nil {
		oc.hbTimer.Stop()
	}
	oc.mu.Unlock()
	oc.w.stop()
	_ = oc.c.Close()
	oc.m.mu.Lock()
	delete(oc.m.outs, oc)
	oc.m.mu.Unlock()
	err := fmt.Errorf("%w to %s: %v", errConnClosed, oc.addr, cause)
	for _, c := range calls {
		c.t.callDone(c, 0, err)
	}
}

// sweep fails the calls past their deadline; when one is and nothing at all was received for the
// call timeout, the peer is not answering on this connection: it is torn down (the next call redials).
func (oc *outConn) sweep(now time.Time) {
	var late []*call
	oc.mu.Lock()
	for id, c := range oc.calls {
		if now.After(c.deadline) {
			late = append(late, c)
			delete(oc.calls, id)
		}
	}
	oc.mu.Unlock()
	if len(late) == 0 {
		return
	}
	limit := rpcCallTimeout
	if oc.lane == laneControl {
		limit = hbCallTimeout
	}
	if now.Sub(time.Unix(0, oc.lastRecv.Load())) > limit {
		oc.teardown(fmt.Errorf("no answer for %s", limit))
	}
	for _, c := range late {
		c.t.callDone(c, 0, fmt.Errorf("cluster: no answer from %s within %s", oc.addr, now.Sub(c.deadline)+limit))
	}
}

// inConn is an accepted mesh connection: requests in, answers out.
type inConn struct {
	m *mesh
	c net.Conn
	w *connWriter
}

// serveMux serves an accepted mesh connection until it breaks.
func (m *mesh) serveMux(c net.Conn, br *bufio.Reader) {
	ic := &inConn{m: m, c: c}
	ic.w = newConnWriter(c, func(error) { _ = c.Close() })
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.ins[ic] = struct{}{}
	m.wg.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		ic.w.loop()
	}()
	defer func() {
		ic.w.stop()
		_ = c.Close()
		m.mu.Lock()
		delete(m.ins, ic)
		m.mu.Unlock()
	}()
	for {
		body, err := readFrame(br)
		if err != nil {
			return
		}
		if err := ic.request(body); err != nil {
			m.n.log.Debug("cluster: malformed raft frame; closing the connection", "remote", c.RemoteAddr().String(), "err", err)
			return
		}
	}
}

// request handles one request frame.
func (ic *inConn) request(body []byte) error {
	if len(body) == 0 {
		return errShortFrame
	}
	kind := body[0]
	d := decoder{b: body[1:]}
	if kind == kindHeartbeats {
		h, entries, err := decodeHeartbeats(&d)
		if err != nil {
			return err
		}
		var answers []hbAnswer
		for _, e := range entries {
			t := ic.m.lookup(e.group)
			if t != nil {
				if a, ok := t.heartbeatInline(h, e); ok {
					answers = append(answers, a)
					continue
				}
			}
			ic.m.dispatch(e.group, parkedReq{
				deliver: func(t *groupTransport) { t.heartbeatAsync(ic, h, e) },
				fail: func(msg string) {
					ic.sendHeartbeatAnswers([]hbAnswer{{id: e.id, err: msg}})
				},
			})
		}
		ic.sendHeartbeatAnswers(answers)
		return nil
	}
	id := d.uvarint()
	gid := d.uvarint()
	if d.err != nil {
		return d.err
	}
	var cmd any
	var err error
	switch kind {
	case kindAppend:
		cmd, err = decodeAppendReq(&d)
		ic.m.stats.appendsReceived.Add(1)
	case kindVote:
		cmd, err = decodeVoteReq(&d)
	case kindPreVote:
		cmd, err = decodePreVoteReq(&d)
	case kindTimeoutNow:
		cmd, err = decodeTimeoutNowReq(&d)
	default:
		err = fmt.Errorf("cluster: unknown raft message kind %d", kind)
	}
	if err != nil {
		return err
	}
	ic.m.dispatch(gid, parkedReq{
		deliver: func(t *groupTransport) { t.enqueue(inReq{ic: ic, kind: kind, id: id, cmd: cmd}) },
		fail:    func(msg string) { ic.w.send(errorFrame(kind, id, msg)) },
	})
	return nil
}

// sendHeartbeatAnswers sends answers in one frame (per run of equal headers).
func (ic *inConn) sendHeartbeatAnswers(answers []hbAnswer) {
	for len(answers) > 0 {
		h := answers[0].resp.RPCHeader
		n := 1
		for n < len(answers) && (answers[n].err != "" || sameHeader(answers[n].resp.RPCHeader, h)) {
			n++
		}
		ic.w.send(appendHeartbeatAnswers(nil, h, answers[:n]))
		answers = answers[n:]
	}
}
