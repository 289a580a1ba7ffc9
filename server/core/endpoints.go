package core

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Advertised endpoints: what each node tells clients to connect to (the stream protocol's
// metadata names a stream's leader and replicas by host and port). Every node serves its own on
// the cluster port (service svcEndpoints) and asks the others when it needs theirs, as RabbitMQ's
// stream plugin asks each node at a metadata request. An answer is cached while the connection
// that carried it stays open: the serving node keeps it open until it stops or its endpoints
// change, so a restarted node (perhaps on another port) is asked again.

// svcEndpoints is the cluster service that answers a node's advertised endpoints.
const svcEndpoints byte = 'e'

// endpointsTimeout bounds asking a node for its endpoints.
const endpointsTimeout = 2 * time.Second

// maxEndpointsFrame bounds an endpoints answer.
const maxEndpointsFrame = 64 << 10

// Endpoints are the client endpoints a node advertises. A zero port means no such listener.
type Endpoints struct {
	StreamHost    string `json:"stream_host,omitempty"`
	StreamPort    int    `json:"stream_port,omitempty"`
	StreamTLSPort int    `json:"stream_tls_port,omitempty"`
}

// endpointRegistry is this node's endpoints and the cached ones of the other nodes.
type endpointRegistry struct {
	mu     sync.Mutex
	self   Endpoints
	served map[net.Conn]struct{}    // connections of peers watching this node's endpoints
	peers  map[string]*peerEndpoint // by node id
	closed bool
}

// peerEndpoint is a node's endpoints as learnt over one watch connection.
type peerEndpoint struct {
	ready chan struct{} // closed once ep and ok are set
	ep    Endpoints
	ok    bool
	conn  net.Conn // the watch connection (nil before it is dialled)
}

// SetEndpoints sets what this node advertises. Nodes that cached the earlier value ask again.
func (b *Broker) SetEndpoints(ep Endpoints) {
	r := &b.endpoints
	r.mu.Lock()
	r.self = ep
	served := r.served
	r.served = nil
	r.mu.Unlock()
	for c := range served {
		c.Close()
	}
}

// NodeEndpoints returns node's advertised endpoints: this node's at once, another's from the
// cache or by asking it over the cluster port (bounded by ctx and a few seconds). ok is false
// when the node is down or did not answer.
func (b *Broker) NodeEndpoints(ctx context.Context, node string) (Endpoints, bool) {
	r := &b.endpoints
	if node == b.node.ID() {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.self, true
	}
	if !b.node.PeerUp(node) {
		return Endpoints{}, false
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return Endpoints{}, false
	}
	if r.peers == nil {
		r.peers = make(map[string]*peerEndpoint)
	}
	pe := r.peers[node]
	if pe == nil {
		pe = &peerEndpoint{ready: make(chan struct{})}
		r.peers[node] = pe
		b.wg.Add(1)
		go b.watchEndpoints(node, pe)
	}
	r.mu.Unlock()
	select {
	case <-pe.ready:
		return pe.ep, pe.ok
	case <-ctx.Done():
		return Endpoints{}, false
	}
}

// watchEndpoints asks node for its endpoints and keeps the connection open: when it ends, the
// cached answer is dropped.
func (b *Broker) watchEndpoints(node string, pe *peerEndpoint) {
	defer b.wg.Done()
	r := &b.endpoints
	answered := false
	defer func() {
		r.mu.Lock()
		if r.peers[node] == pe {
			delete(r.peers, node)
		}
		r.mu.Unlock()
		if !answered {
			close(pe.ready)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), endpointsTimeout)
	c, err := b.node.DialService(ctx, node, svcEndpoints)
	cancel()
	if err != nil {
		b.log.Debug("cannot ask a node for its endpoints", "node", node, "err", err)
		return
	}
	defer c.Close()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	pe.conn = c
	r.mu.Unlock()
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(endpointsTimeout))
	ep, err := readEndpoints(br)
	if err != nil {
		b.log.Debug("no endpoints from a node", "node", node, "err", err)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	pe.ep, pe.ok = ep, true
	answered = true
	close(pe.ready)
	// The peer never writes again: a read ends when it closes the connection (it stopped, or its
	// endpoints changed) or when this broker closes it.
	_, _ = io.Copy(io.Discard, br)
}

// serveEndpoints answers a peer with this node's endpoints and holds the connection open.
func (b *Broker) serveEndpoints(c net.Conn, br *bufio.Reader) {
	r := &b.endpoints
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	if r.served == nil {
		r.served = make(map[net.Conn]struct{})
	}
	r.served[c] = struct{}{}
	self := r.self
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.served, c)
		r.mu.Unlock()
	}()
	body, err := json.Marshal(self)
	if err != nil {
		return
	}
	frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body)))
	_ = c.SetWriteDeadline(time.Now().Add(endpointsTimeout))
	if _, err := c.Write(append(frame, body...)); err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	_, _ = io.Copy(io.Discard, br)
}

func readEndpoints(br *bufio.Reader) (Endpoints, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return Endpoints{}, fmt.Errorf("read endpoints: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxEndpointsFrame {
		return Endpoints{}, errors.New("read endpoints: answer too large")
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return Endpoints{}, fmt.Errorf("read endpoints: %w", err)
	}
	var ep Endpoints
	if err := json.Unmarshal(body, &ep); err != nil {
		return Endpoints{}, fmt.Errorf("decode endpoints: %w", err)
	}
	return ep, nil
}

// closeEndpoints ends the watch and served connections (broker shutdown).
func (b *Broker) closeEndpoints() {
	r := &b.endpoints
	r.mu.Lock()
	r.closed = true
	var conns []net.Conn
	for c := range r.served {
		conns = append(conns, c)
	}
	for _, pe := range r.peers {
		if pe.conn != nil {
			conns = append(conns, pe.conn)
		}
	}
	r.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}
