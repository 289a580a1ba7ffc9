package cluster

import (
	"encoding/binary"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// streamLayer is one group's raft.StreamLayer on the shared cluster port: Accept returns the connections
// the mux hands off for this group, Dial writes the raft tag, header and group id. It tracks every
// connection it produced and closes them all on Close, so no transport goroutine outlives the group.
type streamLayer struct {
	n     *Node
	group uint64
	ch    chan net.Conn

	mu     sync.Mutex
	closed bool
	done   chan struct{}
	conns  map[net.Conn]struct{}
}

var _ raft.StreamLayer = (*streamLayer)(nil)

func newStreamLayer(n *Node, group uint64) *streamLayer {
	return &streamLayer{
		n:     n,
		group: group,
		ch:    make(chan net.Conn, 16),
		done:  make(chan struct{}),
		conns: make(map[net.Conn]struct{}),
	}
}

// handoff gives an accepted connection to the group's transport; false if the layer is closed.
func (s *streamLayer) handoff(c net.Conn) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	select {
	case s.ch <- c:
		return true
	case <-s.done:
		s.forget(c)
		return false
	}
}

func (s *streamLayer) forget(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Accept implements net.Listener.
func (s *streamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-s.ch:
		return &trackedConn{Conn: c, sl: s}, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener: it closes every connection of the layer.
func (s *streamLayer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
	for {
		select {
		case c := <-s.ch:
			_ = c.Close()
		default:
			return nil
		}
	}
}

// Addr implements net.Listener.
func (s *streamLayer) Addr() net.Addr { return stringAddr(s.n.addr) }

// Dial implements raft.StreamLayer.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 || timeout > dialTimeout {
		timeout = dialTimeout
	}
	c, err := s.n.dialPeer(string(address), tagRaft, binary.AppendUvarint(nil, s.group), timeout)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = c.Close()
		return nil, net.ErrClosed
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	return &trackedConn{Conn: c, sl: s}, nil
}

// trackedConn forgets itself in its layer when closed.
type trackedConn struct {
	net.Conn
	sl   *streamLayer
	once sync.Once
}

func (t *trackedConn) Close() error {
	t.once.Do(func() { t.sl.forget(t.Conn) })
	return t.Conn.Close()
}

type stringAddr string

func (a stringAddr) Network() string { return "tcp" }
func (a stringAddr) String() string  { return string(a) }
