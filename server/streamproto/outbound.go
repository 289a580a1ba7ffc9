package streamproto

import (
	"net"
	"sync"
	"time"
)

// outbound is a connection's output: small frames are copied into a pending buffer, chunks are
// queued by reference (they are immutable), and one writer goroutine writes everything queued
// with one writev. Frames are never interleaved: each append is whole.
type outbound struct {
	nc   net.Conn
	mu   sync.Mutex
	cond *sync.Cond // signalled when data is queued, when bytes are written, at close
	// small collects small frames until the next segment boundary.
	small []byte
	bufs  net.Buffers
	// written are called once everything queued before them is written (chunk buffers given
	// back for reuse); dropped uncalled when the connection fails.
	written []func()
	queued  int // bytes in small and bufs not yet written
	closed  bool
	err     error
	done    chan struct{} // closed when the writer exits
}

func newOutbound(nc net.Conn) *outbound {
	o := &outbound{nc: nc, done: make(chan struct{})}
	o.cond = sync.NewCond(&o.mu)
	return o
}

// send queues a copy of frame (one or more whole frames).
func (o *outbound) send(frame []byte) {
	o.mu.Lock()
	if !o.closed {
		o.small = append(o.small, frame...)
		o.queued += len(frame)
		o.cond.Broadcast()
	}
	o.mu.Unlock()
}

// sendParts queues one frame made of parts, which are referenced, not copied, and must not
// change until written.
func (o *outbound) sendParts(parts ...[]byte) { o.sendPartsThen(nil, parts...) }

// sendPartsThen is sendParts calling written (if set) once the parts are written, or not at all
// if they never are (the connection failed or closed first).
func (o *outbound) sendPartsThen(written func(), parts ...[]byte) {
	o.mu.Lock()
	if !o.closed {
		if written != nil {
			o.written = append(o.written, written)
		}
		if len(o.small) > 0 {
			o.bufs = append(o.bufs, o.small)
			o.small = nil
		}
		for _, p := range parts {
			if len(p) > 0 {
				o.bufs = append(o.bufs, p)
				o.queued += len(p)
			}
		}
		o.cond.Broadcast()
	}
	o.mu.Unlock()
}

// waitRoom blocks while more than limit bytes are queued, until the outbound closes or stop
// reports true (checked whenever the outbound changes; wake with kick).
func (o *outbound) waitRoom(limit int, stop func() bool) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for o.queued > limit && !o.closed && !stop() {
		o.cond.Wait()
	}
	return !o.closed && !stop()
}

// kick wakes the waiters of waitRoom (a subscription was stopped).
func (o *outbound) kick() {
	o.mu.Lock()
	o.cond.Broadcast()
	o.mu.Unlock()
}

// run writes until close; after close it writes what is queued (bounded by a deadline) and
// exits.
func (o *outbound) run() {
	defer close(o.done)
	for {
		o.mu.Lock()
		for o.queued == 0 && !o.closed {
			o.cond.Wait()
		}
		if o.queued == 0 && o.closed {
			o.mu.Unlock()
			return
		}
		bufs := o.bufs
		if len(o.small) > 0 {
			bufs = append(bufs, o.small)
		}
		written := o.written
		o.bufs, o.small, o.written = nil, nil, nil
		closed := o.closed
		o.mu.Unlock()
		if closed {
			_ = o.nc.SetWriteDeadline(time.Now().Add(time.Second))
		}
		n, err := bufs.WriteTo(o.nc)
		o.mu.Lock()
		o.queued -= int(n)
		if err != nil {
			o.err = err
			o.closed = true
			o.queued = 0
			o.bufs, o.small, o.written = nil, nil, nil
		}
		o.cond.Broadcast()
		o.mu.Unlock()
		if err != nil {
			return
		}
		for _, f := range written {
			f()
		}
	}
}

// close stops accepting output; the writer flushes what is queued and exits.
func (o *outbound) close() {
	o.mu.Lock()
	o.closed = true
	o.cond.Broadcast()
	o.mu.Unlock()
}
