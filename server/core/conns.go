package core

import (
	"cmp"
	"slices"
	"strconv"
	"sync"
	"time"

	"warren/amqp"
	"warren/server/stats"
)

// ClientConn is a client connection of any protocol, as the core and the HTTP API see it: the
// AMQP 0-9-1 session and the stream protocol register theirs, so operators list and close both
// in one place.
type ClientConn interface {
	// Info describes the connection; it is called from other goroutines and must not block.
	Info() ConnectionInfo
	// ForceClose closes the connection from the server side with code (320 CONNECTION_FORCED
	// for AMQP) and text, as RabbitMQ does when an operator closes it.
	ForceClose(code uint16, text string)
}

// ConnectionInfo describes an open client connection.
type ConnectionInfo struct {
	// Name is RabbitMQ's name for a connection, "peer -> local" ("127.0.0.1:50210 ->
	// 127.0.0.1:5672"); it is what CloseConnection takes.
	Name             string
	Protocol         string // "AMQP 0-9-1" or "stream"
	State            string // "running", or "closing" once it is being closed
	Peer, Local      string
	User, VHost      string
	ClientProperties amqp.Table // as the client sent them
	Channels         int
	ChannelMax       uint16
	FrameMax         uint32
	Heartbeat        time.Duration
	ConnectedAt      time.Time
	id               uint64
}

// connRegistry holds the open client connections by registration order, and how many each vhost
// has (max-connections checks them at every connection.open; counting them there would describe
// every connection of the node).
type connRegistry struct {
	mu      sync.Mutex
	next    uint64
	conns   map[ClientConn]registered
	byVHost map[string]int
}

// registered is a connection's registration: its order and its vhost.
type registered struct {
	id    uint64
	vhost string
}

// RegisterConn adds an open connection (once its vhost is open, before the client is told);
// UnregisterConn removes it.
func (b *Broker) RegisterConn(c ClientConn) {
	vhost := c.Info().VHost
	r := &b.conns
	r.mu.Lock()
	if r.conns == nil {
		r.conns = make(map[ClientConn]registered)
		r.byVHost = make(map[string]int)
	}
	r.next++
	r.conns[c] = registered{id: r.next, vhost: vhost}
	r.byVHost[vhost]++
	r.mu.Unlock()
	b.stats.Inc(stats.ConnectionsOpened)
}

// UnregisterConn removes a connection added with RegisterConn.
func (b *Broker) UnregisterConn(c ClientConn) {
	r := &b.conns
	r.mu.Lock()
	reg, was := r.conns[c]
	if was {
		delete(r.conns, c)
		if r.byVHost[reg.vhost]--; r.byVHost[reg.vhost] == 0 {
			delete(r.byVHost, reg.vhost)
		}
	}
	r.mu.Unlock()
	if was {
		b.stats.Inc(stats.ConnectionsClosed)
	}
}

// LocalConnections counts this node's client connections to vhost.
func (b *Broker) LocalConnections(vhost string) int {
	r := &b.conns
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byVHost[vhost]
}

// Connections lists the open connections, oldest first.
func (b *Broker) Connections() []ConnectionInfo {
	r := &b.conns
	r.mu.Lock()
	out := make([]ConnectionInfo, 0, len(r.conns))
	conns := make([]ClientConn, 0, len(r.conns))
	ids := make([]uint64, 0, len(r.conns))
	for c, reg := range r.conns {
		conns = append(conns, c)
		ids = append(ids, reg.id)
	}
	r.mu.Unlock()
	for i, c := range conns {
		ci := c.Info()
		ci.id = ids[i]
		out = append(out, ci)
	}
	slices.SortFunc(out, func(a, b ConnectionInfo) int { return cmp.Compare(a.id, b.id) })
	return out
}

// CloseConnection closes the open connection called name (see ConnectionInfo.Name) as
// RabbitMQ's management plugin does: 320 CONNECTION_FORCED with reason, or "Closed via
// management plugin" when reason is empty. It reports whether there was one to close: a
// connection already closing is not.
func (b *Broker) CloseConnection(name, reason string) bool {
	if reason == "" {
		reason = "Closed via management plugin"
	}
	r := &b.conns
	r.mu.Lock()
	var target ClientConn
	for c := range r.conns {
		if ci := c.Info(); ci.Name == name && ci.State != "closing" {
			target = c
			break
		}
	}
	r.mu.Unlock()
	if target == nil {
		return false
	}
	target.ForceClose(amqp.ConnectionForced, reason)
	return true
}

// CloseAll closes every registered connection with code and text (broker shutdown, a deleted
// vhost or user).
func (b *Broker) CloseAll(code uint16, text string, match func(ConnectionInfo) bool) {
	r := &b.conns
	r.mu.Lock()
	conns := make([]ClientConn, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	r.mu.Unlock()
	for _, c := range conns {
		if match == nil || match(c.Info()) {
			c.ForceClose(code, text)
		}
	}
}

// ChannelInfo describes an open channel of a client connection, for the management API's
// channels and consumers.
type ChannelInfo struct {
	// Connection is the name of the channel's connection (ConnectionInfo.Name); the channel's
	// own name is RabbitMQ's "<connection> (<number>)".
	Connection  string
	Number      uint16
	User, VHost string
	Confirm, Tx bool
	// Prefetch is basic.qos global=false (what new consumers get); GlobalPrefetch global=true.
	Prefetch, GlobalPrefetch uint32
	Unacked                  int
	Consumers                []ConsumerInfo
	// Counters are the channel's traffic (publishes, deliveries, acks), with rates.
	Counters *stats.Object
}

// Name is RabbitMQ's name for the channel.
func (c ChannelInfo) Name() string { return c.Connection + " (" + strconv.Itoa(int(c.Number)) + ")" }

// ConsumerInfo describes a consumer on a channel.
type ConsumerInfo struct {
	Tag, Queue  string
	AckRequired bool
	Exclusive   bool
	Prefetch    uint32
	Args        amqp.Table
}

// ChannelLister is implemented by client connections that have channels (AMQP 0-9-1).
type ChannelLister interface {
	// Channels describes the connection's open channels; it is called from other goroutines.
	Channels() []ChannelInfo
}

// Channels lists the open channels of every connection, by connection (oldest first) then
// channel number.
func (b *Broker) Channels() []ChannelInfo {
	r := &b.conns
	r.mu.Lock()
	type entry struct {
		l  ChannelLister
		id uint64
	}
	ls := make([]entry, 0, len(r.conns))
	for c, reg := range r.conns {
		if l, ok := c.(ChannelLister); ok {
			ls = append(ls, entry{l, reg.id})
		}
	}
	r.mu.Unlock()
	slices.SortFunc(ls, func(a, b entry) int { return cmp.Compare(a.id, b.id) })
	var out []ChannelInfo
	for _, e := range ls {
		chs := e.l.Channels()
		slices.SortFunc(chs, func(a, b ChannelInfo) int { return cmp.Compare(a.Number, b.Number) })
		out = append(out, chs...)
	}
	return out
}
