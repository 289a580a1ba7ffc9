package server

import (
	"crypto/x509"
	"net"

	"warren/amqp"
	"warren/server/auth"
	"warren/server/cluster"
	"warren/server/core"
	"warren/server/queue"
	"warren/server/stats"
)

// This file is the node's view for operators' tools (the HTTP API): what is connected and
// declared, read from the broker core without stopping it, and the few actions on it.

// ConnectionInfo describes an open client connection.
type ConnectionInfo = core.ConnectionInfo

// Connections lists the connections that finished their handshake, oldest first.
func (s *Server) Connections() []ConnectionInfo { return s.core.Connections() }

// CloseConnection closes the open connection called name (see ConnectionInfo.Name) as
// RabbitMQ's management plugin does: connection.close 320 CONNECTION_FORCED with reason, or
// "Closed via management plugin" when reason is empty. It reports whether there was one to
// close: a connection already closing is not.
func (s *Server) CloseConnection(name, reason string) bool {
	return s.core.CloseConnection(name, reason)
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
	// Policy and OperatorPolicy name what applies to the queue ("" for none);
	// EffectivePolicyDefinition is their merged definition, as RabbitMQ's API shows it.
	Policy, OperatorPolicy    string
	EffectivePolicyDefinition map[string]any
	// Stats are the queue type's counts (a stream's records, offsets and segments included);
	// Traffic its message counters with the rates of the last sample.
	Stats   queue.Stats
	Traffic stats.Snapshot
	// GroupID is the raft group of a replicated queue (0 if not replicated).
	GroupID uint64
	// Members is a quorum queue's leader, members and online members (nil for other queues).
	Members *core.QueueMembers
}

// Queues lists the declared queues of every vhost, by vhost then name.
func (s *Server) Queues() []QueueInfo {
	var all [][]*core.Queue
	n := 0
	for _, v := range s.core.VHosts() {
		qs := v.Queues()
		all = append(all, qs)
		n += len(qs)
	}
	out := make([]QueueInfo, 0, n)
	for _, qs := range all {
		for _, q := range qs {
			out = append(out, queueInfo(q))
		}
	}
	return out
}

// Queue describes the queue called name in vhost, if there is one.
func (s *Server) Queue(vhost, name string) (QueueInfo, bool) {
	v := s.core.VHost(vhost)
	if v == nil {
		return QueueInfo{}, false
	}
	q := v.Queue(name)
	if q == nil {
		return QueueInfo{}, false
	}
	return queueInfo(q), true
}

func queueInfo(q *core.Queue) QueueInfo {
	st := q.Stats()
	m := q.PolicyMatch()
	var members *core.QueueMembers
	if qm, ok := q.Members(); ok {
		members = &qm
	}
	return QueueInfo{Members: members,
		Name: q.Name(), VHost: q.VHost().Name(), Type: q.Kind(),
		Durable: q.Durable(), AutoDelete: q.AutoDelete(), Exclusive: q.Exclusive(), Arguments: q.Args(),
		Ready: st.Ready, Unacked: st.Unacked, Consumers: st.Consumers,
		Policy: m.PolicyName(), OperatorPolicy: m.OperatorPolicyName(), EffectivePolicyDefinition: m.EffectiveDefinition(),
		Stats: st, Traffic: q.Counters().Snapshot(), GroupID: groupID(q),
	}
}

func groupID(q *core.Queue) uint64 {
	if q.Replicated() {
		return q.ID()
	}
	return 0
}

// TLSCertificate is the AMQPS listener's current certificate (nil without one).
func (s *Server) TLSCertificate() *x509.Certificate {
	if s.tls == nil {
		return nil
	}
	return s.tls.Certificate()
}

// ExchangeInfo describes a declared exchange.
type ExchangeInfo struct {
	Name, VHost string
	Type        string
	Durable     bool
	AutoDelete  bool
	Internal    bool
	Arguments   amqp.Table
	Policy      string // the policy that applies ("" for none)
}

// Exchanges lists the exchanges of every vhost, the default exchange ("") included.
func (s *Server) Exchanges() []ExchangeInfo {
	var out []ExchangeInfo
	for _, v := range s.core.VHosts() {
		for _, ex := range v.Exchanges() { // sorted by name
			out = append(out, ExchangeInfo{Name: ex.Name, VHost: v.Name(), Type: ex.Kind.String(),
				Durable: ex.Durable, AutoDelete: ex.AutoDelete, Internal: ex.Internal, Arguments: ex.Args,
				Policy: v.ExchangePolicy(ex.Name).PolicyName()})
		}
	}
	return out
}

// VHosts lists the virtual hosts' names.
func (s *Server) VHosts() []string {
	vs := s.core.VHosts()
	names := make([]string, len(vs))
	for i, v := range vs {
		names[i] = v.Name()
	}
	return names
}

// Alarms returns the resource alarms raised now: "memory", "disk" or both; none before Start.
func (s *Server) Alarms() []string {
	a := s.core.Alarms()
	if a == nil {
		return nil
	}
	return a.Raised()
}

// NodeName is this node's id in its cluster.
func (s *Server) NodeName() string { return s.node.ID() }

// ClusterAddr returns the node's cluster port address ("" for a one-node cluster without a port).
func (s *Server) ClusterAddr() string { return s.node.Addr() }

// ClusterStatus reports the node's view of its cluster: members and Raft groups with their leaders.
func (s *Server) ClusterStatus() cluster.Status { return s.node.Status() }

// Authenticate checks a user's password as the AMQP listener does for a client at remote, so
// the HTTP API lets in exactly whom AMQP lets in (loopback users only from loopback, as
// RabbitMQ). cache, if not nil, remembers the last check of one HTTP connection.
func (s *Server) Authenticate(user, pass string, remote net.Addr, cache *auth.Cache) (core.Principal, error) {
	return s.core.LoginHTTP(user, pass, remote, cache)
}
