package server

import (
	"cmp"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"warren/amqp"
)

// This file is the broker's view for operators' tools (the HTTP API): what is connected and
// declared, read without stopping the broker, and the few actions on it.

// ConnectionInfo describes an open client connection.
type ConnectionInfo struct {
	// Name is RabbitMQ's name for a connection, "peer -> local" ("127.0.0.1:50210 ->
	// 127.0.0.1:5672"); it is what CloseConnection takes.
	Name             string
	State            string // "running", or "closing" once CloseConnection or a shutdown closed it
	Peer, Local      string
	User, VHost      string
	ClientProperties amqp.Table // as the client sent them in connection.start-ok
	Channels         int
	ChannelMax       uint16
	FrameMax         uint32
	Heartbeat        time.Duration
	ConnectedAt      time.Time
}

// Connections lists the connections that finished their handshake, oldest first.
func (s *Server) Connections() []ConnectionInfo {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		if c.open.Load() {
			conns = append(conns, c)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(conns, func(a, b *conn) int { return cmp.Compare(a.id, b.id) })
	out := make([]ConnectionInfo, len(conns))
	for i, c := range conns {
		out[i] = c.info()
	}
	return out
}

// info describes c; c must be open, so the handshake's fields no longer change.
func (c *conn) info() ConnectionInfo {
	peer, local := c.nc.RemoteAddr().String(), c.nc.LocalAddr().String()
	state := "running"
	if c.forced.Load() {
		state = "closing"
	}
	return ConnectionInfo{
		Name:             connectionName(peer, local),
		State:            state,
		Peer:             peer,
		Local:            local,
		User:             c.user,
		VHost:            c.vhost.name,
		ClientProperties: c.clientProps,
		Channels:         int(c.nChannels.Load()),
		ChannelMax:       c.channelMax,
		FrameMax:         c.frameMax,
		Heartbeat:        c.heartbeat,
		ConnectedAt:      c.connectedAt,
	}
}

func connectionName(peer, local string) string { return peer + " -> " + local }

// CloseConnection closes the open connection called name (see ConnectionInfo.Name) as
// RabbitMQ's management plugin does: connection.close 320 CONNECTION_FORCED with reason, or
// "Closed via management plugin" when reason is empty. It reports whether there was one to
// close: a connection already closing is not.
func (s *Server) CloseConnection(name, reason string) bool {
	if reason == "" {
		reason = "Closed via management plugin"
	}
	s.mu.Lock()
	var target *conn
	for c := range s.conns {
		if c.open.Load() && !c.forced.Load() && connectionName(c.nc.RemoteAddr().String(), c.nc.LocalAddr().String()) == name {
			target = c
			break
		}
	}
	s.mu.Unlock()
	if target == nil {
		return false
	}
	target.forceClose(amqp.Errorf(amqp.ConnectionForced, "%s", reason))
	return true
}

// QueueInfo describes a declared queue.
type QueueInfo struct {
	Name, VHost string
	Type        string // classic, quorum or stream
	Durable     bool
	AutoDelete  bool
	Exclusive   bool
	Arguments   amqp.Table
	Ready       int // messages waiting for a consumer (0 for streams, as RabbitMQ's queue counters)
	Unacked     int // messages delivered and not yet settled
	Consumers   int
}

// Queues lists the declared queues of every vhost, by vhost then name.
func (s *Server) Queues() []QueueInfo {
	var out []QueueInfo
	for _, v := range s.sortedVhosts() {
		v.mu.RLock()
		entries := make([]*queueEntry, 0, len(v.queues))
		for _, e := range v.queues {
			entries = append(entries, e)
		}
		v.mu.RUnlock()
		slices.SortFunc(entries, func(a, b *queueEntry) int { return strings.Compare(a.name, b.name) })
		for _, e := range entries {
			out = append(out, e.info())
		}
	}
	return out
}

// Queue describes the queue called name in vhost, if there is one.
func (s *Server) Queue(vhost, name string) (QueueInfo, bool) {
	v := s.vhosts[vhost]
	if v == nil {
		return QueueInfo{}, false
	}
	e := v.lookupQueue(name)
	if e == nil {
		return QueueInfo{}, false
	}
	return e.info(), true
}

func (e *queueEntry) info() QueueInfo {
	qi := QueueInfo{
		Name: e.name, VHost: e.v.name, Type: "classic",
		Durable: e.durable, AutoDelete: e.autoDel, Exclusive: e.owner != nil, Arguments: e.args,
	}
	switch {
	case e.stream != nil:
		qi.Type = "stream"
		qi.Consumers = e.stream.consumerCount()
	case e.settings.quorum:
		qi.Type = "quorum"
	}
	if e.q != nil {
		qi.Ready, qi.Unacked, qi.Consumers = e.q.Stats()
	}
	return qi
}

// ExchangeInfo describes a declared exchange.
type ExchangeInfo struct {
	Name, VHost string
	Type        string
	Durable     bool
	AutoDelete  bool
	Internal    bool
	Arguments   amqp.Table
}

// Exchanges lists the exchanges of every vhost, the default exchange ("") included.
func (s *Server) Exchanges() []ExchangeInfo {
	var out []ExchangeInfo
	for _, v := range s.sortedVhosts() {
		for _, ex := range v.exchanges.Exchanges() { // sorted by name
			out = append(out, ExchangeInfo{Name: ex.Name, VHost: v.name, Type: ex.Kind.String(),
				Durable: ex.Durable, AutoDelete: ex.AutoDelete, Internal: ex.Internal, Arguments: ex.Args})
		}
	}
	return out
}

// VHosts lists the virtual hosts' names.
func (s *Server) VHosts() []string {
	vs := s.sortedVhosts()
	names := make([]string, len(vs))
	for i, v := range vs {
		names[i] = v.name
	}
	return names
}

func (s *Server) sortedVhosts() []*vhost {
	vs := make([]*vhost, 0, len(s.vhosts))
	for _, v := range s.vhosts {
		vs = append(vs, v)
	}
	slices.SortFunc(vs, func(a, b *vhost) int { return strings.Compare(a.name, b.name) })
	return vs
}

// Alarms returns the resource alarms raised now: "memory", "disk" or both; none before Start.
func (s *Server) Alarms() []string {
	s.mu.Lock()
	a := s.alarms
	s.mu.Unlock()
	if a == nil {
		return nil
	}
	return a.raised()
}

// NodeName is this node's id in its cluster.
func (s *Server) NodeName() string { return s.node.ID() }

// Authenticate checks a user's password as the AMQP listener does for a client at remote, so
// the HTTP API lets in exactly whom AMQP lets in (guest only from loopback, as RabbitMQ).
func (s *Server) Authenticate(user, pass string, remote net.Addr) error {
	if user != "guest" || pass != "guest" {
		return fmt.Errorf("login refused for user %q", user)
	}
	if ta, ok := remote.(*net.TCPAddr); ok && !ta.IP.IsLoopback() {
		return fmt.Errorf("user %q may only log in from loopback", user)
	}
	return nil
}
