package conformance

// Login, vhost, channel-max and heartbeat behaviour, over raw sockets and through amqp091-go.

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestLoginPLAINWithClient(t *testing.T) {
	b := sharedBroker(t)
	conn := dial(t, b.URL)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	if err := ch.Close(); err != nil {
		t.Fatalf("close channel: %v", err)
	}
}

func TestLoginAMQPLAINWithClient(t *testing.T) {
	b := sharedBroker(t)
	conn, err := amqp.DialConfig(b.URL, amqp.Config{
		SASL: []amqp.Authentication{&amqp.AMQPlainAuth{Username: "guest", Password: "guest"}},
		Dial: amqp.DefaultDial(5 * time.Second),
	})
	if err != nil {
		t.Fatalf("dial with AMQPLAIN: %v", err)
	}
	defer conn.Close()
	if _, err := conn.Channel(); err != nil {
		t.Fatalf("open channel: %v", err)
	}
}

func TestLoginRaw(t *testing.T) {
	b := sharedBroker(t)
	for name, so := range map[string]startOk{
		"PLAIN":    {mechanism: "PLAIN", response: plainResponse("guest", "guest")},
		"AMQPLAIN": {mechanism: "AMQPLAIN", response: amqplainResponse("guest", "guest")},
	} {
		t.Run(name, func(t *testing.T) {
			c := dialRaw(t, b.Addr)
			c.sendHeader()
			c.readStart()
			c.sendStartOk(so)
			tune := c.readTune()
			c.sendTuneOk(tuneInfo{channelMax: tune.channelMax, frameMax: tune.frameMax})
			c.sendOpen("/")
			c.expect(0, classConnection, 41)
			c.openChannel(1)
		})
	}
}

// TestLoginRefused covers bad credentials. A client that advertises authentication_failure_close
// gets connection.close 403 with RabbitMQ's text; any other client sees the socket closed
// without a frame (RabbitMQ waits about 3 s before closing).
func TestLoginRefused(t *testing.T) {
	b := sharedBroker(t)
	cases := []struct {
		name      string
		mechanism string
		response  string
	}{
		{"PLAIN bad password", "PLAIN", plainResponse("guest", "wrong")},
		{"PLAIN unknown user", "PLAIN", plainResponse("nobody", "guest")},
		{"AMQPLAIN bad password", "AMQPLAIN", amqplainResponse("guest", "wrong")},
	}
	for _, tc := range cases {
		t.Run(tc.name+" with authentication_failure_close", func(t *testing.T) {
			t.Parallel()
			c := dialRaw(t, b.Addr)
			c.sendHeader()
			c.readStart()
			c.sendStartOk(startOk{mechanism: tc.mechanism, response: tc.response, authFailureClose: true})
			ci := c.expectConnectionClose(codeAccessRefused)
			want := "ACCESS_REFUSED - Login was refused using authentication mechanism " + tc.mechanism + "."
			if !strings.HasPrefix(ci.text, want) {
				t.Errorf("reply text %q; want it to start with %q", ci.text, want)
			}
		})
		t.Run(tc.name+" without authentication_failure_close", func(t *testing.T) {
			t.Parallel()
			c := dialRaw(t, b.Addr)
			c.sendHeader()
			c.readStart()
			c.sendStartOk(startOk{mechanism: tc.mechanism, response: tc.response})
			c.expectSocketClosed(10 * time.Second)
		})
	}
	t.Run("through amqp091-go", func(t *testing.T) {
		t.Parallel()
		url := strings.Replace(b.URL, "guest:guest@", "guest:wrong@", 1)
		conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err == nil {
			conn.Close()
			t.Fatal("dial with a wrong password succeeded")
		}
		t.Logf("dial error: %v", err)
	})
}

func TestUnknownMechanism(t *testing.T) {
	b := sharedBroker(t)
	c := dialRaw(t, b.Addr)
	c.sendHeader()
	c.readStart()
	c.sendStartOk(startOk{mechanism: "NOPE", response: "x", authFailureClose: true})
	// RabbitMQ 3.10 closes the socket silently; a connection.close with a hard error is as good.
	f, err := c.readFrame(10 * time.Second)
	switch {
	case isClosedErr(err):
	case err != nil:
		t.Fatalf("want the connection closed; got %v", err)
	case f.is(classConnection, 50):
		ci := parseClose(f)
		t.Logf("connection.close %d %q", ci.code, ci.text)
		if ci.code != codeAccessRefused && ci.code < 500 {
			t.Fatalf("connection.close %d; want 403 or a hard error", ci.code)
		}
	default:
		t.Fatalf("want the connection closed; got %v", f)
	}
	assertStillServing(t, b.URL)
}

