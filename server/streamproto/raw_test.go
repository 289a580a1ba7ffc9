package streamproto_test

// Bad input over a raw TCP connection speaking the protocol with the wire codec: every case gets
// RabbitMQ's answer (a response code, a close with a code, or the connection closed) and never a
// panic or a connection left hanging.

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"testing"
	"time"

	"warren/server/streamproto/wire"
)

type rawConn struct {
	t  *testing.T
	nc net.Conn
	r  *wire.Reader
}

func dialRaw(t *testing.T, b broker) *rawConn {
	t.Helper()
	u, err := url.Parse(b.streamURI)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.DialTimeout("tcp", u.Host, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(waitFor))
	return &rawConn{t: t, nc: nc, r: wire.NewReader(nc, 0)}
}

func (c *rawConn) send(cmd wire.Command) {
	c.t.Helper()
	b, err := cmd.Append(nil)
	if err != nil {
		c.t.Fatal(err)
	}
	c.sendBytes(b)
}

func (c *rawConn) sendBytes(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// read returns the next frame decoded (heartbeats skipped).
func (c *rawConn) read() wire.Command {
	c.t.Helper()
	for {
		f, err := c.r.ReadFrame()
		if err != nil {
			c.t.Fatalf("read: %v", err)
		}
		cmd, err := wire.Decode(f)
		if err != nil {
			c.t.Fatalf("decode: %v", err)
		}
		if _, hb := cmd.(*wire.Heartbeat); !hb {
			return cmd
		}
	}
}

// expectClosed waits for the server to close the socket.
func (c *rawConn) expectClosed() {
	c.t.Helper()
	for {
		_, err := c.r.ReadFrame()
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			c.t.Fatal("the server left the connection open")
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) {
			// a reset is a close too
			var oe *net.OpError
			if !errors.As(err, &oe) {
				c.t.Fatalf("read: %v", err)
			}
		}
		return
	}
}

// expectClose expects a server-sent close with code, answers it and expects the socket closed.
func (c *rawConn) expectClose(code wire.ResponseCode) {
	c.t.Helper()
	cmd := c.read()
	cl, ok := cmd.(*wire.Close)
	if !ok {
		c.t.Fatalf("got %T %+v, want close", cmd, cmd)
	}
	if cl.Code != code {
		c.t.Fatalf("close code %s (%q), want %s", cl.Code, cl.Reason, code)
	}
	c.send(&wire.Response{Command: wire.CommandClose, CorrelationID: cl.CorrelationID, Code: wire.ResponseCodeOK})
	c.expectClosed()
}

// open runs the handshake as guest with frame max frameMax.
func (c *rawConn) open(frameMax uint32) {
	c.t.Helper()
	c.openAs("guest", "guest", frameMax)
}

// openAs runs the handshake as user in vhost "/".
func (c *rawConn) openAs(user, pass string, frameMax uint32) {
	c.t.Helper()
	c.handshake(user, pass, func(tune *wire.Tune) *wire.Tune {
		return &wire.Tune{FrameMax: frameMax, Heartbeat: tune.Heartbeat, Response: true}
	})
}

// handshake runs peer properties, PLAIN authentication as user, the answer answer(tune) to the
// server's tune and open of vhost "/", failing the test on any refusal; it returns open's response
// (its properties advertise the node's endpoint).
func (c *rawConn) handshake(user, pass string, answer func(*wire.Tune) *wire.Tune) *wire.OpenResponse {
	c.t.Helper()
	r := c.handshakeVHost(user, pass, "/", answer)
	if r.Code != wire.ResponseCodeOK {
		c.t.Fatalf("open: %+v", r)
	}
	return r
}

// handshakeVHost is handshake opening vhost, whose refusal it returns rather than fails on.
func (c *rawConn) handshakeVHost(user, pass, vhost string, answer func(*wire.Tune) *wire.Tune) *wire.OpenResponse {
	c.t.Helper()
	c.sendAuthenticate("PLAIN", plain(user, pass))
	if r, ok := c.read().(*wire.SASLAuthenticateResponse); !ok || r.Code != wire.ResponseCodeOK {
		c.t.Fatalf("sasl authenticate: %+v", r)
	}
	tune, ok := c.read().(*wire.Tune)
	if !ok {
		c.t.Fatal("no tune")
	}
	c.send(answer(tune))
	c.send(&wire.Open{CorrelationID: 4, VirtualHost: vhost})
	r, ok := c.read().(*wire.OpenResponse)
	if !ok {
		c.t.Fatalf("open: %+v", r)
	}
	return r
}

