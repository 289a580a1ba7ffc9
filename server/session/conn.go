package session

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"warren/amqp"
	"warren/server/core"
	"warren/server/stats"
	"warren/server/tlsconf"
)

const (
	handshakeTimeout = 10 * time.Second
	// closeOkTimeout bounds how long we wait for connection.close-ok after sending connection.close.
	closeOkTimeout = 3 * time.Second
)

// conn is one client connection. Its reader goroutine (serve) parses frames and handles every
// method inline; its writer goroutine (outbound.run) batches frames into few writes.
type conn struct {
	s   *Server
	id  uint64
	nc  net.Conn
	log connLogger
	out *outbound
	fr  *amqp.FrameReader

	vhost *core.VHost
	user  string
	tags  []string // the user's tags at login
	// endReason says why the connection ended, for the "connection closed" line; set on the
	// reader goroutine only (the first reason wins), or from forceText for a forced close.
	endReason string
	forceText atomic.Pointer[string]
	// tlsVerifyPeer is set for connections of a TLS listener that verifies client certificates
	// (the EXTERNAL mechanism needs that).
	tlsVerifyPeer bool
	frameMax      uint32
	channelMax    uint16
	heartbeat     time.Duration

	clientProps amqp.Table // connection.start-ok's client properties; set before open
	connectedAt time.Time
	registered  bool         // RegisterConn was called (at connection.open); only the conn goroutine uses it
	nChannels   atomic.Int32 // len(channels), for readers off the reader goroutine

	capCancelNotify bool
	capBlocked      bool
	capAuthFailure  bool

	listMu sync.Mutex          // guards listed, a leaf
	listed map[uint16]*channel // the open channels, for Channels (other goroutines)

	// Reader-goroutine state.
	channels      map[uint16]*channel
	closing       bool // we sent connection.close and wait for close-ok
	confirmDirty  []*channel
	exclusiveQs   map[*core.Queue]struct{}
	readTimeout   time.Duration
	forceDeadline atomic.Int64 // unix nanos; set by Shutdown to bound the wait for close-ok
	forced        atomic.Bool
	open          atomic.Bool   // handshake done
	stop          bool          // reader: the connection is finished
	quit          chan struct{} // closed by forceClose
	credit        credit
	peerCloses    bool // we sent close-ok: let the client close the socket first

	// closedInRead are the channels the client closed since the reader last waited for the socket.
	// RabbitMQ still holds such a channel closing while it handles the frames that came with the
	// close: another channel.close gets another close-ok, anything else is dropped.
	closedInRead []uint16
}

func newConn(s *Server, nc net.Conn, id uint64) *conn {
	c := &conn{
		s:        s,
		id:       id,
		nc:       nc,
		log:      connLogger{l: s.log, id: id, peer: nc.RemoteAddr()},
		out:      newOutbound(nc),
		channels: make(map[uint16]*channel),
		quit:     make(chan struct{}),
	}
	c.credit.init(connectionCredit)
	return c
}

// connectionCredit bounds the bytes of persistent messages a connection may have on their way to
// disk; past it the reader stops reading until commits catch up, so a fast publisher cannot outrun
// the disk without limit.
const connectionCredit = 16 << 20

// credit is a byte budget: acquire blocks while it is used up.
type credit struct {
	mu      sync.Mutex
	cond    sync.Cond
	used    int64
	limit   int64
	aborted bool // the connection is being closed: nobody waits any more
}

func (c *credit) init(limit int64) {
	c.limit = limit
	c.cond.L = &c.mu
}

func (c *credit) acquire(n int64) {
	c.mu.Lock()
	for c.used > 0 && c.used+n > c.limit && !c.aborted {
		c.cond.Wait()
	}
	c.used += n
	c.mu.Unlock()
}

// abort wakes a reader waiting for credit and lets every later acquire through (shutdown, or an
// operator closing the connection, must not wait for the disk to catch up).
func (c *credit) abort() {
	c.mu.Lock()
	c.aborted = true
	c.mu.Unlock()
	c.cond.Broadcast()
}

