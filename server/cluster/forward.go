package cluster

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Forwarded request kinds.
const (
	fwdPropose      byte = 1
	fwdAddVoter     byte = 2
	fwdAddNonvoter  byte = 3
	fwdRemoveServer byte = 4
	fwdDemoteVoter  byte = 5
	// fwdTransferLeader asks the leader to hand its leadership to the named voter.
	fwdTransferLeader byte = 6
)

// Forwarded response codes.
const (
	codeOK       byte = 0 // committed; no data
	codeOKData   byte = 1 // committed; the FSM returned []byte
	codeApplyErr byte = 2 // committed; the FSM returned an error (message follows)
	codeRetry    byte = 3 // not applied here (not the leader, leadership lost, group not running): try again
	codeFail     byte = 4 // failed for good (message follows)
)

// Forwarding limits.
const (
	fwdOutQueue       = 4096                   // frames queued for a forward connection's writer
	fwdSweepInterval  = 100 * time.Millisecond // how often expired forwarded requests are failed
	fwdRedialAfter    = 100 * time.Millisecond // a failed dial is not retried sooner (requests fail fast meanwhile)
	fwdMaxApplyWait   = time.Minute            // cap on a forwarded request's enqueue timeout at the leader
	membershipTimeout = 30 * time.Second       // default deadline of a membership change
)

// retryableError marks a failure that a retry against the current leader may overcome.
type retryableError struct{ err error }

func (e *retryableError) Error() string { return e.err.Error() }
func (e *retryableError) Unwrap() error { return e.err }

// retryable reports whether err is transient: not the leader, leadership lost, no connection.
func retryable(err error) bool {
	var re *retryableError
	return errors.As(err, &re) ||
		errors.Is(err, raft.ErrNotLeader) ||
		errors.Is(err, raft.ErrLeadershipLost) ||
		errors.Is(err, raft.ErrLeadershipTransferInProgress) ||
		errors.Is(err, raft.ErrEnqueueTimeout) ||
		errors.Is(err, raft.ErrRaftShutdown) ||
		errors.Is(err, raft.ErrAbortedByRestore)
}

// fwdClient forwards requests to the peer at addr over one pipelined connection.
type fwdClient struct {
	n    *Node
	addr string

	mu         sync.Mutex
	conn       *fwdConn
	closed     bool
	lastDialAt time.Time
	lastDial   error
}

// fwdConn is one forward connection: a writer, a reader and a sweeper goroutine.
type fwdConn struct {
	cl   *fwdClient
	c    net.Conn
	out  chan []byte
	done chan struct{}
	once sync.Once

	mu      sync.Mutex
	dead    bool
	nextID  uint64
	pending map[uint64]*fwdPending
	// busy wakes sweepLoop when pending stops being empty (capacity 1): an idle connection has
	// nothing to sweep and costs no timer.
	busy chan struct{}
	// lastRead is when the reader last got a frame (UnixNano; the dial time before the first).
	lastRead atomic.Int64
}

// fwdPending is a request awaiting its answer: a proposal (p) or a membership change (reply).
type fwdPending struct {
	g        *Group
	p        *proposal
	reply    chan fwdReply // capacity 1
	deadline time.Time
	sent     time.Time // when it was registered
}

type fwdReply struct {
	code  byte
	index uint64
	data  []byte
	err   error
}

// client returns the forwarding client of the peer at addr.
func (n *Node) client(addr string) *fwdClient {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.fwd[addr]
	if c == nil {
		c = &fwdClient{n: n, addr: addr}
		if n.closed {
			c.closed = true
		} else {
			n.fwd[addr] = c
		}
	}
	return c
}

// getConn returns the live connection, dialling if needed.
func (cl *fwdClient) getConn() (*fwdConn, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed {
		return nil, ErrClosed
	}
	if cl.conn != nil {
		return cl.conn, nil
	}
	if cl.lastDial != nil && time.Since(cl.lastDialAt) < fwdRedialAfter {
		return nil, &retryableError{cl.lastDial}
	}
	c, err := cl.n.dialPeer(cl.addr, tagForward, nil, dialTimeout)
	cl.lastDialAt = time.Now()
	cl.lastDial = err
	if err != nil {
		return nil, &retryableError{err}
	}
	fc := &fwdConn{
		cl:      cl,
		c:       c,
		out:     make(chan []byte, fwdOutQueue),
		done:    make(chan struct{}),
		pending: make(map[uint64]*fwdPending),
		busy:    make(chan struct{}, 1),
	}
	fc.lastRead.Store(time.Now().UnixNano())
	started := cl.n.goTracked(fc.writeLoop) &&
		cl.n.goTracked(func() { fc.readLoop(bufio.NewReaderSize(c, 64<<10)) }) &&
		cl.n.goTracked(fc.sweepLoop)
	cl.conn = fc
	if !started {
		fc.teardown(ErrClosed)
		return nil, ErrClosed
	}
	return fc, nil
}

