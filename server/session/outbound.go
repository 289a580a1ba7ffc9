package session

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"warren/amqp"
	"warren/server/queue"
)

// Outbound buffering limits per connection. Above highWater, queues stop handing this connection
// new deliveries (Reserve fails) until the writer has drained it below lowWater.
const (
	highWater = 1 << 20
	lowWater  = 256 << 10
	// spareMax caps the buffer kept for reuse after a large burst.
	spareMax = 4 << 20
)

// writerIdle is how long a writer goroutine waits for more output before it exits; the next frame
// starts a new one. Idle connections then cost no goroutine on the send side.
const writerIdle = 100 * time.Millisecond

// inlineGap is how long a connection must have been quiet for an append to be written at once by
// the appending goroutine (see tryInline).
const inlineGap = 100 * time.Microsecond

// inlineMax bounds what an appending goroutine writes itself; more goes to the writer goroutine.
const inlineMax = 64 << 10

// outbound is a connection's send side: everyone appends encoded frames under mu, and a writer
// goroutine swaps the buffer out and writes it with one syscall, so frames batch by themselves. The
// writer is started when there is something to write and exits after writerIdle without output.
// On a quiet connection the appending goroutine writes instead, without waiting (tryInline).
type outbound struct {
	nc       net.Conn
	raw      syscall.RawConn // nc's descriptor, for non-blocking inline writes; nil if it has none
	frameMax uint32          // set once after tune, before any delivery

	mu         sync.Mutex
	buf        []byte
	spare      []byte
	closing    bool // no new frames; the writer exits once flushed
	failed     bool
	running    bool // a writer goroutine is active
	writing    bool // a write (the writer goroutine's or an inline one) is under way
	blocked    map[queue.Kicker]struct{}
	pending    atomic.Int64 // len(buf) plus the bytes being written (see writingLen)
	writingLen int          // bytes taken out of buf by the write under way
	lastSend   atomic.Int64 // unix nanos of the last write, for heartbeats

	// confirmsDue are the channels whose confirms became due from commit callbacks; the writer
	// encodes them just before it writes (confirms.complete).
	confirmsDue []*channel

	heartbeat time.Duration
	hbTimer   *time.Timer

	kick chan struct{}
	wg   sync.WaitGroup // the writer goroutines
}

func newOutbound(nc net.Conn) *outbound {
	o := &outbound{
		nc:       nc,
		frameMax: 131072,
		kick:     make(chan struct{}, 1),
	}
	if sc, ok := nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			o.raw = raw
		}
	}
	return o
}

// signal wakes the writer, starting one if none runs.
func (o *outbound) signal() {
	o.mu.Lock()
	o.wakeLocked()
}

