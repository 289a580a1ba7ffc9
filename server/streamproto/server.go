// Package streamproto is Warren's front-end for RabbitMQ's binary stream protocol (port 5552),
// the protocol of rabbitmq-stream-go-client, the Java and .NET stream clients, rstream and
// rabbitmq-stream-js-client. It sits on the broker core (server/core) beside the AMQP 0-9-1
// session and uses the same vhosts, streams, named offsets and deduplication table: a message
// published here is read over AMQP 0-9-1 and the other way round.
//
// The codec is server/streamproto/wire. Chunks go from the stream log to the socket as stored
// (stream.Log.ReadDeliveryChunk): the deliver frame's header, then the chunk's header and data
// entries by reference in one writev; only chunks holding AMQP 0-9-1 records are converted.
//
// Goroutines: one accept loop per listener; per connection a reader (conn.serve: every command
// is handled inline on it), a writer (outbound.run) and a heartbeat timer; per subscription one
// reader of the log (subscription.run). Server.Shutdown waits for all of them.
//
// Lock order: conn.mu, sacMember.mu and subscription.mu are leaves except for outbound.mu;
// publisher confirm callbacks take only outbound.mu. Server.mu is a leaf. No lock is held while
// the core or a stream is called; the core calls a single active consumer's sacMember with no
// core lock held.
package streamproto

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"warren/server/auth"
	"warren/server/core"
	"warren/server/netserve"
	"warren/server/stats"
	"warren/server/streamproto/wire"
)

// Config configures the stream-protocol front-end.
type Config struct {
	Core   *core.Broker
	Logger *slog.Logger
	// Version is reported as the "version" peer property. Stream clients turn features on by
	// it (filtering and command-version exchange need 3.13 or later), so the default is the
	// RabbitMQ version whose protocol Warren speaks.
	Version string
	// FrameMax is the frame_max proposed in tune (default 1 MiB, RabbitMQ's).
	FrameMax uint32
	// Heartbeat is proposed in tune (default 60 s; 0 disables).
	Heartbeat time.Duration
	// AdvertisedHost and AdvertisedPort are what metadata and open tell clients to connect to
	// (default: the listener's address; a wildcard listener advertises the host name).
	AdvertisedHost string
	AdvertisedPort int
	// Authenticate checks a PLAIN login from remote; a non-nil error refuses it. A
	// *LoopbackError refusal is answered with sasl_authentication_failure_loopback.
	Authenticate func(user, pass string, remote net.Addr) error
	// AuthFailureDelay is how long a failed login (wrong password, unknown user) or a refused
	// open waits for its answer (default SilentCloseDelay, RabbitMQ's); tests shorten it.
	AuthFailureDelay time.Duration
	// Grant returns user's permissions in vhost: nil, nil when the user has none there (open
	// is refused); an error when the vhost does not exist.
	Grant func(user, vhost string) (*auth.Grant, error)
	// PublishBufferBytes bounds a connection's published bytes waiting for their confirm
	// (default 64 MiB): the reader stops reading beyond it.
	PublishBufferBytes int64
	// OutboundBytes bounds a connection's bytes queued for the socket before subscriptions
	// wait (default 4 MiB).
	OutboundBytes int
}

// CompatVersion is the default "version" peer property: the RabbitMQ release whose stream
// protocol this package implements.
const CompatVersion = "4.0.0"

// LoopbackError refuses a login because the user may only connect from loopback.
type LoopbackError struct{ User string }

func (e *LoopbackError) Error() string {
	return fmt.Sprintf("user '%s' can only connect via localhost", e.User)
}

// Server serves stream-protocol clients.
type Server struct {
	cfg  Config
	core *core.Broker
	log  *slog.Logger

	net *netserve.Tracker[*conn] // listeners, connections and the goroutines serving them

	mu sync.Mutex
	ep core.Endpoints // what this node advertises (set as listeners are served)

	// counters are the protocol's traffic (rabbitmq_global_messages_*{protocol="stream"}):
	// Published (and PublishedConfirm: every publish expects a confirm), Routed, Confirmed and
	// DeliveredNoAck (stream deliveries are credit, not acks), counted in messages (a sub-batch
	// entry is one).
	counters stats.Object // outside any registry: counts for this protocol only
}

// New creates the front-end; Serve starts it on a listener.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Version == "" {
		cfg.Version = CompatVersion
	}
	if cfg.FrameMax == 0 {
		cfg.FrameMax = wire.DefaultFrameMax
	}
	if cfg.PublishBufferBytes == 0 {
		cfg.PublishBufferBytes = 64 << 20
	}
	if cfg.OutboundBytes == 0 {
		cfg.OutboundBytes = 4 << 20
	}
	if cfg.AuthFailureDelay == 0 {
		cfg.AuthFailureDelay = SilentCloseDelay
	}
	if cfg.Authenticate == nil {
		cfg.Authenticate = func(string, string, net.Addr) error { return errors.New("no authentication configured") }
	}
	if cfg.Grant == nil {
		cfg.Grant = func(string, string) (*auth.Grant, error) { return nil, nil }
	}
	s := &Server{cfg: cfg, core: cfg.Core, log: cfg.Logger.With("protocol", "stream")}
	s.net = netserve.NewTracker[*conn](s.log)
	if s.core != nil {
		s.core.WatchStreams(s.streamEvent)
	}
	return s
}

// Listen binds addr, with a clear error when it cannot (the port in use, say).
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("stream protocol: listen on %s: %w", addr, err)
	}
	return ln, nil
}

// Serve accepts connections on ln in the background until Shutdown.
func (s *Server) Serve(ln net.Listener) { s.serve(ln, nil) }

