// Package netserve is the listener side shared by Warren's front-ends (the AMQP 0-9-1 session
// and the stream protocol): accept loops that back off on temporary errors, the set of open
// connections, and a shutdown that closes the listeners, closes the connections and waits for
// every goroutine it started; and (HTTPListener) the HTTP servers of the management API and
// the Prometheus exporter. One implementation per kind, so that the binary front-ends accept,
// track and stop their clients alike (Tracker), and the HTTP servers start, log and stop alike
// (net/http tracks their connections).
//
// Lock order: Tracker.mu is a leaf, except that the open callback of Serve and the cut
// callback of Shutdown run under it (they must take no lock that is held while the Tracker is
// called).
package netserve

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Backoff bounds for temporary accept failures (EMFILE and the like): the loop sleeps, doubling
// from the first to the last, rather than spin.
const (
	firstBackoff = 5 * time.Millisecond
	maxBackoff   = time.Second
)

// Tracker owns a front-end's listeners, its open connections (of type C) and the goroutines
// serving them.
type Tracker[C comparable] struct {
	log *slog.Logger

	mu      sync.Mutex
	lns     []net.Listener // every listener served, in order; closed by Shutdown
	conns   map[C]struct{}
	closing bool

	wg sync.WaitGroup // accept loops, connection goroutines and those started with Go
}

// NewTracker returns an empty Tracker logging accept failures to log.
func NewTracker[C comparable](log *slog.Logger) *Tracker[C] {
	if log == nil {
		log = slog.Default()
	}
	return &Tracker[C]{log: log, conns: make(map[C]struct{})}
}

// Serve accepts connections on ln in the background until Shutdown. For each, open (called
// under the Tracker's lock, so it must not call the Tracker) makes the connection, which is
// tracked and then run on its own goroutine; when run returns the connection is forgotten.
// Connections accepted once Shutdown has begun are closed at once.
func (t *Tracker[C]) Serve(ln net.Listener, open func(net.Conn) C, run func(C)) {
	t.mu.Lock()
	t.lns = append(t.lns, ln)
	t.wg.Add(1)
	t.mu.Unlock()
	go t.acceptLoop(ln, open, run)
}

func (t *Tracker[C]) acceptLoop(ln net.Listener, open func(net.Conn) C, run func(C)) {
	defer t.wg.Done()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary failures (EMFILE and the like): back off rather than spin.
			if delay == 0 {
				delay = firstBackoff
			} else if delay < maxBackoff {
				delay *= 2
			}
			t.log.Warn("accept failed", "err", err, "retry_in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		t.mu.Lock()
		if t.closing {
			t.mu.Unlock()
			nc.Close()
			continue
		}
		c := open(nc)
		t.conns[c] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go func() {
			defer t.wg.Done()
			defer t.remove(c)
			run(c)
		}()
	}
}

func (t *Tracker[C]) remove(c C) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
}

// Addr returns the address of the first listener served (nil before Serve).
func (t *Tracker[C]) Addr() net.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lns) == 0 {
		return nil
	}
	return t.lns[0].Addr()
}

// Conns returns the open connections, in no order.
func (t *Tracker[C]) Conns() []C {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]C, 0, len(t.conns))
	for c := range t.conns {
		out = append(out, c)
	}
	return out
}

// Go runs f on a goroutine that Shutdown waits for (a connection's helpers: heartbeats,
// subscriptions). As with sync.WaitGroup.Add, call it while some goroutine Shutdown waits for
// is still running (a connection's, typically), so that it cannot start after the wait ended.
func (t *Tracker[C]) Go(f func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
}

// Shutdown stops accepting (closing every listener), asks every open connection to close
// (closeConn, called unlocked) and waits for every goroutine. If ctx ends first it stops
// waiting politely: cut (called under the Tracker's lock) is applied to each connection still
// open, typically closing its socket, and Shutdown waits again and returns ctx's error.
func (t *Tracker[C]) Shutdown(ctx context.Context, closeConn, cut func(C)) error {
	t.mu.Lock()
	t.closing = true
	lns := t.lns
	conns := make([]C, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	for _, c := range conns {
		closeConn(c)
	}
	done := make(chan struct{})
	go func() {
		t.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		t.mu.Lock()
		for c := range t.conns {
			cut(c)
		}
		t.mu.Unlock()
		<-done
		return ctx.Err()
	}
}
