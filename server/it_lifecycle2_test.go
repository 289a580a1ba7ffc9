package server_test

// Component tests of the message lifecycle (issue 5), part 2: single active
// consumer, delivery limits, consumer timeouts, and lifecycle state across a
// broker restart. See it_lifecycle_test.go for part 1 and the helpers.

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server"
)

// lcLogs records a broker's log lines (and forwards them to the test log).
type lcLogs struct {
	mu    sync.Mutex
	lines []string
	fwd   *testLogWriter
}

func (l *lcLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.lines = append(l.lines, string(p))
	l.mu.Unlock()
	return l.fwd.Write(p)
}

// matching returns the lines that contain every one of subs.
func (l *lcLogs) matching(subs ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		ok := true
		for _, s := range subs {
			if !strings.Contains(line, s) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// lcStartBroker starts an in-process broker whose configuration mutate may
// change and whose logs are recorded; it is shut down when the test ends.
// Callers must skip first when the suite runs against an external broker.
func lcStartBroker(t *testing.T, mutate func(*server.Config)) (string, *lcLogs) {
	t.Helper()
	lw := &testLogWriter{t: t}
	logs := &lcLogs{fwd: lw}
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := server.New(cfg)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	if err := s.Start(); err != nil {
		t.Fatalf("server.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("server.Shutdown: %v", err)
		}
		lw.stop()
	})
	return "amqp://guest:guest@" + s.Addr().String() + "/", logs
}

// lcDeliveryCount returns the x-delivery-count header (ok=false when absent).
func lcDeliveryCount(t *testing.T, m amqp.Delivery) (int64, bool) {
	t.Helper()
	v, present := m.Headers["x-delivery-count"]
	if !present {
		return 0, false
	}
	n, ok := lcInt(v)
	if !ok {
		t.Fatalf("x-delivery-count = %#v (%T), want an integer", v, v)
	}
	return n, true
}

// lcCheckDeliveryCount checks the x-delivery-count of a delivery (want 0: no header).
func lcCheckDeliveryCount(t *testing.T, m amqp.Delivery, want int64) {
	t.Helper()
	n, ok := lcDeliveryCount(t, m)
	switch {
	case want == 0 && ok:
		t.Errorf("%q: x-delivery-count %d on a first delivery, want no header", m.Body, n)
	case want > 0 && !ok:
		t.Errorf("%q: no x-delivery-count header, want %d", m.Body, want)
	case want > 0 && n != want:
		t.Errorf("%q: x-delivery-count %d, want %d", m.Body, n, want)
	}
}

// lcPublishOne publishes body to queue through the default exchange, confirmed.
func lcPublishOne(t *testing.T, ch *itChan, queue, body string) {
	t.Helper()
	publishConfirmed(t, ch, "", queue, false, amqp.Publishing{Body: []byte(body)})
}

// TestITLifecycleSingleActiveConsumerCancel: only one consumer of a
// single-active-consumer queue gets messages; when it cancels, the next one
// takes over.
func TestITLifecycleSingleActiveConsumerCancel(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "sac", amqp.Table{"x-single-active-consumer": true})
	cha, chb := mustChannel(t, c), mustChannel(t, c)
	da := mustConsume(t, cha, q, "a", true, nil)
	db := mustConsume(t, chb, q, "b", true, nil)
	for i := range 4 {
		lcPublishOne(t, ch, q, fmt.Sprint("m", i))
	}
	for i := range 4 {
		recvBody(t, da, fmt.Sprint("m", i))
	}
	noDelivery(t, db, quiet)
	if err := cha.Cancel("a", false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}
	for i := 4; i < 7; i++ {
		lcPublishOne(t, ch, q, fmt.Sprint("m", i))
	}
	for i := 4; i < 7; i++ {
		recvBody(t, db, fmt.Sprint("m", i))
	}
	if _, consumers := queueCounts(t, ch, q); consumers != 1 {
		t.Errorf("consumer count %d, want 1", consumers)
	}
}

