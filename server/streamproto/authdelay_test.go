package streamproto_test

// A failed login and a refused open are answered as RabbitMQ 4.x's rabbit_stream_reader answers
// them: the attempt is counted and logged at once, the answer (authentication_failure,
// vhost_access_failure) comes only after ?SILENT_CLOSE_DELAY (streamproto.SilentCloseDelay, 3 s;
// shortened or lengthened here through server.Config.StreamAuthFailureDelay) and the socket is
// then closed. Only the refused connection waits.

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"warren/server/auth"
	"warren/server/core"
	"warren/server/streamproto/wire"
)

// TestFailedLoginAnsweredAfterDelay: wrong credentials get authentication_failure no sooner than
// the delay, then the socket is closed; the attempt is counted once.
func TestFailedLoginAnsweredAfterDelay(t *testing.T) {
	if _, ok := external(); ok {
		t.Skip("sets the in-process broker's delay")
	}
	const delay = 300 * time.Millisecond
	cfg := brokerConfig(t)
	cfg.StreamAuthFailureDelay = delay
	b := brokerOf(startServer(t, cfg))
	for _, tc := range []struct{ name, user, pass string }{
		{"wrong password", "guest", "nope"},
		{"unknown user", "nobody", "guest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, failedBefore := b.srv.Core().AuthAttemptsOf(core.AuthStream)
			c := dialRaw(t, b)
			c.sendAuthenticate("PLAIN", plain(tc.user, tc.pass))
			sent := time.Now()
			r, ok := c.read().(*wire.SASLAuthenticateResponse)
			took := time.Since(sent)
			if !ok || r.Code != wire.ResponseAuthenticationFailure || r.CorrelationID != 3 {
				t.Fatalf("got %+v, want sasl_authenticate authentication_failure for correlation id 3", r)
			}
			if took < delay {
				t.Fatalf("answered after %v, want no sooner than %v", took, delay)
			}
			c.expectClosed()
			if _, failed := b.srv.Core().AuthAttemptsOf(core.AuthStream); failed != failedBefore+1 {
				t.Errorf("failed stream logins %d, want %d", failed, failedBefore+1)
			}
		})
	}
	t.Run("open of a vhost the user may not use", func(t *testing.T) {
		user, pass := noAccessUser(t, b.srv.Core())
		c := dialRaw(t, b)
		began := time.Now()
		r := c.handshakeVHost(user, pass, "/", func(tune *wire.Tune) *wire.Tune {
			return &wire.Tune{FrameMax: tune.FrameMax, Heartbeat: tune.Heartbeat, Response: true}
		})
		took := time.Since(began)
		if r.Code != wire.ResponseVhostAccessFailure {
			t.Fatalf("open: code %s, want vhost_access_failure", r.Code)
		}
		if took < delay {
			t.Fatalf("answered after %v, want no sooner than %v", took, delay)
		}
		c.expectClosed()
	})
}

// noAccessUser creates a user without permissions anywhere and returns its name and password.
func noAccessUser(t *testing.T, co *core.Broker) (user, pass string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	user, pass = "noaccess", "noaccess-secret"
	h, err := auth.HashPassword(auth.DefaultAlgorithm, pass)
	if err != nil {
		t.Fatal(err)
	}
	if err := co.PutUser(ctx, core.User{Name: user, Hash: h}); err != nil {
		t.Fatal(err)
	}
	return user, pass
}

// TestFailedLoginDelayBlocksNobody: while a failed login's answer is withheld (a delay of a
// minute here), other connections are served at once, an unknown mechanism is refused at once as
// in RabbitMQ, and the wait ends as soon as the client goes away or the broker shuts down.
func TestFailedLoginDelayBlocksNobody(t *testing.T) {
	if _, ok := external(); ok {
		t.Skip("sets the in-process broker's delay")
	}
	cfg := brokerConfig(t)
	cfg.StreamAuthFailureDelay = time.Minute
	logs := &logText{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, stop := startStoppableServer(t, cfg)
	b := brokerOf(srv)

	// withheld sends a wrong password and waits until the broker withholds the answer.
	withheld := func(t *testing.T) *rawConn {
		t.Helper()
		c := dialRaw(t, b)
		c.sendAuthenticate("PLAIN", plain("guest", "nope"))
		logs.wait(t, `msg="withholding the answer to a refusal"`, `refusal="failed login"`, connField(c))
		return c
	}

	t.Run("others at once", func(t *testing.T) {
		_, failedBefore := srv.Core().AuthAttemptsOf(core.AuthStream)
		w := withheld(t)
		if _, failed := srv.Core().AuthAttemptsOf(core.AuthStream); failed != failedBefore+1 {
			t.Errorf("failed stream logins %d while the answer is withheld, want %d", failed, failedBefore+1)
		}
		// Each of these is answered at once: all of them well within 5 s, where waiting for the
		// refused connection would take its minute or (the handshake timeout closing it) 10 s.
		began := time.Now()
		dialRaw(t, b).open(0)

		c := dialRaw(t, b)
		c.sendAuthenticate("CRAM-MD5", []byte("x"))
		if r, ok := c.read().(*wire.SASLAuthenticateResponse); !ok || r.Code != wire.ResponseSASLMechanismNotSupported {
			t.Fatalf("unknown mechanism: %+v", r)
		}
		c.expectClosed()

		if took := time.Since(began); took > 5*time.Second {
			t.Fatalf("the other connections took %v", took)
		}

		// The refused connection is still open and unanswered.
		_ = w.nc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		f, err := w.r.ReadFrame()
		var ne net.Error
		if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("the refused connection: frame %x, error %v; want it open and unanswered", f, err)
		}
	})

	t.Run("client goes away", func(t *testing.T) {
		w := withheld(t)
		conn := connField(w)
		w.nc.Close()
		logs.wait(t, `msg="stream connection closed before it opened"`, conn, `reason="client closed the connection"`)
	})

	t.Run("shutdown", func(t *testing.T) {
		w := withheld(t)
		began := time.Now()
		if err := stop(); err != nil {
			t.Fatalf("shutdown during the delay: %v", err)
		}
		t.Logf("shutdown took %v", time.Since(began))
		f, err := w.r.ReadFrame()
		if err == nil {
			t.Fatalf("got a frame, want the socket closed without an answer: %x", f)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the server left the connection open")
		}
	})
}

// connField is the conn field of the broker's log lines about c's connection.
func connField(c *rawConn) string { return `conn="` + c.nc.LocalAddr().String() + " -> " }

// logText collects a broker's text log for a test to wait on.
type logText struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logText) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// wait waits (bounded by waitFor) for a line holding every one of parts.
func (l *logText) wait(t *testing.T, parts ...string) {
	t.Helper()
	pollUntil(t, "log line with "+strings.Join(parts, " "), waitFor, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
	lines:
		for line := range strings.Lines(l.b.String()) {
			for _, p := range parts {
				if !strings.Contains(line, p) {
					continue lines
				}
			}
			return true
		}
		return false
	})
}
