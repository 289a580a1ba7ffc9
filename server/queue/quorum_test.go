package queue

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"warren/amqp"
)

func TestQuorumReplicasAgree(t *testing.T) {
	c := newCluster(t)
	cfg := OpenConfig{Lifecycle: cfgWith(func(c *Config) { c.DeliveryLimit = 5 })}
	var qs []*Quorum
	for range 3 {
		qs = append(qs, c.add(t, cfg, false))
	}
	if qs[0].Kind() != "quorum" {
		t.Fatalf("kind %q", qs[0].Kind())
	}
	// A consumer on node 2 (prefetch 2); publishes go through node 1.
	cons := &tconsumer{}
	consume(t, qs[1], ConsumeSpec{ID: cid(1, 1), Prefetch: 2}, cons)
	for i := range 5 {
		publishOK(t, qs[0], body(fmt.Sprint(i)))
	}
	waitFor(t, "two deliveries on node 2", func() bool { return cons.count() == 2 })
	for _, q := range qs {
		waitFor(t, "replica counts", func() bool { st := q.Stats(); return st.Ready == 3 && st.Consumers == 1 })
	}
	// Ack one, requeue the other: the requeued message comes back with its delivery count.
	ds := cons.deliveries()
	cons.take()
	settle(t, qs[1], SettleAck, []Tag{ds[0].Tag()})
	settle(t, qs[1], SettleRequeue, []Tag{ds[1].Tag()})
	waitFor(t, "two more deliveries", func() bool { return cons.count() == 2 })
	if !slices.ContainsFunc(cons.deliveries(), func(d Delivery) bool {
		return string(d.Msg.Body) == "1" && d.DeliveryCount == 1 && d.Redelivered
	}) {
		t.Fatalf("no redelivery of the requeued message: %+v", cons.deliveries())
	}
	// Every replica snapshots to the same bytes, and a restored replica too.
	waitFor(t, "replicas applied", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.log) == 0
	})
	snap := qs[0].Snapshot()
	for i, q := range qs[1:] {
		if !bytes.Equal(q.Snapshot()[1:], snap[1:]) {
			t.Fatalf("replica %d's snapshot differs from replica 0's", i+1)
		}
	}
	fresh := c.add(t, cfg, false)
	if err := fresh.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh.Snapshot(), snap) {
		t.Fatal("restored replica snapshots differently")
	}
	// Node 2 goes down: its unacked messages return to the queue for everyone.
	if got := qs[0].ConsumerNodes(); !slices.Equal(got, []uint16{2}) {
		t.Fatalf("consumer nodes %v", got)
	}
	qs[0].NodeDown(2)
	for _, q := range qs {
		waitFor(t, "node 2's messages back", func() bool { st := q.Stats(); return st.Ready == 4 && st.Consumers == 0 })
	}
}

