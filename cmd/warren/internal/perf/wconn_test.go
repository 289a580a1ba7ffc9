package perf

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
)

// TestCoalescingConnKeepsOrderAndContent writes numbered records through a coalescingConn,
// reusing the caller's buffer after every Write as amqp091-go does, and checks that the
// peer reads every record intact and in order, including those still queued at Close.
func TestCoalescingConnKeepsOrderAndContent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const records = 200000
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		buf := make([]byte, 8)
		for i := uint64(0); i < records; i++ {
			if _, err := io.ReadFull(c, buf); err != nil {
				got <- err
				return
			}
			if v := binary.BigEndian.Uint64(buf); v != i {
				got <- &mismatch{i, v}
				return
			}
		}
		got <- nil
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	w := newCoalescingConn(raw)
	p := make([]byte, 8)
	for i := uint64(0); i < records; i++ {
		binary.BigEndian.PutUint64(p, i)
		if _, err := w.Write(p); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(p); err == nil {
		t.Fatal("write after close succeeded")
	}
}

type mismatch struct{ want, got uint64 }

func (m *mismatch) Error() string {
	return "record " + fmtInt(m.want) + " read as " + fmtInt(m.got)
}
