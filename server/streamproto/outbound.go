package streamproto

import (
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// outbound is a connection's output: small frames are copied into a pending buffer, chunks are
// queued by reference (they are immutable) or as file regions, and one writer goroutine writes
// everything queued with one writev per run of buffers and one sendfile per file region.
// Frames are never interleaved: each append is whole.
type outbound struct {
	nc   net.Conn
	mu   sync.Mutex
	cond *sync.Cond // signalled when data is queued, when bytes are written, at close
	// small collects small frames until the next segment boundary.
	small []byte
	segs  []outSeg
	// written are called once everything queued before them is written, or once it never will
	// be (the connection failed or closed): chunk buffers are given back, chunk files closed.
	written []func()
	scratch net.Buffers // the writer's, for each writev
	queued  int         // bytes in small and segs not yet written
	closed  bool
	err     error
	done    chan struct{} // closed when the writer exits
}

// outSeg is a queued buffer, or with f set, n bytes of f at off.
type outSeg struct {
	b   []byte
	f   *os.File
	off int64
	n   int
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

// sendPartsThen is sendParts calling written (if set) once the parts are written, or once they
// never will be (the connection failed or closed first): then nothing uses them any more.
func (o *outbound) sendPartsThen(written func(), parts ...[]byte) {
	o.sendFileThen(written, nil, 0, 0, parts...)
}

// sendFileThen is sendPartsThen with n bytes of f at offset off after the parts (none when f is
// nil); f must stay open, and those bytes unchanged, until written is called.
func (o *outbound) sendFileThen(written func(), f *os.File, off int64, n int, parts ...[]byte) {
	o.mu.Lock()
	if !o.closed {
		if written != nil {
			o.written = append(o.written, written)
		}
		if len(o.small) > 0 {
			o.segs = append(o.segs, outSeg{b: o.small})
			o.small = nil
		}
		for _, p := range parts {
			if len(p) > 0 {
				o.segs = append(o.segs, outSeg{b: p})
				o.queued += len(p)
			}
		}
		if f != nil && n > 0 {
			o.segs = append(o.segs, outSeg{f: f, off: off, n: n})
			o.queued += n
		}
		o.cond.Broadcast()
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()
	if written != nil {
		written()
	}
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
			written := o.written
			o.written = nil
			o.mu.Unlock()
			for _, f := range written {
				f()
			}
			return
		}
		segs := o.segs
		if len(o.small) > 0 {
			segs = append(segs, outSeg{b: o.small})
		}
		written := o.written
		o.segs, o.small, o.written = nil, nil, nil
		closed := o.closed
		o.mu.Unlock()
		if closed {
			_ = o.nc.SetWriteDeadline(time.Now().Add(time.Second))
		}
		n, err := o.write(segs)
		o.mu.Lock()
		o.queued -= int(n)
		if err != nil {
			o.err = err
			o.closed = true
			o.queued = 0
			written = append(written, o.written...)
			o.segs, o.small, o.written = nil, nil, nil
		}
		o.cond.Broadcast()
		o.mu.Unlock()
		for _, f := range written {
			f()
		}
		if err != nil {
			return
		}
	}
}

// write writes segs in order: each run of buffers with one writev, each file region with
// sendfile (io.Copy falls back to reading it when the connection cannot, as a TLS one). It
// returns the bytes written.
func (o *outbound) write(segs []outSeg) (int64, error) {
	var total int64
	for i := 0; i < len(segs); {
		bufs := o.scratch[:0]
		for ; i < len(segs) && segs[i].f == nil; i++ {
			bufs = append(bufs, segs[i].b)
		}
		o.scratch = bufs[:0] // WriteTo consumes bufs; the array is kept for the next run
		if len(bufs) > 0 {
			n, err := bufs.WriteTo(o.nc)
			clear(o.scratch[:cap(o.scratch)]) // let the written buffers go
			total += n
			if err != nil {
				return total, err
			}
		}
		if i < len(segs) {
			s := &segs[i]
			i++
			if _, err := s.f.Seek(s.off, io.SeekStart); err != nil {
				return total, err
			}
			n, err := io.Copy(o.nc, &io.LimitedReader{R: s.f, N: int64(s.n)})
			total += n
			if err == nil && n < int64(s.n) {
				err = io.ErrUnexpectedEOF // the file is shorter than the region
			}
			if err != nil {
				return total, err
			}
		}
	}
	return total, nil
}

// close stops accepting output; the writer flushes what is queued and exits.
func (o *outbound) close() {
	o.mu.Lock()
	o.closed = true
	o.cond.Broadcast()
	o.mu.Unlock()
}