// Applied twice, as a retry after a lost leadership is, no command changes the queue twice.
func TestQuorumRetriedCommandsAreIdempotent(t *testing.T) {
	c := newCluster(t)
	c.twice = true
	q := c.add(t, OpenConfig{}, false)
	for i := range 4 {
		publishOK(t, q, body(fmt.Sprint(i)))
	}
	if st := q.Stats(); st.Ready != 4 {
		t.Fatalf("ready %d after 4 publishes applied twice each", st.Ready)
	}
	d, n, ok, err := q.Get(false)
	if err != nil || !ok || n != 3 || string(d.Msg.Body) != "0" {
		t.Fatalf("get = %+v %d %v %v", d, n, ok, err)
	}
	if st := q.Stats(); st.Ready != 3 || st.Unacked != 1 {
		t.Fatalf("a retried get took a second message: %s", fmtStats(q))
	}
	// Return it, then settle the same (old) tag: a retry of the return cannot return the
	// redelivery, nor the ack ack it.
	settle(t, q, SettleRequeue, []Tag{d.Tag()})
	waitFor(t, "returned", func() bool { return q.Stats().Ready == 4 })
	cons := &tconsumer{}
	consume(t, q, ConsumeSpec{ID: cid(0, 1), Prefetch: 1}, cons)
	waitFor(t, "redelivered", func() bool { return cons.count() == 1 })
	again := cons.deliveries()[0]
	if string(again.Msg.Body) != "0" || again.DeliveryCount != 1 {
		t.Fatalf("redelivery %+v", again)
	}
	settle(t, q, SettleRequeue, []Tag{d.Tag()})
	settle(t, q, SettleAck, []Tag{d.Tag()})
	settle(t, q, SettleDiscard, []Tag{d.Tag()})
	waitFor(t, "applied", func() bool { return c.count(CmdDiscard, nil) == 2 })
	if st := q.Stats(); st.Unacked != 1 || st.Ready != 3 {
		t.Fatalf("stale tags changed the queue: %s", fmtStats(q))
	}
	q.Cancel(cid(0, 1))
	settle(t, q, SettleRequeue, cons.take())
	waitFor(t, "requeued", func() bool { return q.Stats().Ready == 4 })
	publishOK(t, q, body("late"))
	if n, err := q.Purge(); n != 5 || err != nil {
		t.Fatalf("purge = %d %v (applied twice: the retry answers the first count)", n, err)
	}
	publishOK(t, q, body("after"))
	if st := q.Stats(); st.Ready != 1 {
		t.Fatalf("ready %d after purge and one publish", st.Ready)
	}
}

// Commands that cannot be decoded are skipped, never a panic.
func TestQuorumMalformedCommandsSkipped(t *testing.T) {
	c := newCluster(t)
	q := c.add(t, OpenConfig{}, false)
	cmd := AppendCommand(nil, &Command{Type: CmdEnqueue, Producer: 9, Seq: 1,
		Msg: &Message{Exchange: "x", RoutingKey: "k", Body: []byte("body"), BCC: []string{"a"}}}, 0)
	for i := 0; i < len(cmd); i++ {
		q.Apply(uint64(i+1), cmd[:i])
	}
	for kind := 0; kind < 256; kind++ {
		q.Apply(uint64(1000+kind), []byte{commandVersion, byte(kind), 0xff, 0xff, 0xff})
		q.Apply(uint64(2000+kind), []byte{byte(kind), 1, 2, 3})
	}
	q.Apply(5000, cmd)
	if st := q.Stats(); st.Ready != 1 {
		t.Fatalf("ready %d", st.Ready)
	}
	if err := q.Restore([]byte{quorumSnapshotVersion, 0xff}); err == nil {
		t.Fatal("garbage snapshot restored")
	}
}

// A delivery to a consumer that went away before its cancel was applied goes back; so does one to
// a consumer whose cancel never made it into the log.
func TestQuorumOrphanedDeliveryGoesBack(t *testing.T) {
	c := newCluster(t)
	q1 := c.add(t, OpenConfig{}, false)
	q2 := c.add(t, OpenConfig{}, false)
	c.mu.Lock()
	c.held = true
	c.mu.Unlock()
	id := cid(1, 1)
	added := make(chan error, 1)
	go func() { added <- q2.Consume(ConsumeSpec{ID: id, Prefetch: 10}, &tconsumer{}) }()
	waitFor(t, "consume proposed", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.log) == 1 })
	c.flush(t)
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	// A publish from node 1 is ordered before node 2's cancel, which node 2 has already done locally.
	// Node 2's dispatcher proposes the orphaned delivery's return after that apply, from its own
	// goroutine: the log is released until it is back.
	q1.Publish(body("m"), nil)
	q2.Cancel(id)
	c.flush(t)
	c.release()
	for _, q := range []*Quorum{q1, q2} {
		waitFor(t, "the message back, no consumer", func() bool { st := q.Stats(); return st.Ready == 1 && st.Consumers == 0 })
	}
	c.hold()
	// A consumer whose cancel never made it into the log (no quorum at the time) is detached
	// when a delivery to it shows it is stale, and its message comes back.
	id2 := id + 1
	go func() { added <- q2.Consume(ConsumeSpec{ID: id2, Prefetch: 10}, &tconsumer{}) }()
	waitFor(t, "second consume proposed", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.log) == 1 })
	c.flush(t)
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	c.flush(t) // delivers the ready message to id2
	q2.mu.Lock()
	delete(q2.consumers, id2) // gone locally; its cancel was lost
	q2.mu.Unlock()
	q1.Publish(body("m2"), nil)
	c.flush(t)
	c.release() // the stale consumer's reaping is proposed by node 2's dispatcher after that apply
	for _, q := range []*Quorum{q1, q2} {
		waitFor(t, "both messages back, no consumer", func() bool { st := q.Stats(); return st.Ready == 2 && st.Consumers == 0 })
	}
}