func (c *credit) release(n int64) {
	c.mu.Lock()
	c.used -= n
	c.mu.Unlock()
	c.cond.Broadcast()
}

// waitWhileBlocked holds a publishing connection while a resource alarm is raised: it tells the
// client with connection.blocked (if it asked for that) and stops reading until the alarm clears.
func (c *conn) waitWhileBlocked() {
	a := c.s.core.Alarms()
	if a == nil {
		return
	}
	reason, cleared := a.Blocked()
	if reason == "" {
		return
	}
	if c.capBlocked {
		c.out.sendMethod(0, &amqp.ConnectionBlocked{Reason: reason})
	}
	c.log.Info("connection blocked by a resource alarm", "reason", reason)
	select {
	case <-cleared:
	case <-c.quit:
		return
	}
	if c.capBlocked {
		c.out.sendMethod(0, &amqp.ConnectionUnblocked{})
	}
	c.log.Info("connection unblocked")
}

// connLogger logs with the connection's id and peer. It adds them per call rather than holding a
// derived slog.Logger, which would cost every idle connection its own pre-formatted handler.
type connLogger struct {
	l    *slog.Logger
	id   uint64
	peer net.Addr
}

func (c connLogger) log(level slog.Level, msg string, args []any) {
	if !c.l.Enabled(context.Background(), level) {
		return
	}
	c.l.Log(context.Background(), level, msg, append([]any{"conn", c.id, "peer", c.peer.String()}, args...)...)
}

func (c connLogger) Debug(msg string, args ...any) { c.log(slog.LevelDebug, msg, args) }
func (c connLogger) Info(msg string, args ...any)  { c.log(slog.LevelInfo, msg, args) }
func (c connLogger) Warn(msg string, args ...any)  { c.log(slog.LevelWarn, msg, args) }
func (c connLogger) Error(msg string, args ...any) { c.log(slog.LevelError, msg, args) }

// deadlineReader refreshes the read deadline before each read: heartbeats (two missed intervals mean
// the peer is dead) or the handshake timeout, whichever applies, bounded by a forced-close deadline.
type deadlineReader struct{ c *conn }

func (r deadlineReader) Read(p []byte) (int, error) {
	c := r.c
	var dl time.Time
	if c.readTimeout > 0 {
		dl = time.Now().Add(c.readTimeout)
	}
	if f := c.forceDeadline.Load(); f != 0 {
		if fd := time.Unix(0, f); dl.IsZero() || fd.Before(dl) {
			dl = fd
		}
	}
	c.nc.SetReadDeadline(dl)
	return c.nc.Read(p)
}

func (c *conn) serve() {
	c.readTimeout = handshakeTimeout
	c.fr = amqp.NewFrameReader(deadlineReader{c}, c.s.cfg.FrameMax)

	if tc, ok := c.nc.(*tls.Conn); ok {
		ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
		err := tlsconf.Handshake(ctx, tc)
		cancel()
		if err != nil {
			c.log.Info("TLS handshake failed", "err", err)
			c.nc.Close()
			return
		}
	}
	var hdr [8]byte
	if _, err := io.ReadFull(deadlineReader{c}, hdr[:]); err != nil {
		c.nc.Close()
		return
	}
	if string(hdr[:]) != amqp.ProtocolHeader {
		// Tell the client which version we speak, then hang up (the spec's version negotiation).
		c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		c.nc.Write([]byte(amqp.ProtocolHeader))
		c.nc.Close()
		return
	}

	defer func() {
		c.cleanup()
		c.out.finish()
		select {
		case <-c.out.wait():
		case <-time.After(5 * time.Second):
			c.nc.Close()
			<-c.out.wait()
		}
		if c.peerCloses {
			// As RabbitMQ: after close-ok the client closes first; wait briefly for its EOF.
			c.nc.SetReadDeadline(time.Now().Add(closeOkTimeout))
			var scratch [512]byte
			for {
				if _, err := c.nc.Read(scratch[:]); err != nil {
					break
				}
			}
		}
		c.nc.Close()
	}()

	err := c.handshake()
	if c.registered {
		defer c.s.core.UnregisterConn(c)
	}
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code != 0 {
			c.closeWithError(ae)
			c.awaitCloseOk()
		} else {
			c.log.Debug("handshake failed", "err", err)
		}
		return
	}
	c.log.Info("connection opened", c.logFields()...)
	defer func() {
		reason := c.endReason
		if t := c.forceText.Load(); t != nil && (reason == "" || c.forced.Load()) {
			reason = *t
		}
		if reason == "" {
			reason = "connection lost"
		}
		c.log.Info("connection closed", append(c.logFields(), "reason", reason)...)
	}()
	if c.forced.Load() {
		c.closeWithError(amqp.Errorf(amqp.ConnectionForced, "broker shutdown"))
		return
	}
	c.readLoop()
}