// wakeLocked is signal with mu held; it releases mu.
func (o *outbound) wakeLocked() {
	if !o.running && (len(o.buf) > 0 || len(o.confirmsDue) > 0 || o.closing) && !o.failed {
		o.running = true
		o.wg.Add(1)
		go o.run()
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// queueConfirms asks the writer to send ch's due confirms when it next runs, starting a writer if
// none runs. It reports false (and queues nothing) when the connection takes no more frames.
// Called with ch.confirms.mu held.
func (o *outbound) queueConfirms(ch *channel) bool {
	o.mu.Lock()
	if o.closing || o.failed {
		o.mu.Unlock()
		return false
	}
	o.confirmsDue = append(o.confirmsDue, ch)
	o.wakeLocked()
	return true
}

// sendConfirmsDue encodes the confirms of the channels queued by queueConfirms (writer goroutine,
// mu held on entry and on return; released meanwhile, as confirms.mu comes first).
func (o *outbound) sendConfirmsDue() {
	for len(o.confirmsDue) > 0 {
		due := o.confirmsDue
		o.confirmsDue = nil
		o.mu.Unlock()
		for i, ch := range due {
			ch.confirms.flushQueued(ch)
			due[i] = nil
		}
		o.mu.Lock()
		if o.confirmsDue == nil {
			o.confirmsDue = due[:0]
		}
	}
}

// startHeartbeats sends a heartbeat whenever nothing was written for half the interval.
func (o *outbound) startHeartbeats(hb time.Duration) {
	if hb <= 0 {
		return
	}
	o.lastSend.Store(time.Now().UnixNano())
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closing || o.failed {
		return
	}
	o.heartbeat = hb
	o.hbTimer = time.AfterFunc(hb/2, o.beat)
}

func (o *outbound) beat() {
	half := o.heartbeat / 2
	if idle := time.Duration(time.Now().UnixNano() - o.lastSend.Load()); idle >= half {
		if o.lockAppend() {
			o.buf = amqp.AppendHeartbeat(o.buf)
			o.lastSend.Store(time.Now().UnixNano())
			o.unlockAppend()
		}
	}
	o.mu.Lock()
	if !o.closing && !o.failed && o.hbTimer != nil {
		next := half - time.Duration(time.Now().UnixNano()-o.lastSend.Load())
		if next < time.Millisecond {
			next = time.Millisecond
		}
		o.hbTimer.Reset(next)
	}
	o.mu.Unlock()
}

// lockAppend locks the buffer for appending; it returns false (and stays unlocked) if the connection
// no longer accepts frames.
func (o *outbound) lockAppend() bool {
	o.mu.Lock()
	if o.closing || o.failed {
		o.mu.Unlock()
		return false
	}
	return true
}

// unlockAppend publishes what was appended and wakes the writer.
func (o *outbound) unlockAppend() {
	o.pending.Store(int64(len(o.buf) + o.writingLen))
	o.mu.Unlock()
	o.signal()
}

// unlockAppendDelivery is unlockAppend for a delivery: on a quiet connection it is written at
// once (tryInline). Other output keeps to the writer goroutine, so that goroutines others wait
// on (a quorum queue's Raft apply loop sending confirms, say) never spend time in a system call.
func (o *outbound) unlockAppendDelivery() {
	o.pending.Store(int64(len(o.buf) + o.writingLen))
	if o.tryInline() {
		return
	}
	o.mu.Unlock()
	o.signal()
}

// tryInline is called with mu held after an append. If the connection has been quiet for
// inlineGap and nothing is being written, it writes the buffer on the caller's goroutine with one
// non-blocking system call, releasing mu, and reports true. A message to an idle consumer then
// leaves without waking the writer goroutine: on a small machine each thread wake-up is a good
// part of the delivery latency. What the socket does not take at once is put back for the writer
// goroutine. Busy connections keep batching in the writer goroutine.
func (o *outbound) tryInline() bool {
	if o.raw == nil || o.writing || o.closing || len(o.buf) > inlineMax ||
		time.Duration(time.Now().UnixNano()-o.lastSend.Load()) < inlineGap {
		return false
	}
	b := o.buf
	o.buf = o.spare[:0]
	o.spare = nil
	o.writing = true
	o.writingLen = len(b)
	o.mu.Unlock()

	n := 0
	var werr error
	if err := o.raw.Write(func(fd uintptr) bool {
		n, werr = syscall.Write(int(fd), b)
		return true // one attempt: never wait for the socket to become writable
	}); err != nil {
		werr = err
	}
	if n < 0 {
		n = 0
	}
	if werr != nil && !errors.Is(werr, syscall.EAGAIN) {
		n = 0 // let the writer goroutine meet the error and do the failure bookkeeping
	}
	if n == len(b) {
		o.lastSend.Store(time.Now().UnixNano())
	}

	o.mu.Lock()
	o.writing = false
	o.writingLen = 0
	if n < len(b) {
		// Put the unwritten rest in front of whatever was appended meanwhile.
		rest := append(append(make([]byte, 0, len(b)-n+len(o.buf)), b[n:]...), o.buf...)
		o.spare, o.buf = o.buf[:0], rest
	} else if cap(b) <= spareMax && o.spare == nil {
		o.spare = b[:0]
	}
	o.pending.Store(int64(len(o.buf) + o.writingLen))
	wake := len(o.buf) > 0 || o.closing // a finishing writer waits for this write to end
	o.mu.Unlock()
	if wake {
		o.signal()
	}
	return true
}

func (o *outbound) sendMethod(channel uint16, m amqp.Method) {
	if !o.lockAppend() {
		return
	}
	o.buf = amqp.AppendMethodFrame(o.buf, channel, m)
	o.unlockAppend()
}

// sendFinal appends a last frame (connection.close) and then refuses further frames.
func (o *outbound) sendFinal(channel uint16, m amqp.Method) {
	if !o.lockAppend() {
		return
	}
	o.buf = amqp.AppendMethodFrame(o.buf, channel, m)
	o.closing = true
	o.unlockAppend()
}

// full reports whether the connection is over its outbound high-water mark.
func (o *outbound) full() bool { return o.pending.Load() > highWater }

// block records something (a queue, a stream cursor) that skipped this connection because it was
// full; it is kicked once the writer drains.
func (o *outbound) block(k queue.Kicker) {
	o.mu.Lock()
	if o.blocked == nil {
		o.blocked = make(map[queue.Kicker]struct{})
	}
	o.blocked[k] = struct{}{}
	o.mu.Unlock()
}

// finish stops accepting frames; the writer exits after flushing what is buffered.
func (o *outbound) finish() {
	o.mu.Lock()
	o.closing = true
	if o.hbTimer != nil {
		o.hbTimer.Stop()
	}
	o.mu.Unlock()
	o.signal()
}

// wait returns a channel closed once every writer goroutine has exited.
func (o *outbound) wait() <-chan struct{} {
	c := make(chan struct{})
	go func() {
		o.wg.Wait()
		close(c)
	}()
	return c
}

// run is a writer goroutine: it writes until the buffer stays empty for writerIdle (or the
// connection is finishing and everything is written).
func (o *outbound) run() {
	defer o.wg.Done()
	idle := time.NewTimer(writerIdle)
	defer idle.Stop()
	for {
		o.mu.Lock()
		o.sendConfirmsDue()
		b := o.buf
		if len(b) == 0 || o.writing {
			if o.closing && !o.writing {
				o.running = false
				o.mu.Unlock()
				return
			}
			o.mu.Unlock()
			idle.Reset(writerIdle)
			select {
			case <-o.kick:
				continue
			case <-idle.C:
			}
			o.mu.Lock()
			if len(o.buf) == 0 && !o.writing && len(o.confirmsDue) == 0 {
				o.running = false
				o.mu.Unlock()
				return
			}
			o.mu.Unlock()
			continue
		}
		o.buf = o.spare[:0]
		o.spare = nil
		o.writing = true
		o.writingLen = len(b)
		o.pending.Store(int64(len(o.buf) + o.writingLen))
		o.mu.Unlock()
		if err := o.write(b); err != nil {
			o.mu.Lock()
			o.running = false
			o.mu.Unlock()
			return
		}
	}
}

// write sends b (taken from o.buf by the caller) and does the bookkeeping: the spare buffer, the
// pending count, waking queues and stream readers that waited for the buffer to drain, and failure.
func (o *outbound) write(b []byte) error {
	_, err := o.nc.Write(b)
	o.lastSend.Store(time.Now().UnixNano())

	o.mu.Lock()
	o.writing = false
	o.writingLen = 0
	if cap(b) <= spareMax {
		o.spare = b[:0]
	}
	o.pending.Store(int64(len(o.buf) + o.writingLen))
	var wake []queue.Kicker
	if len(o.buf) < lowWater || err != nil {
		for q := range o.blocked {
			wake = append(wake, q)
		}
		clear(o.blocked)
	}
	if err != nil {
		o.failed = true
		o.buf = nil
		if o.hbTimer != nil {
			o.hbTimer.Stop()
		}
	}
	o.mu.Unlock()
	for _, q := range wake {
		q.Kick()
	}
	if err != nil {
		// The peer is gone: unblock the reader too.
		o.nc.Close()
	}
	return err
}
