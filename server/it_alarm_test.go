package server_test

// Component tests of resource alarms: while a memory or disk alarm is raised,
// connections that publish are blocked (connection.blocked for clients that
// ask for it, nothing more read from them) and consumers keep working; when it
// clears, publishers are unblocked and what they sent goes through.

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// expectBlocking waits for a connection.blocked/unblocked notification.
func expectBlocking(t *testing.T, notes <-chan amqp.Blocking, active bool, reasonHas string) {
	t.Helper()
	select {
	case b, ok := <-notes:
		if !ok {
			t.Fatalf("blocked notifications closed, want Active=%v", active)
		}
		if b.Active != active {
			t.Fatalf("got blocked notification %+v, want Active=%v", b, active)
		}
		if active && !strings.Contains(b.Reason, reasonHas) {
			t.Fatalf("connection.blocked reason %q does not mention %q", b.Reason, reasonHas)
		}
	case <-time.After(waitFor):
		t.Fatalf("no connection.blocked Active=%v within %v", active, waitFor)
	}
}

// testAlarmBlocksPublisher raises an alarm with SetResourceLimits(mem, disk)
// and checks what a publisher and a consumer on two connections see.
func testAlarmBlocksPublisher(t *testing.T, mem, disk int64, reasonHas string) {
	b := newRestartBroker(t)
	pub := mustDial(t, b.url)
	blocked := pub.NotifyBlocked(make(chan amqp.Blocking, 4))
	pch := mustConfirmChannel(t, pub)
	q := uniq(t, "q")
	mustDeclareDurableQueue(t, pch, q, nil)
	publishConfirmed(t, pch, "", q, false, persistentMsg("before-1"))
	publishConfirmed(t, pch, "", q, false, transientMsg("before-2"))
	cons := mustDial(t, b.url)
	cch := mustChannel(t, cons)

	b.srv.SetResourceLimits(mem, disk)
	// Runs before the connections are closed, so a failure cannot leave the
	// publisher's close stuck behind the alarm.
	t.Cleanup(func() {
		if b.srv != nil {
			b.srv.SetResourceLimits(0, 0)
		}
	})

	dc, err := pch.PublishWithDeferredConfirm("", q, false, false, persistentMsg("during"))
	if err != nil {
		t.Fatalf("publish while the alarm is raised: %v", err)
	}
	expectBlocking(t, blocked, true, reasonHas)

	// The consumer's connection still works and receives what was queued before.
	d := mustConsume(t, cch, q, "c", false, nil)
	for _, want := range []string{"before-1", "before-2"} {
		m := recvBody(t, d, want)
		if err := m.Ack(false); err != nil {
			t.Fatalf("ack while the alarm is raised: %v", err)
		}
	}
	noDelivery(t, d, 2*quiet)
	if n, consumers := queueCounts(t, cch, q); n != 0 || consumers != 1 {
		t.Fatalf("while blocked %s has %d messages and %d consumers, want 0 and 1 (the blocked publish not enqueued)", q, n, consumers)
	}
	select {
	case <-dc.Done():
		t.Fatalf("the publish sent while blocked was confirmed before the alarm cleared")
	default:
	}

	b.srv.SetResourceLimits(0, 0)
	expectBlocking(t, blocked, false, "")
	m := recvBody(t, d, "during")
	if err := m.Ack(false); err != nil {
		t.Fatalf("ack: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("confirm of the publish sent while blocked: acked=%v err=%v", ok, err)
	}
	// Publishing goes on normally afterwards, with no further notification.
	publishConfirmed(t, pch, "", q, false, persistentMsg("after"))
	m = recvBody(t, d, "after")
	if err := m.Ack(false); err != nil {
		t.Fatalf("ack: %v", err)
	}
	select {
	case n := <-blocked:
		t.Fatalf("unexpected blocked notification %+v after the alarm cleared", n)
	default:
	}
}

func TestITAlarmMemoryBlocksPublishers(t *testing.T) {
	testAlarmBlocksPublisher(t, 1, 0, "memory")
}

func TestITAlarmDiskBlocksPublishers(t *testing.T) {
	testAlarmBlocksPublisher(t, 0, 1<<62, "disk")
}

// TestITAlarmBlocksClientWithoutCapability: a client that does not advertise
// connection.blocked is still held back, but is never sent
// connection.blocked or connection.unblocked.
func TestITAlarmBlocksClientWithoutCapability(t *testing.T) {
	b := newRestartBroker(t)
	cons := mustDial(t, b.url)
	cch := mustChannel(t, cons)
	q := declareQueue(t, b.url, cch, "q", nil)
	d := mustConsume(t, cch, q, "c", true, nil)

	r := rawDial(t, b.url)
	r.open("guest", "guest") // no client capabilities at all
	b.srv.SetResourceLimits(1, 0)
	t.Cleanup(func() {
		if b.srv != nil {
			b.srv.SetResourceLimits(0, 0)
		}
	})
	r.rawPublish(1, "", q, 1, []byte("raw-during"))
	noDelivery(t, d, 2*quiet)
	b.srv.SetResourceLimits(0, 0)
	recvBody(t, d, "raw-during")
	// The next frame the raw client sees answers its next method: no
	// connection.blocked / unblocked came before it.
	var sel rawBuf
	sel.u8(0)
	r.send(1, 85, 10, &sel)
	r.expect(85, 11)
	r.close()
}

// TestITAlarmRaisedAndClearedTwice: the alarm can be raised again after it
// cleared, and each time the publisher is blocked and then unblocked.
func TestITAlarmRaisedAndClearedTwice(t *testing.T) {
	b := newRestartBroker(t)
	pub := mustDial(t, b.url)
	blocked := pub.NotifyBlocked(make(chan amqp.Blocking, 4))
	pch := mustConfirmChannel(t, pub)
	q := declareQueue(t, b.url, pch, "q", nil)
	cch := mustChannel(t, mustDial(t, b.url))
	d := mustConsume(t, cch, q, "c", true, nil)
	t.Cleanup(func() {
		if b.srv != nil {
			b.srv.SetResourceLimits(0, 0)
		}
	})
	for round, limits := range [][2]int64{{1, 0}, {0, 1 << 62}} {
		b.srv.SetResourceLimits(limits[0], limits[1])
		body := []byte{'r', byte('0' + round)}
		if err := pch.Publish("", q, false, false, amqp.Publishing{Body: body}); err != nil {
			t.Fatalf("publish: %v", err)
		}
		expectBlocking(t, blocked, true, "")
		noDelivery(t, d, quiet)
		b.srv.SetResourceLimits(0, 0)
		expectBlocking(t, blocked, false, "")
		recvBody(t, d, string(body))
	}
}

// TestITAlarmShutdownWhileBlocked: a broker holding a blocked publisher still
// shuts down promptly, closing the publisher's connection with 320, and its
// data directory opens again.
func TestITAlarmShutdownWhileBlocked(t *testing.T) {
	b := newRestartBroker(t)
	pub := mustDial(t, b.url)
	blocked := pub.NotifyBlocked(make(chan amqp.Blocking, 4))
	pch := mustConfirmChannel(t, pub)
	q := uniq(t, "q")
	mustDeclareDurableQueue(t, pch, q, nil)
	publishConfirmed(t, pch, "", q, false, persistentMsg("before"))
	b.srv.SetResourceLimits(0, 1<<62)
	if _, err := pch.PublishWithDeferredConfirm("", q, false, false, persistentMsg("during")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	expectBlocking(t, blocked, true, "disk")

	start := time.Now()
	b.stop()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("shutdown with a blocked publisher took %v", d)
	}
	expectConnClosed(t, pub, amqp.ConnectionForced, "")

	// The next broker starts without the alarm; what was confirmed is there.
	b.start()
	ch := mustChannel(t, mustDial(t, b.url))
	mustGetBody(t, ch, q, true, "before")
}