// sendAuthenticate runs peer properties and the SASL handshake, failing the test on a refusal,
// and sends sasl_authenticate (correlation id 3) with mechanism and data.
func (c *rawConn) sendAuthenticate(mechanism string, data []byte) {
	c.t.Helper()
	c.send(&wire.PeerProperties{CorrelationID: 1, Properties: []wire.Property{{Key: "product", Value: "raw"}}})
	if r, ok := c.read().(*wire.PeerPropertiesResponse); !ok || r.Code != wire.ResponseCodeOK {
		c.t.Fatalf("peer properties: %+v", r)
	}
	c.send(&wire.SASLHandshake{CorrelationID: 2})
	if r, ok := c.read().(*wire.SASLHandshakeResponse); !ok || r.Code != wire.ResponseCodeOK {
		c.t.Fatalf("sasl handshake: %+v", r)
	}
	c.send(&wire.SASLAuthenticate{CorrelationID: 3, Mechanism: mechanism, Data: data})
}

// plain is PLAIN's response for user and pass (no authorization identity).
func plain(user, pass string) []byte { return []byte("\x00" + user + "\x00" + pass) }

func TestBadInput(t *testing.T) {
	b := startBroker(t)
	frame := func(key wire.Key, version uint16, body ...byte) []byte {
		f := binary.BigEndian.AppendUint32(nil, uint32(4+len(body)))
		f = binary.BigEndian.AppendUint16(f, uint16(key))
		f = binary.BigEndian.AppendUint16(f, version)
		return append(f, body...)
	}
	t.Run("command before authentication", func(t *testing.T) {
		c := dialRaw(t, b)
		c.send(&wire.DeclarePublisher{CorrelationID: 1, PublisherID: 1, Stream: "s"})
		c.expectClosed()
	})
	t.Run("frame over the pre-open maximum", func(t *testing.T) {
		c := dialRaw(t, b)
		c.sendBytes(binary.BigEndian.AppendUint32(nil, wire.DefaultInitialFrameMax+1))
		c.expectClosed()
	})
	t.Run("garbage before peer properties", func(t *testing.T) {
		c := dialRaw(t, b)
		c.sendBytes(frame(0x7777, 1, 1, 2, 3))
		c.expectClosed()
	})
	t.Run("unknown SASL mechanism", func(t *testing.T) {
		c := dialRaw(t, b)
		c.send(&wire.PeerProperties{CorrelationID: 1})
		c.read()
		c.send(&wire.SASLHandshake{CorrelationID: 2})
		c.read()
		c.send(&wire.SASLAuthenticate{CorrelationID: 3, Mechanism: "CRAM-MD5", Data: []byte("x")})
		if r := c.read().(*wire.SASLAuthenticateResponse); r.Code != wire.ResponseSASLMechanismNotSupported {
			t.Fatalf("code %s", r.Code)
		}
		c.expectClosed()
	})
	t.Run("wrong password", func(t *testing.T) {
		c := dialRaw(t, b)
		c.send(&wire.PeerProperties{CorrelationID: 1})
		c.read()
		c.send(&wire.SASLHandshake{CorrelationID: 2})
		c.read()
		c.send(&wire.SASLAuthenticate{CorrelationID: 3, Mechanism: "PLAIN", Data: []byte("\x00guest\x00nope")})
		if r := c.read().(*wire.SASLAuthenticateResponse); r.Code != wire.ResponseAuthenticationFailure {
			t.Fatalf("code %s", r.Code)
		}
		c.expectClosed()
	})
	t.Run("open of a vhost that does not exist", func(t *testing.T) {
		c := dialRaw(t, b)
		c.send(&wire.PeerProperties{CorrelationID: 1})
		c.read()
		c.send(&wire.SASLHandshake{CorrelationID: 2})
		c.read()
		c.send(&wire.SASLAuthenticate{CorrelationID: 3, Mechanism: "PLAIN", Data: []byte("\x00guest\x00guest")})
		c.read()
		c.read() // tune
		c.send(&wire.Tune{FrameMax: 0, Heartbeat: 0, Response: true})
		c.send(&wire.Open{CorrelationID: 4, VirtualHost: "no-such-vhost"})
		if r := c.read().(*wire.OpenResponse); r.Code != wire.ResponseVhostAccessFailure {
			t.Fatalf("code %s", r.Code)
		}
		c.expectClosed()
	})
	t.Run("unknown command key", func(t *testing.T) {
		c := dialRaw(t, b)
		c.open(0)
		c.sendBytes(frame(0x0777, 1, 0, 0, 0, 1))
		c.expectClose(wire.ResponseCodeUnknownFrame)
	})
	t.Run("unknown version", func(t *testing.T) {
		c := dialRaw(t, b)
		c.open(0)
		c.sendBytes(frame(wire.CommandMetadata, 9, 0, 0, 0, 1, 0, 0, 0, 0))
		c.expectClose(wire.ResponseCodeUnknownFrame)
	})
	t.Run("malformed field", func(t *testing.T) {
		c := dialRaw(t, b)
		c.open(0)
		// A create_stream whose name length runs past the frame.
		c.sendBytes(frame(wire.CommandCreateStream, 1, 0, 0, 0, 1, 0x7f, 0xff, 'a'))
		c.expectClose(wire.ResponseCodeUnknownFrame)
	})
	t.Run("frame over the negotiated maximum", func(t *testing.T) {
		c := dialRaw(t, b)
		c.open(4096)
		big := make([]byte, 5000)
		c.sendBytes(frame(wire.CommandPublish, 1, big...))
		c.expectClose(wire.ResponseCodeFrameTooLarge)
	})
	t.Run("publish with an undeclared publisher", func(t *testing.T) {
		c := dialRaw(t, b)
		c.open(0)
		c.send(&wire.Publish{PublisherID: 9, Messages: []wire.PublishedMessage{{PublishingID: 5, Data: []byte("x")}}})
		pe, ok := c.read().(*wire.PublishError)
		if !ok || len(pe.Errors) != 1 || pe.Errors[0].Code != wire.ResponseCodePublisherDoesNotExist || pe.Errors[0].PublishingID != 5 {
			t.Fatalf("got %+v", pe)
		}
	})
	t.Run("responses to commands on a stream that does not exist", func(t *testing.T) {
		c := dialRaw(t, b)
		c.open(0)
		c.send(&wire.DeclarePublisher{CorrelationID: 10, PublisherID: 1, Stream: "missing"})
		if r := c.read().(*wire.Response); r.Code != wire.ResponseCodeStreamDoesNotExist {
			t.Fatalf("declare publisher: %s", r.Code)
		}
		c.send(&wire.Subscribe{CorrelationID: 11, SubscriptionID: 1, Stream: "missing", Offset: wire.OffsetSpec{Type: wire.OffsetTypeFirst}, Credit: 1})
		if r := c.read().(*wire.Response); r.Code != wire.ResponseCodeStreamDoesNotExist {
			t.Fatalf("subscribe: %s", r.Code)
		}
		c.send(&wire.DeleteStream{CorrelationID: 12, Stream: "missing"})
		if r := c.read().(*wire.Response); r.Code != wire.ResponseCodeStreamDoesNotExist {
			t.Fatalf("delete: %s", r.Code)
		}
		c.send(&wire.QueryOffset{CorrelationID: 13, Reference: "r", Stream: "missing"})
		if r := c.read().(*wire.QueryOffsetResponse); r.Code != wire.ResponseCodeStreamDoesNotExist {
			t.Fatalf("query offset: %s", r.Code)
		}
		c.send(&wire.Credit{SubscriptionID: 77, Credit: 1})
		if r := c.read().(*wire.CreditResponse); r.Code != wire.ResponseCodeSubscriptionIDDoesNotExist || r.SubscriptionID != 77 {
			t.Fatalf("credit: %+v", r)
		}
		c.send(&wire.Unsubscribe{CorrelationID: 14, SubscriptionID: 77})
		if r := c.read().(*wire.Response); r.Code != wire.ResponseCodeSubscriptionIDDoesNotExist {
			t.Fatalf("unsubscribe: %s", r.Code)
		}
		c.send(&wire.DeletePublisher{CorrelationID: 15, PublisherID: 77})
		if r := c.read().(*wire.Response); r.Code != wire.ResponseCodePublisherDoesNotExist {
			t.Fatalf("delete publisher: %s", r.Code)
		}
		c.send(&wire.Partitions{CorrelationID: 16, SuperStream: "missing"})
		if r := c.read().(*wire.StreamsResponse); r.Code != wire.ResponseCodeStreamDoesNotExist {
			t.Fatalf("partitions: %s", r.Code)
		}
		c.send(&wire.Close{CorrelationID: 17, Code: wire.ResponseCodeOK, Reason: "bye"})
		if r := c.read().(*wire.Response); r.Command != wire.CommandClose || r.Code != wire.ResponseCodeOK {
			t.Fatalf("close: %+v", r)
		}
		c.expectClosed()
	})
}

// TestTuneAnsweredWithRequestKey: rabbitmq-stream-js-client answers the server's tune with the
// request's key 0x0014 (the Go and Java clients with 0x8014); RabbitMQ accepts both, so the
// connection opens and works.
func TestTuneAnsweredWithRequestKey(t *testing.T) {
	b := startBroker(t)
	c := dialRaw(t, b)
	c.handshake("guest", "guest", func(tune *wire.Tune) *wire.Tune {
		return &wire.Tune{FrameMax: tune.FrameMax, Heartbeat: tune.Heartbeat} // key 0x0014
	})
	r := readMetadata(t, c, 5, "no-such-stream")
	if len(r.Streams) != 1 || r.Streams[0].Code != wire.ResponseCodeStreamDoesNotExist {
		t.Fatalf("metadata after open: %+v", r)
	}
}
