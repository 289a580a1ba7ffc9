package server_test

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestITServerProperties(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	if c.Major != 0 || c.Minor != 9 {
		t.Errorf("protocol version %d-%d, want 0-9", c.Major, c.Minor)
	}
	for _, k := range []string{"product", "version"} {
		if s, ok := c.Properties[k].(string); !ok || s == "" {
			t.Errorf("server property %q = %#v, want a non-empty string", k, c.Properties[k])
		}
	}
	caps, ok := c.Properties["capabilities"].(amqp.Table)
	if !ok {
		t.Fatalf("server property capabilities = %#v, want a table", c.Properties["capabilities"])
	}
	for _, k := range []string{
		"publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
		"connection.blocked", "consumer_priorities", "authentication_failure_close",
		"per_consumer_qos", "direct_reply_to",
	} {
		if v, ok := caps[k].(bool); !ok || !v {
			t.Errorf("capability %q = %#v, want true", k, caps[k])
		}
	}
}

func TestITTune(t *testing.T) {
	u := startBroker(t)
	cases := []struct {
		name          string
		cfg           amqp.Config
		chMax         uint16
		frameMax      int
		heartbeat     time.Duration
		hbUnspecified bool
	}{
		// The client proposing nothing (0 / unlimited) takes the server's values.
		{name: "server values", cfg: amqp.Config{FrameSize: amqp.FrameSizeUnlimited, Heartbeat: time.Millisecond},
			chMax: 2047, frameMax: 131072, heartbeat: 60 * time.Second},
		// Lower wins.
		{name: "client lower", cfg: amqp.Config{ChannelMax: 10, FrameSize: 8192, Heartbeat: 5 * time.Second},
			chMax: 10, frameMax: 8192, heartbeat: 5 * time.Second},
		{name: "client higher", cfg: amqp.Config{ChannelMax: 4000, FrameSize: 1 << 20, Heartbeat: 120 * time.Second},
			chMax: 2047, frameMax: 131072, heartbeat: 60 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustDialConfig(t, u, tc.cfg)
			if c.Config.ChannelMax != tc.chMax {
				t.Errorf("channel max %d, want %d", c.Config.ChannelMax, tc.chMax)
			}
			if c.Config.FrameSize != tc.frameMax {
				t.Errorf("frame max %d, want %d", c.Config.FrameSize, tc.frameMax)
			}
			if c.Config.Heartbeat != tc.heartbeat {
				t.Errorf("heartbeat %v, want %v", c.Config.Heartbeat, tc.heartbeat)
			}
			// The negotiated values work: a round trip on a channel.
			expectOpen(t, mustChannel(t, c))
		})
	}
}

func TestITBadCredentials(t *testing.T) {
	t.Parallel() // RabbitMQ delays its answer to a failed login by ~3 s.
	u := startBroker(t)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	for _, ui := range []*url.Userinfo{url.UserPassword("guest", "wrong"), url.UserPassword("nobody", "guest")} {
		bad := *pu
		bad.User = ui
		t.Run(ui.Username(), func(t *testing.T) {
			t.Parallel()
			c, err := amqp.Dial(bad.String())
			if err == nil {
				_ = c.Close()
				t.Fatalf("dial with bad credentials succeeded")
			}
			// amqp091-go does not advertise authentication_failure_close, so
			// the broker just closes the socket and the client reports
			// ErrCredentials (403).
			checkAMQPError(t, err, amqp.AccessRefused, "")
		})
	}
}

func TestITAuthenticationFailureClose(t *testing.T) {
	u := startBroker(t)
	r := rawDial(t, u)
	f := r.handshake("guest", "wrong", map[string]bool{"authentication_failure_close": true})
	if f.typ != 1 || f.class != 10 || f.method != 50 {
		t.Fatalf("after a bad login got frame %d method %d.%d, want connection.close", f.typ, f.class, f.method)
	}
	code, text := closeArgs(f.args)
	want := "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."
	if code != 403 || text != want {
		t.Fatalf("connection.close %d %q, want 403 %q", code, text, want)
	}
	// Then the server closes the socket.
	for {
		if _, err := r.read(); err != nil {
			break
		}
	}
}

