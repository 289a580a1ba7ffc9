package queue

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// loopRep replicates commands by applying them to every replica at once, in one order: the queue's
// side of a Raft group without the network.
type loopRep struct {
	mu       sync.Mutex
	replicas []*Classic
	index    uint64
}

func (r *loopRep) Propose(cmd []byte, done func([]byte, error)) {
	r.mu.Lock()
	r.index++
	var resp []byte
	for i, q := range r.replicas {
		if out := q.Apply(r.index, cmd); i == 0 {
			resp = out
		}
	}
	r.mu.Unlock()
	go done(resp, nil)
}

func (r *loopRep) IsLeader() bool { return true }

// recConsumer records deliveries.
type recConsumer struct {
	mu sync.Mutex
	ds []Delivery
}

func (c *recConsumer) Reserve(*Classic) bool { return true }
func (c *recConsumer) Deliver(_ *Classic, d Delivery) {
	c.mu.Lock()
	c.ds = append(c.ds, d)
	c.mu.Unlock()
}

func (c *recConsumer) bodies() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, d := range c.ds {
		out = append(out, string(d.Msg.Body))
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true within 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func publishWait(t *testing.T, q *Classic, body string) {
	t.Helper()
	errc := make(chan error, 1)
	q.Publish(&Message{Body: []byte(body), Persistent: true}, func(err error) { errc <- err })
	if err := <-errc; err != nil {
		t.Fatalf("publish %s: %v", body, err)
	}
}

func TestReplicatedReplicasAgree(t *testing.T) {
	rep := &loopRep{}
	var qs []*Classic
	for tag := uint16(1); tag <= 3; tag++ {
		cfg := DefaultConfig()
		cfg.DeliveryLimit = 5
		q := NewReplicated(Options{Name: "qq", Durable: true, Config: &cfg}, rep, tag, 7)
		defer q.Close()
		qs = append(qs, q)
	}
	rep.replicas = qs
	// A consumer on node 2 (prefetch 2); publishes go through node 1.
	cid := ConsumerID(2<<48 | 7<<32 | 1)
	c := &recConsumer{}
	if err := qs[1].AddConsumer(ConsumerSpec{ID: cid, Prefetch: 2}, false, c, nil); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		publishWait(t, qs[0], fmt.Sprint(i))
	}
	waitFor(t, "two deliveries on node 2", func() bool { return len(c.bodies()) == 2 })
	for _, q := range qs {
		if ready, consumers := q.Counts(); ready != 3 || consumers != 1 {
			t.Fatalf("replica counts = %d ready, %d consumers; want 3, 1", ready, consumers)
		}
	}
	// Ack one, requeue the other: the requeued message comes back with its delivery count.
	c.mu.Lock()
	first, second := c.ds[0].ID, c.ds[1].ID
	c.mu.Unlock()
	qs[1].Settle([]uint64{first})
	qs[1].Return([]uint64{second})
	waitFor(t, "two more deliveries", func() bool { return len(c.bodies()) == 4 })
	// Every replica snapshots to the same bytes, and a restored replica too.
	snap := qs[0].Snapshot()
	for i, q := range qs[1:] {
		if !bytes.Equal(q.Snapshot(), snap) {
			t.Fatalf("replica %d's snapshot differs from replica 0's", i+1)
		}
	}
	fresh := NewReplicated(Options{Name: "qq"}, rep, 4, 7)
	defer fresh.Close()
	if err := fresh.RestoreSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh.Snapshot(), snap) {
		t.Fatal("restored replica snapshots differently")
	}
	// Node 2 goes down: its unacked messages return to the queue for everyone.
	qs[0].NodeReset(2, 0, true)
	waitFor(t, "node 2's messages back", func() bool {
		ready, consumers := qs[2].Counts()
		return ready == 4 && consumers == 0
	})
	// A duplicate enqueue (same producer and sequence: a retry after a lost leadership) is applied once.
	cmd := cmdHeader(cmdEnqueue, 64)
	cmd = append(cmd, 0, 0, 0, 0, 0, 0, 0, 9) // producer
	cmd = append(cmd, 0, 0, 0, 0, 0, 0, 0, 1) // seq
	cmd = append(cmd, 0)                      // now
	cmd = appendMsg(cmd, &Message{Body: []byte("dup")})
	done := make(chan struct{}, 2)
	rep.Propose(cmd, func([]byte, error) { done <- struct{}{} })
	rep.Propose(cmd, func([]byte, error) { done <- struct{}{} })
	<-done
	<-done
	if ready, _ := qs[1].Counts(); ready != 5 {
		t.Fatalf("ready after duplicate enqueue = %d, want 5", ready)
	}
}

