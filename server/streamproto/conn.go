package streamproto

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"warren/amqp"
	"warren/server/auth"
	"warren/server/core"
	"warren/server/streamproto/wire"
)

// step is where a connection is in RabbitMQ's sequence: peer properties, SASL handshake and
// authenticate, tune (the server's, then the client's answer), open.
type step uint8

const (
	stepConnected step = iota
	stepPeerProperties
	stepAuthenticating
	stepTuning // authenticated; the server's tune was sent
	stepTuned
	stepOpened
	stepCloseSent // the server sent close and waits for the answer
	stepClosing
)

// handshakeTimeout bounds the time from accept to open.
const handshakeTimeout = 10 * time.Second

// closeWait bounds how long a server-sent close waits for the client's answer.
const closeWait = 3 * time.Second

// SilentCloseDelay is how long a failed login (wrong password, unknown user) and a refused open
// (a vhost that does not exist or that the user may not use) wait before their answer
// (authentication_failure, vhost_access_failure), after which the connection is closed: RabbitMQ
// 4.x's rabbit_stream_reader sleeps ?SILENT_CLOSE_DELAY (3,000 ms) in both places, a tarpit that
// slows down the guessing of passwords and vhost names. Only the refused connection waits (see
// conn.withholdRefusal).
const SilentCloseDelay = 3 * time.Second

// conn is one stream-protocol connection.
type conn struct {
	s   *Server
	nc  net.Conn
	tc  *tls.Config
	out *outbound
	log *slog.Logger
	// sendfile: nc is a plain TCP connection, chunks may be sent from their files (set by serve).
	sendfile bool

	name        string
	connectedAt time.Time

	// Reader-goroutine state.
	r         *wire.Reader
	step      step
	mechanism string
	frameMax  uint32 // negotiated (0 = none)
	deliverV2 bool
	scratch   []byte
	pub       wire.Publish // reused for every publish frame

	// Set once at open and read by other goroutines (Info).
	user      atomic.Pointer[string]
	vhostName atomic.Pointer[string]
	vhost     *core.VHost
	grant     *auth.Grant
	clientP   atomic.Pointer[[]wire.Property]
	// closeReason is why the broker closed the connection (ForceClose), for the closed line.
	closeReason atomic.Pointer[string]
	heartbeat   atomic.Int64 // negotiated, ns

	lastRead atomic.Int64 // unix ns of the last frame read

	mu         sync.Mutex // publishers and subscriptions (the reader changes them; others read)
	publishers map[uint8]*publisher
	subs       map[uint8]*subscription
	updates    map[uint32]pendingUpdate // consumer updates sent, by correlation id
	nextCorr   uint32

	closing   atomic.Bool
	closeOnce sync.Once
	quit      chan struct{} // closed when the connection ends

	pubBytes pubCredit
}

func newConn(s *Server, nc net.Conn, tc *tls.Config) *conn {
	c := &conn{s: s, nc: nc, tc: tc, connectedAt: time.Now(), publishers: make(map[uint8]*publisher),
		subs: make(map[uint8]*subscription), quit: make(chan struct{})}
	c.name = nc.RemoteAddr().String() + " -> " + nc.LocalAddr().String()
	c.log = s.log.With("conn", c.name)
	c.pubBytes.init(s.cfg.PublishBufferBytes)
	return c
}

// serve runs the connection on its own goroutine until it ends.
func (c *conn) serve() {
	if c.tc != nil {
		tlsConn := tls.Server(c.nc, c.tc)
		_ = c.nc.SetDeadline(time.Now().Add(handshakeTimeout))
		if err := tlsConn.Handshake(); err != nil {
			c.log.Debug("TLS handshake failed", "err", err)
			c.nc.Close()
			return
		}
		_ = c.nc.SetDeadline(time.Time{})
		c.nc = tlsConn
	}
	// Chunks go from their storage files to a plain TCP socket with sendfile; through TLS they
	// are read and encrypted.
	_, c.sendfile = c.nc.(*net.TCPConn)
	c.out = newOutbound(c.nc)
	var writerWG sync.WaitGroup
	writerWG.Add(1)
	go func() {
		defer writerWG.Done()
		c.out.run()
	}()
	c.r = wire.NewReader(c.nc, wire.DefaultInitialFrameMax)
	hsTimer := time.AfterFunc(handshakeTimeout, func() {
		if c.stepOpened() {
			return
		}
		c.log.Info("stream connection did not open in time")
		c.nc.Close()
	})
	err := c.readLoop()
	hsTimer.Stop()
	reason := "client closed the connection"
	switch {
	case c.closing.Load():
		reason = "closed by the broker"
		if r := c.closeReason.Load(); r != nil {
			reason = *r
		}
	case err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed):
		reason = err.Error()
	}
	c.shutdown()
	c.out.close()
	writerWG.Wait()
	c.nc.Close()
	if c.stepOpened() {
		c.log.Info("connection closed", append(c.logFields(), "reason", reason)...)
	} else {
		c.log.Debug("stream connection closed before it opened", "reason", reason)
	}
}