// register adds a pending request and returns its id; false if the connection is dead.
func (fc *fwdConn) register(pd *fwdPending) (uint64, bool) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.dead {
		return 0, false
	}
	fc.nextID++
	pd.sent = time.Now()
	fc.pending[fc.nextID] = pd
	if len(fc.pending) == 1 {
		select {
		case fc.busy <- struct{}{}:
		default:
		}
	}
	return fc.nextID, true
}

func (fc *fwdConn) unregister(id uint64) *fwdPending {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	pd := fc.pending[id]
	delete(fc.pending, id)
	return pd
}

// send queues a frame; when the connection breaks first, teardown has already taken over the request.
func (fc *fwdConn) send(frame []byte) {
	select {
	case fc.out <- frame:
	case <-fc.done:
	}
}

func encodeRequest(kind byte, id, group uint64, timeout time.Duration, payload func([]byte) []byte, size int) []byte {
	body := make([]byte, 0, 1+3*binary.MaxVarintLen64+size)
	body = append(body, kind)
	body = binary.AppendUvarint(body, id)
	body = binary.AppendUvarint(body, group)
	ms := max(timeout.Milliseconds(), 1)
	body = binary.AppendUvarint(body, uint64(ms))
	body = payload(body)
	return appendFrame(make([]byte, 0, len(body)+binary.MaxVarintLen64), body)
}

// propose forwards p for group g.
func (cl *fwdClient) propose(g *Group, p *proposal) error {
	fc, err := cl.getConn()
	if err != nil {
		return err
	}
	id, ok := fc.register(&fwdPending{g: g, p: p, deadline: p.deadline})
	if !ok {
		return &retryableError{errors.New("forward connection broken")}
	}
	fc.send(encodeRequest(fwdPropose, id, g.id, time.Until(p.deadline),
		func(b []byte) []byte { return append(b, p.cmd...) }, len(p.cmd)))
	return nil
}

// membership forwards a configuration change of group g to the leader and waits for its answer.
func (cl *fwdClient) membership(ctx context.Context, g *Group, op byte, id, addr string) error {
	fc, err := cl.getConn()
	if err != nil {
		return err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(membershipTimeout)
	}
	reply := make(chan fwdReply, 1)
	rid, ok := fc.register(&fwdPending{g: g, reply: reply, deadline: deadline})
	if !ok {
		return &retryableError{errors.New("forward connection broken")}
	}
	fc.send(encodeRequest(op, rid, g.id, time.Until(deadline), func(b []byte) []byte {
		return appendBytes(appendBytes(b, []byte(id)), []byte(addr))
	}, len(id)+len(addr)+4))
	select {
	case r := <-reply:
		switch {
		case r.err != nil:
			return r.err
		case r.code == codeOK || r.code == codeOKData:
			return nil
		case r.code == codeRetry:
			return &retryableError{fmt.Errorf("leader %s: %s", cl.addr, r.data)}
		default:
			return fmt.Errorf("leader %s: %s", cl.addr, r.data)
		}
	case <-ctx.Done():
		fc.unregister(rid)
		return ctx.Err()
	}
}

func (fc *fwdConn) writeLoop() {
	bw := bufio.NewWriterSize(fc.c, 64<<10)
	for {
		select {
		case f := <-fc.out:
			_, err := bw.Write(f)
			for more := err == nil; more; {
				select {
				case f := <-fc.out:
					_, err = bw.Write(f)
					more = err == nil
				default:
					more = false
				}
			}
			if err == nil {
				err = bw.Flush()
			}
			if err != nil {
				fc.teardown(err)
				return
			}
		case <-fc.done:
			return
		}
	}
}

