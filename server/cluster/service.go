package cluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"time"
)

// Services: other packages serve their own connections on the cluster port (the replication of
// streams, stream/replica). A service connection starts with the usual header (tag tagService,
// the cluster fingerprint) and the service's byte; the rest is the service's.

// tagService starts a service connection.
const tagService byte = 'V'

// ServiceHandler serves one service connection: br holds what was read ahead. The connection is
// closed when the handler returns (and when the node closes).
type ServiceHandler func(c net.Conn, br *bufio.Reader)

// HandleService registers the handler of service id (replacing an earlier one). Connections for a
// service without a handler are closed.
func (n *Node) HandleService(id byte, h ServiceHandler) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.services == nil {
		n.services = make(map[byte]ServiceHandler)
	}
	n.services[id] = h
}

// DialService connects to service id on member node (by node id), within ctx's deadline (or 2 s).
func (n *Node) DialService(ctx context.Context, node string, id byte) (net.Conn, error) {
	if n.single() {
		return nil, fmt.Errorf("cluster: dial service on %s: this node has no cluster port", node)
	}
	addr, ok := n.addrOf(node)
	if !ok {
		return nil, fmt.Errorf("cluster: dial service on %s: no address known", node)
	}
	timeout := dialTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("cluster: dial service on %s: %w", node, context.DeadlineExceeded)
	}
	return n.dialPeer(addr, tagService, []byte{id}, timeout)
}

// serveService hands an accepted service connection to its handler.
func (n *Node) serveService(c net.Conn, br *bufio.Reader) {
	id, err := br.ReadByte()
	if err != nil {
		return
	}
	n.mu.Lock()
	h := n.services[id]
	n.mu.Unlock()
	if h == nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	h(c, br)
}