func TestReplicatedDecodeNeverPanics(t *testing.T) {
	q := NewReplicated(Options{Name: "qq", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, &loopRep{}, 1, 7)
	defer q.Close()
	cmd := cmdHeader(cmdEnqueue, 64)
	cmd = append(cmd, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 0)
	cmd = appendMsg(cmd, &Message{Exchange: "x", RoutingKey: "k", Body: []byte("body"), BCC: []string{"a"}})
	for i := 0; i <= len(cmd); i++ {
		q.Apply(uint64(i+1), cmd[:i])
	}
	for kind := cmdEnqueue; kind <= cmdPurge; kind++ {
		q.Apply(uint64(1000+int(kind)), []byte{replVersion, kind, 0xff, 0xff, 0xff})
	}
	if err := q.RestoreSnapshot([]byte{replVersion, 0xff}); err == nil {
		t.Fatal("garbage snapshot restored")
	}
}

// heldRep queues proposals until flush applies them, so a test can order commands.
type heldRep struct {
	mu       sync.Mutex
	replicas []*Classic
	index    uint64
	queued   [][]byte
	dones    []func([]byte, error)
}

func (r *heldRep) Propose(cmd []byte, done func([]byte, error)) {
	r.mu.Lock()
	r.queued, r.dones = append(r.queued, cmd), append(r.dones, done)
	r.mu.Unlock()
}

func (r *heldRep) IsLeader() bool { return true }

// flush applies everything queued (and what that proposes in turn) in order.
func (r *heldRep) flush() {
	for {
		r.mu.Lock()
		if len(r.queued) == 0 {
			r.mu.Unlock()
			return
		}
		cmd, done := r.queued[0], r.dones[0]
		r.queued, r.dones = r.queued[1:], r.dones[1:]
		r.index++
		idx, replicas := r.index, r.replicas
		r.mu.Unlock()
		var resp []byte
		for i, q := range replicas {
			if out := q.Apply(idx, cmd); i == 0 {
				resp = out
			}
		}
		done(resp, nil)
	}
}

func TestReplicatedOrphanedDeliveryGoesBack(t *testing.T) {
	rep := &heldRep{}
	q1 := NewReplicated(Options{Name: "qq"}, rep, 1, 7)
	q2 := NewReplicated(Options{Name: "qq"}, rep, 2, 7)
	defer q1.Close()
	defer q2.Close()
	rep.replicas = []*Classic{q1, q2}
	cid := ConsumerID(2<<48 | 7<<32 | 1)
	added := make(chan error, 1)
	go func() { added <- q2.AddConsumer(ConsumerSpec{ID: cid, Prefetch: 10}, false, &recConsumer{}, nil) }()
	waitFor(t, "consume proposed", func() bool { rep.mu.Lock(); defer rep.mu.Unlock(); return len(rep.queued) == 1 })
	rep.flush()
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	// A publish from node 1 is ordered before node 2's cancel, which node 2 has already done locally.
	q1.Publish(&Message{Body: []byte("m")}, nil)
	q2.RemoveConsumer(cid)
	rep.flush()
	for _, q := range []*Classic{q1, q2} {
		if ready, consumers := q.Counts(); ready != 1 || consumers != 0 {
			t.Fatalf("counts = %d ready, %d consumers; want the message back and no consumer", ready, consumers)
		}
	}
	// A consumer whose removal never made it into the log (no quorum at the time) is detached
	// when a delivery to it shows it is stale, and its message comes back.
	cid2 := cid + 1
	go func() { added <- q2.AddConsumer(ConsumerSpec{ID: cid2, Prefetch: 10}, false, &recConsumer{}, nil) }()
	waitFor(t, "second consume proposed", func() bool { rep.mu.Lock(); defer rep.mu.Unlock(); return len(rep.queued) == 1 })
	rep.flush()
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	rep.flush() // delivers the ready message to cid2
	q2.mu.Lock()
	delete(q2.consumers, cid2) // gone locally; its removal was lost
	q2.mu.Unlock()
	q1.Publish(&Message{Body: []byte("m2")}, nil)
	rep.flush()
	for _, q := range []*Classic{q1, q2} {
		if ready, consumers := q.Counts(); ready != 2 || consumers != 0 {
			t.Fatalf("after the stale consumer: %d ready, %d consumers; want 2 and 0", ready, consumers)
		}
	}
}
