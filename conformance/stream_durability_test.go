package conformance

// Stream durability (issue 6 point 7): kill -9 loses no confirmed stream message, and a restart
// keeps every offset and every stored (named) consumer offset.

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// alternatingMode makes even sequence numbers persistent and odd ones transient: the stream
// kill test's publishers (ids s<p>-<seq>) send both.
func alternatingMode(seq int) uint8 {
	if seq%2 == 1 {
		return amqp.Transient
	}
	return amqp.Persistent
}

// streamOffsetOf returns the x-stream-offset header of a stream delivery.
func streamOffsetOf(t testing.TB, d amqp.Delivery) int64 {
	t.Helper()
	switch v := d.Headers["x-stream-offset"].(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	case int:
		return int64(v)
	default:
		t.Fatalf("delivery %q has x-stream-offset %#v (%T); want an integer", d.MessageId, d.Headers["x-stream-offset"], v)
		return 0
	}
}

// streamReadUntil consumes stream queue on a new channel of conn (qos 500, manual ack) with args
// and calls fn for every delivery until fn returns false. It fails the test when no delivery
// arrives for 10 s. Deliveries are acked (multiple) every 100 and at the end.
func streamReadUntil(t testing.TB, conn *amqp.Connection, queue string, args amqp.Table, fn func(amqp.Delivery) bool) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	defer ch.Close()
	if err := ch.Qos(500, 0, false); err != nil {
		t.Fatalf("basic.qos: %v", err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, args)
	if err != nil {
		t.Fatalf("consume %s with %v: %v", queue, args, err)
	}
	idle := time.NewTimer(10 * time.Second)
	defer idle.Stop()
	for n := 1; ; n++ {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatalf("consumer on %s (%v) closed after %d deliveries", queue, args, n-1)
			}
			more := fn(d)
			if !more || n%100 == 0 {
				if err := d.Ack(true); err != nil {
					t.Fatalf("ack: %v", err)
				}
			}
			if !more {
				return
			}
			idle.Reset(10 * time.Second)
		case <-idle.C:
			t.Fatalf("consumer on %s (%v): no delivery for 10s after %d deliveries", queue, args, n-1)
		}
	}
}