func TestUnknownVhost(t *testing.T) {
	b := sharedBroker(t)
	t.Run("raw", func(t *testing.T) {
		c := dialRaw(t, b.Addr)
		c.sendHeader()
		c.readStart()
		c.sendStartOk(startOk{mechanism: "PLAIN", response: plainResponse("guest", "guest")})
		tune := c.readTune()
		c.sendTuneOk(tuneInfo{channelMax: tune.channelMax, frameMax: tune.frameMax})
		c.sendOpen("no-such-vhost")
		ci := c.expectConnectionClose(codeNotAllowed)
		if ci.class != classConnection || ci.method != 40 {
			t.Errorf("connection.close names method %d.%d; want 10.40 (connection.open)", ci.class, ci.method)
		}
		if !strings.HasPrefix(ci.text, "NOT_ALLOWED - ") || !strings.Contains(ci.text, "no-such-vhost") {
			t.Errorf("reply text %q; want NOT_ALLOWED naming the vhost", ci.text)
		}
	})
	t.Run("amqp091-go", func(t *testing.T) {
		conn, err := amqp.DialConfig(b.URL, amqp.Config{Vhost: "no-such-vhost", Dial: amqp.DefaultDial(5 * time.Second)})
		if err == nil {
			conn.Close()
			t.Fatal("dial to an unknown vhost succeeded")
		}
		var aerr *amqp.Error
		if !errors.As(err, &aerr) || aerr.Code != codeNotAllowed {
			t.Fatalf("dial error %v; want *amqp.Error code 530", err)
		}
	})
	assertStillServing(t, b.URL)
}

// TestChannelMax negotiates channel-max 4: four channels may be open at once whatever their
// numbers, and opening a fifth is a connection error 530.
func TestChannelMax(t *testing.T) {
	b := sharedBroker(t)
	c := dialRaw(t, b.Addr)
	c.handshake(tuneInfo{channelMax: 4})
	for _, ch := range []uint16{1, 2, 3, 100} {
		c.openChannel(ch)
	}
	c.send(5, classChannel, 10, channelOpenArgs())
	ci := c.expectConnectionClose(codeNotAllowed)
	if !strings.Contains(ci.text, "channel_max") {
		t.Errorf("reply text %q; want it to mention channel_max", ci.text)
	}
	assertStillServing(t, b.URL)
}

func TestChannelMaxClosedChannelsFreeSlots(t *testing.T) {
	b := sharedBroker(t)
	c := dialRaw(t, b.Addr)
	c.handshake(tuneInfo{channelMax: 2})
	c.openChannel(1)
	c.openChannel(2)
	c.send(2, classChannel, 40, closeArgs(200, "", 0, 0))
	c.expect(2, classChannel, 41)
	c.openChannel(3)
	c.send(0, classConnection, 50, closeArgs(200, "", 0, 0))
	c.expect(0, classConnection, 51)
}

// TestHeartbeatDeadPeer negotiates a 1 s heartbeat and then sends nothing: the server must send
// heartbeats of its own and close the socket once two intervals pass without hearing from us.
func TestHeartbeatDeadPeer(t *testing.T) {
	t.Parallel()
	b := sharedBroker(t)
	c := dialRaw(t, b.Addr)
	c.handshake(tuneInfo{heartbeat: 1})
	opened := time.Now()
	heartbeats := 0
	for {
		f, err := c.readFrame(10 * time.Second)
		if isClosedErr(err) {
			break
		}
		if err != nil {
			t.Fatalf("waiting for the server to give up on a silent peer: %v", err)
		}
		switch {
		case f.typ == frameHeartbeat:
			heartbeats++
		case f.is(classConnection, 50):
			ci := parseClose(f)
			t.Logf("server sent connection.close %d %q before closing", ci.code, ci.text)
		default:
			t.Fatalf("unexpected %v", f)
		}
	}
	elapsed := time.Since(opened)
	t.Logf("socket closed %v after open-ok; %d heartbeats received", elapsed.Round(10*time.Millisecond), heartbeats)
	if elapsed > 4500*time.Millisecond {
		t.Errorf("the server took %v to drop a peer silent for two 1 s heartbeat intervals; want about 2-3 s", elapsed)
	}
	if elapsed < 1500*time.Millisecond {
		t.Errorf("the server dropped the peer after %v, before two heartbeat intervals passed", elapsed)
	}
	if heartbeats == 0 {
		t.Error("the server sent no heartbeat frames with a 1 s heartbeat negotiated")
	}
	assertStillServing(t, b.URL)
}

// TestHeartbeatKeepsPeerAlive sends a heartbeat every 400 ms for 4 s: the connection must stay.
func TestHeartbeatKeepsPeerAlive(t *testing.T) {
	t.Parallel()
	b := sharedBroker(t)
	c := dialRaw(t, b.Addr)
	c.handshake(tuneInfo{heartbeat: 1})
	heartbeats := 0
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); {
		c.write(frameBytes(frameHeartbeat, 0, nil))
		f, err := c.readFrame(400 * time.Millisecond)
		switch {
		case isTimeout(err):
		case err != nil:
			t.Fatalf("connection dropped although the peer sent heartbeats: %v", err)
		case f.typ == frameHeartbeat:
			heartbeats++
		default:
			t.Fatalf("unexpected %v", f)
		}
	}
	if heartbeats == 0 {
		t.Error("the server sent no heartbeat frames in 4 s with a 1 s heartbeat negotiated")
	}
	c.send(0, classConnection, 50, closeArgs(200, "bye", 0, 0))
	c.expect(0, classConnection, 51)
}
