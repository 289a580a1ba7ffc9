package streamproto_test

import (
	"context"
	"testing"
	"time"

	"warren/server/core"
	"warren/server/streamproto/wire"
)

// TestConnectionLimitCountsAnOpenConnection sets max-connections 1 on "/": a second open is
// refused with vhost_access_failure while the first connection is open, and a connection counts
// from its open response on (it is registered before the response is written), so a second one
// opened right after is refused every time.
func TestConnectionLimitCountsAnOpenConnection(t *testing.T) {
	if _, ok := external(); ok {
		t.Skip("sets a vhost limit on the in-process broker")
	}
	cfg := brokerConfig(t)
	cfg.StreamAuthFailureDelay = time.Millisecond
	b := brokerOf(startServer(t, cfg))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := b.srv.Core().SetVHostLimits(ctx, "/", map[string]int64{core.LimitMaxConnections: 1}); err != nil {
		t.Fatal(err)
	}
	tune := func(tn *wire.Tune) *wire.Tune {
		return &wire.Tune{FrameMax: tn.FrameMax, Heartbeat: tn.Heartbeat, Response: true}
	}
	for i := range 10 {
		// The connection closed in the attempt before may still be counted for a moment.
		deadline := time.Now().Add(waitFor)
		var first *rawConn
		for first == nil {
			c := dialRaw(t, b)
			if r := c.handshakeVHost("guest", "guest", "/", tune); r.Code == wire.ResponseCodeOK {
				first = c
				break
			}
			c.nc.Close()
			if time.Now().After(deadline) {
				t.Fatalf("attempt %d: no connection under max-connections 1 within %v", i, waitFor)
			}
			time.Sleep(10 * time.Millisecond)
		}
		second := dialRaw(t, b)
		if r := second.handshakeVHost("guest", "guest", "/", tune); r.Code != wire.ResponseVhostAccessFailure {
			t.Fatalf("attempt %d: a second open over max-connections 1 got %v, want vhost access failure", i, r.Code)
		}
		second.nc.Close()
		first.nc.Close()
	}
}