func TestITUnknownVhost(t *testing.T) {
	u := startBroker(t)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pu.Path = "/no-such-vhost"
	c, err := amqp.Dial(pu.String())
	if err == nil {
		_ = c.Close()
		t.Fatalf("dial to an unknown vhost succeeded")
	}
	checkAMQPError(t, err, amqp.NotAllowed, "NOT_ALLOWED - vhost no-such-vhost not found")
	// The broker keeps serving.
	expectOpen(t, mustChannel(t, mustDial(t, u)))
}

func TestITManyChannels(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	const n = 200
	chans := make([]*itChan, n)
	for i := range chans {
		chans[i] = mustChannel(t, c)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, ch := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- useChannel(ch, i)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// useChannel declares a private queue, publishes to it with a confirm and
// reads the message back.
func useChannel(ch *itChan, i int) error {
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("channel %d confirm.select: %w", i, err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return fmt.Errorf("channel %d declare: %w", i, err)
	}
	body := fmt.Sprintf("message %d", i)
	dc, err := ch.PublishWithDeferredConfirm("", q.Name, false, false, amqp.Publishing{Body: []byte(body)})
	if err != nil {
		return fmt.Errorf("channel %d publish: %w", i, err)
	}
	select {
	case <-dc.Done():
		if !dc.Acked() {
			return fmt.Errorf("channel %d: publish nacked", i)
		}
	case <-time.After(waitFor):
		return fmt.Errorf("channel %d: no confirm", i)
	}
	m, ok, err := ch.Get(q.Name, true)
	if err != nil || !ok || string(m.Body) != body {
		return fmt.Errorf("channel %d get: ok=%v body=%q err=%v", i, ok, m.Body, err)
	}
	if _, err := ch.QueueDelete(q.Name, false, false, false); err != nil {
		return fmt.Errorf("channel %d delete: %w", i, err)
	}
	return nil
}

func TestITClientClosesConnection(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	expectOpen(t, ch)
	if err := c.Close(); err != nil {
		t.Fatalf("connection.close: %v", err)
	}
	select {
	case e, ok := <-c.closed:
		if ok && e != nil {
			t.Fatalf("client close reported error %v", e)
		}
	case <-time.After(waitFor):
		t.Fatalf("close notification not delivered")
	}
	if !c.IsClosed() || !ch.IsClosed() {
		t.Fatalf("connection or channel not closed after Close")
	}
	if _, err := c.Channel(); !errors.Is(err, amqp.ErrClosed) {
		t.Fatalf("Channel on a closed connection: %v, want ErrClosed", err)
	}
	// A new connection works.
	expectOpen(t, mustChannel(t, mustDial(t, u)))
}

func TestITChannelCloseAndReopenSameID(t *testing.T) {
	u := startBroker(t)
	// With channel-max 1 the client can only ever use channel id 1.
	c := mustDialConfig(t, u, amqp.Config{ChannelMax: 1})
	if c.Config.ChannelMax != 1 {
		t.Fatalf("channel max %d, want 1", c.Config.ChannelMax)
	}
	q := uniq(t, "q")
	for i := range 3 {
		ch := mustChannel(t, c)
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			t.Fatalf("round %d: declare: %v", i, err)
		}
		if err := ch.Close(); err != nil {
			t.Fatalf("round %d: channel.close: %v", i, err)
		}
	}
	// Reopen after the server closed the channel with an error.
	ch := mustChannel(t, c)
	_, err := ch.QueueDeclarePassive(uniq(t, "missing"), false, false, false, false, nil)
	checkAMQPError(t, err, amqp.NotFound, "")
	expectChannelClosed(t, ch, amqp.NotFound, "")
	ch = mustChannel(t, c)
	if _, err := ch.QueueDelete(q, false, false, false); err != nil {
		t.Fatalf("delete after reopen: %v", err)
	}
}

func TestITChannelErrorKeepsOtherChannels(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	bad := mustChannel(t, c)
	good := mustConfirmChannel(t, c)
	q := declareQueue(t, u, good, "q", nil)
	deliveries := mustConsume(t, good, q, "keep", true, nil)

	missing := uniq(t, "missing")
	_, err := bad.QueueDeclarePassive(missing, false, false, false, false, nil)
	want := fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", missing)
	checkAMQPError(t, err, amqp.NotFound, want)
	expectChannelClosed(t, bad, amqp.NotFound, want)

	// The other channel, its consumer and the connection keep working.
	publishBodies(t, good, q, "still here")
	recvBody(t, deliveries, "still here")
	expectOpen(t, mustChannel(t, c))
	// And a new connection works too.
	expectOpen(t, mustChannel(t, mustDial(t, u)))
}

func TestITConnectionErrorClosesConnection(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch1 := mustChannel(t, c)
	ch2 := mustChannel(t, c)
	x := uniq(t, "x")
	err := ch1.ExchangeDeclare(x, "no-such-type", false, false, false, false, nil)
	if err == nil {
		deleteAtEnd(t, u, nil, []string{x})
		t.Fatalf("declare of an unknown exchange type succeeded")
	}
	expectConnClosed(t, c, amqp.CommandInvalid, "")
	eventually(t, "channels closed with their connection", func() bool {
		return ch1.IsClosed() && ch2.IsClosed()
	})
	// Other connections are unaffected and new ones work.
	expectOpen(t, mustChannel(t, mustDial(t, u)))
}

func TestITHeartbeatsKeepIdleConnectionAlive(t *testing.T) {
	t.Parallel() // idles for 2.5 s
	u := startBroker(t)
	// The client reads with a deadline of 1.5 s (three half-intervals): the
	// connection only survives if the server sends heartbeats.
	c := mustDialConfig(t, u, amqp.Config{Heartbeat: time.Second})
	if c.Config.Heartbeat != time.Second {
		t.Fatalf("heartbeat %v, want 1s", c.Config.Heartbeat)
	}
	ch := mustChannel(t, c)
	select {
	case e := <-c.closed:
		t.Fatalf("idle connection with heartbeats closed: %v", e)
	case <-time.After(2500 * time.Millisecond):
	}
	expectOpen(t, ch)
}

func TestITHeartbeatDeadPeer(t *testing.T) {
	t.Parallel() // waits for the server to give up on a silent client
	u := startBroker(t)
	r := rawDial(t, u)
	r.openHeartbeat("guest", "guest", 1)
	start := time.Now()
	// Never send anything: the server must send heartbeats, then drop us.
	for {
		f, err := r.read()
		if err != nil {
			break
		}
		if f.typ == 1 && f.class == 10 && f.method == 50 {
			code, text := closeArgs(f.args)
			t.Logf("server closed the silent connection with %d %q", code, text)
		}
	}
	if r.heartbeats == 0 {
		t.Errorf("no heartbeat frame from the server before it closed the connection")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("silent client dropped after %v, want within a few heartbeat intervals", d)
	}
	// The broker keeps serving.
	expectOpen(t, mustChannel(t, mustDial(t, u)))
}

func TestITBadProtocolHeader(t *testing.T) {
	u := startBroker(t)
	for _, hdr := range []string{"AMQP\x00\x00\x08\x00", "AMQP\x01\x01\x00\x0a", "HTTP/1.1"} {
		r := rawDial(t, u)
		if _, err := r.c.Write([]byte(hdr)); err != nil {
			t.Fatal(err)
		}
		// A reset after the answer counts as a close.
		got, err := io.ReadAll(r.rd)
		if string(got) != "AMQP\x00\x00\x09\x01" {
			t.Errorf("header %q answered with %q (%v), want AMQP 0-9-1's header then close", hdr, got, err)
		}
	}
	expectOpen(t, mustChannel(t, mustDial(t, u)))
}