// deadLetterInto returns a hook that republishes dead letters into target with their dedupe
// keys and reports done once target has them all.
func deadLetterInto(target Queue) func(Queue, []Dead, func(error)) {
	return func(_ Queue, dead []Dead, done func(error)) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var failed error
		for _, d := range dead {
			m := *d.Msg
			m.Dedupe = d.Key
			wg.Add(1)
			target.Publish(&m, doneFunc(func(err error) {
				mu.Lock()
				failed = errors.Join(failed, err)
				mu.Unlock()
				wg.Done()
			}))
		}
		go func() {
			wg.Wait()
			if done != nil {
				done(failed)
			}
		}()
	}
}

type doneFunc func(error)

func (f doneFunc) Done(err error) { f(err) }

// Dead letters are handed over at least once from the log and never visibly twice: the leader
// hands them to the hook; when leadership moves before their removal is committed, the new leader
// hands them over again, and the target drops the duplicates by their dedupe keys.
func TestQuorumDeadLetterAcrossLeaderChange(t *testing.T) {
	for _, targetKind := range []string{"classic", "quorum"} {
		t.Run(targetKind, func(t *testing.T) {
			var target Queue
			if targetKind == "classic" {
				target = openClassic(t, OpenConfig{})
			} else {
				tc := newCluster(t)
				target = tc.add(t, OpenConfig{ID: 99, Name: "target"}, false)
			}
			c := newCluster(t)
			h := &thooks{deadLetter: deadLetterInto(target)}
			cfg := OpenConfig{Hooks: h, Lifecycle: cfgWith(func(c *Config) { c.MaxLength = 0 })}
			a := c.add(t, cfg, false)
			b := c.add(t, cfg, false)
			c.setLeader(0)
			// Node A's removals of the records it handed over never commit (it loses its quorum
			// for them), so the records stay while A has handed the messages over already.
			c.mu.Lock()
			c.fail = func(node int, cmd *Command) bool { return node == 0 && cmd.Type == CmdDeadLettered }
			c.mu.Unlock()
			for i := range 10 {
				publishOK(t, a, body(fmt.Sprint(i))) // max-length 0, drop-head: every one dies at once
			}
			waitFor(t, "A handed all ten over", func() bool { return target.Stats().Ready == 10 })
			if n := a.s.DeadLetters(); n != 10 {
				t.Fatalf("records left after A's hand-over: %d, want 10 (removal failed)", n)
			}
			// B becomes leader: it hands everything still recorded over again.
			c.setLeader(1)
			waitFor(t, "records removed by B", func() bool {
				a.mu.Lock()
				defer a.mu.Unlock()
				return a.s.DeadLetters() == 0
			})
			if st := target.Stats(); st.Ready != 10 {
				t.Fatalf("target has %d messages, want each of the 10 once", st.Ready)
			}
			var got []string
			for {
				d, _, ok, err := target.Get(true)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				got = append(got, string(d.Msg.Body))
			}
			if !slices.Equal(got, []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}) {
				t.Fatalf("target got %v", got)
			}
			_ = b
		})
	}
}