// TestITLifecycleSingleActiveConsumerDisconnect: when the active consumer's
// connection goes away, its unacked message and the following ones go to the
// next consumer.
func TestITLifecycleSingleActiveConsumerDisconnect(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "sac", amqp.Table{"x-single-active-consumer": true})
	ca, cb := mustDial(t, u), mustDial(t, u)
	da := mustConsume(t, mustChannel(t, ca), q, "a", false, nil)
	db := mustConsume(t, mustChannel(t, cb), q, "b", false, nil)
	lcPublishOne(t, ch, q, "m1")
	recvBody(t, da, "m1") // held unacked
	lcPublishOne(t, ch, q, "m2")
	recvBody(t, da, "m2")
	noDelivery(t, db, quiet)
	if err := ca.Close(); err != nil {
		t.Fatalf("close a's connection: %v", err)
	}
	for _, body := range []string{"m1", "m2"} {
		m := recvBody(t, db, body)
		if !m.Redelivered {
			t.Errorf("%s: redelivered=false after its consumer's connection closed", body)
		}
		if err := m.Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	lcPublishOne(t, ch, q, "m3")
	recvBody(t, db, "m3").Ack(false)
}

// TestITLifecycleSingleActiveConsumerPriority: when the active consumer goes,
// the waiting consumer with the highest x-priority takes over, not the oldest.
func TestITLifecycleSingleActiveConsumerPriority(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "sac", amqp.Table{"x-single-active-consumer": true})
	cha := mustChannel(t, c)
	da := mustConsume(t, cha, q, "a", false, nil)
	lcPublishOne(t, ch, q, "m1")
	held := recvBody(t, da, "m1") // keeps a active while the others attach
	db := mustConsume(t, mustChannel(t, c), q, "b", true, amqp.Table{"x-priority": int32(0)})
	dc := mustConsume(t, mustChannel(t, c), q, "c", true, amqp.Table{"x-priority": int32(10)})
	if err := cha.Cancel("a", false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}
	if err := held.Ack(false); err != nil {
		t.Fatalf("ack after cancel: %v", err)
	}
	lcPublishOne(t, ch, q, "m2")
	recvBody(t, dc, "m2")
	noDelivery(t, db, quiet)
}

// TestITLifecycleSingleActiveConsumerPriorityTakeover: a consumer with a
// higher x-priority that attaches takes over once the active one has settled
// its messages (RabbitMQ 4.x quorum-queue rule, which Warren applies to every
// queue); meanwhile the active one gets no new messages.
func TestITLifecycleSingleActiveConsumerPriorityTakeover(t *testing.T) {
	lcWarrenOnly(t, "a RabbitMQ 3.10 classic queue keeps its active consumer until it cancels")
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "sac", amqp.Table{"x-single-active-consumer": true})
	da := mustConsume(t, mustChannel(t, c), q, "a", false, nil)
	lcPublishOne(t, ch, q, "m1")
	held := recvBody(t, da, "m1")
	dh := mustConsume(t, mustChannel(t, c), q, "high", false, amqp.Table{"x-priority": int32(5)})
	lcPublishOne(t, ch, q, "m2")
	noDelivery(t, da, quiet)
	noDelivery(t, dh, quiet)
	if err := held.Ack(false); err != nil {
		t.Fatalf("ack: %v", err)
	}
	recvBody(t, dh, "m2").Ack(false)
	lcPublishOne(t, ch, q, "m3")
	recvBody(t, dh, "m3").Ack(false)
	noDelivery(t, da, quiet)
}