// logFields are the fields of the operators' connection log lines (opened, closed): user, vhost,
// peer, the client's connection_name, the protocol.
func (c *conn) logFields() []any {
	var user, vhost string
	if u := c.user.Load(); u != nil {
		user = *u
	}
	if v := c.vhostName.Load(); v != nil {
		vhost = *v
	}
	return []any{"protocol", "stream", "user", user, "vhost", vhost, "peer", c.nc.RemoteAddr().String(),
		"client_name", c.clientName()}
}

// clientName is the connection_name the client gave in its peer properties ("" if none).
func (c *conn) clientName() string {
	if p := c.clientP.Load(); p != nil {
		for _, kv := range *p {
			if kv.Key == "connection_name" {
				return kv.Value
			}
		}
	}
	return ""
}

// actor is ctx carrying who this connection is, for the core's log lines of declares and
// deletes.
func (c *conn) actor(ctx context.Context) context.Context {
	var user string
	if u := c.user.Load(); u != nil {
		user = *u
	}
	return core.WithActor(ctx, core.Actor{User: user, Connection: c.name, Via: "stream", Peer: c.nc.RemoteAddr().String()})
}

// stepOpened reports, from any goroutine, whether open succeeded.
func (c *conn) stepOpened() bool { return c.vhostName.Load() != nil }

// readLoop reads and handles frames until the connection ends.
func (c *conn) readLoop() error {
	for {
		frame, err := c.r.ReadFrame()
		if err != nil {
			var tl *wire.FrameTooLargeError
			if errors.As(err, &tl) {
				c.log.Warn("frame too large", "size", tl.Size, "max", tl.Max)
				if c.step >= stepOpened && c.step < stepCloseSent {
					c.sendClose(wire.ResponseCodeFrameTooLarge, "frame too large")
					c.drainAfterClose()
				}
				return err
			}
			var de *wire.DecodeError
			if errors.As(err, &de) {
				// A frame too short for key and version: unknown data.
				if c.step >= stepOpened && c.step < stepCloseSent {
					c.sendClose(wire.ResponseCodeUnknownFrame, "unknown frame")
					c.drainAfterClose()
				}
				return err
			}
			return err
		}
		c.lastRead.Store(time.Now().UnixNano())
		if done := c.handle(frame); done {
			return nil
		}
	}
}

// drainAfterClose waits (bounded) for the client's answer to a server-sent close. After a
// frame too large the framing is lost: bytes are read until the client closes or time is up.
func (c *conn) drainAfterClose() {
	c.step = stepCloseSent
	_ = c.nc.SetReadDeadline(time.Now().Add(closeWait))
	for {
		f, err := c.r.ReadFrame()
		if err != nil {
			var tl *wire.FrameTooLargeError
			if !errors.As(err, &tl) {
				return
			}
			var buf [4096]byte
			for {
				if _, err := c.nc.Read(buf[:]); err != nil {
					return
				}
			}
		}
		if h, err := wire.PeekHeader(f); err == nil && h.Key == wire.CommandClose.Response() {
			return
		}
	}
}

// handle handles one frame; it returns true when the connection is to end.
func (c *conn) handle(frame []byte) bool {
	h, err := wire.PeekHeader(frame)
	if err != nil {
		return c.badFrame(err)
	}
	switch c.step {
	case stepCloseSent:
		// Only the answer to our close matters.
		if h.Key == wire.CommandClose.Response() {
			return true
		}
		return false
	case stepOpened:
		return c.handleOpened(h, frame)
	}
	return c.handlePreOpen(h, frame)
}

// badFrame answers a frame that does not decode: before open the connection is closed, after
// it a close with unknown_frame is sent, as RabbitMQ does.
func (c *conn) badFrame(err error) bool {
	c.log.Warn("bad stream frame", "err", err)
	if c.step == stepOpened {
		c.sendClose(wire.ResponseCodeUnknownFrame, "unknown frame")
		c.drainAfterClose()
	}
	return true
}

func (c *conn) write(cmd wire.Command) {
	b, err := cmd.Append(c.scratch[:0])
	if err != nil {
		c.log.Error("cannot encode stream frame", "command", cmd.Key(), "err", err)
		return
	}
	c.scratch = b
	c.out.send(b)
}

