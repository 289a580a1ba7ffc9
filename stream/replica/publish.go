package replica

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"warren/stream"
)

// Publishing. Every publish of this node goes through one ordered pipeline per stream: to the
// local log while this replica leads, else forwarded to the leader's node over one pipelined
// connection. Each record carries this node's writer id and a sequence number that grows by one
// per record, so the leader stores a publish retried after a leader change once, and refuses one
// that would leave a hole (stream.ErrGap: an earlier publish of this node is still unresolved);
// the pipeline then sends everything unfinished again, in order, so the sequence of a writer is
// stored without gaps or reordering. A publish that finds no leader within PublishTimeout fails,
// and with it every publish still waiting (the pipeline starts a new writer id).

// pubReq is one publish in the pipeline.
type pubReq struct {
	recs     []stream.Record
	done     func(error)
	deadline time.Time
	state    atomic.Int32  // reqPending, reqFinished, reqFailed
	gen      atomic.Uint64 // the send attempt whose outcome counts
}

const (
	reqPending int32 = iota
	reqFinished
	reqFailed // failed in a way a resend may fix
)

func (p *pubReq) finish(err error) bool {
	for {
		s := p.state.Load()
		if s == reqFinished {
			return false
		}
		if p.state.CompareAndSwap(s, reqFinished) {
			if p.done != nil {
				p.done(err)
			}
			return true
		}
	}
}

// pipeline orders this node's publishes to the stream.
type pipeline struct {
	r *Replica

	mu         sync.Mutex
	pending    []*pubReq // unfinished publishes in order (finished ones are popped from the front)
	sent       int       // pending[:sent] were sent to target
	target     string    // "" = none, self = the local log
	gen        uint64
	writerID   string
	session    int
	nextSeq    uint64
	fwd        *fwdConn
	closed     bool
	closedFlag atomic.Bool   // closed, for outcome callbacks (which must not take mu)
	notify     chan struct{} // capacity 1
	ticking    atomic.Bool   // run's ticker is on; a publish that finds it off wakes run
	done       chan struct{}
	fwdWG      sync.WaitGroup
	inflightN  atomic.Int64 // sends whose outcome is not in yet
}

func (p *pipeline) init(r *Replica) {
	p.r = r
	p.notify = make(chan struct{}, 1)
	p.done = make(chan struct{})
	p.newSessionLocked()
}

func (p *pipeline) newSessionLocked() {
	p.session++
	p.writerID = p.r.cfg.WriterID + "/" + strconv.Itoa(p.session)
	p.nextSeq = 0
}

func (p *pipeline) wake() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// Publish appends recs through the leader; done runs once, when they are committed (nil) or
// failed. The replica keeps recs until done runs.
func (r *Replica) Publish(recs []stream.Record, done func(error)) {
	if r.cfg.Coord == nil {
		r.log.Append(recs, func(_ uint64, err error) {
			if done != nil {
				done(err)
			}
		})
		return
	}
	p := &r.pub
	req := &pubReq{recs: recs, done: done, deadline: time.Now().Add(r.cfg.PublishTimeout)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		if done != nil {
			done(ErrClosed)
		}
		return
	}
	for i := range recs {
		p.nextSeq++
		recs[i].WriterID, recs[i].WriterSeq = p.writerID, p.nextSeq
	}
	p.popFinishedLocked()
	p.pending = append(p.pending, req)
	if p.sent == len(p.pending)-1 && p.target == r.cfg.Self && r.Leading() {
		p.sendLocked(req) // the direct path: nothing queued, this replica leads
		p.sent++
		p.mu.Unlock()
		if !p.ticking.Load() {
			p.wake() // so that run ticks (and expires req) until it is finished
		}
		return
	}
	p.mu.Unlock()
	p.wake()
}

// popFinishedLocked drops the finished publishes at the front (p.mu held).
func (p *pipeline) popFinishedLocked() {
	n := 0
	for n < len(p.pending) && p.pending[n].state.Load() == reqFinished {
		n++
	}
	if n > 0 {
		clear(p.pending[:n])
		p.pending = p.pending[n:]
		p.sent -= min(n, p.sent)
	}
}