func (fc *fwdConn) readLoop(br *bufio.Reader) {
	for {
		body, err := readFrame(br)
		if err != nil {
			fc.teardown(err)
			return
		}
		fc.lastRead.Store(time.Now().UnixNano())
		d := decoder{b: body}
		id := d.uvarint()
		code := d.byte()
		index := d.uvarint()
		if d.err != nil {
			fc.teardown(d.err)
			return
		}
		if pd := fc.unregister(id); pd != nil {
			fc.deliver(pd, fwdReply{code: code, index: index, data: d.b})
		}
	}
}

// deliver completes a pending request with the leader's answer.
func (fc *fwdConn) deliver(pd *fwdPending, r fwdReply) {
	if pd.p == nil {
		pd.reply <- r
		return
	}
	g, p := pd.g, pd.p
	switch {
	case r.err != nil:
		p.lastErr = r.err
		g.retryLater(p)
	case r.code == codeOK:
		g.finish(p, Result{Index: r.index}, nil)
	case r.code == codeOKData:
		g.finish(p, Result{Index: r.index, Data: r.data}, nil)
	case r.code == codeApplyErr:
		g.finish(p, Result{Index: r.index}, &ApplyError{Msg: string(r.data)})
	case r.code == codeRetry:
		p.lastErr = fmt.Errorf("leader %s: %s", fc.cl.addr, r.data)
		g.retryLater(p)
	default:
		g.finish(p, Result{}, fmt.Errorf("cluster: group %d (%s): propose via %s: %s", g.id, g.name, fc.cl.addr, r.data))
	}
}

// sweepLoop fails forwarded requests whose deadline passed without an answer, and tears the
// connection down when it has stalled (see stalled). It ticks only while requests are pending.
func (fc *fwdConn) sweepLoop() {
	t := time.NewTicker(fwdSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-fc.done:
			return
		case now := <-t.C:
			if fc.stalled(now) {
				fc.teardown(fmt.Errorf("no answer for %v from %s, which answers no pings", suspectAfter, fc.cl.addr))
				return
			}
			var expired []*fwdPending
			fc.mu.Lock()
			for id, pd := range fc.pending {
				if (pd.p != nil && pd.p.expired(now)) || (pd.p == nil && now.After(pd.deadline)) {
					expired = append(expired, pd)
					delete(fc.pending, id)
				}
			}
			idle := len(fc.pending) == 0
			fc.mu.Unlock()
			for _, pd := range expired {
				if pd.p != nil {
					pd.p.lastErr = fmt.Errorf("no answer from leader %s", fc.cl.addr)
					pd.g.finish(pd.p, Result{}, pd.g.noLeaderErr(pd.p))
				} else {
					pd.reply <- fwdReply{err: &retryableError{fmt.Errorf("no answer from leader %s", fc.cl.addr)}}
				}
			}
			if idle {
				t.Stop()
				select {
				case <-fc.done:
					return
				case <-fc.busy:
				}
				t.Reset(fwdSweepInterval)
			}
		}
	}
}

// stalled reports whether a request has waited suspectAfter and nothing was read from the peer
// for as long, while the peer answers no pings either. A partitioned peer resets no connection:
// without this its requests would wait for their deadlines (and fail) although the groups elect a
// new leader within seconds. The teardown hands them back for a retry at whichever node leads
// then, as after a reset (the state machines dedupe a command applied twice). A slow peer that
// still answers something, or still answers pings, keeps its connection.
func (fc *fwdConn) stalled(now time.Time) bool {
	if now.Sub(time.Unix(0, fc.lastRead.Load())) < suspectAfter {
		return false
	}
	waiting := false
	fc.mu.Lock()
	for _, pd := range fc.pending {
		if now.Sub(pd.sent) >= suspectAfter {
			waiting = true
			break
		}
	}
	fc.mu.Unlock()
	return waiting && fc.cl.n.live.suspectedAddr(fc.cl.addr)
}

// teardown closes the connection once and hands every pending request back for a retry.
func (fc *fwdConn) teardown(cause error) {
	fc.once.Do(func() {
		fc.mu.Lock()
		fc.dead = true
		pending := fc.pending
		fc.pending = nil
		fc.mu.Unlock()
		close(fc.done)
		_ = fc.c.Close()
		fc.cl.mu.Lock()
		if fc.cl.conn == fc {
			fc.cl.conn = nil
		}
		fc.cl.mu.Unlock()
		err := &retryableError{fmt.Errorf("forward connection to %s: %w", fc.cl.addr, cause)}
		for _, pd := range pending {
			fc.deliver(pd, fwdReply{err: err})
		}
	})
}

