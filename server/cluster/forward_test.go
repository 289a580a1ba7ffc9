package cluster

import (
	"io"
	"net"
	"testing"
	"time"
)

// A forward connection's sweeper sleeps while nothing is pending; a request registered after a
// quiet spell still fails at its deadline when the peer never answers (the sweeper wakes for it).
func TestForwardSweepWakesForNewRequest(t *testing.T) {
	c := newCluster(t, 1, false)
	n := c.nodes[0].node
	// A peer that takes everything and answers nothing.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, conn); _ = conn.Close() }()
		}
	}()
	fc, err := n.client(ln.Addr().String()).getConn()
	if err != nil {
		t.Fatal(err)
	}
	// Quiet for several sweep intervals: the sweeper has found nothing pending and parked.
	time.Sleep(5 * fwdSweepInterval)
	const wait = 300 * time.Millisecond
	reply := make(chan fwdReply, 1)
	if _, ok := fc.register(&fwdPending{reply: reply, deadline: time.Now().Add(wait)}); !ok {
		t.Fatal("the connection is dead")
	}
	select {
	case r := <-reply:
		if r.err == nil {
			t.Fatalf("got an answer from a peer that never answers: %+v", r)
		}
	case <-time.After(wait + 5*time.Second):
		t.Fatalf("no failure %v after the request's deadline: the sweeper did not wake", 5*time.Second)
	}
}