func (c *conn) respond(key wire.Key, corr uint32, code wire.ResponseCode) {
	c.write(&wire.Response{Command: key, CorrelationID: corr, Code: code})
}

// sendClose sends a server-initiated close request.
func (c *conn) sendClose(code wire.ResponseCode, reason string) {
	c.write(&wire.Close{CorrelationID: 1, Code: code, Reason: reason})
}

func (c *conn) handlePreOpen(h wire.Header, frame []byte) bool {
	switch {
	case h.Key == wire.CommandPeerProperties && c.step == stepConnected:
		var m wire.PeerProperties
		if err := m.Decode(frame); err != nil {
			return c.badFrame(err)
		}
		props := append([]wire.Property(nil), m.Properties...)
		c.clientP.Store(&props)
		c.write(&wire.PeerPropertiesResponse{CorrelationID: m.CorrelationID, Code: wire.ResponseCodeOK, Properties: []wire.Property{
			{Key: "cluster_name", Value: "warren"},
			{Key: "copyright", Value: "Copyright (c) the Warren authors"},
			{Key: "information", Value: "Licensed under the Apache License 2.0"},
			{Key: "platform", Value: "Go"},
			{Key: "product", Value: "Warren"},
			{Key: "version", Value: c.s.cfg.Version},
		}})
		c.step = stepPeerProperties
		return false
	case h.Key == wire.CommandSASLHandshake && (c.step == stepPeerProperties || c.step == stepAuthenticating):
		var m wire.SASLHandshake
		if err := m.Decode(frame); err != nil {
			return c.badFrame(err)
		}
		c.write(&wire.SASLHandshakeResponse{CorrelationID: m.CorrelationID, Code: wire.ResponseCodeOK, Mechanisms: []string{"PLAIN"}})
		c.step = stepAuthenticating
		return false
	case h.Key == wire.CommandSASLAuthenticate && c.step == stepAuthenticating:
		return c.authenticate(frame)
	case h.Key.Command() == wire.CommandTune && c.step == stepTuning:
		// The Go and Java clients answer the server's tune with 0x8014, rabbitmq-stream-js-client
		// with 0x0014 (the request's key); RabbitMQ accepts both.
		var m wire.Tune
		if err := m.Decode(frame); err != nil {
			return c.badFrame(err)
		}
		c.frameMax = negotiate(m.FrameMax, c.s.cfg.FrameMax)
		hb := negotiate(m.Heartbeat, uint32(c.s.cfg.Heartbeat/time.Second))
		c.heartbeat.Store(int64(time.Duration(hb) * time.Second))
		c.step = stepTuned
		return false
	case h.Key == wire.CommandOpen && c.step == stepTuned:
		return c.open(frame)
	case h.Key == wire.CommandHeartbeat:
		return false
	case h.Key == wire.CommandClose:
		var m wire.Close
		if err := m.Decode(frame); err != nil {
			return true
		}
		c.respond(wire.CommandClose, m.CorrelationID, wire.ResponseCodeOK)
		return true
	}
	c.log.Info("stream command before the connection is open: closing", "command", h.Key, "step", c.step)
	return true
}

// negotiate picks the smaller of two values where 0 means no limit.
func negotiate(client, server uint32) uint32 {
	switch {
	case client == 0:
		return server
	case server == 0:
		return client
	}
	return min(client, server)
}

func (c *conn) authenticate(frame []byte) bool {
	var m wire.SASLAuthenticate
	if err := m.Decode(frame); err != nil {
		return c.badFrame(err)
	}
	fail := func(code wire.ResponseCode) bool {
		c.write(&wire.SASLAuthenticateResponse{CorrelationID: m.CorrelationID, Code: code})
		return true
	}
	if m.Mechanism != "PLAIN" {
		return fail(wire.ResponseSASLMechanismNotSupported)
	}
	// PLAIN: [authzid] NUL authcid NUL password.
	parts := bytes.SplitN(m.Data, []byte{0}, 3)
	if len(parts) != 3 {
		c.log.Warn("malformed PLAIN response")
		return fail(wire.ResponseSASLError)
	}
	user, pass := string(parts[1]), string(parts[2])
	if err := c.s.cfg.Authenticate(user, pass, c.nc.RemoteAddr()); err != nil {
		var le *LoopbackError
		// The core counted and logged the refusal (user, peer, mechanism, reason).
		if errors.As(err, &le) {
			// As RabbitMQ: a loopback-only user is answered at once.
			return fail(wire.ResponseSASLAuthenticationFailureLoopback)
		}
		if !c.withholdRefusal("failed login") {
			return true // the connection ended while the answer was withheld
		}
		return fail(wire.ResponseAuthenticationFailure)
	}
	c.user.Store(&user)
	c.write(&wire.SASLAuthenticateResponse{CorrelationID: m.CorrelationID, Code: wire.ResponseCodeOK})
	c.write(&wire.Tune{FrameMax: c.s.cfg.FrameMax, Heartbeat: uint32(c.s.cfg.Heartbeat / time.Second)})
	c.step = stepTuning
	return false
}