// close tears down the client's connection for good.
func (cl *fwdClient) close() {
	cl.mu.Lock()
	cl.closed = true
	fc := cl.conn
	cl.mu.Unlock()
	if fc != nil {
		fc.teardown(ErrClosed)
	}
}

// cancelForwards fails the forwarded requests of group g (being closed).
func (n *Node) cancelForwards(g *Group) {
	n.mu.Lock()
	clients := make([]*fwdClient, 0, len(n.fwd))
	for _, c := range n.fwd {
		clients = append(clients, c)
	}
	n.mu.Unlock()
	closedErr := fmt.Errorf("cluster: group %d (%s): %w", g.id, g.name, ErrClosed)
	for _, cl := range clients {
		cl.mu.Lock()
		fc := cl.conn
		cl.mu.Unlock()
		if fc == nil {
			continue
		}
		var mine []*fwdPending
		fc.mu.Lock()
		for id, pd := range fc.pending {
			if pd.g == g {
				mine = append(mine, pd)
				delete(fc.pending, id)
			}
		}
		fc.mu.Unlock()
		for _, pd := range mine {
			if pd.p != nil {
				g.finish(pd.p, Result{}, closedErr)
			} else {
				pd.reply <- fwdReply{err: closedErr}
			}
		}
	}
}

// serveForward serves one accepted forward connection: it applies the requests in order and answers them
// (pipelined, in log order per group).
func (n *Node) serveForward(c net.Conn, br *bufio.Reader) {
	out := make(chan []byte, fwdOutQueue)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		bw := bufio.NewWriterSize(c, 64<<10)
		var werr error
		for f := range out {
			if werr != nil {
				continue // the connection is broken: drain and discard
			}
			_, werr = bw.Write(f)
			if werr == nil && len(out) == 0 {
				werr = bw.Flush()
			}
			if werr != nil {
				_ = c.Close()
			}
		}
	}()
	// Forwarded proposals are awaited by their group's local waiter (in log order, with the group's
	// own proposals): no goroutine per group and connection. wg counts the answers still to come.
	var wg sync.WaitGroup
	for {
		body, err := readFrame(br)
		if err != nil {
			break
		}
		d := decoder{b: body}
		kind := d.byte()
		id := d.uvarint()
		gid := d.uvarint()
		timeout := min(time.Duration(d.uvarint())*time.Millisecond, fwdMaxApplyWait)
		if d.err != nil {
			break
		}
		g := n.Group(gid)
		if g == nil {
			out <- encodeResponse(id, codeRetry, 0, []byte(fmt.Sprintf("group %d is not running on node %s", gid, n.cfg.NodeID)))
			continue
		}
		switch kind {
		case fwdPropose:
			if !g.IsLeader() {
				out <- encodeResponse(id, codeRetry, 0, []byte("node "+n.cfg.NodeID+" is not the leader"))
				continue
			}
			wg.Add(1)
			if !g.applyForwarded(d.b, timeout, func(f raft.ApplyFuture) {
				defer wg.Done()
				out <- futureResponse(id, f)
			}) {
				wg.Done()
				out <- encodeResponse(id, codeRetry, 0, []byte("group closing on node "+n.cfg.NodeID))
			}
		case fwdAddVoter, fwdAddNonvoter, fwdRemoveServer, fwdDemoteVoter, fwdTransferLeader:
			sid, addr := string(d.bytes()), string(d.bytes())
			if d.err != nil {
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := g.changeLocal(kind, sid, addr, timeout)
				switch {
				case err == nil:
					out <- encodeResponse(id, codeOK, 0, nil)
				case retryable(err):
					out <- encodeResponse(id, codeRetry, 0, []byte(err.Error()))
				default:
					out <- encodeResponse(id, codeFail, 0, []byte(err.Error()))
				}
			}()
		default:
			out <- encodeResponse(id, codeFail, 0, []byte(fmt.Sprintf("unknown request kind %d", kind)))
		}
	}
	_ = c.Close()
	wg.Wait()
	close(out)
	<-writerDone
}

func futureResponse(id uint64, f raft.ApplyFuture) []byte {
	if err := f.Error(); err != nil {
		return encodeResponse(id, codeRetry, 0, []byte(err.Error()))
	}
	switch v := f.Response().(type) {
	case []byte:
		return encodeResponse(id, codeOKData, f.Index(), v)
	case error:
		return encodeResponse(id, codeApplyErr, f.Index(), []byte(v.Error()))
	}
	return encodeResponse(id, codeOK, f.Index(), nil)
}

