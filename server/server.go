// Package server is Warren's AMQP 0-9-1 broker: the listener, connections, channels and vhosts.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"warren/amqp"
	"warren/server/cluster"
	"warren/storage"
)

// Version is reported in connection.start's server properties.
const Version = "0.1.0"

// Server is a running broker.
type Server struct {
	cfg Config
	log *slog.Logger

	vhosts map[string]*vhost // fixed after New: only "/" for now

	mu       sync.Mutex
	ln       net.Listener
	conns    map[*conn]struct{}
	closing  bool
	nextConn uint64

	replyMu sync.Mutex
	replyTo map[string]*channel // direct reply-to keys -> channel with a reply consumer

	nextConsumerID atomic.Uint64
	nextQueueID    atomic.Uint64

	db     *storage.DB
	alarms *alarms

	node  *cluster.Node  // the cluster layer (a one-node cluster unless configured)
	meta  *cluster.Group // the metadata group
	tag   uint16         // this node's tag in consumer ids
	epoch uint16         // this boot's tag in consumer ids

	started     time.Time
	janitor     chan *queueEntry // queues to delete off their own goroutines
	janitorQuit chan struct{}

	wg sync.WaitGroup // accept loop and connection goroutines
}

// New creates a broker from cfg. It does not listen until Start.
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
	s := &Server{
		cfg:         cfg,
		log:         cfg.Logger,
		db:          db,
		conns:       make(map[*conn]struct{}),
		replyTo:     make(map[string]*channel),
		started:     time.Now(),
		janitor:     make(chan *queueEntry, 64),
		janitorQuit: make(chan struct{}),
	}
	if err := s.startCluster(); err != nil {
		db.Close()
		return nil, err
	}
	s.wg.Add(1)
	go s.runJanitor()
	v := newVhost("/", db)
	s.vhosts = map[string]*vhost{"/": v}
	err = v.recover(s)
	if err == nil {
		err = s.startMeta()
	}
	if err != nil {
		close(s.janitorQuit)
		s.wg.Wait()
		v.close()
		s.node.Close()
		db.Close()
		return nil, fmt.Errorf("recover %s: %w", cfg.DataDir, err)
	}
	return s, nil
}

// Start binds the AMQP listener and serves in the background.
func (s *Server) Start() error {
	ln, err := net.Listen("tcp", s.cfg.AMQPListen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.AMQPListen, err)
	}
	a := newAlarms(s.cfg.DataDir, s.memoryLimit(), s.cfg.DiskFreeLimit, s.db, s.log)
	s.mu.Lock()
	s.ln = ln
	s.alarms = a
	s.mu.Unlock()
	s.log.Info("AMQP listener started", "addr", ln.Addr().String())
	s.wg.Add(1)
	go s.acceptLoop(ln)
	return nil
}

// Addr returns the bound AMQP address (nil before Start).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

func (s *Server) acceptLoop(ln net.Listener) {
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
		c := newConn(s, nc, s.nextConn)
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
	ln := s.ln
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	for _, c := range conns {
		c.forceClose(amqp.Errorf(amqp.ConnectionForced, "broker shutdown"))
	}
	close(s.janitorQuit)
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		// Give up waiting politely: cut the sockets.
		s.mu.Lock()
		for c := range s.conns {
			c.nc.Close()
		}
		s.mu.Unlock()
		<-done
		err = ctx.Err()
	}
	if s.alarms != nil {
		s.alarms.stop()
	}
	for _, v := range s.vhosts {
		v.close()
	}
	if cerr := s.node.Close(); cerr != nil {
		s.log.Warn("cannot stop the cluster layer cleanly", "err", cerr)
	}
	st := s.db.Stats()
	s.log.Info("storage totals", "commits", st.Batches, "transactions_fsynced", st.Txns, "operations", st.Ops,
		"uptime", time.Since(s.started).Round(time.Second))
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
	return int64(s.cfg.MemoryHighWatermark * float64(totalMemory()))
}

// SetResourceLimits changes the memory limit (bytes; 0 disables) and the disk free limit (bytes)
// of a running broker, and re-checks the alarms at once.
func (s *Server) SetResourceLimits(memoryBytes, diskFreeBytes int64) {
	s.mu.Lock()
	a := s.alarms
	if a == nil {
		// Not started yet: Start uses these.
		s.cfg.MemoryHighWatermarkBytes, s.cfg.DiskFreeLimit = memoryBytes, diskFreeBytes
		if memoryBytes == 0 {
			s.cfg.MemoryHighWatermark = 0
		}
	}
	s.mu.Unlock()
	if a != nil {
		a.setLimits(memoryBytes, diskFreeBytes)
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