// sendLocked sends req to the current target (p.mu held). A publish with nothing unfinished
// before it lifts the leader's gap check: its earlier records may have been dropped as
// duplicates, which leaves numbers unused.
func (p *pipeline) sendLocked(req *pubReq) {
	if len(req.recs) > 0 {
		req.recs[0].WriterResync = len(p.pending) > 0 && p.pending[0] == req
	}
	p.gen++
	g := p.gen
	req.gen.Store(g)
	req.state.Store(reqPending)
	p.inflightN.Add(1)
	outcome := func(err error) {
		p.inflightN.Add(-1)
		p.outcome(req, g, err)
	}
	if p.target == p.r.cfg.Self {
		p.r.log.Append(req.recs, func(_ uint64, err error) { outcome(err) })
		return
	}
	p.fwd.send(req, outcome)
}

// outcome records the result of send attempt g of req.
func (p *pipeline) outcome(req *pubReq, g uint64, err error) {
	if err == nil {
		req.finish(nil) // stored and committed: whatever attempt said so
		p.wake()
		return
	}
	if p.closedFlag.Load() && req.gen.Load() == g {
		req.finish(ErrClosed)
		return
	}
	if req.gen.Load() == g {
		req.state.CompareAndSwap(reqPending, reqFailed)
	}
	p.wake()
}

// pipelineTick is how often a pipeline with unfinished publishes looks again for a leader to
// send them to and for publishes past their deadline.
const pipelineTick = 50 * time.Millisecond

// run is the pipeline's goroutine: it pops finished publishes, expires old ones, and (re)sends
// the rest to the current leader. It ticks only while publishes are unfinished: an idle stream's
// pipeline sleeps until a publish or an outcome wakes it, so that idle streams cost nothing.
func (p *pipeline) run() {
	defer p.r.wg.Done()
	tick := time.NewTicker(pipelineTick)
	defer tick.Stop()
	ticking := true
	p.ticking.Store(true)
	for {
		select {
		case <-p.r.stop:
			return
		case <-p.notify:
		case <-tick.C:
		}
		p.step()
		busy := p.unfinished()
		if !busy {
			// Off first, then look again: a publish that took the direct path after that look
			// finds the flag off and wakes this loop.
			p.ticking.Store(false)
			busy = p.unfinished()
		}
		if busy {
			p.ticking.Store(true)
		}
		if busy != ticking {
			if busy {
				tick.Reset(pipelineTick)
			} else {
				tick.Stop()
			}
			ticking = busy
		}
	}
}

// unfinished reports whether publishes wait in the pipeline.
func (p *pipeline) unfinished() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending) > 0
}

func (p *pipeline) step() {
	r := p.r
	var expired []*pubReq
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.popFinishedLocked()
	// A publish past its deadline fails, and so does everything still waiting: a new writer id
	// starts, so that the next publishes leave no gap behind the abandoned ones.
	if len(p.pending) > 0 && time.Now().After(p.pending[0].deadline) {
		expired = p.pending
		p.pending, p.sent = nil, 0
		p.newSessionLocked()
	}
	// A failed send: everything from the first failed publish is sent again.
	for i := 0; i < p.sent; i++ {
		if p.pending[i].state.Load() == reqFailed {
			p.sent = i
			break
		}
	}
	target := r.cfg.Self
	if !r.Leading() {
		target = r.cfg.Coord.Leader()
		if target == r.cfg.Self {
			target = "" // this node is about to lead: wait for it
		}
	}
	if target != p.target {
		// Only once everything sent to the old target has an outcome, or a resend could overtake
		// a publish the old target may still store.
		if p.inflightN.Load() > 0 && p.target != "" {
			if p.fwd != nil && p.target != target {
				p.fwd.close() // a dead or deposed leader: its pending sends fail now
			}
			p.mu.Unlock()
			p.failExpired(expired)
			return
		}
		if p.fwd != nil {
			p.fwd.close()
			p.fwd = nil
		}
		p.target = target
		p.sent = 0
	}
	// The forwarding connection is opened when there is something to send: a follower node's
	// pipeline of a stream nobody publishes to through it holds none.
	if target != "" && target != r.cfg.Self && p.sent < len(p.pending) && (p.fwd == nil || p.fwd.dead()) {
		if p.fwd != nil {
			if p.inflightN.Load() > 0 {
				p.mu.Unlock()
				p.failExpired(expired)
				return
			}
			p.sent = 0
		}
		p.fwd = p.dial(target)
		if p.fwd == nil {
			p.mu.Unlock()
			p.failExpired(expired)
			return
		}
	}
	if target != "" {
		for ; p.sent < len(p.pending); p.sent++ {
			if req := p.pending[p.sent]; req.state.Load() != reqFinished {
				p.sendLocked(req)
			}
		}
	}
	p.mu.Unlock()
	p.failExpired(expired)
}

