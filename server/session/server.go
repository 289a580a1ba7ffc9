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
// Lock order: channel.mu -> outbound.mu; confirms.mu -> outbound.mu; Server.mu and
// Server.replyMu are leaves. Queue locks are never held while the session is called (queues call
// Deliver, Cancelled and Done unlocked), except around Consumer.Reserve/HasRoom, which take only
// outbound.mu.
package session

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"warren/amqp"
	"warren/server/auth"
	"warren/server/core"
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

	mu       sync.Mutex
	ln       net.Listener   // the first listener served (Addr)
	lns      []net.Listener // every listener, closed by Shutdown
	conns    map[*conn]struct{}
	closing  bool
	nextConn uint64

	replyMu sync.Mutex
	replyTo map[string]*channel // direct reply-to keys -> channel with a reply consumer

	wg sync.WaitGroup // accept loop and connection goroutines
}

// New creates the front-end; Serve starts it on a listener.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg, core: cfg.Core, log: cfg.Logger, conns: make(map[*conn]struct{}), replyTo: make(map[string]*channel)}
}

// Serve accepts connections on ln in the background until Shutdown.
func (s *Server) Serve(ln net.Listener) { s.serve(ln, nil) }

// ServeTLS accepts AMQPS connections on ln (a plain TCP listener: the TLS handshake runs on each
// connection's goroutine, bounded by the handshake timeout) in the background until Shutdown.
func (s *Server) ServeTLS(ln net.Listener, tc *tlsconf.Config) { s.serve(ln, tc) }

func (s *Server) serve(ln net.Listener, tc *tlsconf.Config) {
	s.mu.Lock()
	if s.ln == nil {
		s.ln = ln
	}
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	s.wg.Add(1)
	go s.acceptLoop(ln, tc)
}

// Addr returns the bound address (nil before Serve).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

func (s *Server) acceptLoop(ln net.Listener, tc *tlsconf.Config) {
	defer s.wg.Done()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary failures (EMFILE and the like): back off rather than spin.
			if delay == 0 {
				delay = 5 * time.Millisecond
			} else if delay < time.Second {
				delay *= 2
			}
			s.log.Warn("accept failed", "err", err, "retry_in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			nc.Close()
			continue
		}
		s.nextConn++
		if tc != nil {
			nc = tls.Server(nc, tc.TLSConfig())
		}
		c := newConn(s, nc, s.nextConn)
		c.tlsVerifyPeer = tc != nil && tc.VerifyPeer()
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

func (s *Server) removeConn(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Shutdown stops accepting, closes every client connection with 320 CONNECTION_FORCED and waits,
// bounded by ctx, for every goroutine to finish.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	lns := s.lns
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	for _, c := range conns {
		c.forceClose(amqp.Errorf(amqp.ConnectionForced, "broker shutdown"))
	}
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		// Give up waiting politely: cut the sockets.
		s.mu.Lock()
		for c := range s.conns {
			c.nc.Close()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
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