func encodeResponse(id uint64, code byte, index uint64, data []byte) []byte {
	body := make([]byte, 0, 1+2*binary.MaxVarintLen64+len(data))
	body = binary.AppendUvarint(body, id)
	body = append(body, code)
	body = binary.AppendUvarint(body, index)
	body = append(body, data...)
	return appendFrame(make([]byte, 0, len(body)+binary.MaxVarintLen64), body)
}

// changeLocal applies a configuration change on this node (which must lead the group).
func (g *Group) changeLocal(op byte, id, addr string, timeout time.Duration) error {
	var f raft.IndexFuture
	switch op {
	case fwdAddVoter:
		f = g.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeout)
	case fwdAddNonvoter:
		f = g.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeout)
	case fwdRemoveServer:
		f = g.raft.RemoveServer(raft.ServerID(id), 0, timeout)
	case fwdDemoteVoter:
		f = g.raft.DemoteVoter(raft.ServerID(id), 0, timeout)
	case fwdTransferLeader:
		if id == g.n.cfg.NodeID {
			return nil // done meanwhile (a retry reached the new leader)
		}
		return g.raft.LeadershipTransferToServer(raft.ServerID(id), raft.ServerAddress(addr)).Error()
	default:
		return fmt.Errorf("unknown configuration change %d", op)
	}
	return f.Error()
}

// membership runs a configuration change on the leader (here or forwarded), retrying until ctx ends.
func (g *Group) membership(ctx context.Context, op byte, what, id, addr string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, membershipTimeout)
		defer cancel()
	}
	var last error
	for {
		g.submitMu.RLock()
		closed := g.closed
		g.submitMu.RUnlock()
		if closed {
			return fmt.Errorf("cluster: group %d (%s): %s %s: %w", g.id, g.name, what, id, ErrClosed)
		}
		var err error
		if g.IsLeader() {
			dl, _ := ctx.Deadline()
			err = g.changeLocal(op, id, addr, time.Until(dl))
		} else if laddr, lid := g.raft.LeaderWithID(); lid != "" && string(lid) != g.n.cfg.NodeID && !g.n.single() {
			err = g.n.client(string(laddr)).membership(ctx, g, op, id, addr)
		} else {
			err = &retryableError{errors.New("no leader known")}
		}
		if err == nil {
			return nil
		}
		if !retryable(err) && ctx.Err() == nil {
			return fmt.Errorf("cluster: group %d (%s): %s %s: %w", g.id, g.name, what, id, err)
		}
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			last = err
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("cluster: group %d (%s): %s %s: %w (last error: %v)", g.id, g.name, what, id, ErrNoLeader, last)
		case <-g.stop:
			t.Stop()
			return fmt.Errorf("cluster: group %d (%s): %s %s: %w", g.id, g.name, what, id, ErrClosed)
		case <-t.C:
		}
	}
}

// AddVoter adds node id at addr to the group as a voter (forwarded to the leader if needed).
func (g *Group) AddVoter(ctx context.Context, id, addr string) error {
	return g.membership(ctx, fwdAddVoter, "add voter", id, addr)
}

// AddNonvoter adds node id at addr to the group as a nonvoter (forwarded to the leader if needed).
func (g *Group) AddNonvoter(ctx context.Context, id, addr string) error {
	return g.membership(ctx, fwdAddNonvoter, "add nonvoter", id, addr)
}

// RemoveServer removes node id from the group (forwarded to the leader if needed).
func (g *Group) RemoveServer(ctx context.Context, id string) error {
	return g.membership(ctx, fwdRemoveServer, "remove server", id, "")
}

// DemoteVoter makes voter id a nonvoter: it keeps its replica (and receives the log) but no
// longer counts for the group's quorum (forwarded to the leader if needed).
func (g *Group) DemoteVoter(ctx context.Context, id string) error {
	return g.membership(ctx, fwdDemoteVoter, "demote voter", id, "")
}

// TransferLeadership asks the group's leader (here or forwarded) to hand its leadership to voter
// id at addr, and waits until the transfer is done or failed.
func (g *Group) TransferLeadership(ctx context.Context, id, addr string) error {
	if g.Leader() == id {
		return nil
	}
	return g.membership(ctx, fwdTransferLeader, "transfer leadership to", id, addr)
}