func (p *pipeline) failExpired(expired []*pubReq) {
	for _, req := range expired {
		req.finish(ErrNoLeader)
	}
}

// dial opens the forwarding connection to node (p.mu held; the dial is bounded).
func (p *pipeline) dial(node string) *fwdConn {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := p.r.cfg.Transport.Dial(ctx, node, KindPublish)
	if err != nil {
		p.r.logger.Debug("stream publish: cannot reach the leader", "leader", node, "err", err)
		return nil
	}
	fc := &fwdConn{p: p, c: c, pending: make(map[uint64]func(error)), out: make(chan []byte, 256), quit: make(chan struct{})}
	p.fwdWG.Add(2)
	go fc.readLoop()
	go fc.writeLoop()
	return fc
}

// close fails every publish still waiting (ErrClosed) and stops the forwarding connection.
func (p *pipeline) close() {
	p.mu.Lock()
	p.closed = true
	p.closedFlag.Store(true)
	rest := p.pending
	p.pending = nil
	fwd := p.fwd
	p.fwd = nil
	p.mu.Unlock()
	if fwd != nil {
		fwd.close()
	}
	p.fwdWG.Wait()
	for _, req := range rest {
		req.finish(ErrClosed)
	}
}

// fwdConn is a forwarding connection to the leader's node.
type fwdConn struct {
	p    *pipeline
	c    net.Conn
	out  chan []byte
	quit chan struct{}
	once sync.Once

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]func(error)
	isDead  bool
}

func (fc *fwdConn) dead() bool {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.isDead
}

// send forwards a publish; outcome runs once with its result (an error if the connection fails).
func (fc *fwdConn) send(req *pubReq, outcome func(error)) {
	fc.mu.Lock()
	if fc.isDead {
		fc.mu.Unlock()
		outcome(errors.New("forwarding connection closed"))
		return
	}
	fc.nextID++
	id := fc.nextID
	fc.pending[id] = outcome
	fc.mu.Unlock()
	var e enc
	e.u64(id)
	encodeRecords(&e, req.recs)
	frame := appendFrame(nil, frPublish, e.b)
	select {
	case fc.out <- frame:
	case <-fc.quit:
		fc.fail(id, errors.New("forwarding connection closed"))
	}
}

func (fc *fwdConn) fail(id uint64, err error) {
	fc.mu.Lock()
	f := fc.pending[id]
	delete(fc.pending, id)
	fc.mu.Unlock()
	if f != nil {
		f(err)
	}
}

func (fc *fwdConn) writeLoop() {
	defer fc.p.fwdWG.Done()
	w := bufio.NewWriterSize(fc.c, 256<<10)
	for {
		select {
		case <-fc.quit:
			return
		case b := <-fc.out:
			if _, err := w.Write(b); err != nil {
				fc.close()
				return
			}
			for more := true; more; {
				select {
				case b := <-fc.out:
					if _, err := w.Write(b); err != nil {
						fc.close()
						return
					}
				default:
					more = false
				}
			}
			if err := w.Flush(); err != nil {
				fc.close()
				return
			}
		}
	}
}