// handshake runs connection.start .. connection.open.
func (c *conn) handshake() error {
	caps := amqp.Table{
		"publisher_confirms":           true,
		"exchange_exchange_bindings":   true,
		"basic.nack":                   true,
		"consumer_cancel_notify":       true,
		"connection.blocked":           true,
		"consumer_priorities":          true,
		"authentication_failure_close": true,
		"per_consumer_qos":             true,
		"direct_reply_to":              true,
	}
	start := &amqp.ConnectionStart{
		VersionMajor: 0,
		VersionMinor: 9,
		ServerProperties: amqp.Table{
			"product":      "Warren",
			"version":      c.s.cfg.Version,
			"platform":     "Go",
			"copyright":    "Copyright (c) the Warren authors",
			"information":  "Licensed under the Apache License 2.0",
			"capabilities": caps,
			"cluster_name": "warren",
		},
		Mechanisms: c.mechanisms(),
		Locales:    "en_US",
	}
	// Write the handshake frames directly: the writer goroutine is not running yet.
	if err := c.writeNow(amqp.AppendMethodFrame(nil, 0, start)); err != nil {
		return err
	}

	m, err := c.readHandshakeMethod()
	if err != nil {
		return err
	}
	so, ok := m.(*amqp.ConnectionStartOk)
	if !ok {
		return unexpectedHandshakeMethod("starting", m)
	}
	c.clientProps = so.ClientProperties
	if capsV, ok := so.ClientProperties["capabilities"].(amqp.Table); ok {
		c.capCancelNotify = capsV["consumer_cancel_notify"] == true
		c.capBlocked = capsV["connection.blocked"] == true
		c.capAuthFailure = capsV["authentication_failure_close"] == true
	}
	if err := c.login(so.Mechanism, so.Response); err != nil {
		return err
	}

	tune := &amqp.ConnectionTune{
		ChannelMax: c.s.cfg.ChannelMax,
		FrameMax:   c.s.cfg.FrameMax,
		Heartbeat:  uint16(c.s.cfg.Heartbeat / time.Second),
	}
	if err := c.writeNow(amqp.AppendMethodFrame(nil, 0, tune)); err != nil {
		return err
	}
	m, err = c.readHandshakeMethod()
	if err != nil {
		return err
	}
	to, ok := m.(*amqp.ConnectionTuneOk)
	if !ok {
		return unexpectedHandshakeMethod("tuning", m)
	}
	c.channelMax = c.s.cfg.ChannelMax
	if to.ChannelMax != 0 {
		if to.ChannelMax > c.s.cfg.ChannelMax {
			return amqp.Errorf(amqp.NotAllowed, "negotiated channel_max = %d is higher than the maximum allowed value (%d)",
				to.ChannelMax, c.s.cfg.ChannelMax)
		}
		c.channelMax = to.ChannelMax
	}
	c.frameMax = c.s.cfg.FrameMax
	if to.FrameMax != 0 {
		if to.FrameMax > c.s.cfg.FrameMax {
			return amqp.Errorf(amqp.NotAllowed, "negotiated frame_max = %d is higher than the maximum allowed value (%d)",
				to.FrameMax, c.s.cfg.FrameMax)
		}
		if to.FrameMax < amqp.FrameMinSize {
			return amqp.Errorf(amqp.NotAllowed, "negotiated frame_max = %d is lower than the minimum allowed value (%d)",
				to.FrameMax, amqp.FrameMinSize)
		}
		c.frameMax = to.FrameMax
	}
	c.fr.SetMaxFrameSize(c.frameMax)
	c.out.frameMax = c.frameMax
	c.heartbeat = time.Duration(to.Heartbeat) * time.Second
	c.out.startHeartbeats(c.heartbeat)

	m, err = c.readHandshakeMethod()
	if err != nil {
		return err
	}
	op, ok := m.(*amqp.ConnectionOpen)
	if !ok {
		return unexpectedHandshakeMethod("opening", m)
	}
	v, aerr := c.openVHost(op.VirtualHost)
	if aerr != nil {
		aerr.ClassID, aerr.MethodID = amqp.ClassConnection, 40
		return aerr
	}
	c.vhost = v
	if c.heartbeat > 0 {
		c.readTimeout = 2 * c.heartbeat
	} else {
		c.readTimeout = 0
	}
	// Registered before open-ok: a client that opens another connection once this one is open
	// finds it counted against the vhost's max-connections.
	c.connectedAt = time.Now()
	c.open.Store(true)
	c.s.core.RegisterConn(c)
	c.registered = true
	c.out.sendMethod(0, &amqp.ConnectionOpenOk{})
	c.log.Debug("connection open", "user", c.user, "vhost", v.Name(), "heartbeat", c.heartbeat, "frame_max", c.frameMax)
	return nil
}