// withholdRefusal waits the configured delay (Config.AuthFailureDelay, SilentCloseDelay by
// default) before a failed login or a refused open (what) is answered. It waits on the
// connection's own reader goroutine by reading, and dropping, what the client sends until a read
// deadline that far away, so that it blocks no other connection and ends early when the socket
// is closed: by the client, by Shutdown or an operator (ForceClose), or by the handshake timer.
// It reports whether the connection is still there to be answered.
func (c *conn) withholdRefusal(what string) bool {
	d := c.s.cfg.AuthFailureDelay
	if d <= 0 {
		return true
	}
	c.log.Debug("withholding the answer to a refusal", "refusal", what, "delay", d)
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	defer func() { _ = c.nc.SetReadDeadline(time.Time{}) }()
	var buf [512]byte
	for {
		_, err := c.nc.Read(buf[:])
		if err == nil {
			continue
		}
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout() && !c.closing.Load()
	}
}

func (c *conn) open(frame []byte) bool {
	var m wire.Open
	if err := m.Decode(frame); err != nil {
		return c.badFrame(err)
	}
	user := *c.user.Load()
	refuse := func(reason string, args ...any) bool {
		c.log.Warn("stream open refused", "vhost", m.VirtualHost, "user", user, "reason", fmt.Sprintf(reason, args...))
		if c.withholdRefusal("open refused") {
			c.write(&wire.OpenResponse{CorrelationID: m.CorrelationID, Code: wire.ResponseVhostAccessFailure})
		}
		return true
	}
	v := c.s.core.VHost(m.VirtualHost)
	if v == nil {
		return refuse("vhost does not exist")
	}
	grant, err := c.s.cfg.Grant(user, m.VirtualHost)
	if err != nil {
		return refuse("%v", err)
	}
	if grant == nil {
		return refuse("no permissions")
	}
	c.vhost, c.grant = v, grant
	c.step = stepOpened
	vh := m.VirtualHost
	c.vhostName.Store(&vh)
	c.r.SetMaxFrameSize(c.frameMax)
	// Registered before the response: a client that opens another connection once this one is
	// open finds it counted against the vhost's max-connections.
	c.s.core.RegisterConn(c)
	host, port := c.s.advertised(c.tc != nil)
	c.write(&wire.OpenResponse{CorrelationID: m.CorrelationID, Code: wire.ResponseCodeOK, Properties: []wire.Property{
		{Key: "advertised_host", Value: host}, {Key: "advertised_port", Value: itoa(port)},
	}})
	c.startHeartbeat()
	c.log.Info("connection opened", c.logFields()...)
	return false
}

// startHeartbeat sends a heartbeat every interval and closes a connection silent for two.
func (c *conn) startHeartbeat() {
	hb := time.Duration(c.heartbeat.Load())
	if hb <= 0 {
		return
	}
	c.s.net.Go(func() {
		t := time.NewTicker(hb)
		defer t.Stop()
		var hbFrame []byte
		hbFrame, _ = (&wire.Heartbeat{}).Append(nil)
		for {
			select {
			case <-c.quit:
				return
			case <-t.C:
				if time.Since(time.Unix(0, c.lastRead.Load())) > 2*hb {
					c.log.Info("stream connection missed heartbeats: closing")
					c.nc.Close()
					return
				}
				c.out.send(hbFrame)
			}
		}
	})
}