// A hand-over whose target fails is retried: nothing is lost.
func TestQuorumDeadLetterRetried(t *testing.T) {
	c := newCluster(t)
	var mu sync.Mutex
	calls := 0
	var got []Dead
	h := &thooks{deadLetter: func(_ Queue, dead []Dead, done func(error)) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			done(errors.New("target has no quorum"))
			return
		}
		got = append(got, dead...)
		done(nil)
	}}
	q := c.add(t, OpenConfig{Hooks: h}, false)
	q.dlxRetry = 10 * time.Millisecond
	c.setLeader(0)
	cons := &tconsumer{}
	consume(t, q, ConsumeSpec{ID: cid(0, 1)}, cons)
	publishOK(t, q, body("x"))
	waitFor(t, "delivered", func() bool { return cons.count() == 1 })
	settle(t, q, SettleDiscard, cons.take())
	waitFor(t, "handed over after the retry", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 1
	})
	waitFor(t, "record removed", func() bool { q.mu.Lock(); defer q.mu.Unlock(); return q.s.DeadLetters() == 0 })
	if d := got[0]; d.Reason != ReasonRejected || string(d.Msg.Body) != "x" || d.Key.Source != 42 || d.Key.Seq != 1 {
		t.Fatalf("dead letter %+v", d)
	}
}

// A consumer with prefetch 0 on a long quorum queue holds at most its credit window while its
// connection has no room; credit is granted again as it drains.
func TestQuorumCredit(t *testing.T) {
	c := newCluster(t)
	q := c.add(t, OpenConfig{}, false)
	for i := range 1000 {
		q.Publish(body(fmt.Sprint(i)), nil)
	}
	waitFor(t, "published", func() bool { return q.Stats().Ready == 1000 })
	cons := &tconsumer{noRoom: true}
	id := cid(0, 1)
	consume(t, q, ConsumeSpec{ID: id, Prefetch: 0, NoAck: true}, cons)
	// The state stops at the initial credit: exactly one window is assigned and handed over.
	waitFor(t, "one window delivered", func() bool { return cons.count() == creditWindow })
	q.mu.Lock()
	sc := q.s.m.consumers[id]
	delivered, credit, ready := sc.delivered, sc.spec.Credit, q.s.m.ready
	q.mu.Unlock()
	if delivered != creditWindow || credit != creditWindow || ready != 1000-creditWindow {
		t.Fatalf("state: delivered %d credit %d ready %d", delivered, credit, ready)
	}
	if n := c.count(CmdCredit, nil); n != 0 {
		t.Fatalf("%d credit grants while the connection had no room", n)
	}
	// Room again: the connection kicks the queue, which grants more as it goes.
	cons.setRoom(true)
	waitFor(t, "everything delivered", func() bool { return cons.count() == 1000 })
	for i, b := range cons.bodies() {
		if b != fmt.Sprint(i) {
			t.Fatalf("delivery %d is %q", i, b)
		}
	}
	if n := c.count(CmdCredit, nil); n == 0 {
		t.Fatal("no credit granted")
	}
}

// Credit grants carry absolute totals: applied twice they grant once.
func TestQuorumCreditRetried(t *testing.T) {
	c := newCluster(t)
	c.twice = true
	q := c.add(t, OpenConfig{}, false)
	for range 600 {
		q.Publish(body("x"), nil)
	}
	waitFor(t, "published", func() bool { return q.Stats().Ready == 600 })
	cons := &tconsumer{}
	id := cid(0, 1)
	consume(t, q, ConsumeSpec{ID: id, NoAck: true}, cons)
	waitFor(t, "delivered", func() bool { return cons.count() == 600 })
	q.mu.Lock()
	sc := q.s.m.consumers[id]
	q.mu.Unlock()
	if over := sc.spec.Credit - sc.delivered; over > creditWindow {
		t.Fatalf("credit %d for %d deliveries: retried grants added up", sc.spec.Credit, sc.delivered)
	}
}