// writeNow writes before the writer goroutine runs (handshake only).
func (c *conn) writeNow(b []byte) error {
	c.nc.SetWriteDeadline(time.Now().Add(handshakeTimeout))
	_, err := c.nc.Write(b)
	c.nc.SetWriteDeadline(time.Time{})
	return err
}

// readHandshakeMethod reads the next method frame on channel 0, skipping heartbeats. Any other
// frame, or one on another channel (a channel.open before connection.open), is 505 as in RabbitMQ.
func (c *conn) readHandshakeMethod() (amqp.Method, error) {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return nil, err
		}
		if f.Channel != 0 || (f.Type != amqp.FrameMethod && f.Type != amqp.FrameHeartbeat) {
			return nil, amqp.UnexpectedFrameError(f)
		}
		if f.Type == amqp.FrameHeartbeat {
			continue
		}
		m, err := amqp.DecodeMethod(f.Payload)
		if err != nil {
			return nil, decodeError(err)
		}
		if _, ok := m.(*amqp.ConnectionClose); ok {
			return nil, errors.New("client closed during handshake")
		}
		return m, nil
	}
}

// unexpectedHandshakeMethod is RabbitMQ's answer to a method other than the one the handshake
// waits for in state ("starting", "tuning", "opening").
func unexpectedHandshakeMethod(state string, m amqp.Method) *amqp.Error {
	e := amqp.Errorf(amqp.ChannelError, "unexpected method in connection state %s", state)
	e.ClassID, e.MethodID = m.ClassID(), m.MethodID()
	return e
}

