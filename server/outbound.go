package server

import (
	"net"
	"sync"
	"sync/atomic"
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

// outbound is a connection's send side: everyone appends encoded frames under mu, and the writer
// goroutine swaps the buffer out and writes it with one syscall, so frames batch by themselves.
type outbound struct {
	nc       net.Conn
	frameMax uint32 // set once after tune, before any delivery

	mu       sync.Mutex
	buf      []byte
	spare    []byte
	closing  bool // no new frames; writer exits once flushed
	failed   bool
	blocked  map[*queue.Queue]struct{}
	waiters  []chan struct{} // closed once the buffer drains below lowWater
	pending  atomic.Int64    // len(buf) plus the bytes being written
	lastSend atomic.Int64    // unix nanos of the last write, for heartbeats

	kick chan struct{}
	done chan struct{}
}

func newOutbound(nc net.Conn) *outbound {
	return &outbound{
		nc:       nc,
		frameMax: 131072,
		kick:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
}

func (o *outbound) signal() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
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
	o.pending.Store(int64(len(o.buf)))
	o.mu.Unlock()
	o.signal()
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

// sendRaw appends bytes that are already framed (the protocol header on a version mismatch).
func (o *outbound) sendRaw(b []byte) {
	if !o.lockAppend() {
		return
	}
	o.buf = append(o.buf, b...)
	o.unlockAppend()
}

// full reports whether the connection is over its outbound high-water mark.
func (o *outbound) full() bool { return o.pending.Load() > highWater }

// block records a queue that skipped this connection because it was full; it is kicked once the
// writer drains.
func (o *outbound) block(q *queue.Queue) {
	o.mu.Lock()
	if o.blocked == nil {
		o.blocked = make(map[*queue.Queue]struct{})
	}
	o.blocked[q] = struct{}{}
	o.mu.Unlock()
}

// drained returns a channel closed once the pending output is below the low-water mark.
func (o *outbound) drained() <-chan struct{} {
	c := make(chan struct{})
	o.mu.Lock()
	if len(o.buf) < lowWater || o.failed || o.closing {
		o.mu.Unlock()
		close(c)
		return c
	}
	o.waiters = append(o.waiters, c)
	o.mu.Unlock()
	return c
}

// finish stops accepting frames; the writer exits after flushing what is buffered.
func (o *outbound) finish() {
	o.mu.Lock()
	o.closing = true
	o.mu.Unlock()
	o.signal()
}

// run is the writer goroutine. heartbeat 0 disables heartbeat frames.
func (o *outbound) run(heartbeat time.Duration) {
	defer close(o.done)
	var tick <-chan time.Time
	if heartbeat > 0 {
		t := time.NewTicker(heartbeat / 2)
		defer t.Stop()
		tick = t.C
	}
	o.lastSend.Store(time.Now().UnixNano())
	for {
		select {
		case <-o.kick:
		case now := <-tick:
			if now.UnixNano()-o.lastSend.Load() >= int64(heartbeat/2) {
				if o.lockAppend() {
					o.buf = amqp.AppendHeartbeat(o.buf)
					o.unlockAppend()
				}
			}
			continue
		}
		for {
			o.mu.Lock()
			b := o.buf
			closing := o.closing
			if len(b) == 0 {
				o.mu.Unlock()
				if closing {
					return
				}
				break
			}
			o.buf = o.spare[:0]
			o.spare = nil
			o.mu.Unlock()

			_, err := o.nc.Write(b)
			o.lastSend.Store(time.Now().UnixNano())

			o.mu.Lock()
			if cap(b) <= spareMax {
				o.spare = b[:0]
			}
			o.pending.Store(int64(len(o.buf)))
			var wake []*queue.Queue
			if len(o.buf) < lowWater || err != nil {
				for q := range o.blocked {
					wake = append(wake, q)
				}
				clear(o.blocked)
				for _, w := range o.waiters {
					close(w)
				}
				o.waiters = o.waiters[:0]
			}
			if err != nil {
				o.failed = true
				o.buf = nil
			}
			o.mu.Unlock()
			for _, q := range wake {
				q.Kick()
			}
			if err != nil {
				// The peer is gone: unblock the reader too.
				o.nc.Close()
				return
			}
		}
	}
}
