package perf

import (
	"errors"
	"net"
	"sync"
	"time"
)

// coalescingConn batches the client's writes. amqp091-go flushes its buffer after every
// publish and every ack, which costs the load tool one write system call per message; here
// Write only appends to a buffer and a flusher goroutine writes whatever has accumulated in
// one call. When the tool is idle, a write goes out at once (one goroutine hand-off later);
// when it is busy, many messages share a system call. Write blocks while maxPending bytes
// are waiting, so TCP back-pressure still reaches the publisher. A write error is returned
// by the next Write.
type coalescingConn struct {
	net.Conn

	mu        sync.Mutex
	cond      sync.Cond // signalled when a batch has been written
	pending   []byte
	spare     []byte
	err       error
	closed    bool
	writing   bool      // a write (inline or the flusher's) is under way
	lastWrite time.Time // when the last write ended

	wake chan struct{} // capacity 1: there is something to write
	done chan struct{} // closed when the flusher has ended
}

const maxPending = 1 << 20

var errConnClosed = errors.New("connection closed")

func newCoalescingConn(c net.Conn) *coalescingConn {
	w := &coalescingConn{Conn: c, wake: make(chan struct{}, 1), done: make(chan struct{})}
	w.cond.L = &w.mu
	go w.flush()
	return w
}

// Write queues p for the flusher. A write that finds the connection idle (nothing queued or being
// written, and no write for idleGap) goes out at once on the caller's goroutine instead: at low
// rates, as in the latency scenario, that saves the flusher's wake-up on every message, while
// busy connections still batch.
func (w *coalescingConn) Write(p []byte) (int, error) {
	w.mu.Lock()
	for len(w.pending) >= maxPending && w.err == nil && !w.closed {
		w.cond.Wait()
	}
	if w.err != nil || w.closed {
		err := w.err
		w.mu.Unlock()
		if err == nil {
			err = errConnClosed
		}
		return 0, err
	}
	if now := time.Now(); !w.writing && len(w.pending) == 0 && now.Sub(w.lastWrite) >= idleGap {
		w.writing = true
		w.mu.Unlock()
		_, err := w.Conn.Write(p)
		w.mu.Lock()
		w.writing = false
		w.lastWrite = time.Now()
		if err != nil && w.err == nil {
			w.err = err
		}
		more := len(w.pending) > 0
		w.cond.Broadcast()
		w.mu.Unlock()
		if more {
			w.kick()
		}
		if err != nil {
			return 0, err
		}
		return len(p), nil
	}
	w.pending = append(w.pending, p...)
	w.mu.Unlock()
	w.kick()
	return len(p), nil
}

// idleGap is how long a connection must have been quiet for Write to write inline.
const idleGap = 200 * time.Microsecond

func (w *coalescingConn) kick() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// flush writes batches until the connection is closed and everything queued is written.
func (w *coalescingConn) flush() {
	defer close(w.done)
	for range w.wake {
		for {
			w.mu.Lock()
			if len(w.pending) == 0 || w.writing {
				// Nothing to do, or an inline write is under way: it kicks us when it is done.
				w.mu.Unlock()
				break
			}
			// Swap buffers: Write fills the spare one while this batch is written.
			batch := w.pending
			w.pending = w.spare[:0]
			w.spare = nil
			w.writing = true
			w.mu.Unlock()
			_, err := w.Conn.Write(batch)
			w.mu.Lock()
			w.writing = false
			w.lastWrite = time.Now()
			w.spare = batch
			if err != nil && w.err == nil {
				w.err = err
			}
			w.cond.Broadcast()
			w.mu.Unlock()
			if err != nil {
				return
			}
		}
		w.mu.Lock()
		stop := w.closed && len(w.pending) == 0
		w.mu.Unlock()
		if stop {
			return
		}
	}
}

// Close writes what is queued (for at most 5 s), stops the flusher and closes the connection.
func (w *coalescingConn) Close() error {
	w.mu.Lock()
	already := w.closed
	w.closed = true
	w.cond.Broadcast()
	w.mu.Unlock()
	if already {
		return w.Conn.Close()
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-w.done:
		return w.Conn.Close()
	case <-t.C:
	}
	err := w.Conn.Close() // unblocks a stuck write
	<-w.done
	return err
}