// parseCredentials decodes a PLAIN or AMQPLAIN start-ok response.
func parseCredentials(mechanism, response string) (user, pass string, err error) {
	switch mechanism {
	case "PLAIN":
		// [authzid] NUL authcid NUL passwd
		parts := bytes.Split([]byte(response), []byte{0})
		if len(parts) != 3 {
			return "", "", errors.New("malformed PLAIN response")
		}
		return string(parts[1]), string(parts[2]), nil
	case "AMQPLAIN":
		// A field table without its length prefix.
		b := make([]byte, 4+len(response))
		binary.BigEndian.PutUint32(b, uint32(len(response)))
		copy(b[4:], response)
		t, _, err := amqp.DecodeTable(b)
		if err != nil {
			return "", "", fmt.Errorf("malformed AMQPLAIN response: %w", err)
		}
		u, _ := t["LOGIN"].(string)
		p, _ := t["PASSWORD"].(string)
		return u, p, nil
	default:
		return "", "", amqp.Errorf(amqp.CommandInvalid, "unknown authentication mechanism '%s'", mechanism)
	}
}

// decodeError maps a method decoding error onto the connection.close RabbitMQ sends: 501 for
// arguments that do not fill their frame, 540 for an unknown method, 502 for other malformed data
// (a bad type tag in a field table, where RabbitMQ drops the connection).
func decodeError(err error) *amqp.Error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return ae
	}
	var fe *amqp.FramingError
	if errors.As(err, &fe) {
		return fe.Reply()
	}
	var um *amqp.UnknownMethodError
	if errors.As(err, &um) {
		return amqp.Errorf(amqp.NotImplemented, "unknown method (class %d, method %d)", um.ClassID, um.MethodID)
	}
	return amqp.Errorf(amqp.SyntaxError, "cannot decode method: %v", err)
}

// readLoop handles frames until the connection ends.
func (c *conn) readLoop() {
	for {
		if c.fr.Buffered() == 0 {
			// About to block on the socket: publish confirms for everything handled so far.
			c.flushConfirms()
			c.closedInRead = c.closedInRead[:0]
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) && !c.closing {
				c.closeWithError(ae)
				return
			}
			if c.closing || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !c.forced.Load() {
				c.log.Warn("missed heartbeats from client, closing connection", "timeout", c.readTimeout)
				c.setEndReason("missed heartbeats from client, timeout: " + c.readTimeout.String())
			} else {
				c.log.Debug("read failed", "err", err)
				c.setEndReason("read failed: " + err.Error())
			}
			return
		}
		if c.closing {
			// After our connection.close only close-ok (or a crossing close) matters.
			if f.Type == amqp.FrameMethod && f.Channel == 0 && len(f.Payload) >= 4 {
				cls := binary.BigEndian.Uint16(f.Payload)
				mid := binary.BigEndian.Uint16(f.Payload[2:])
				if cls == amqp.ClassConnection && (mid == 51 || mid == 50) {
					if mid == 50 {
						c.writeCloseOkAndStop()
					}
					return
				}
			}
			continue
		}
		var aerr *amqp.Error
		switch f.Type {
		case amqp.FrameHeartbeat:
			if f.Channel != 0 {
				aerr = amqp.Errorf(amqp.UnexpectedFrame, "heartbeat frame on channel %d", f.Channel)
			}
		case amqp.FrameMethod:
			aerr = c.handleMethodFrame(f)
		case amqp.FrameHeader, amqp.FrameBody:
			aerr = c.handleContentFrame(f)
		default:
			aerr = amqp.Errorf(amqp.FrameError, "unknown frame type %d", f.Type)
		}
		if aerr != nil {
			c.closeWithError(aerr)
			if !c.closing {
				return
			}
		}
		if c.done() {
			return
		}
	}
}

// done reports whether the reader should stop (a close handshake finished).
func (c *conn) done() bool { return c.stop }

// writeCloseOkAndStop answers a client's connection.close.
func (c *conn) writeCloseOkAndStop() {
	c.out.sendFinal(0, &amqp.ConnectionCloseOk{})
	c.stop = true
	c.peerCloses = true
}