// done is called exactly once for every publish to a quorum queue.
func TestQuorumDoneOnce(t *testing.T) {
	c := newCluster(t)
	q := c.add(t, OpenConfig{Lifecycle: cfgWith(func(c *Config) { c.MaxLength = 1; c.Overflow = RejectPublish })}, false)
	d := newDone(t)
	if st := q.Publish(body("a"), d); st != Accepted || d.wait() != nil {
		t.Fatal("accepted publish")
	}
	d = newDone(t)
	if q.Publish(body("b"), d); !errors.Is(d.wait(), ErrRejected) {
		t.Fatal("rejected publish")
	}
	c.mu.Lock()
	c.fail = func(int, *Command) bool { return true }
	c.mu.Unlock()
	d = newDone(t)
	if q.Publish(body("c"), d); !errors.Is(d.wait(), ErrNoQuorum) {
		t.Fatal("publish without quorum")
	}
	q.Delete()
	d = newDone(t)
	if st := q.Publish(body("d"), d); st != Gone || !d.called() || !errors.Is(d.wait(), ErrGone) {
		t.Fatal("publish to a deleted queue")
	}
}

// Close wakes publishers waiting for the proposal window.
func TestQuorumCloseWakesPublishers(t *testing.T) {
	c := newCluster(t)
	c.mu.Lock()
	c.held = true // nothing commits: the window fills up
	c.mu.Unlock()
	q := c.add(t, OpenConfig{}, false)
	dones := make([]*tdone, quorumMaxInflight)
	for i := range dones {
		dones[i] = newDone(t)
		q.Publish(body("x"), dones[i])
	}
	blocked := newDone(t)
	returned := make(chan PublishStatus, 1)
	go func() { returned <- q.Publish(body("y"), blocked) }()
	waitFor(t, "window full", func() bool { return len(q.slots) == quorumMaxInflight })
	q.Close()
	select {
	case st := <-returned:
		if st != Gone || !errors.Is(blocked.wait(), ErrGone) {
			t.Fatalf("blocked publisher: %d", st)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the blocked publisher")
	}
	c.flush(t)
	for _, d := range dones {
		d.wait()
	}
}

func TestQuorumGlobalPrefetch(t *testing.T) {
	c := newCluster(t)
	q := c.add(t, OpenConfig{VHost: "/", Name: "qq"}, false)
	err := q.Consume(ConsumeSpec{ID: cid(0, 1), GlobalPrefetch: 5}, &tconsumer{})
	var aerr *amqp.Error
	if !errors.As(err, &aerr) || aerr.Code != amqp.NotImplemented || aerr.Text != "NOT_IMPLEMENTED - queue 'qq' in vhost '/' does not support global qos" {
		t.Fatalf("global prefetch on a quorum queue: %v", err)
	}
	// A replicated classic queue applies it per consumer.
	cc := newCluster(t)
	rc := cc.add(t, OpenConfig{Name: "cq"}, true)
	if rc.Kind() != "classic" {
		t.Fatalf("kind %q", rc.Kind())
	}
	cons := &tconsumer{}
	consume(t, rc, ConsumeSpec{ID: cid(0, 1), GlobalPrefetch: 2, Prefetch: 10}, cons)
	for range 5 {
		rc.Publish(body("x"), nil)
	}
	// Publishes without a done commit asynchronously: wait until all five
	// are in the queue before judging how many went out.
	waitFor(t, "five enqueued", func() bool { st := rc.Stats(); return st.Ready+st.Unacked == 5 })
	waitFor(t, "two delivered", func() bool { return cons.count() == 2 })
	if st := rc.Stats(); st.Ready != 3 || st.Unacked != 2 || cons.count() != 2 {
		t.Fatalf("global prefetch 2 per consumer: %s, %d delivered", fmtStats(rc), cons.count())
	}
	// ClassicType opens a replicated classic queue when given a QuorumConfig.
	q2, err := ClassicType{}.Open(OpenConfig{Name: "c2", Lifecycle: DefaultConfig(), Logger: quiet,
		Extra: &QuorumConfig{Replicator: &memRep{c: cc, node: 5}, Node: 6, Epoch: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer q2.Close()
	if _, ok := q2.(*Quorum); !ok || q2.Kind() != "classic" {
		t.Fatalf("ClassicType with a QuorumConfig opened a %T %q", q2, q2.Kind())
	}
	if _, err := (QuorumType{}).Open(OpenConfig{Name: "x"}); err == nil {
		t.Fatal("quorum queue without a QuorumConfig")
	}
}

// A replicated classic queue whose home node is down cancels the consumers attached here.
func TestQuorumUnavailable(t *testing.T) {
	c := newCluster(t)
	q := c.add(t, OpenConfig{}, true)
	cons := &tconsumer{}
	consume(t, q, ConsumeSpec{ID: cid(0, 1)}, cons)
	q.Unavailable()
	if got := cons.cancels(); !slices.Equal(got, []CancelReason{CancelUnavailable}) {
		t.Fatalf("cancels %v", got)
	}
	q.Delete()
	if got := cons.cancels(); len(got) != 1 {
		t.Fatalf("cancelled again by Delete: %v", got)
	}
}

func TestQuorumDeleteCancelsConsumers(t *testing.T) {
	c := newCluster(t)
	q := c.add(t, OpenConfig{}, false)
	cons := &tconsumer{}
	consume(t, q, ConsumeSpec{ID: cid(0, 1)}, cons)
	q.Publish(body("x"), nil)
	q.Publish(body("y"), nil)
	waitFor(t, "delivered", func() bool { return cons.count() == 2 })
	publishOK(t, q, body("z"))
	q.Delete()
	if got := cons.cancels(); !slices.Equal(got, []CancelReason{CancelDeleted}) {
		t.Fatalf("cancels %v", got)
	}
}

// A node that restarts removes the consumers of its earlier boots (Rejoin); a node that goes down
// loses the consumers of the epochs it had, and a retry of that reset spares its new consumers.
func TestQuorumNodeResetEpochs(t *testing.T) {
	c := newCluster(t)
	q := c.add(t, OpenConfig{}, false)
	old := ConsumerID(1<<48 | 7<<32 | 1) // node 1, an earlier boot (epoch 7)
	other := ConsumerID(2<<48 | 3<<32 | 1)
	for _, id := range []ConsumerID{old, other} {
		cmd := AppendCommand(nil, &Command{Type: CmdConsume, Consumer: id, Credited: true, Credit: 10}, nowMs())
		q.Apply(0, cmd)
	}
	for range 4 {
		publishOK(t, q, body("x"))
	}
	if st := q.Stats(); st.Unacked != 4 || st.Consumers != 2 {
		t.Fatalf("stats %s", fmtStats(q))
	}
	q.Rejoin() // node 1 (this replica), epoch 1: epoch 7's consumer goes
	waitFor(t, "old epoch reset", func() bool { return q.Stats().Consumers == 1 })
	q.NodeDown(2)
	waitFor(t, "node 2 reset", func() bool { st := q.Stats(); return st.Consumers == 0 && st.Unacked == 0 && st.Ready == 4 })
	// Node 2 is back with epoch 4; a retried reset of its epoch 3 leaves the new consumer alone.
	back := ConsumerID(2<<48 | 4<<32 | 1)
	q.Apply(0, AppendCommand(nil, &Command{Type: CmdConsume, Consumer: back, Credited: true, Credit: 10}, nowMs()))
	q.Apply(0, AppendCommand(nil, &Command{Type: CmdNodeReset, Node: 2, Epochs: []uint16{3}}, nowMs()))
	if st := q.Stats(); st.Consumers != 1 {
		t.Fatalf("retried reset removed the node's new consumer: %s", fmtStats(q))
	}
}

// A quorum queue's snapshot and commands from the previous release (version 1) still load.
func TestQuorumReadsVersion1(t *testing.T) {
	c := newCluster(t)
	q := c.add(t, OpenConfig{}, false)
	// Version 1 commands: an enqueue (producer 9, seq 1), a consumer, a settle by id only.
	enq := []byte{1, v1Enqueue}
	enq = binary.BigEndian.AppendUint64(enq, 9)
	enq = binary.BigEndian.AppendUint64(enq, 1)
	enq = binary.AppendVarint(enq, nowMs())
	enq = append(enq, 0)               // priority
	enq = binary.AppendVarint(enq, 0)  // expires at
	enq = binary.AppendUvarint(enq, 1) // one BCC key
	enq = binary.AppendUvarint(enq, 2)
	enq = append(enq, "cc"...)
	enq = encodeRecord(enq, &Message{Exchange: "x", RoutingKey: "k", Body: []byte("old")}, 0)
	q.Apply(1, enq)
	q.Apply(2, enq) // the same command id again: deduplicated
	add := []byte{1, v1AddConsumer}
	add = binary.BigEndian.AppendUint64(add, uint64(cid(0, 1)))
	add = binary.AppendUvarint(add, 5)
	add = binary.AppendVarint(add, 0)
	add = append(add, 0, 0)
	add = binary.AppendVarint(add, nowMs())
	cons := &tconsumer{}
	q.mu.Lock()
	q.consumers[cid(0, 1)] = &quorumConsumer{c: cons, window: creditWindow, granted: creditWindow}
	q.mu.Unlock()
	q.Apply(3, add)
	waitFor(t, "delivered", func() bool { return cons.count() == 1 })
	if d := cons.deliveries()[0]; string(d.Msg.Body) != "old" || !slices.Equal(d.Msg.BCC, []string{"cc"}) {
		t.Fatalf("delivery %+v", d)
	}
	settle1 := []byte{1, v1Settle}
	settle1 = binary.AppendVarint(settle1, nowMs())
	settle1 = binary.AppendUvarint(settle1, 1)
	settle1 = binary.AppendUvarint(settle1, 1)
	q.Apply(4, settle1)
	if st := q.Stats(); st.Ready != 0 || st.Unacked != 0 {
		t.Fatalf("after version 1 commands: %s", fmtStats(q))
	}
	// A version 1 snapshot: applied index, exclusive consumer, producers, basic.get owners, machine.
	m := newDriver(DefaultConfig())
	m.Enqueue(body("kept"))
	ms := m.s.m.appendSnapshot(nil)
	ms[0] = 1
	// version 1 machines had no delivered counts: with no consumers the layouts agree
	snap := []byte{1}
	snap = binary.AppendUvarint(snap, 10)
	snap = binary.BigEndian.AppendUint64(snap, 0)
	snap = binary.AppendUvarint(snap, 1)
	snap = binary.BigEndian.AppendUint64(snap, 9)
	snap = binary.AppendUvarint(snap, 5)
	snap = binary.AppendUvarint(snap, 0)
	snap = binary.AppendUvarint(snap, 1)
	snap = binary.AppendUvarint(snap, 77)
	snap = binary.BigEndian.AppendUint16(snap, 3)
	snap = append(snap, ms...)
	if err := q.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if st := q.Stats(); st.Ready != 1 {
		t.Fatalf("restored version 1: %s", fmtStats(q))
	}
	if got := q.ConsumerNodes(); !slices.Equal(got, []uint16{3}) {
		t.Fatalf("basic.get owner of the version 1 snapshot: %v", got)
	}
}

// A follower cut off from the log catches up from a snapshot: it hands its consumers what the
// state assigned them meanwhile (and nothing twice), and tells a consumer the state dropped.
func TestQuorumRestoreReconcilesConsumers(t *testing.T) {
	c := newCluster(t)
	a := c.add(t, OpenConfig{}, false)
	b := c.add(t, OpenConfig{}, false)
	kept, dropped := &tconsumer{}, &tconsumer{}
	consume(t, b, ConsumeSpec{ID: cid(1, 1), Prefetch: 10}, kept)
	publishOK(t, a, body("before"))
	waitFor(t, "first delivery", func() bool { return kept.count() == 1 })
	consume(t, b, ConsumeSpec{ID: cid(1, 2), Prefetch: 10}, dropped)
	c.mu.Lock()
	c.cut = map[int]bool{1: true}
	c.mu.Unlock()
	for i := range 4 {
		publishOK(t, a, body(fmt.Sprint("gap", i))) // assigned on the log B misses
	}
	// The leader resets one of B's consumers (say, by an older epoch's rule) while B is cut off.
	a.Apply(0, AppendCommand(nil, &Command{Type: CmdCancel, Consumer: cid(1, 2), GiveBack: true}, nowMs()))
	if err := b.Restore(a.Snapshot()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the gap's deliveries handed over", func() bool { return kept.count() == 1+4 })
	waitFor(t, "the dropped consumer told", func() bool { return len(dropped.cancels()) == 1 })
	if got := dropped.cancels(); got[0] != CancelUnavailable {
		t.Fatalf("cancel reason %v", got)
	}
	var bodies []string
	for _, d := range kept.deliveries() {
		bodies = append(bodies, string(d.Msg.Body))
	}
	slices.Sort(bodies)
	if !slices.Equal(bodies, []string{"before", "gap0", "gap1", "gap2", "gap3"}) {
		t.Fatalf("kept consumer got %v", bodies)
	}
}

// The leader answers a consume before the consumer's node has applied it: that node's replica
// must not take the consumer for one the state dropped when it applies an earlier reset of its
// own node (its Rejoin, say), and the consumer gets its messages once the replica caught up.
func TestQuorumConsumeAnsweredBeforeLocalApply(t *testing.T) {
	c := newCluster(t)
	a := c.add(t, OpenConfig{}, false)
	b := c.add(t, OpenConfig{}, false)
	c.setLag(1)
	b.Rejoin() // node 2's reset of its earlier boots, ahead of the consume in the log
	cons := &tconsumer{}
	consume(t, b, ConsumeSpec{ID: cid(1, 1), Prefetch: 10}, cons)
	publishOK(t, a, body("m"))
	c.catchUp(t, 1)
	waitFor(t, "the delivery on node 2", func() bool { return cons.count() == 1 })
	if got := cons.cancels(); len(got) != 0 {
		t.Fatalf("node 2 cancelled its consumer (%v) although the state has it: %s", got, fmtStats(a))
	}
	if st := b.Stats(); st.Consumers != 1 || st.Unacked != 1 {
		t.Fatalf("node 2's replica: %s", fmtStats(b))
	}
	// A consumer really dropped by a reset of node 2's current epoch is told, once applied.
	a.Apply(0, AppendCommand(nil, &Command{Type: CmdNodeReset, Node: 2, Epochs: []uint16{1}}, nowMs()))
	b.Apply(0, AppendCommand(nil, &Command{Type: CmdNodeReset, Node: 2, Epochs: []uint16{1}}, nowMs()))
	waitFor(t, "the dropped consumer told", func() bool { return len(cons.cancels()) == 1 })
	if got := cons.cancels(); got[0] != CancelUnavailable {
		t.Fatalf("cancel reason %v", got)
	}
}

// A consume of this node's current boot that the log applies after the consumer went away here
// (its proposal timed out and was committed later) is detached again by this node: it does not
// stay in the replicated state holding deliveries nobody gets.
func TestQuorumLateConsumeOfAGoneConsumerIsDetached(t *testing.T) {
	c := newCluster(t)
	a := c.add(t, OpenConfig{}, false)
	b := c.add(t, OpenConfig{}, false)
	late := AppendCommand(nil, &Command{Type: CmdConsume, Consumer: cid(1, 9), Credited: true, Credit: 10}, nowMs())
	c.propose(1, late, func(uint64, []byte, error) {})
	waitFor(t, "the late consumer detached on every replica", func() bool {
		return c.count(CmdCancel, func(cmd *Command) bool { return cmd.Consumer == cid(1, 9) }) == 1 &&
			a.Stats().Consumers == 0 && b.Stats().Consumers == 0
	})
}