// TestITLifecycleDeliveryLimit: with x-delivery-limit 2 a message is
// delivered three times (x-delivery-count 1 and 2 on the redeliveries), then
// dead-lettered with reason delivery_limit. A Warren extension on classic
// queues.
func TestITLifecycleDeliveryLimit(t *testing.T) {
	lcWarrenOnly(t, "RabbitMQ 3.10 classic queues have no delivery limit")
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	dlq := declareQueue(t, u, ch, "dlq", nil)
	q := declareQueue(t, u, ch, "q", amqp.Table{"x-delivery-limit": int32(2),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	cch := mustChannel(t, c)
	d := mustConsume(t, cch, q, "c", false, nil)
	lcPublishOne(t, ch, q, "poison")
	for i := range 3 {
		m := recvBody(t, d, "poison")
		if m.Redelivered != (i > 0) {
			t.Errorf("delivery %d: redelivered=%v", i+1, m.Redelivered)
		}
		lcCheckDeliveryCount(t, m, int64(i))
		// Alternate the ways of giving a message back: both count.
		var err error
		if i%2 == 0 {
			err = m.Reject(true)
		} else {
			err = m.Nack(false, true)
		}
		if err != nil {
			t.Fatalf("requeue: %v", err)
		}
	}
	m := lcWaitGet(t, ch, dlq, waitFor)
	if string(m.Body) != "poison" {
		t.Fatalf("dead-letter queue delivered %q, want poison", m.Body)
	}
	dd := lcDeaths(t, m)
	if len(dd) != 1 {
		t.Fatalf("x-death has %d entries, want 1: %v", len(dd), dd)
	}
	lcCheckDeath(t, 0, dd[0], lcDeath{queue: q, reason: "delivery_limit", exchange: "", count: 1, keys: []string{q}})
	lcCheckFirstLast(t, m, q, "delivery_limit", "", q, "delivery_limit", "")
	noDelivery(t, d, quiet)
	expectEmpty(t, ch, q)
	if err := cch.Cancel("c", false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}

	// basic.get deliveries count too, and a channel closing with the message unacked is a return.
	lcPublishOne(t, ch, q, "got")
	for i := range 3 {
		gch := mustChannel(t, c)
		m := mustGetBody(t, gch, q, false, "got")
		lcCheckDeliveryCount(t, m, int64(i))
		if err := gch.Close(); err != nil {
			t.Fatalf("close channel: %v", err)
		}
	}
	m = lcWaitGet(t, ch, dlq, waitFor)
	if string(m.Body) != "got" {
		t.Fatalf("dead-letter queue delivered %q, want got", m.Body)
	}
	lcCheckDeath(t, 0, lcDeaths(t, m)[0], lcDeath{queue: q, reason: "delivery_limit", exchange: "", count: 1, keys: []string{q}})
	expectEmpty(t, ch, q)
}

// TestITLifecycleDeliveryLimitNoDLXCounted: over the delivery limit with no
// dead-letter exchange, the message is dropped, but never silently: each drop
// is logged with the queue's running count.
func TestITLifecycleDeliveryLimitNoDLXCounted(t *testing.T) {
	lcWarrenOnly(t, "RabbitMQ 3.10 classic queues have no delivery limit")
	u, logs := lcStartBroker(t, nil)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "q", amqp.Table{"x-delivery-limit": int32(0)})
	counter := regexp.MustCompile(`dropped\w*=(\d+)`)
	for i := 1; i <= 2; i++ {
		lcPublishOne(t, ch, q, fmt.Sprint("p", i))
		mustGetBody(t, ch, q, false, fmt.Sprint("p", i)).Reject(true)
		expectEmpty(t, ch, q)
		var lines []string
		eventually(t, "a log line for the dropped message", func() bool {
			lines = logs.matching(q, "delivery limit")
			return len(lines) >= i
		})
		if len(lines) != i {
			t.Fatalf("%d log lines about drops after %d drops: %q", len(lines), i, lines)
		}
		line := lines[i-1]
		if !strings.Contains(line, "level=WARN") && !strings.Contains(line, "level=ERROR") {
			t.Errorf("drop logged below warning level: %s", line)
		}
		if mm := counter.FindStringSubmatch(line); mm == nil || mm[1] != fmt.Sprint(i) {
			t.Errorf("drop %d: log line does not carry the queue's drop count %d: %s", i, i, line)
		}
	}
	expectOpen(t, ch)
}

// TestITLifecycleConsumerTimeout: a consumer holding a delivery longer than
// x-consumer-timeout is cancelled (basic.cancel) and its message requeued; the
// channel stays open, its other consumer keeps working, and acking the old
// delivery tag is harmless (RabbitMQ closes the whole channel instead).
func TestITLifecycleConsumerTimeout(t *testing.T) {
	lcWarrenOnly(t, "RabbitMQ closes the channel with 406 when a delivery is not acked in time")
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "q", amqp.Table{"x-consumer-timeout": int32(500)})
	other := declareQueue(t, u, ch, "other", nil)
	cch := mustChannel(t, c)
	cancels := cch.NotifyCancel(make(chan string, 4))
	dOther := mustConsume(t, cch, other, "other", false, nil)
	da := mustConsume(t, cch, q, "a", false, nil)
	lcPublishOne(t, ch, q, "m1")
	start := time.Now()
	held := recvBody(t, da, "m1")
	select {
	case tag := <-cancels:
		if tag != "a" {
			t.Fatalf("basic.cancel for %q, want a", tag)
		}
	case <-time.After(waitFor):
		t.Fatalf("no basic.cancel within %v of a 500 ms consumer timeout", waitFor)
	}
	if el := time.Since(start); el < 400*time.Millisecond {
		t.Errorf("consumer cancelled after %v, before its 500 ms timeout", el)
	}
	// The client closes a cancelled consumer's delivery channel.
	select {
	case m, ok := <-da:
		if ok {
			t.Fatalf("cancelled consumer received %q", m.Body)
		}
	case <-time.After(waitFor):
		t.Fatalf("the cancelled consumer's delivery channel stayed open")
	}
	db := mustConsume(t, cch, q, "b", false, nil)
	m := recvBody(t, db, "m1")
	if !m.Redelivered {
		t.Errorf("m1 redelivered=false after its consumer timed out")
	}
	if err := m.Ack(false); err != nil {
		t.Fatalf("ack: %v", err)
	}
	// The stale tag of a's delivery does not fail the channel.
	if err := held.Ack(false); err != nil {
		t.Fatalf("ack of the timed-out delivery: %v", err)
	}
	expectOpen(t, cch)
	lcPublishOne(t, ch, q, "m2")
	recvBody(t, db, "m2").Ack(false)
	lcPublishOne(t, ch, other, "o1")
	recvBody(t, dOther, "o1").Ack(false)
	expectOpen(t, cch)
	select {
	case tag := <-cancels:
		t.Fatalf("unexpected basic.cancel for %q", tag)
	default:
	}
	if cch.IsClosed() || c.IsClosed() {
		t.Fatalf("channel or connection closed")
	}
	if n, consumers := queueCounts(t, ch, q); n != 0 || consumers != 1 {
		t.Errorf("%s: %d messages, %d consumers; want 0 and 1", q, n, consumers)
	}
}

