// Package server wires one Warren node together: storage, the cluster layer, the broker core
// (server/core) and the AMQP 0-9-1 front-end (server/session). cmd/warren and the tests start
// a broker through it; the HTTP API reads it through the views in admin.go.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"warren/amqp"
	"warren/server/cluster"
	"warren/server/core"
	"warren/server/queue"
	"warren/server/queue/streamq"
	"warren/server/session"
	"warren/server/streamproto"
	"warren/server/tlsconf"
	"warren/storage"
)

// Server is a running broker node.
type Server struct {
	cfg Config
	log *slog.Logger

	db   *storage.DB
	node *cluster.Node
	core *core.Broker
	amqp *session.Server
	tls  *tlsconf.Config // the AMQPS listener's, nil without one
	// stream is the stream-protocol front-end (nil when its listeners are off).
	stream *streamproto.Server

	tlsAddr net.Addr

	mu      sync.Mutex
	started bool

	startedAt time.Time
}

// New opens the data directory, starts the cluster layer and recovers the broker core. It does
// not listen until Start.
func New(cfg Config) (*Server, error) {
	def := DefaultConfig()
	if cfg.AMQPListen == "" {
		cfg.AMQPListen = def.AMQPListen
	}
	if cfg.FrameMax == 0 {
		cfg.FrameMax = def.FrameMax
	}
	if cfg.FrameMax < amqp.FrameMinSize {
		return nil, fmt.Errorf("frame max %d is below the AMQP minimum %d", cfg.FrameMax, amqp.FrameMinSize)
	}
	if cfg.ChannelMax == 0 {
		cfg.ChannelMax = def.ChannelMax
	}
	if cfg.MaxMessageSize == 0 {
		cfg.MaxMessageSize = def.MaxMessageSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Version == "" {
		cfg.Version = def.Version
	}
	if cfg.DataDir == "" {
		cfg.DataDir = def.DataDir
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	db, err := storage.Open(storage.Options{Dir: cfg.DataDir, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, db: db, startedAt: time.Now()}
	id := cfg.NodeID
	if id == "" {
		id = "warren"
	}
	var coreRef atomic.Pointer[core.Broker]
	node, err := cluster.Start(cluster.Config{
		NodeID: id, Listen: cfg.ClusterListen, Peers: cfg.ClusterPeers, Join: cfg.ClusterJoin,
		DB: db, DataDir: cfg.DataDir, Logger: cfg.Logger,
		OnPeerChange: func(id string, up bool) {
			if b := coreRef.Load(); b != nil {
				b.PeerChanged(id, up)
			}
		},
		CountConnections: func(vhost string) int {
			if b := coreRef.Load(); b != nil {
				return b.LocalConnections(vhost)
			}
			return 0
		},
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("start cluster node: %w", err)
	}
	s.node = node
	types := append([]queue.Type{queue.ClassicType{}, queue.QuorumType{}, streamq.Type{}}, cfg.QueueTypes...)
	if cfg.LoopbackUsers == nil {
		cfg.LoopbackUsers = def.LoopbackUsers
	}
	if cfg.TLSLoginFrom == "" {
		cfg.TLSLoginFrom = def.TLSLoginFrom
	}
	if cfg.AMQPSListen != "" || cfg.StreamTLSListen != "" {
		if s.tls, err = tlsconf.Load(cfg.TLS); err != nil {
			node.Close()
			db.Close()
			return nil, fmt.Errorf("TLS listener: %w", err)
		}
	}
	b, err := core.New(core.Options{DB: db, Node: node, Join: cfg.ClusterJoin, Logger: cfg.Logger,
		ConsumerTimeout: cfg.ConsumerTimeout, Types: types,
		DefaultUser: cfg.DefaultUser, DefaultPass: cfg.DefaultPass, LoopbackUsers: cfg.LoopbackUsers,
		StartAbort: cfg.StartAbort})
	if err != nil {
		node.Close()
		db.Close()
		return nil, fmt.Errorf("recover %s: %w", cfg.DataDir, err)
	}
	coreRef.Store(b)
	s.core = b
	s.amqp = session.New(session.Config{
		Core: b, Logger: cfg.Logger, Heartbeat: cfg.Heartbeat, FrameMax: cfg.FrameMax, ChannelMax: cfg.ChannelMax,
		MaxMessageSize: cfg.MaxMessageSize, Version: cfg.Version, LoginFrom: cfg.TLSLoginFrom,
	})
	if cfg.LoadDefinitions != "" {
		if err := s.loadDefinitionsFile(cfg.LoadDefinitions); err != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = s.Shutdown(ctx)
			return nil, err
		}
	}
	s.newStreamFrontEnd()
	return s, nil
}

// Start binds the AMQP listener and serves in the background.
func (s *Server) Start() error {
	ln, err := net.Listen("tcp", s.cfg.AMQPListen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.AMQPListen, err)
	}
	if err := s.startStream(); err != nil {
		ln.Close()
		return err
	}
	s.mu.Lock()
	s.started = true
	s.mu.Unlock()
	var tlsLn net.Listener
	if s.cfg.AMQPSListen != "" {
		if tlsLn, err = net.Listen("tcp", s.cfg.AMQPSListen); err != nil {
			ln.Close()
			return fmt.Errorf("listen on %s: %w", s.cfg.AMQPSListen, err)
		}
	}
	s.core.StartAlarms(s.cfg.DataDir, s.memoryLimit(), s.cfg.DiskFreeLimit)
	s.log.Info("AMQP listener started", "addr", ln.Addr().String())
	s.amqp.Serve(ln)
	if tlsLn != nil {
		s.tlsAddr = tlsLn.Addr()
		s.log.Info("AMQPS listener started", "addr", tlsLn.Addr().String(), "verify_peer", s.cfg.TLS.VerifyPeer,
			"certificate_expires", s.tls.Certificate().NotAfter)
		s.amqp.ServeTLS(tlsLn, s.tls)
	}
	return nil
}

// Addr returns the bound AMQP address (nil before Start).
func (s *Server) Addr() net.Addr { return s.amqp.Addr() }

// TLSAddr returns the bound AMQPS address (nil without one or before Start).
func (s *Server) TLSAddr() net.Addr { return s.tlsAddr }

// ReloadTLS reads the AMQPS certificate files again (SIGHUP); connections opened afterwards use
// them. Without an AMQPS listener it does nothing.
func (s *Server) ReloadTLS() error {
	if s.tls == nil {
		return nil
	}
	return s.tls.Reload()
}

// Core is the node's broker core (for the HTTP API and other front-ends).
func (s *Server) Core() *core.Broker { return s.core }

// Version is the version the broker reports.
func (s *Server) Version() string { return s.cfg.Version }

// Shutdown stops accepting, closes every client connection with 320 CONNECTION_FORCED and waits,
// bounded by ctx, for every goroutine to finish; then it stops the core, the cluster layer and
// storage.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.amqp.Shutdown(ctx)
	if serr := s.shutdownStream(ctx); err == nil {
		err = serr
	}
	s.core.Close()
	if cerr := s.node.Close(); cerr != nil {
		s.log.Warn("cannot stop the cluster layer cleanly", "err", cerr)
	}
	st := s.db.Stats()
	s.log.Info("storage totals", "commits", st.Batches, "transactions_fsynced", st.Txns, "operations", st.Ops,
		"uptime", time.Since(s.startedAt).Round(time.Second))
	if cerr := s.db.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close storage: %w", cerr)
	}
	s.log.Info("broker stopped")
	return err
}

// memoryLimit turns the configured watermark into bytes.
func (s *Server) memoryLimit() int64 {
	if s.cfg.MemoryHighWatermarkBytes > 0 {
		return s.cfg.MemoryHighWatermarkBytes
	}
	if s.cfg.MemoryHighWatermark <= 0 {
		return 0
	}
	return int64(s.cfg.MemoryHighWatermark * float64(core.TotalMemory()))
}

// SetResourceLimits changes the memory limit (bytes; 0 disables) and the disk free limit (bytes)
// of a running broker, and re-checks the alarms at once.
func (s *Server) SetResourceLimits(memoryBytes, diskFreeBytes int64) {
	if a := s.core.Alarms(); a != nil {
		a.SetLimits(memoryBytes, diskFreeBytes)
		return
	}
	// Not started yet: Start uses these.
	s.cfg.MemoryHighWatermarkBytes, s.cfg.DiskFreeLimit = memoryBytes, diskFreeBytes
	if memoryBytes == 0 {
		s.cfg.MemoryHighWatermark = 0
	}
}