// closeWithError sends connection.close and waits (bounded) for close-ok.
func (c *conn) closeWithError(e *amqp.Error) {
	if c.closing {
		return
	}
	c.log.Info("closing connection", "code", e.Code, "text", e.Text)
	c.setEndReason(e.Text)
	c.closing = true
	c.releaseChannels()
	c.out.sendMethod(0, &amqp.ConnectionClose{ReplyCode: e.Code, ReplyText: e.Text, FailingClassID: e.ClassID, FailingMethodID: e.MethodID})
	dl := time.Now().Add(closeOkTimeout).UnixNano()
	if f := c.forceDeadline.Load(); f == 0 || dl < f {
		c.forceDeadline.Store(dl)
	}
}

// awaitCloseOk waits (bounded by the close deadline) for the client to answer our connection.close,
// so it reads the reason before the socket goes away.
func (c *conn) awaitCloseOk() {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		if f.Type == amqp.FrameMethod && f.Channel == 0 && len(f.Payload) >= 4 &&
			binary.BigEndian.Uint16(f.Payload) == amqp.ClassConnection {
			if mid := binary.BigEndian.Uint16(f.Payload[2:]); mid == 51 || mid == 50 {
				return
			}
		}
	}
}

// forceClose is called by Shutdown from another goroutine.
func (c *conn) forceClose(e *amqp.Error) {
	if c.forced.Swap(true) {
		return
	}
	text := e.Text
	c.forceText.Store(&text)
	close(c.quit)
	c.credit.abort()
	c.forceDeadline.Store(time.Now().Add(closeOkTimeout).UnixNano())
	if !c.open.Load() {
		c.nc.SetReadDeadline(time.Now())
		return
	}
	// The reader may be blocked in Read: send the close from here and let the deadline wake it.
	c.out.sendMethod(0, &amqp.ConnectionClose{ReplyCode: e.Code, ReplyText: e.Text})
	c.nc.SetReadDeadline(time.Unix(0, c.forceDeadline.Load()))
}

func (c *conn) handleMethodFrame(f amqp.Frame) *amqp.Error {
	cls := binary.BigEndian.Uint16(f.Payload)
	mid := binary.BigEndian.Uint16(f.Payload[2:])
	args := f.Payload[4:]
	if f.Channel == 0 {
		if cls != amqp.ClassConnection {
			return &amqp.Error{Code: amqp.ChannelError, Text: "CHANNEL_ERROR - expected 'channel.open'", ClassID: cls, MethodID: mid}
		}
		return c.handleConnectionMethod(f.Payload)
	}
	if cls == amqp.ClassConnection {
		return &amqp.Error{Code: amqp.CommandInvalid, Text: "COMMAND_INVALID - connection method on a non-zero channel", ClassID: cls, MethodID: mid}
	}
	ch := c.channels[f.Channel]
	if ch == nil {
		if cls == amqp.ClassChannel && mid == 10 {
			return c.openChannel(f.Channel, args)
		}
		if cls == amqp.ClassChannel && mid == 41 {
			return nil // a late close-ok, as RabbitMQ tolerates
		}
		if slices.Contains(c.closedInRead, f.Channel) {
			if cls == amqp.ClassChannel && mid == 40 {
				c.out.sendMethod(f.Channel, &amqp.ChannelCloseOk{})
			}
			return nil
		}
		if amqp.NewMethod(cls, mid) == nil {
			return decodeError(&amqp.UnknownMethodError{ClassID: cls, MethodID: mid})
		}
		return &amqp.Error{Code: amqp.ChannelError, Text: "CHANNEL_ERROR - expected 'channel.open'", ClassID: cls, MethodID: mid}
	}
	ch.waitDurable()
	if ch.closing {
		// We sent channel.close: drop everything but close-ok, a crossing close, or a new open.
		if cls == amqp.ClassChannel {
			switch mid {
			case 40: // the client closed at the same time: answer, and still wait for our close-ok
				c.out.sendMethod(ch.id, &amqp.ChannelCloseOk{})
			case 41:
				c.dropChannel(ch.id)
			case 10:
				c.dropChannel(ch.id)
				return c.openChannel(f.Channel, args)
			}
		}
		return nil
	}
	if ch.pub.state != pubIdle {
		err := ch.pub.interrupted()
		err.ClassID, err.MethodID = amqp.ClassBasic, 40 // the publish, as RabbitMQ reports it
		return err
	}
	err := ch.handleMethod(cls, mid, args)
	if err != nil {
		if err.ClassID == 0 && err.MethodID == 0 {
			err.ClassID, err.MethodID = cls, mid
		}
		if err.Hard() {
			return err
		}
		ch.closeWithError(err)
	}
	return nil
}