// TestITLifecycleConsumerTimeoutDefault: the broker's --consumer-timeout
// applies to queues without x-consumer-timeout; x-consumer-timeout 0 turns it
// off for a queue.
func TestITLifecycleConsumerTimeoutDefault(t *testing.T) {
	lcWarrenOnly(t, "reconfigures the in-process broker")
	u, _ := lcStartBroker(t, func(cfg *server.Config) { cfg.ConsumerTimeout = 400 * time.Millisecond })
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "default", nil)
	off := declareQueue(t, u, ch, "off", amqp.Table{"x-consumer-timeout": int32(0)})
	cch := mustChannel(t, c)
	cancels := cch.NotifyCancel(make(chan string, 4))
	dq := mustConsume(t, cch, q, "timed", false, nil)
	doff := mustConsume(t, cch, off, "untimed", false, nil)
	lcPublishOne(t, ch, q, "m")
	lcPublishOne(t, ch, off, "n")
	recvBody(t, dq, "m")
	held := recvBody(t, doff, "n")
	select {
	case tag := <-cancels:
		if tag != "timed" {
			t.Fatalf("basic.cancel for %q, want timed", tag)
		}
	case <-time.After(waitFor):
		t.Fatalf("no basic.cancel within %v of the broker's 400 ms consumer timeout", waitFor)
	}
	select {
	case tag := <-cancels:
		t.Fatalf("basic.cancel for %q, whose queue has x-consumer-timeout 0", tag)
	case <-time.After(time.Second):
	}
	if err := held.Ack(false); err != nil {
		t.Fatalf("ack: %v", err)
	}
	expectOpen(t, cch)
	if n, _ := queueCounts(t, ch, q); n != 1 {
		t.Errorf("%s holds %d ready messages, want 1 (requeued)", q, n)
	}
}

