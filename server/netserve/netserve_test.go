package netserve

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoConn is a tracked connection that echoes until its socket closes.
type echoConn struct{ nc net.Conn }

func serveEcho(t *testing.T) (*Tracker[*echoConn], net.Listener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := NewTracker[*echoConn](nil)
	tr.Serve(ln, func(nc net.Conn) *echoConn {
		return &echoConn{nc: nc}
	}, func(c *echoConn) {
		_, _ = io.Copy(c.nc, c.nc)
		c.nc.Close()
	})
	return tr, ln
}

func waitConns(t *testing.T, tr *Tracker[*echoConn], n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(tr.Conns()) != n {
		if time.Now().After(deadline) {
			t.Fatalf("tracked connections: %d, want %d", len(tr.Conns()), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestTracksAndShutsDown(t *testing.T) {
	tr, ln := serveEcho(t)
	if got := tr.Addr(); got.String() != ln.Addr().String() {
		t.Fatalf("Addr = %v, want %v", got, ln.Addr())
	}
	var clients []net.Conn
	for range 3 {
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		clients = append(clients, nc)
	}
	waitConns(t, tr, 3)

	// A client that hangs up is forgotten.
	clients[0].Close()
	waitConns(t, tr, 2)

	helperDone := make(chan struct{})
	stop := make(chan struct{})
	var stopOnce sync.Once
	tr.Go(func() {
		<-stop
		close(helperDone)
	})

	err := tr.Shutdown(context.Background(), func(c *echoConn) {
		c.nc.Close()
		stopOnce.Do(func() { close(stop) })
	}, func(*echoConn) { t.Error("cut called though every connection closed") })
	if err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	<-helperDone
	if n := len(tr.Conns()); n != 0 {
		t.Fatalf("connections after Shutdown: %d", n)
	}
	// The listener is closed: a new client is refused or hung up on.
	if nc, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := nc.Read(make([]byte, 1)); err == nil {
			t.Fatal("read from a connection after Shutdown")
		}
		nc.Close()
	}
}

func TestShutdownCutsOnContextEnd(t *testing.T) {
	tr, ln := serveEcho(t)
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	waitConns(t, tr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cuts := 0
	// closeConn does nothing, so only cut can end the echo loop.
	err = tr.Shutdown(ctx, func(*echoConn) {}, func(c *echoConn) {
		cuts++
		c.nc.Close()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown = %v, want context.Canceled", err)
	}
	if cuts != 1 {
		t.Fatalf("cut called %d times, want 1", cuts)
	}
}

func TestAddrBeforeServe(t *testing.T) {
	if a := NewTracker[*echoConn](nil).Addr(); a != nil {
		t.Fatalf("Addr before Serve = %v, want nil", a)
	}
}
