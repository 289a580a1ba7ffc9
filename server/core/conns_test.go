package core

import (
	"fmt"
	"net"
	"testing"
)

// fakeConn is a registered client connection with an address, as the protocols' are.
type fakeConn struct {
	vhost string
	peer  net.TCPAddr
}

func (f *fakeConn) Info() ConnectionInfo {
	peer := f.peer.String()
	return ConnectionInfo{Name: peer + " -> 127.0.0.1:5672", Protocol: "AMQP 0-9-1", State: "running",
		Peer: peer, Local: "127.0.0.1:5672", User: "guest", VHost: f.vhost}
}

func (f *fakeConn) ForceClose(uint16, string) {}

func fakeConns(n int, vhost string) []*fakeConn {
	cs := make([]*fakeConn, n)
	for i := range cs {
		cs[i] = &fakeConn{vhost: vhost, peer: net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1024 + i}}
	}
	return cs
}

// TestLocalConnectionsCountsPerVHost: max-connections' count of a vhost's connections follows
// registrations, and a connection unregistered twice is counted out once.
func TestLocalConnectionsCountsPerVHost(t *testing.T) {
	b := newTestBroker(t, "guest")
	as, bs := fakeConns(3, "a"), fakeConns(2, "b")
	for _, c := range as {
		b.RegisterConn(c)
	}
	for _, c := range bs {
		b.RegisterConn(c)
	}
	if a, bb, none := b.LocalConnections("a"), b.LocalConnections("b"), b.LocalConnections("c"); a != 3 || bb != 2 || none != 0 {
		t.Fatalf("counts a=%d b=%d c=%d, want 3 2 0", a, bb, none)
	}
	b.UnregisterConn(as[0])
	b.UnregisterConn(as[0])
	b.UnregisterConn(bs[1])
	if a, bb := b.LocalConnections("a"), b.LocalConnections("b"); a != 2 || bb != 1 {
		t.Fatalf("after unregistering: a=%d b=%d, want 2 1", a, bb)
	}
	if n := len(b.Connections()); n != 3 {
		t.Fatalf("Connections lists %d, want 3", n)
	}
}

// BenchmarkLocalConnections is max-connections' count at a connection.open, with 1,000 and
// 10,000 connections open on the node (half of them to the vhost counted).
func BenchmarkLocalConnections(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			br := newTestBroker(b, "guest")
			for _, c := range fakeConns(n/2, "counted") {
				br.RegisterConn(c)
			}
			for _, c := range fakeConns(n-n/2, "other") {
				br.RegisterConn(c)
			}
			b.ResetTimer()
			for range b.N {
				if got := br.LocalConnections("counted"); got != n/2 {
					b.Fatalf("counted %d, want %d", got, n/2)
				}
			}
		})
	}
}