// TestITLifecycleRestartKeepsTTLDeadline: a durable queue's message TTL runs
// from the publish, not from the restart.
func TestITLifecycleRestartKeepsTTLDeadline(t *testing.T) {
	b := newRestartBroker(t)
	c := mustDial(t, b.url)
	ch := mustConfirmChannel(t, c)
	q, dlq := uniq(t, "q"), uniq(t, "dlq")
	mustDeclareDurableQueue(t, ch, dlq, nil)
	mustDeclareDurableQueue(t, ch, q, amqp.Table{"x-message-ttl": int32(2000),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	start := time.Now()
	publishConfirmed(t, ch, "", q, false, persistentMsg("ttl"))
	time.Sleep(500*time.Millisecond - time.Since(start)) // the scenario: restart 0.5 s after the publish

	b.restart()

	// Nothing may touch q now (a passive declare or a consumer would wake the queue): the
	// recovered deadline alone must expire the message.
	c2 := mustDial(t, b.url)
	ch2 := mustChannel(t, c2)
	m := lcWaitGet(t, ch2, dlq, 5*time.Second)
	el := time.Since(start)
	if el < 1900*time.Millisecond || el > 3*time.Second {
		t.Errorf("dead-lettered %v after the publish, want 2 s (TTL 2 s counted from the publish, not the restart)", el)
	}
	if string(m.Body) != "ttl" {
		t.Fatalf("dead-letter queue delivered %q, want ttl", m.Body)
	}
	lcCheckDeath(t, 0, lcDeaths(t, m)[0], lcDeath{queue: q, reason: "expired", exchange: "", count: 1, keys: []string{q}})
	expectEmpty(t, ch2, q)
}

// TestITLifecycleRestartKeepsDeliveryCount: a durable queue's delivery counts
// survive a restart and the limit applies at the same count.
func TestITLifecycleRestartKeepsDeliveryCount(t *testing.T) {
	b := newRestartBroker(t)
	c := mustDial(t, b.url)
	ch := mustConfirmChannel(t, c)
	q, dlq := uniq(t, "q"), uniq(t, "dlq")
	mustDeclareDurableQueue(t, ch, dlq, nil)
	mustDeclareDurableQueue(t, ch, q, amqp.Table{"x-delivery-limit": int32(3),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	publishConfirmed(t, ch, "", q, false, persistentMsg("poison"))
	for i := range 3 {
		m := mustGetBody(t, ch, q, false, "poison")
		lcCheckDeliveryCount(t, m, int64(i))
		if err := m.Reject(true); err != nil {
			t.Fatalf("reject: %v", err)
		}
	}
	if n, _ := queueCounts(t, ch, q); n != 1 {
		t.Fatalf("%s holds %d messages before the restart, want 1", q, n)
	}

	b.restart()

	c2 := mustDial(t, b.url)
	ch2 := mustChannel(t, c2)
	m := mustGetBody(t, ch2, q, false, "poison")
	if !m.Redelivered {
		t.Errorf("redelivered=false after the restart")
	}
	lcCheckDeliveryCount(t, m, 3)
	if err := m.Reject(true); err != nil {
		t.Fatalf("reject: %v", err)
	}
	dm := lcWaitGet(t, ch2, dlq, waitFor)
	if string(dm.Body) != "poison" {
		t.Fatalf("dead-letter queue delivered %q, want poison", dm.Body)
	}
	lcCheckDeath(t, 0, lcDeaths(t, dm)[0], lcDeath{queue: q, reason: "delivery_limit", exchange: "", count: 1, keys: []string{q}})
	expectEmpty(t, ch2, q)
}