func (fc *fwdConn) readLoop() {
	defer fc.p.fwdWG.Done()
	br := bufio.NewReaderSize(fc.c, 64<<10)
	for {
		typ, body, err := readFrame(br)
		if err != nil {
			fc.close()
			return
		}
		if typ != frResult {
			fc.close()
			return
		}
		d := dec{b: body}
		id, code, msg := d.u64(), d.byte(), d.str()
		if d.done() != nil {
			fc.close()
			return
		}
		var rerr error
		switch code {
		case resultOK:
		case resultRetry:
			rerr = fmt.Errorf("leader: %s", msg)
		default:
			rerr = fmt.Errorf("%w: %s", errPublishFailed, msg)
		}
		fc.fail(id, rerr)
	}
}

// errPublishFailed is a leader's refusal that a resend cannot fix (still retried until the
// deadline: the next leader may take it).
var errPublishFailed = errors.New("replica: publish failed on the leader")

// close ends the connection; every publish without a result fails (and is sent again).
func (fc *fwdConn) close() {
	fc.once.Do(func() {
		fc.mu.Lock()
		fc.isDead = true
		rest := fc.pending
		fc.pending = make(map[uint64]func(error))
		fc.mu.Unlock()
		close(fc.quit)
		_ = fc.c.Close()
		for _, f := range rest {
			f(errors.New("forwarding connection closed"))
		}
		fc.p.wake()
	})
}

// Result codes of forwarded publishes.
const (
	resultOK    byte = 0
	resultRetry byte = 1
	resultFail  byte = 2
)

// servePublish is the leader's side of a forwarding connection. Results are queued without
// bound (they are small and their number is bounded by what the forwarder sent): Append's
// callbacks run on the storage goroutine and must not wait for a slow connection.
func (r *Replica) servePublish(c net.Conn, br *bufio.Reader) {
	var (
		qmu     sync.Mutex
		queue   []byte
		wakeW   = make(chan struct{}, 1)
		quit    = make(chan struct{})
		wg      sync.WaitGroup
		pending sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		w := bufio.NewWriterSize(c, 64<<10)
		var buf []byte
		for {
			select {
			case <-quit:
				return
			case <-wakeW:
			}
			qmu.Lock()
			buf, queue = queue, buf[:0]
			qmu.Unlock()
			if _, err := w.Write(buf); err == nil {
				if err = w.Flush(); err != nil {
					_ = c.Close()
					return
				}
			} else {
				_ = c.Close()
				return
			}
		}
	}()
	reply := func(id uint64, code byte, msg string) {
		var e enc
		e.u64(id)
		e.byte(code)
		e.str(msg)
		qmu.Lock()
		queue = appendFrame(queue, frResult, e.b)
		qmu.Unlock()
		select {
		case wakeW <- struct{}{}:
		default:
		}
	}
	defer func() {
		pending.Wait() // every Append answered (or the log closed) before the writer stops
		close(quit)
		wg.Wait()
	}()
	for {
		typ, body, err := readFrame(br)
		if err != nil || typ != frPublish {
			return
		}
		d := dec{b: body}
		id := d.u64()
		recs := decodeRecords(&d)
		if d.done() != nil {
			return
		}
		if !r.Leading() {
			reply(id, resultRetry, "not the leader")
			continue
		}
		pending.Add(1)
		r.log.Append(recs, func(_ uint64, err error) {
			defer pending.Done()
			switch {
			case err == nil:
				reply(id, resultOK, "")
			case errors.Is(err, stream.ErrNotLeader), errors.Is(err, stream.ErrGap), errors.Is(err, stream.ErrClosed):
				reply(id, resultRetry, err.Error())
			default:
				reply(id, resultFail, err.Error())
			}
		})
	}
}