// TestStreamKill9: two publishers publish persistent and transient messages with unique ids in
// confirm mode to a durable stream while the broker is killed with SIGKILL 100-700 ms after each
// start and restarted on the same data directory, WARREN_STREAM_KILLS times (default 5). Reading
// the stream from "first" afterwards must find every confirmed id (duplicates are counted) at
// dense, increasing offsets from 0. Then a named consumer (x-stream-consumer-name "c1") acks
// offsets 0-99, the broker is killed again, and c1 attached without x-stream-offset resumes
// after its stored offset: somewhere in 1..100 (the store is asynchronous), never below it, and
// the stream still ends with the last message confirmed before the kill.
func TestStreamKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("kills the broker several times; skipped with -short")
	}
	kills := envInt(t, "WARREN_STREAM_KILLS", 5)
	const (
		queue      = "kill9.stream"
		publishers = 2
	)
	n := newNode(t)
	{
		conn := dial(t, n.b.URL)
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
			t.Fatalf("declare stream %s: %v", queue, err)
		}
		_ = conn.Close()
	}

	h := &killHarness{
		queue: queue, size: 300, window: 64,
		stop: make(chan struct{}), confirmed: make(map[string]bool), acked: make(map[string]int),
	}
	url := n.b.URL
	h.url.Store(&url)
	for p := range publishers {
		h.wg.Add(1)
		go h.publisher(p, "s", alternatingMode)
	}
	var stopOnce sync.Once
	signalStop := func() { stopOnce.Do(func() { close(h.stop) }) }
	stopClients := func() {
		signalStop()
		done := make(chan struct{})
		go func() { h.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatalf("the test's publishers did not stop within 60s")
		}
	}
	defer stopClients()

	start := time.Now()
	livesWithConfirms := 0
	var startTimes []time.Duration
	for i := 1; i <= kills; i++ {
		before := h.confirmedCount()
		time.Sleep(100*time.Millisecond + rand.N(600*time.Millisecond))
		if i == kills {
			signalStop() // the publishers stop when the broker dies: the read below sees only what was recovered
		}
		if h.confirmedCount() > before {
			livesWithConfirms++
		}
		n.kill9()
		if i == kills {
			stopClients()
		}
		t0 := time.Now()
		n.start()
		startTimes = append(startTimes, time.Since(t0))
		url := n.b.URL
		h.url.Store(&url)
	}
	loopTime := time.Since(start)

	h.mu.Lock()
	for _, e := range h.errs {
		t.Error(e)
	}
	confirmed := h.confirmed
	published := h.published.Load()
	h.mu.Unlock()
	if len(confirmed) == 0 {
		t.Fatalf("no publish was ever confirmed: the test exercised nothing")
	}

	// A sentinel published after the last restart marks the end of the stream.
	conn := dial(t, n.b.URL)
	pch := confirmChannel(t, conn)
	publishConfirmed(t, pch, "", queue, amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: "end-1", Body: []byte("end-1")})

	counts := make(map[string]int)
	var offsets []int64
	damaged, unknown := 0, 0
	var sentinelOff int64 = -1
	readStart := time.Now()
	streamReadUntil(t, conn, queue, amqp.Table{"x-stream-offset": "first"}, func(d amqp.Delivery) bool {
		off := streamOffsetOf(t, d)
		offsets = append(offsets, off)
		if d.MessageId == "end-1" {
			sentinelOff = off
			return false
		}
		counts[d.MessageId]++
		switch {
		case !strings.HasPrefix(d.MessageId, "s"):
			unknown++
			if unknown <= 5 {
				t.Errorf("read a message with unknown id %q at offset %d", d.MessageId, off)
			}
		case string(d.Body) != string(killBody(d.MessageId, h.size)):
			damaged++
			if damaged <= 5 {
				t.Errorf("message %q at offset %d: body %q is not the published one", d.MessageId, off, abbrev(d.Body))
			}
		}
		return true
	})
	readTime := time.Since(readStart)

	// Offsets: dense and increasing from 0.
	gaps := 0
	for i, off := range offsets {
		if off != int64(i) {
			gaps++
			if gaps <= 5 {
				t.Errorf("delivery #%d from \"first\" has offset %d; want %d (offsets must be dense and increasing from 0)", i, off, i)
			}
		}
	}
	lost, dups, unconfirmedPresent := 0, 0, 0
	var lostIDs []string
	for id := range confirmed {
		if counts[id] == 0 {
			lost++
			lostIDs = append(lostIDs, id)
		}
	}
	slices.Sort(lostIDs)
	for id, c := range counts {
		if c > 1 {
			dups += c - 1
		}
		if !confirmed[id] {
			unconfirmedPresent++
		}
	}
	t.Logf("kills %d in %v (%d of the broker lives between kills confirmed something; restart took %v median, %v max)",
		kills, loopTime.Round(time.Millisecond), livesWithConfirms, median(startTimes), slices.Max(startTimes))
	t.Logf("published %d, confirmed %d (persistent and transient alternating); read %d entries from \"first\" in %v (sentinel at offset %d): lost %d, duplicates %d, unconfirmed ids present %d, offset errors %d",
		published, len(confirmed), len(offsets), readTime.Round(time.Millisecond), sentinelOff, lost, dups, unconfirmedPresent, gaps)
	if lost > 0 {
		t.Errorf("%d confirmed messages are missing from the stream after %d kills, e.g. %v", lost, kills, lostIDs[:min(20, len(lostIDs))])
	}
	if livesWithConfirms < kills/2 {
		t.Errorf("only %d of %d broker lives confirmed anything before being killed: the kills did not hit confirm-mode publishing", livesWithConfirms, kills)
	}
	if sentinelOff < 100 {
		t.Fatalf("the stream holds only %d entries; the named-consumer check needs more than 100", sentinelOff)
	}

	// A named consumer acks offsets 0..99; its stored offset survives a kill -9.
	named := amqp.Table{"x-stream-offset": "first", "x-stream-consumer-name": "c1"}
	{
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Qos(500, 0, false); err != nil {
			t.Fatal(err)
		}
		deliveries, err := ch.Consume(queue, "c1-first", false, false, false, false, named)
		if err != nil {
			t.Fatalf("consume as c1 from first: %v", err)
		}
		timeout := time.After(10 * time.Second)
		for i := int64(0); i < 100; i++ {
			select {
			case d, ok := <-deliveries:
				if !ok {
					t.Fatalf("consumer c1 closed after %d deliveries", i)
				}
				if off := streamOffsetOf(t, d); off != i {
					t.Fatalf("consumer c1 from first: delivery #%d has offset %d; want %d", i, off, i)
				}
				if i == 99 {
					if err := d.Ack(true); err != nil {
						t.Fatalf("ack offsets 0..99: %v", err)
					}
				}
			case <-timeout:
				t.Fatalf("consumer c1 got only %d of 100 deliveries within 10s", i)
			}
		}
		// A confirmed publish on the same connection after the ack: the ack has been processed
		// and the offset store handed to the committer before this commit.
		publishConfirmed(t, pch, "", queue, amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: "end-2", Body: []byte("end-2")})
	}
	n.restartKill()

	conn = dial(t, n.b.URL)
	resume, prev := int64(-1), int64(-1)
	resumed, disorder := 0, 0
	var end2Off int64 = -1
	streamReadUntil(t, conn, queue, amqp.Table{"x-stream-consumer-name": "c1"}, func(d amqp.Delivery) bool {
		off := streamOffsetOf(t, d)
		if resume < 0 {
			resume = off
		} else if off != prev+1 {
			disorder++
			if disorder <= 5 {
				t.Errorf("resumed consumer c1: offset %d after %d; want dense, increasing offsets", off, prev)
			}
		}
		prev = off
		resumed++
		if d.MessageId == "end-2" {
			end2Off = off
			return false
		}
		return true
	})
	t.Logf("named consumer c1 acked offsets 0..99, kill -9: resumed at offset %d (want 100; 1..100 allowed), read %d entries up to end-2 at offset %d",
		resume, resumed, end2Off)
	if resume < 1 || resume > 100 {
		t.Errorf("named consumer c1 resumed at offset %d after kill -9; want 1..100 (it acked offsets 0..99)", resume)
	}
	if end2Off != sentinelOff+1 {
		t.Errorf("end-2, confirmed before the kill right after end-1 at offset %d, is at offset %d after the restart; want %d",
			sentinelOff, end2Off, sentinelOff+1)
	}
}
