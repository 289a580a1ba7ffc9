// Package session is Warren's AMQP 0-9-1 front-end: the listener, connections (handshake,
// heartbeats, frame mux), channels (consumers, unacked deliveries, publisher confirms,
// transactions) and the outbound writer. It calls the broker core (server/core) for vhosts,
// exchanges and queues, and the queue-type interface (server/queue) for publishing, consuming and
// settling; it never asks what type a queue is.
//
// Goroutines: one accept loop per listener; per connection a reader (conn.serve, every method is
// handled inline on it) and, while there is output, a writer (outbound.run). Server.Shutdown
// waits for all of them.
//
// Lock order: channel.mu -> outbound.mu; confirms.mu -> outbound.mu; Server.replyMu and
// the listener tracker's lock (server/netserve) are leaves. Queue locks are never held while the session is called (queues call
// Deliver, Cancelled and Done unlocked), except around Consumer.Reserve/HasRoom, which take only
// outbound.mu.
package session

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"warren/amqp"
	"warren/server/auth"
	"warren/server/core"
	"warren/server/netserve"
	"warren/server/tlsconf"
)

// Config configures the AMQP front-end.
type Config struct {
	Core           *core.Broker
	Logger         *slog.Logger
	Heartbeat      time.Duration // proposed in connection.tune (0 disables)
	FrameMax       uint32
	ChannelMax     uint16
	MaxMessageSize uint64
	// Version is reported in connection.start's server properties.
	Version string
	// LoginFrom is which part of a client certificate the EXTERNAL mechanism logs in as
	// (--tls-login-from; default the distinguished name, as RabbitMQ's).
	LoginFrom auth.LoginFrom
}

// Server serves AMQP 0-9-1 clients on one listener.
type Server struct {
	cfg  Config
	core *core.Broker
	log  *slog.Logger

	net      *netserve.Tracker[*conn] // listeners, connections and their goroutines
	nextConn atomic.Uint64

	replyMu sync.Mutex
	replyTo map[string]*channel // direct reply-to keys -> channel with a reply consumer
}

// New creates the front-end; Serve starts it on a listener.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg, core: cfg.Core, log: cfg.Logger, net: netserve.NewTracker[*conn](cfg.Logger), replyTo: make(map[string]*channel)}
}

// Serve accepts connections on ln in the background until Shutdown.
func (s *Server) Serve(ln net.Listener) { s.serve(ln, nil) }

// ServeTLS accepts AMQPS connections on ln (a plain TCP listener: the TLS handshake runs on each
// connection's goroutine, bounded by the handshake timeout) in the background until Shutdown.
func (s *Server) ServeTLS(ln net.Listener, tc *tlsconf.Config) { s.serve(ln, tc) }

func (s *Server) serve(ln net.Listener, tc *tlsconf.Config) {
	s.net.Serve(ln, func(nc net.Conn) *conn {
		if tc != nil {
			nc = tls.Server(nc, tc.TLSConfig())
		}
		c := newConn(s, nc, s.nextConn.Add(1))
		c.tlsVerifyPeer = tc != nil && tc.VerifyPeer()
		return c
	}, (*conn).serve)
}

// Addr returns the bound address of the first listener (nil before Serve).
func (s *Server) Addr() net.Addr { return s.net.Addr() }

// Shutdown stops accepting, closes every client connection with 320 CONNECTION_FORCED and waits,
// bounded by ctx, for every goroutine to finish (then cuts the sockets still open).
func (s *Server) Shutdown(ctx context.Context) error {
	return s.net.Shutdown(ctx,
		func(c *conn) { c.forceClose(amqp.Errorf(amqp.ConnectionForced, "broker shutdown")) },
		func(c *conn) { c.nc.Close() })
}

func (s *Server) registerReplyTo(key string, ch *channel) {
	s.replyMu.Lock()
	s.replyTo[key] = ch
	s.replyMu.Unlock()
}

func (s *Server) unregisterReplyTo(key string) {
	s.replyMu.Lock()
	delete(s.replyTo, key)
	s.replyMu.Unlock()
}

func (s *Server) lookupReplyTo(key string) *channel {
	s.replyMu.Lock()
	defer s.replyMu.Unlock()
	return s.replyTo[key]
}