// handleOpened dispatches a command of an open connection.
func (c *conn) handleOpened(h wire.Header, frame []byte) bool {
	var err error
	switch h.Key {
	case wire.CommandPublish:
		err = c.publish(frame)
	case wire.CommandDeclarePublisher:
		err = c.declarePublisher(frame)
	case wire.CommandDeletePublisher:
		err = c.deletePublisher(frame)
	case wire.CommandQueryPublisherSequence:
		err = c.queryPublisherSequence(frame)
	case wire.CommandSubscribe:
		err = c.subscribe(frame)
	case wire.CommandCredit:
		err = c.credit(frame)
	case wire.CommandUnsubscribe:
		err = c.unsubscribe(frame)
	case wire.CommandStoreOffset:
		err = c.storeOffset(frame)
	case wire.CommandQueryOffset:
		err = c.queryOffset(frame)
	case wire.CommandCreateStream:
		err = c.createStream(frame)
	case wire.CommandDeleteStream:
		err = c.deleteStream(frame)
	case wire.CommandMetadata:
		err = c.metadata(frame)
	case wire.CommandStreamStats:
		err = c.streamStats(frame)
	case wire.CommandExchangeCommandVersions:
		err = c.exchangeCommandVersions(frame)
	case wire.CommandResolveOffsetSpec:
		err = c.resolveOffsetSpec(frame)
	case wire.CommandPartitions:
		err = c.partitions(frame)
	case wire.CommandRoute:
		err = c.route(frame)
	case wire.CommandCreateSuperStream:
		err = c.createSuperStream(frame)
	case wire.CommandDeleteSuperStream:
		err = c.deleteSuperStream(frame)
	case wire.CommandConsumerUpdate.Response():
		err = c.consumerUpdateResponse(frame)
	case wire.CommandHeartbeat:
		return false
	case wire.CommandClose:
		var m wire.Close
		if err := m.Decode(frame); err != nil {
			return c.badFrame(err)
		}
		c.closing.Store(true)
		c.respond(wire.CommandClose, m.CorrelationID, wire.ResponseCodeOK)
		return true
	case wire.CommandClose.Response():
		return true
	default:
		c.log.Warn("unknown stream command", "key", h.Key, "version", h.Version)
		c.sendClose(wire.ResponseCodeUnknownFrame, "unknown frame")
		c.drainAfterClose()
		return true
	}
	if err != nil {
		return c.badFrame(err)
	}
	return false
}

// shutdown ends the connection's publishers and subscriptions (reader goroutine, at the end).
func (c *conn) shutdown() {
	c.closeOnce.Do(func() { close(c.quit) })
	if c.stepOpened() {
		c.s.core.UnregisterConn(c)
	}
	c.mu.Lock()
	subs := make([]*subscription, 0, len(c.subs))
	for _, s := range c.subs {
		subs = append(subs, s)
	}
	clear(c.subs)
	clear(c.publishers)
	c.mu.Unlock()
	for _, s := range subs {
		c.stopSubscription(s)
	}
	c.out.kick()
	c.pubBytes.abort()
}

// Info implements core.ClientConn.
func (c *conn) Info() core.ConnectionInfo {
	ci := core.ConnectionInfo{Name: c.name, Protocol: "stream", State: "running", Peer: c.nc.RemoteAddr().String(),
		Local: c.nc.LocalAddr().String(), FrameMax: c.frameMaxValue(), Heartbeat: time.Duration(c.heartbeat.Load()),
		ConnectedAt: c.connectedAt}
	if c.closing.Load() {
		ci.State = "closing"
	}
	if u := c.user.Load(); u != nil {
		ci.User = *u
	}
	if v := c.vhostName.Load(); v != nil {
		ci.VHost = *v
	}
	if p := c.clientP.Load(); p != nil {
		t := amqp.Table{}
		for _, kv := range *p {
			t[kv.Key] = kv.Value
		}
		ci.ClientProperties = t
	}
	return ci
}

func (c *conn) frameMaxValue() uint32 { return c.r.MaxFrameSize() }

// ForceClose implements core.ClientConn: an operator (or shutdown) closes the connection. As
// RabbitMQ's stream reader does, the socket is closed.
func (c *conn) ForceClose(code uint16, text string) {
	if c.closing.Swap(true) {
		return
	}
	c.closeReason.Store(&text)
	c.log.Info("closing stream connection", "reason", text)
	c.nc.Close()
}

// pubCredit bounds the bytes a connection has published and not had confirmed.
type pubCredit struct {
	mu      sync.Mutex
	cond    *sync.Cond
	limit   int64
	used    int64
	aborted bool
}

func (p *pubCredit) init(limit int64) {
	p.limit = limit
	p.cond = sync.NewCond(&p.mu)
}

// acquire waits for room for n bytes (a batch larger than the limit waits for an empty buffer).
func (p *pubCredit) acquire(n int64) {
	p.mu.Lock()
	for !p.aborted && p.used > 0 && p.used+n > p.limit {
		p.cond.Wait()
	}
	p.used += n
	p.mu.Unlock()
}

func (p *pubCredit) release(n int64) {
	p.mu.Lock()
	p.used -= n
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *pubCredit) abort() {
	p.mu.Lock()
	p.aborted = true
	p.cond.Broadcast()
	p.mu.Unlock()
}