// ServeTLS accepts TLS connections on ln (a TCP listener; the handshake runs on each
// connection's goroutine) in the background until Shutdown.
func (s *Server) ServeTLS(ln net.Listener, tc *tls.Config) { s.serve(ln, tc) }

func (s *Server) serve(ln net.Listener, tc *tls.Config) {
	s.mu.Lock()
	host, port := s.listenerEndpoint(ln, tc != nil && s.ep.StreamPort != 0)
	s.ep.StreamHost = host
	if tc != nil {
		s.ep.StreamTLSPort = port
	} else {
		s.ep.StreamPort = port
	}
	ep := s.ep
	s.mu.Unlock()
	if s.core != nil {
		s.core.SetEndpoints(ep)
	}
	s.net.Serve(ln, func(nc net.Conn) *conn {
		if tcp, ok := nc.(*net.TCPConn); ok {
			_ = tcp.SetNoDelay(true)
		}
		return newConn(s, nc, tc)
	}, (*conn).serve)
}

// Addr returns the address of the first listener (nil before Serve).
func (s *Server) Addr() net.Addr { return s.net.Addr() }

// listenerEndpoint returns what this node advertises for a listener: --stream-advertised-host,
// else the listener's address, or the host name for a wildcard one; --stream-advertised-port
// (for the plain listener, or the TLS one when there is no plain one: ownPort), else the
// listener's port. It is one value per node and listener, whatever address a client used, so
// that what open announces on this node is what metadata on every node says of it (clients
// such as rabbitmq-stream-go-client reconnect until the two agree).
func (s *Server) listenerEndpoint(ln net.Listener, ownPort bool) (string, int) {
	host, port := s.cfg.AdvertisedHost, s.cfg.AdvertisedPort
	if ownPort {
		port = 0
	}
	if ta, ok := ln.Addr().(*net.TCPAddr); ok {
		if host == "" {
			host = ta.IP.String()
			if ta.IP.IsUnspecified() {
				if h, err := os.Hostname(); err == nil {
					host = h
				}
			}
		}
		if port == 0 {
			port = ta.Port
		}
	}
	return host, port
}

// advertised returns the host and port open and metadata announce for this node to a
// connection over TLS or not.
func (s *Server) advertised(overTLS bool) (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if overTLS {
		return s.ep.StreamHost, s.ep.StreamTLSPort
	}
	return s.ep.StreamHost, s.ep.StreamPort
}

// streamEvent tells the clients of a stream that moved to another leader or was deleted, as
// RabbitMQ does: metadata_update (stream_not_available), and their publishers and
// subscriptions on it are gone, so they look the stream up again and reconnect.
func (s *Server) streamEvent(e core.StreamEvent) {
	if e.Deleted {
		s.log.Debug("stream deleted: telling its clients", "vhost", e.VHost, "stream", e.Stream)
	} else {
		s.log.Info("stream leader moved: telling its clients", "vhost", e.VHost, "stream", e.Stream, "leader", e.Leader)
	}
	s.notifyStreamGone(e.VHost, e.Stream)
}

// Shutdown stops accepting, closes every connection (RabbitMQ drops stream connections at
// shutdown; Warren sends a close command first, so clients can tell a shutdown from a network
// failure) and waits, bounded by ctx, for every goroutine to finish.
func (s *Server) Shutdown(ctx context.Context) error {
	return s.net.Shutdown(ctx,
		func(c *conn) { c.ForceClose(0, "broker shutdown") },
		func(c *conn) { c.nc.Close() })
}

// notifyStreamGone sends metadata_update to every connection with a publisher or subscription
// on the stream (it was deleted here), as RabbitMQ does.
func (s *Server) notifyStreamGone(vhost, stream string) {
	conns := s.net.Conns()
	for _, c := range conns {
		c.streamGone(vhost, stream)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// Counters reads the protocol's traffic counters (Published, Routed, Confirmed, DeliveredNoAck).
func (s *Server) Counters() stats.Values { return s.counters.Values() }

// Clients counts the open subscriptions and the declared publishers of every connection.
func (s *Server) Clients() (consumers, publishers int) {
	conns := s.net.Conns()
	for _, c := range conns {
		c.mu.Lock()
		consumers += len(c.subs)
		publishers += len(c.publishers)
		c.mu.Unlock()
	}
	return consumers, publishers
}

// SubscriptionInfo describes one stream-protocol subscription, for the operators' views
// (/api/stream/consumers, warren ctl streams lag, the exporter's lag).
type SubscriptionInfo struct {
	VHost, Stream string
	Connection    string // the connection's name (peer -> local)
	ID            uint8  // the subscription id on its connection
	Name          string // the consumer's name property (its stored offsets' reference), if any
	Next          uint64 // the next offset it reads
	Credit        int64
	Active        bool // false: a single active consumer waiting for its turn
}

// Subscriptions lists the open subscriptions of every connection.
func (s *Server) Subscriptions() []SubscriptionInfo {
	conns := s.net.Conns()
	var out []SubscriptionInfo
	for _, c := range conns {
		vh := c.vhostName.Load()
		if vh == nil {
			continue
		}
		c.mu.Lock()
		subs := make([]*subscription, 0, len(c.subs))
		for _, sub := range c.subs {
			subs = append(subs, sub)
		}
		c.mu.Unlock()
		for _, sub := range subs {
			sub.mu.Lock()
			next := sub.next
			sub.mu.Unlock()
			out = append(out, SubscriptionInfo{VHost: *vh, Stream: sub.stream, Connection: c.name, ID: sub.id,
				Name: sub.name, Next: next, Credit: sub.credit.Load(), Active: sub.active.Load()})
		}
	}
	return out
}