func (c *conn) handleConnectionMethod(payload []byte) *amqp.Error {
	m, err := amqp.DecodeMethod(payload)
	if err != nil {
		return decodeError(err)
	}
	switch m := m.(type) {
	case *amqp.ConnectionClose:
		c.log.Debug("client closed connection", "code", m.ReplyCode, "text", m.ReplyText)
		c.setEndReason(fmt.Sprintf("client closed the connection (%d %s)", m.ReplyCode, m.ReplyText))
		c.releaseChannels()
		c.writeCloseOkAndStop()
		return nil
	case *amqp.ConnectionCloseOk:
		// Only meaningful after a close we sent (Shutdown sends it from another goroutine).
		if c.forced.Load() {
			c.stop = true
		}
		return nil
	case *amqp.ConnectionUpdateSecret:
		c.out.sendMethod(0, &amqp.ConnectionUpdateSecretOk{})
		return nil
	case *amqp.ConnectionBlocked, *amqp.ConnectionUnblocked:
		return nil
	default:
		return &amqp.Error{Code: amqp.CommandInvalid, Text: fmt.Sprintf("COMMAND_INVALID - unexpected method '%s'", m.Name()),
			ClassID: m.ClassID(), MethodID: m.MethodID()}
	}
}

func (c *conn) openChannel(id uint16, args []byte) *amqp.Error {
	if err := new(amqp.ChannelOpen).Decode(args); err != nil {
		return decodeError(err)
	}
	if len(c.channels) >= int(c.channelMax) {
		return &amqp.Error{Code: amqp.NotAllowed, ClassID: amqp.ClassChannel, MethodID: 10,
			Text: fmt.Sprintf("NOT_ALLOWED - number of channels opened (%d) has reached the negotiated channel_max (%d)",
				len(c.channels), c.channelMax)}
	}
	ch := newChannel(c, id)
	ch.counters = c.s.core.Stats().NewObject(stats.ScopeChannel, stats.Labels{VHost: c.vhost.Name(), Name: c.name(), Type: "AMQP 0-9-1", Channel: id})
	c.s.core.Stats().Inc(stats.ChannelsOpened)
	c.setACL(ch)
	c.channels[id] = ch
	c.listChannel(ch)
	if i := slices.Index(c.closedInRead, id); i >= 0 {
		c.closedInRead = slices.Delete(c.closedInRead, i, i+1)
	}
	c.nChannels.Store(int32(len(c.channels)))
	c.out.sendMethod(id, &amqp.ChannelOpenOk{})
	return nil
}

func (c *conn) dropChannel(id uint16) {
	if ch := c.channels[id]; ch != nil {
		c.s.core.Stats().Release(ch.counters)
		c.s.core.Stats().Inc(stats.ChannelsClosed)
		c.unlistChannel(id)
	}
	delete(c.channels, id)
	c.nChannels.Store(int32(len(c.channels)))
}

func (c *conn) handleContentFrame(f amqp.Frame) *amqp.Error {
	ch := c.channels[f.Channel]
	if ch == nil {
		if f.Channel == 0 {
			return amqp.Errorf(amqp.UnexpectedFrame, "content frame on channel 0")
		}
		if slices.Contains(c.closedInRead, f.Channel) {
			return nil
		}
		return amqp.Errorf(amqp.ChannelError, "expected 'channel.open'")
	}
	if ch.closing {
		return nil
	}
	publishing := ch.pub.state != pubIdle
	err := ch.handleContent(f)
	if err != nil {
		if publishing && err.ClassID == 0 && err.MethodID == 0 {
			err.ClassID, err.MethodID = amqp.ClassBasic, 40 // what failed is the publish, as RabbitMQ reports it
		}
		if err.Hard() {
			return err
		}
		ch.closeWithError(err)
	}
	return nil
}

func (c *conn) markConfirmDirty(ch *channel) {
	if !ch.confirmDirty {
		ch.confirmDirty = true
		c.confirmDirty = append(c.confirmDirty, ch)
	}
}

// flushConfirms sends one basic.ack (multiple when it covers several) per channel with new confirms.
func (c *conn) flushConfirms() {
	if len(c.confirmDirty) == 0 {
		return
	}
	for i, ch := range c.confirmDirty {
		ch.confirmDirty = false
		c.confirmDirty[i] = nil
		if ch.closing || ch.gone {
			continue
		}
		ch.flushConfirm()
	}
	c.confirmDirty = c.confirmDirty[:0]
}

// releaseChannels frees every channel's consumers and unacked messages (connection closing).
func (c *conn) releaseChannels() {
	for id, ch := range c.channels {
		ch.release()
		c.dropChannel(id)
	}
}

// cleanup runs when the reader exits: channels, exclusive queues.
func (c *conn) cleanup() {
	c.releaseChannels()
	for q := range c.exclusiveQs {
		c.deleteExclusive(q)
	}
	clear(c.exclusiveQs)
}

// deleteExclusive deletes one of the connection's exclusive queues as it closes.
func (c *conn) deleteExclusive(q *core.Queue) {
	if _, err := c.vhost.DeleteQueue(c.actor(context.Background()), q, false, false, c); err != nil {
		c.log.Warn("cannot delete an exclusive queue", "queue", q.Name(), "err", err.Text)
	}
}

// setEndReason records why the connection ends, unless a reason is already recorded (reader
// goroutine only).
func (c *conn) setEndReason(r string) {
	if c.endReason == "" {
		c.endReason = r
	}
}

// logFields are the fields of the operators' connection log lines (opened, closed): user,
// vhost, the client's connection_name and the protocol (connLogger adds the peer).
func (c *conn) logFields() []any {
	name, _ := c.clientProps["connection_name"].(string)
	return []any{"protocol", "amqp091", "user", c.user, "vhost", c.vhost.Name(), "client_name", name}
}

// actor is ctx carrying who this connection is, for the core's log lines of declares and
// deletes (off the hot path: only those methods pay for it).
func (c *conn) actor(ctx context.Context) context.Context {
	return core.WithActor(ctx, core.Actor{User: c.user, Connection: c.name(), Via: "amqp091", Peer: c.nc.RemoteAddr().String()})
}

// name is RabbitMQ's name for the connection ("peer -> local"), as Info reports it.
func (c *conn) name() string { return c.nc.RemoteAddr().String() + " -> " + c.nc.LocalAddr().String() }

// Info implements core.ClientConn. The handshake's fields no longer change once the connection is
// registered.
func (c *conn) Info() core.ConnectionInfo {
	peer, local := c.nc.RemoteAddr().String(), c.nc.LocalAddr().String()
	state := "running"
	if c.forced.Load() {
		state = "closing"
	}
	return core.ConnectionInfo{
		Name:             peer + " -> " + local,
		Protocol:         "AMQP 0-9-1",
		State:            state,
		Peer:             peer,
		Local:            local,
		User:             c.user,
		VHost:            c.vhost.Name(),
		ClientProperties: c.clientProps,
		Channels:         int(c.nChannels.Load()),
		ChannelMax:       c.channelMax,
		FrameMax:         c.frameMax,
		Heartbeat:        c.heartbeat,
		ConnectedAt:      c.connectedAt,
	}
}

// ForceClose implements core.ClientConn: connection.close with code and text, from any goroutine.
func (c *conn) ForceClose(code uint16, text string) {
	c.forceClose(amqp.Errorf(code, "%s", text))
}
