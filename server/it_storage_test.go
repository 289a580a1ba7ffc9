package server_test

// Component tests of durable storage: what a client sees across a broker
// restart (durable topology, persistent messages, unacked messages coming back
// redelivered), long queues whose tail is paged to disk, publisher confirms of
// persistent messages, and a data directory held by another broker.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server"
	"warren/storage"
)

// bulkWait bounds waits for bulk work (thousands of confirms) under -race.
const bulkWait = 60 * time.Second

// restartBroker is an in-process broker on 127.0.0.1:0 that a test can shut
// down and start again on the same data directory.
type restartBroker struct {
	t   *testing.T
	dir string
	srv *server.Server
	lw  *testLogWriter
	url string
	gen int // how many times the broker was started
}

// newRestartBroker starts a broker on a fresh data directory; it is shut down
// when the test ends. Tests using it cannot run against WARREN_TEST_URL.
func newRestartBroker(t *testing.T) *restartBroker {
	t.Helper()
	if againstRabbitMQ() {
		t.Skip("restarts or reconfigures the in-process broker; not possible with WARREN_TEST_URL")
	}
	b := &restartBroker{t: t, dir: t.TempDir()}
	// Registered before any client connection, so it runs after their cleanups.
	t.Cleanup(b.stop)
	b.start()
	return b
}

// config is the broker configuration for b's data directory; its logs go to
// the test log through lw.
func (b *restartBroker) config(lw *testLogWriter) server.Config {
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.DataDir = b.dir
	cfg.Logger = slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: slog.LevelDebug})).
		With("broker", b.gen)
	return cfg
}

// start starts a new broker on b's data directory.
func (b *restartBroker) start() {
	b.t.Helper()
	if b.srv != nil {
		b.t.Fatalf("restartBroker.start: broker already running")
	}
	b.gen++
	lw := &testLogWriter{t: b.t}
	s, err := server.New(b.config(lw))
	if err != nil {
		lw.stop()
		b.t.Fatalf("server.New (start %d): %v", b.gen, err)
	}
	if err := s.Start(); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		lw.stop()
		b.t.Fatalf("server.Start (start %d): %v", b.gen, err)
	}
	b.srv, b.lw = s, lw
	b.url = "amqp://guest:guest@" + s.Addr().String() + "/"
}

// stop shuts the broker down (no-op when it is not running).
func (b *restartBroker) stop() {
	b.t.Helper()
	if b.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := b.srv.Shutdown(ctx)
	b.lw.stop()
	b.srv, b.lw = nil, nil
	if err != nil {
		b.t.Errorf("server.Shutdown (start %d): %v", b.gen, err)
	}
}

// restart shuts the broker down and starts a new one on the same data
// directory; b.url changes.
func (b *restartBroker) restart() {
	b.t.Helper()
	b.stop()
	b.start()
}

// persistentMsg returns a delivery-mode 2 message.
func persistentMsg(body string) amqp.Publishing {
	return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)}
}

// transientMsg returns a delivery-mode 1 message.
func transientMsg(body string) amqp.Publishing {
	return amqp.Publishing{DeliveryMode: amqp.Transient, Body: []byte(body)}
}

// mustDeclareDurableQueue declares a durable, non-exclusive queue.
func mustDeclareDurableQueue(t *testing.T, ch *itChan, name string, args amqp.Table) {
	t.Helper()
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("queue.declare durable %s: %v", name, err)
	}
}

// publishAllConfirmed publishes msg(0..n-1) on a confirm-mode channel and
// waits until every one is acked.
func publishAllConfirmed(t *testing.T, ch *itChan, exchange, key string, n int, msg func(i int) amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bulkWait)
	defer cancel()
	dcs := make([]*amqp.DeferredConfirmation, n)
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, msg(i))
		if err != nil {
			t.Fatalf("publish %d of %d to %q/%q: %v", i, n, exchange, key, err)
		}
		if dc == nil {
			t.Fatalf("publishAllConfirmed needs a channel in confirm mode")
		}
		dcs[i] = dc
	}
	for i, dc := range dcs {
		acked, err := dc.WaitContext(ctx)
		if err != nil {
			t.Fatalf("confirm of publish %d of %d (tag %d): %v", i, n, dc.DeliveryTag, err)
		}
		if !acked {
			t.Fatalf("publish %d of %d (tag %d) was nacked", i, n, dc.DeliveryTag)
		}
	}
}

// indexedBody is message i of a bulk test: an 8-digit index then a filler
// that depends on i, size bytes in all (at least 9).
func indexedBody(i, size int) []byte {
	b := make([]byte, size)
	copy(b, fmt.Sprintf("%08d|", i))
	for j := 9; j < size; j++ {
		b[j] = byte('a' + (i+j)%26)
	}
	return b
}

// bodyIndex reads the index of an indexedBody.
func bodyIndex(b []byte) (int, bool) {
	if len(b) < 9 || b[8] != '|' {
		return 0, false
	}
	n, err := strconv.Atoi(string(b[:8]))
	return n, err == nil
}

// drainSpec describes what drainInOrder expects from a queue.
type drainSpec struct {
	want     []int              // message indexes in the order of their first delivery
	body     func(i int) []byte // the body of message i
	requeue  func(i int) bool   // nack message i with requeue=true on its first delivery
	prefetch int                // consumer prefetch (default 100)
	// firstRedelivered, when not nil, is the redelivered flag every first delivery must carry.
	firstRedelivered *bool
}

// drainInOrder consumes a queue with manual acks until every message of
// spec.want has been acked. First deliveries must come in spec.want's order
// with intact bodies; a message nacked with requeue must come back with
// redelivered=true. Warren puts it back at its position, so it must come back
// ahead of the backlog, within two prefetch windows of other first deliveries
// (Warren: under one window). RabbitMQ 3.10 only roughly does so for a long
// queue (seen: 150 to over 400 with a prefetch of 100), so that bound is not
// checked against it. Finally nothing more may arrive and the queue must be
// empty.
func drainInOrder(t *testing.T, ch *itChan, queue string, spec drainSpec) {
	t.Helper()
	if spec.prefetch == 0 {
		spec.prefetch = 100
	}
	if spec.requeue == nil {
		spec.requeue = func(int) bool { return false }
	}
	if err := ch.Qos(spec.prefetch, 0, false); err != nil {
		t.Fatalf("basic.qos: %v", err)
	}
	tag := "drain." + strconv.FormatInt(time.Now().UnixNano(), 36)
	d := mustConsume(t, ch, queue, tag, false, nil)
	next := 0                // position in spec.want of the next first delivery
	pending := map[int]int{} // requeued message -> deliveries seen since its nack
	acked, requeued, maxLag := 0, 0, 0
	for acked < len(spec.want) {
		var m amqp.Delivery
		select {
		case dm, ok := <-d:
			if !ok {
				t.Fatalf("delivery channel closed after %d of %d messages", acked, len(spec.want))
			}
			m = dm
		case <-time.After(waitFor):
			t.Fatalf("queue %s: no delivery within %v after %d of %d messages acked (%d first deliveries, %d requeued not back)",
				queue, waitFor, acked, len(spec.want), next, len(pending))
		}
		i, ok := bodyIndex(m.Body)
		if !ok {
			t.Fatalf("delivery %d: unexpected body %.40q", acked, m.Body)
		}
		if want := spec.body(i); !bytes.Equal(m.Body, want) {
			t.Fatalf("message %d: body damaged (%d bytes, want %d bytes)", i, len(m.Body), len(want))
		}
		if lag, back := pending[i]; back {
			if !m.Redelivered {
				t.Fatalf("requeued message %d came back with redelivered=false", i)
			}
			maxLag = max(maxLag, lag)
			delete(pending, i)
			if err := m.Ack(false); err != nil {
				t.Fatalf("ack: %v", err)
			}
			acked++
			continue
		}
		if next >= len(spec.want) {
			t.Fatalf("unexpected extra message %d (redelivered=%v) after all %d first deliveries", i, m.Redelivered, len(spec.want))
		}
		if i != spec.want[next] {
			t.Fatalf("first delivery #%d is message %d, want message %d (order broken or message lost)", next, i, spec.want[next])
		}
		if spec.firstRedelivered != nil && m.Redelivered != *spec.firstRedelivered {
			t.Fatalf("message %d: redelivered=%v on its first delivery here, want %v", i, m.Redelivered, *spec.firstRedelivered)
		}
		next++
		for k, n := range pending {
			if n+1 > 2*spec.prefetch && !againstRabbitMQ() {
				t.Fatalf("requeued message %d not redelivered within %d deliveries (went to the tail?)", k, 2*spec.prefetch)
			}
			pending[k] = n + 1
		}
		if spec.requeue(i) {
			if err := m.Nack(false, true); err != nil {
				t.Fatalf("nack: %v", err)
			}
			pending[i] = 0
			requeued++
			continue
		}
		if err := m.Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
		acked++
	}
	noDelivery(t, d, quiet)
	if err := ch.Cancel(tag, false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}
	if n, _ := queueCounts(t, ch, queue); n != 0 {
		t.Fatalf("queue %s holds %d messages after draining, want 0", queue, n)
	}
	t.Logf("drained %d messages from %s (%d requeued once, back after at most %d other first deliveries)",
		acked, queue, requeued, maxLag)
}

// indexRange returns the indexes from..to-1 that keep(i) accepts.
func indexRange(from, to int, keep func(i int) bool) []int {
	var s []int
	for i := from; i < to; i++ {
		if keep == nil || keep(i) {
			s = append(s, i)
		}
	}
	return s
}

func TestITRestartDurableTopology(t *testing.T) {
	b := newRestartBroker(t)
	c := mustDial(t, b.url)
	ch := mustConfirmChannel(t, c)

	dx := uniq(t, "dx")     // durable direct exchange
	dsrc := uniq(t, "dsrc") // durable topic exchange bound to dx (exchange-to-exchange)
	tx := uniq(t, "tx")     // transient fanout exchange
	dq := uniq(t, "dq")     // durable queue
	tq := uniq(t, "tq")     // transient queue
	eq := uniq(t, "eq")     // exclusive queue, declared durable
	for _, x := range []struct {
		name, kind string
		durable    bool
	}{{dx, "direct", true}, {dsrc, "topic", true}, {tx, "fanout", false}} {
		if err := ch.ExchangeDeclare(x.name, x.kind, x.durable, false, false, false, nil); err != nil {
			t.Fatalf("exchange.declare %s: %v", x.name, err)
		}
	}
	dqArgs := amqp.Table{"x-dead-letter-exchange": "dlx"}
	mustDeclareDurableQueue(t, ch, dq, dqArgs)
	if _, err := ch.QueueDeclare(tq, false, false, false, false, nil); err != nil {
		t.Fatalf("queue.declare %s: %v", tq, err)
	}
	if _, err := ch.QueueDeclare(eq, true, false, true, false, nil); err != nil {
		t.Fatalf("queue.declare exclusive %s: %v", eq, err)
	}
	mustBind(t, ch, dq, "k", dx, nil)
	mustBind(t, ch, tq, "k", dx, nil) // durable exchange -> transient queue
	mustBind(t, ch, eq, "k", dx, nil) // durable exchange -> exclusive queue
	mustBind(t, ch, dq, "", tx, nil)  // transient exchange -> durable queue
	if err := ch.ExchangeBind(dx, "#", dsrc, false, nil); err != nil {
		t.Fatalf("exchange.bind %s -> %s: %v", dsrc, dx, err)
	}

	// Persistent and transient messages through the durable exchange, interleaved.
	sent := []amqp.Publishing{
		{DeliveryMode: amqp.Persistent, ContentType: "text/plain", MessageId: "p1", Headers: amqp.Table{"h": "v1"}, Body: []byte("p1")},
		transientMsg("t1"),
		{DeliveryMode: amqp.Persistent, ContentType: "application/json", MessageId: "p2", Priority: 3, Body: []byte(`{"p":2}`)},
		transientMsg("t2"),
		{DeliveryMode: amqp.Persistent, CorrelationId: "c3", ReplyTo: "r3", Timestamp: time.Unix(1700000000, 0), Body: []byte("p3")},
	}
	for _, m := range sent {
		publishConfirmed(t, ch, dx, "k", false, m)
	}
	if n, _ := queueCounts(t, ch, dq); n != len(sent) {
		t.Fatalf("before restart %s holds %d messages, want %d", dq, n, len(sent))
	}

	b.restart()

	c2 := mustDial(t, b.url)
	ch2 := mustConfirmChannel(t, c2)
	for _, x := range []struct {
		name string
		want bool
	}{{dx, true}, {dsrc, true}, {tx, false}} {
		if got := exchangeExists(t, c2, x.name); got != x.want {
			t.Errorf("after restart exchange %s exists=%v, want %v", x.name, got, x.want)
		}
	}
	for _, x := range []struct {
		name string
		want bool
	}{{dq, true}, {tq, false}, {eq, false}} {
		if got := queueExists(t, c2, x.name); got != x.want {
			t.Errorf("after restart queue %s exists=%v, want %v", x.name, got, x.want)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// Only the persistent messages came back, in order and with their properties.
	if n, _ := queueCounts(t, ch2, dq); n != 3 {
		t.Fatalf("after restart %s holds %d messages, want the 3 persistent ones", dq, n)
	}
	for _, want := range []amqp.Publishing{sent[0], sent[2], sent[4]} {
		m := mustGetBody(t, ch2, dq, true, string(want.Body))
		if m.Exchange != dx || m.RoutingKey != "k" {
			t.Errorf("message %s: exchange/key %q/%q, want %q/%q", want.Body, m.Exchange, m.RoutingKey, dx, "k")
		}
		if m.DeliveryMode != amqp.Persistent || m.ContentType != want.ContentType || m.MessageId != want.MessageId ||
			m.Priority != want.Priority || m.CorrelationId != want.CorrelationId || m.ReplyTo != want.ReplyTo ||
			!m.Timestamp.Equal(want.Timestamp) || fmt.Sprint(m.Headers) != fmt.Sprint(want.Headers) {
			t.Errorf("message %s: properties changed across restart:\n got  mode=%d ct=%q id=%q prio=%d corr=%q reply=%q ts=%v headers=%v\n want mode=2 ct=%q id=%q prio=%d corr=%q reply=%q ts=%v headers=%v",
				want.Body, m.DeliveryMode, m.ContentType, m.MessageId, m.Priority, m.CorrelationId, m.ReplyTo, m.Timestamp, m.Headers,
				want.ContentType, want.MessageId, want.Priority, want.CorrelationId, want.ReplyTo, want.Timestamp, want.Headers)
		}
	}
	expectEmpty(t, ch2, dq)

	// The transient queue comes back empty and unbound when redeclared.
	if q, err := ch2.QueueDeclare(tq, false, false, false, false, nil); err != nil || q.Messages != 0 {
		t.Fatalf("redeclare %s after restart: %+v, %v; want empty", tq, q, err)
	}
	// Bindings survived: dx routes to dq (not to the redeclared tq), and so does dsrc through dx.
	if got := routedTo(t, ch2, dx, "k", nil, []string{dq, tq}); !sameStrings(got, []string{dq}) {
		t.Errorf("after restart %s/k routed to %v, want [%s]", dx, got, dq)
	}
	if got := routedTo(t, ch2, dsrc, "k", nil, []string{dq, tq}); !sameStrings(got, []string{dq}) {
		t.Errorf("after restart %s/k (exchange-to-exchange) routed to %v, want [%s]", dsrc, got, dq)
	}
	if got := routedTo(t, ch2, dx, "other", nil, []string{dq, tq}); len(got) != 0 {
		t.Errorf("after restart %s/other routed to %v, want nowhere", dx, got)
	}

	// The declarations' properties survived: same ones are accepted, different ones refused.
	if _, err := ch2.QueueDeclare(dq, true, false, false, false, dqArgs); err != nil {
		t.Fatalf("redeclare %s with its arguments after restart: %v", dq, err)
	}
	if err := ch2.ExchangeDeclare(dx, "direct", true, false, false, false, nil); err != nil {
		t.Fatalf("redeclare %s after restart: %v", dx, err)
	}
	bad := mustChannel(t, c2)
	_, err := bad.QueueDeclare(dq, true, false, false, false, amqp.Table{"x-dead-letter-exchange": "other"})
	checkAMQPError(t, err, amqp.PreconditionFailed, "")
	bad = mustChannel(t, c2)
	err = bad.ExchangeDeclare(dx, "fanout", true, false, false, false, nil)
	checkAMQPError(t, err, amqp.PreconditionFailed, "")
	bad = mustChannel(t, c2)
	_, err = bad.QueueDeclare(dq, false, false, false, false, dqArgs)
	checkAMQPError(t, err, amqp.PreconditionFailed, "")
}

func TestITRestartUnackedComeBackRedelivered(t *testing.T) {
	b := newRestartBroker(t)
	c := mustDial(t, b.url)
	ch := mustConfirmChannel(t, c)
	q := uniq(t, "q")
	g := uniq(t, "get")
	mustDeclareDurableQueue(t, ch, q, nil)
	mustDeclareDurableQueue(t, ch, g, nil)
	publishAllConfirmed(t, ch, "", q, 10, func(i int) amqp.Publishing { return persistentMsg(fmt.Sprint("m", i)) })
	publishAllConfirmed(t, ch, "", g, 3, func(i int) amqp.Publishing { return persistentMsg(fmt.Sprint("g", i)) })

	// A consumer takes all ten; 0-3 are acked, 4 is rejected without requeue, 5-9 stay unacked.
	cc := mustDial(t, b.url)
	cch := mustChannel(t, cc)
	d := mustConsume(t, cch, q, "c", false, nil)
	var got []amqp.Delivery
	for i := range 10 {
		m := recvBody(t, d, fmt.Sprint("m", i))
		if m.Redelivered {
			t.Fatalf("m%d redelivered=true on its first delivery", i)
		}
		got = append(got, m)
	}
	for i := range 4 {
		if err := got[i].Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	if err := got[4].Reject(false); err != nil {
		t.Fatalf("reject: %v", err)
	}
	// A no-ack consumer on a third queue takes everything.
	auto := uniq(t, "auto")
	mustDeclareDurableQueue(t, ch, auto, nil)
	publishAllConfirmed(t, ch, "", auto, 3, func(i int) amqp.Publishing { return persistentMsg(fmt.Sprint("a", i)) })
	ad := mustConsume(t, cch, auto, "auto", true, nil)
	for i := range 3 {
		recvBody(t, ad, fmt.Sprint("a", i))
	}
	// basic.get: g0 unacked, g1 auto-acked, g2 left ready.
	mustGetBody(t, cch, g, false, "g0")
	mustGetBody(t, cch, g, true, "g1")
	// A round trip on the same channel: the acks above have been handled.
	if n, _ := queueCounts(t, cch, q); n != 0 {
		t.Fatalf("%s holds %d ready messages before restart, want 0 (all delivered)", q, n)
	}

	b.restart()

	c2 := mustDial(t, b.url)
	ch2 := mustChannel(t, c2)
	if n, _ := queueCounts(t, ch2, q); n != 5 {
		t.Fatalf("after restart %s holds %d messages, want 5 (the unacked m5..m9)", q, n)
	}
	d2 := mustConsume(t, ch2, q, "c2", false, nil)
	for i := 5; i < 10; i++ {
		m := recvBody(t, d2, fmt.Sprint("m", i))
		if !m.Redelivered {
			t.Errorf("m%d: redelivered=false after coming back from a restart unacked, want true", i)
		}
		if err := m.Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	noDelivery(t, d2, quiet)
	if n, _ := queueCounts(t, ch2, g); n != 2 {
		t.Fatalf("after restart %s holds %d messages, want 2 (g0 unacked, g2 ready)", g, n)
	}
	m := mustGetBody(t, ch2, g, true, "g0")
	if !m.Redelivered {
		t.Errorf("g0: redelivered=false after coming back from a restart unacked, want true")
	}
	mustGetBody(t, ch2, g, true, "g2")
	expectEmpty(t, ch2, g)
	if n, _ := queueCounts(t, ch2, auto); n != 0 {
		t.Errorf("after restart %s holds %d messages, want 0 (all delivered to a no-ack consumer)", auto, n)
	}

	// Acks after a restart are durable too: nothing comes back the second time.
	b.restart()
	c3 := mustDial(t, b.url)
	ch3 := mustChannel(t, c3)
	for _, name := range []string{q, g} {
		if n, _ := queueCounts(t, ch3, name); n != 0 {
			t.Errorf("after the second restart %s holds %d messages, want 0", name, n)
		}
		expectEmpty(t, ch3, name)
	}
}

// TestITRestartDuringConfirmedPublishing shuts the broker down while a
// publisher streams persistent messages with confirms: after the restart every
// confirmed message is in the queue, exactly once and in order.
func TestITRestartDuringConfirmedPublishing(t *testing.T) {
	b := newRestartBroker(t)
	c := mustDial(t, b.url)
	ch := mustChannel(t, c)
	q := uniq(t, "q")
	mustDeclareDurableQueue(t, ch, q, nil)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1<<16))
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	published := make(chan int, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), bulkWait)
		defer cancel()
		i := 1 // publish i gets delivery tag i
		for ; i < 1<<16; i++ {
			msg := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: indexedBody(i, 600)}
			if err := ch.PublishWithContext(ctx, "", q, false, false, msg); err != nil {
				break // the broker went away
			}
		}
		published <- i - 1
	}()
	var acked []int
	nacks := 0
	stopped := false
	for cf := range confirms {
		if cf.Ack {
			acked = append(acked, int(cf.DeliveryTag))
		} else {
			nacks++
		}
		if !stopped && len(acked) >= 500 {
			stopped = true
			b.stop() // the client's channel closes, which ends this loop
		}
	}
	if !stopped {
		t.Fatalf("confirmations ended after %d acks, before the broker was stopped", len(acked))
	}
	var sent int
	select {
	case sent = <-published:
	case <-time.After(bulkWait):
		t.Fatalf("publisher did not stop after the broker went away")
	}

	b.start()

	ch2 := mustChannel(t, mustDial(t, b.url))
	n, _ := queueCounts(t, ch2, q)
	t.Logf("published %d, confirmed %d (%d nacked), %d in the queue after restart", sent, len(acked), nacks, n)
	if n < len(acked) {
		t.Fatalf("after restart %s holds %d messages, fewer than the %d confirmed", q, n, len(acked))
	}
	d := mustConsume(t, ch2, q, "check", true, nil)
	present := make(map[int]bool, n)
	prev := 0
	for range n {
		m := recvWithin(t, d, waitFor)
		i, ok := bodyIndex(m.Body)
		if !ok || !bytes.Equal(m.Body, indexedBody(i, 600)) {
			t.Fatalf("unexpected or damaged message %.20q", m.Body)
		}
		if i <= prev {
			t.Fatalf("message %d after message %d: duplicate or out of order", i, prev)
		}
		prev = i
		present[i] = true
	}
	noDelivery(t, d, quiet)
	for _, tag := range acked {
		if !present[tag] {
			t.Errorf("confirmed message %d is missing after the restart", tag)
		}
	}
}

func TestITRestartTransactions(t *testing.T) {
	b := newRestartBroker(t)
	c := mustDial(t, b.url)
	ch := mustChannel(t, c)
	q := uniq(t, "q")
	mustDeclareDurableQueue(t, ch, q, nil)
	pch := mustConfirmChannel(t, c)
	publishAllConfirmed(t, pch, "", q, 2, func(i int) amqp.Publishing { return persistentMsg(fmt.Sprint("pre", i)) })
	if err := ch.Tx(); err != nil {
		t.Fatalf("tx.select: %v", err)
	}
	// Committed: two persistent publishes and the ack of pre0.
	m := mustGetBody(t, ch, q, false, "pre0")
	publish(t, ch, "", q, persistentMsg("c1"))
	publish(t, ch, "", q, persistentMsg("c2"))
	if err := m.Ack(false); err != nil {
		t.Fatalf("ack: %v", err)
	}
	if err := ch.TxCommit(); err != nil {
		t.Fatalf("tx.commit: %v", err)
	}
	// Rolled back: a publish and the ack of pre1 (which stays unacked).
	m = mustGetBody(t, ch, q, false, "pre1")
	publish(t, ch, "", q, persistentMsg("rolled-back"))
	if err := m.Ack(false); err != nil {
		t.Fatalf("ack: %v", err)
	}
	if err := ch.TxRollback(); err != nil {
		t.Fatalf("tx.rollback: %v", err)
	}

	b.restart()

	ch2 := mustChannel(t, mustDial(t, b.url))
	if n, _ := queueCounts(t, ch2, q); n != 3 {
		t.Fatalf("after restart %s holds %d messages, want 3 (pre1 unacked, c1, c2)", q, n)
	}
	for _, want := range []string{"pre1", "c1", "c2"} {
		mustGetBody(t, ch2, q, true, want)
	}
	expectEmpty(t, ch2, q)
}

func TestITRestartPurgedAndDeletedQueues(t *testing.T) {
	b := newRestartBroker(t)
	c := mustDial(t, b.url)
	ch := mustConfirmChannel(t, c)
	purged, deleted, renewed, unacked := uniq(t, "purged"), uniq(t, "deleted"), uniq(t, "renewed"), uniq(t, "unacked")
	for _, q := range []string{purged, deleted, renewed, unacked} {
		mustDeclareDurableQueue(t, ch, q, nil)
		publishAllConfirmed(t, ch, "", q, 5, func(i int) amqp.Publishing { return persistentMsg(fmt.Sprint("old", i)) })
	}
	if n, err := ch.QueuePurge(purged, false); err != nil || n != 5 {
		t.Fatalf("queue.purge %s: %d, %v; want 5", purged, n, err)
	}
	if n, err := ch.QueueDelete(deleted, false, false, false); err != nil || n != 5 {
		t.Fatalf("queue.delete %s: %d, %v; want 5", deleted, n, err)
	}
	if _, err := ch.QueueDelete(renewed, false, false, false); err != nil {
		t.Fatalf("queue.delete %s: %v", renewed, err)
	}
	mustDeclareDurableQueue(t, ch, renewed, nil)
	publishAllConfirmed(t, ch, "", renewed, 2, func(i int) amqp.Publishing { return persistentMsg(fmt.Sprint("new", i)) })
	// Deleted while its messages are delivered and unacked.
	gch := mustChannel(t, c)
	for i := range 5 {
		mustGetBody(t, gch, unacked, false, fmt.Sprint("old", i))
	}
	if _, err := ch.QueueDelete(unacked, false, false, false); err != nil {
		t.Fatalf("queue.delete %s: %v", unacked, err)
	}
	// The most recently declared queue, deleted: queues declared after the
	// restart must not inherit its messages.
	last := uniq(t, "last")
	mustDeclareDurableQueue(t, ch, last, nil)
	publishAllConfirmed(t, ch, "", last, 5, func(i int) amqp.Publishing { return persistentMsg(fmt.Sprint("last", i)) })
	if _, err := ch.QueueDelete(last, false, false, false); err != nil {
		t.Fatalf("queue.delete %s: %v", last, err)
	}

	b.restart()

	c2 := mustDial(t, b.url)
	ch2 := mustChannel(t, c2)
	if !queueExists(t, c2, purged) {
		t.Fatalf("purged durable queue %s gone after restart", purged)
	}
	if n, _ := queueCounts(t, ch2, purged); n != 0 {
		t.Errorf("purged queue %s holds %d messages after restart, want 0", purged, n)
	}
	expectEmpty(t, ch2, purged)
	for _, q := range []string{deleted, unacked} {
		if queueExists(t, c2, q) {
			t.Errorf("deleted queue %s exists after restart", q)
			continue
		}
		qi, err := ch2.QueueDeclare(q, true, false, false, false, nil)
		if err != nil {
			t.Fatalf("redeclare %s: %v", q, err)
		}
		if qi.Messages != 0 {
			t.Errorf("queue %s deleted before the restart and redeclared holds %d messages, want 0", q, qi.Messages)
		}
		expectEmpty(t, ch2, q)
	}
	if n, _ := queueCounts(t, ch2, renewed); n != 2 {
		t.Fatalf("queue %s (deleted and redeclared before restart) holds %d messages, want its 2 new ones", renewed, n)
	}
	mustGetBody(t, ch2, renewed, true, "new0")
	mustGetBody(t, ch2, renewed, true, "new1")
	expectEmpty(t, ch2, renewed)
	fresh := []string{uniq(t, "fresh0"), uniq(t, "fresh1"), uniq(t, "fresh2")}
	for k, q := range fresh {
		qi, err := ch2.QueueDeclare(q, k%2 == 0, false, false, false, nil)
		if err != nil {
			t.Fatalf("queue.declare %s: %v", q, err)
		}
		if qi.Messages != 0 {
			t.Errorf("queue %s, new after the restart, holds %d messages, want 0", q, qi.Messages)
		}
		expectEmpty(t, ch2, q)
	}
	pch := mustConfirmChannel(t, c2)
	publishConfirmed(t, pch, "", fresh[0], false, persistentMsg("fresh"))

	// A second restart: the queues declared since hold only their own messages
	// (their storage ids may be those of queues deleted before the first one).
	b.restart()
	ch3 := mustChannel(t, mustDial(t, b.url))
	for _, w := range []struct {
		q string
		n int
	}{{purged, 0}, {renewed, 0}, {deleted, 0}, {unacked, 0}, {fresh[0], 1}, {fresh[2], 0}} {
		if n, _ := queueCounts(t, ch3, w.q); n != w.n {
			t.Errorf("after the second restart %s holds %d messages, want %d", w.q, n, w.n)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	mustGetBody(t, ch3, fresh[0], true, "fresh")
	if queueExists(t, ch3.conn, fresh[1]) {
		t.Errorf("transient queue %s exists after the second restart", fresh[1])
	}
}

func TestITRestartOrderPreserved(t *testing.T) {
	b := newRestartBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, b.url))
	q := uniq(t, "q")
	mustDeclareDurableQueue(t, ch, q, nil)
	const n = 500
	publishAllConfirmed(t, ch, "", q, n, func(i int) amqp.Publishing {
		return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: indexedBody(i+1, 64)}
	})

	b.restart()

	ch2 := mustChannel(t, mustDial(t, b.url))
	if got, _ := queueCounts(t, ch2, q); got != n {
		t.Fatalf("after restart %s holds %d messages, want %d", q, got, n)
	}
	drainInOrder(t, ch2, q, drainSpec{want: indexRange(1, n+1, nil), body: func(i int) []byte { return indexedBody(i, 64) }})
}

// pagedBody is the 2 KB body of message i in the long-queue tests.
func pagedBody(i int) []byte { return indexedBody(i, 2048) }

// longQueue declares a queue, fills it with n 2 KB messages (persistent or
// transient) and checks its length.
func longQueue(t *testing.T, u string, ch *itChan, durable, persistentMsgs bool, n int) string {
	t.Helper()
	q := uniq(t, "long")
	if _, err := ch.QueueDeclare(q, durable, false, false, false, nil); err != nil {
		t.Fatalf("queue.declare %s: %v", q, err)
	}
	deleteAtEnd(t, u, []string{q}, nil)
	mode := amqp.Transient
	if persistentMsgs {
		mode = amqp.Persistent
	}
	publishAllConfirmed(t, ch, "", q, n, func(i int) amqp.Publishing {
		return amqp.Publishing{DeliveryMode: mode, Body: pagedBody(i)}
	})
	if got, _ := queueCounts(t, ch, q); got != n {
		t.Fatalf("%s holds %d messages, want %d", q, got, n)
	}
	return q
}

func TestITPagingLongQueue(t *testing.T) {
	const n = 5000
	for _, tc := range []struct {
		name                string
		durable, persistent bool
	}{
		{"DurablePersistent", true, true},
		{"DurableTransient", true, false},
		{"TransientQueue", false, false},
		{"TransientQueuePersistent", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := startBroker(t)
			c := mustDial(t, u)
			q := longQueue(t, u, mustConfirmChannel(t, c), tc.durable, tc.persistent, n)
			no := false
			drainInOrder(t, mustChannel(t, c), q, drainSpec{want: indexRange(0, n, nil), body: pagedBody, firstRedelivered: &no})
		})
	}
}

func TestITPagingLongQueueNackRequeue(t *testing.T) {
	const n = 5000
	// Requeued on first delivery: some in the in-memory window, some in the paged tail.
	requeue := func(i int) bool {
		return i == 10 || i == 500 || i == 1023 || i == 1024 || i == 1500 || i == 2500 || i == 4999
	}
	for _, tc := range []struct {
		name                string
		durable, persistent bool
	}{
		{"DurablePersistent", true, true},
		{"TransientQueue", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := startBroker(t)
			c := mustDial(t, u)
			q := longQueue(t, u, mustConfirmChannel(t, c), tc.durable, tc.persistent, n)
			no := false
			drainInOrder(t, mustChannel(t, c), q, drainSpec{want: indexRange(0, n, nil), body: pagedBody, requeue: requeue, firstRedelivered: &no})
		})
	}
}

func TestITPagingBasicGetAcrossWindow(t *testing.T) {
	const n = 3000
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := longQueue(t, u, ch, false, false, n)
	// basic.get through the in-memory window into the paged tail; every other one is requeued once.
	for i := range 1500 {
		m := mustGet(t, ch, q, false)
		if !bytes.Equal(m.Body, pagedBody(i)) {
			t.Fatalf("basic.get #%d: got %.9q, want message %d", i, m.Body, i)
		}
		if i%2 == 1 {
			if err := m.Nack(false, true); err != nil {
				t.Fatalf("nack: %v", err)
			}
			m = mustGet(t, ch, q, false)
			if !bytes.Equal(m.Body, pagedBody(i)) || !m.Redelivered {
				t.Fatalf("basic.get after requeue of %d: got %.9q redelivered=%v, want message %d redelivered", i, m.Body, m.Redelivered, i)
			}
		}
		if err := m.Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	no := false
	drainInOrder(t, mustChannel(t, c), q, drainSpec{want: indexRange(1500, n, nil), body: pagedBody, firstRedelivered: &no})
}

// TestITPagingBasicGetNoAck drains a long queue with basic.get no-ack: the
// message removed at delivery must still be read back from disk.
func TestITPagingBasicGetNoAck(t *testing.T) {
	const n = 2500
	for _, tc := range []struct {
		name                string
		durable, persistent bool
	}{
		{"DurablePersistent", true, true},
		{"TransientQueue", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := startBroker(t)
			ch := mustConfirmChannel(t, mustDial(t, u))
			q := longQueue(t, u, ch, tc.durable, tc.persistent, n)
			for i := range n {
				m, ok, err := ch.Get(q, true)
				if err != nil {
					t.Fatalf("basic.get #%d: %v", i, err)
				}
				if !ok {
					t.Fatalf("basic.get #%d: get-empty, want message %d (%d left unread)", i, i, n-i)
				}
				if !bytes.Equal(m.Body, pagedBody(i)) {
					t.Fatalf("basic.get #%d: got %.9q, want message %d (a message was lost)", i, m.Body, i)
				}
			}
			expectEmpty(t, ch, q)
		})
	}
}

func TestITPagingConcurrentPublishConsume(t *testing.T) {
	const prefill, more = 3000, 3000
	u := startBroker(t)
	pc := mustDial(t, u)
	pch := mustConfirmChannel(t, pc)
	q := longQueue(t, u, pch, true, true, prefill)
	// Keep publishing (alternating persistent and transient) while a consumer on
	// another connection drains the paged backlog.
	pubErr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), bulkWait)
		defer cancel()
		var last *amqp.DeferredConfirmation
		for i := prefill; i < prefill+more; i++ {
			mode := amqp.Persistent
			if i%2 == 1 {
				mode = amqp.Transient
			}
			dc, err := pch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{DeliveryMode: mode, Body: pagedBody(i)})
			if err != nil {
				pubErr <- fmt.Errorf("publish %d: %w", i, err)
				return
			}
			last = dc
		}
		ok, err := last.WaitContext(ctx)
		if err == nil && !ok {
			err = errors.New("last publish nacked")
		}
		pubErr <- err
	}()
	cc := mustDial(t, u)
	no := false
	drainInOrder(t, mustChannel(t, cc), q, drainSpec{want: indexRange(0, prefill+more, nil), body: pagedBody, firstRedelivered: &no})
	select {
	case err := <-pubErr:
		if err != nil {
			t.Fatalf("publisher: %v", err)
		}
	case <-time.After(bulkWait):
		t.Fatalf("publisher did not finish")
	}
}

func TestITPagingRestartKeepsPersistentOnly(t *testing.T) {
	const n = 4000
	b := newRestartBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, b.url))
	q := uniq(t, "q")
	mustDeclareDurableQueue(t, ch, q, nil)
	// Even messages persistent, odd ones transient; most of them are paged out.
	publishAllConfirmed(t, ch, "", q, n, func(i int) amqp.Publishing {
		mode := amqp.Persistent
		if i%2 == 1 {
			mode = amqp.Transient
		}
		return amqp.Publishing{DeliveryMode: mode, Body: pagedBody(i)}
	})

	b.restart()

	ch2 := mustChannel(t, mustDial(t, b.url))
	if got, _ := queueCounts(t, ch2, q); got != n/2 {
		t.Fatalf("after restart %s holds %d messages, want the %d persistent ones", q, got, n/2)
	}
	even := indexRange(0, n, func(i int) bool { return i%2 == 0 })
	drainInOrder(t, ch2, q, drainSpec{want: even, body: pagedBody, requeue: func(i int) bool { return i == 1000 || i == 3000 }})
}

func TestITConfirmManyPublishersPersistent(t *testing.T) {
	const conns, chans, perChan = 3, 2, 300
	u := startBroker(t)
	setup := mustConfirmChannel(t, mustDial(t, u))
	q := uniq(t, "q")
	mustDeclareDurableQueue(t, setup, q, nil)
	deleteAtEnd(t, u, []string{q}, nil)

	type publisher struct {
		name     string
		ch       *itChan
		confirms chan amqp.Confirmation
	}
	var pubs []publisher
	for ci := range conns {
		c := mustDial(t, u)
		for k := range chans {
			ch := mustChannel(t, c)
			confirms := ch.NotifyPublish(make(chan amqp.Confirmation, perChan))
			if err := ch.Confirm(false); err != nil {
				t.Fatalf("confirm.select: %v", err)
			}
			pubs = append(pubs, publisher{name: fmt.Sprintf("c%dch%d", ci, k), ch: ch, confirms: confirms})
		}
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), bulkWait)
			defer cancel()
			for i := range perChan {
				msg := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(fmt.Sprintf("%s-%05d", p.name, i))}
				if err := p.ch.PublishWithContext(ctx, "", q, false, false, msg); err != nil {
					t.Errorf("%s: publish %d: %v", p.name, i, err)
					return
				}
			}
			for i := 1; i <= perChan; i++ {
				select {
				case cf := <-p.confirms:
					if cf.DeliveryTag != uint64(i) || !cf.Ack {
						t.Errorf("%s: confirmation %+v, want ack of tag %d", p.name, cf, i)
						return
					}
				case <-ctx.Done():
					t.Errorf("%s: only %d of %d confirms arrived", p.name, i-1, perChan)
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	total := conns * chans * perChan
	if n, _ := queueCounts(t, setup, q); n != total {
		t.Fatalf("%s holds %d messages after %d confirms, want %d", q, n, total, total)
	}
	// Every publisher's messages are all there, each publisher's in its order.
	cch := mustChannel(t, mustDial(t, u))
	d := mustConsume(t, cch, q, "check", true, nil)
	next := map[string]int{}
	for k := range total {
		m := recvWithin(t, d, waitFor)
		name, idx, ok := strings.Cut(string(m.Body), "-")
		i, err := strconv.Atoi(idx)
		if !ok || err != nil {
			t.Fatalf("delivery %d: unexpected body %q", k, m.Body)
		}
		if i != next[name] {
			t.Fatalf("publisher %s: got message %d, want %d", name, i, next[name])
		}
		next[name]++
	}
	noDelivery(t, d, quiet)
	for _, p := range pubs {
		if next[p.name] != perChan {
			t.Errorf("publisher %s: %d messages in the queue, want %d", p.name, next[p.name], perChan)
		}
	}
}

// mixedTarget is where publish i of the mixed-confirm tests goes: persistent
// to a durable queue, transient to a durable queue, persistent to a transient
// queue, persistent and unroutable.
func mixedTarget(i int, durableQ, transientQ, unroutable string) (key string, mode uint8) {
	switch i % 4 {
	case 0:
		return durableQ, amqp.Persistent
	case 1:
		return durableQ, amqp.Transient
	case 2:
		return transientQ, amqp.Persistent
	default:
		return unroutable, amqp.Persistent
	}
}

func TestITConfirmMixedPersistenceInOrder(t *testing.T) {
	const n = 400
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n))
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	dq := uniq(t, "durable")
	mustDeclareDurableQueue(t, ch, dq, nil)
	deleteAtEnd(t, u, []string{dq}, nil)
	tq := declareQueue(t, u, ch, "transient", nil)
	unroutable := uniq(t, "nowhere")
	for i := range n {
		key, mode := mixedTarget(i, dq, tq, unroutable)
		publish(t, ch, "", key, amqp.Publishing{DeliveryMode: mode, Body: []byte(strconv.Itoa(i))})
	}
	for i := 1; i <= n; i++ {
		select {
		case cf := <-confirms:
			if cf.DeliveryTag != uint64(i) || !cf.Ack {
				t.Fatalf("confirmation %+v, want ack of tag %d", cf, i)
			}
		case <-time.After(waitFor):
			t.Fatalf("confirmation %d of %d missing", i, n)
		}
	}
	select {
	case cf := <-confirms:
		t.Fatalf("extra confirmation %+v", cf)
	case <-time.After(quiet):
	}
	if got, _ := queueCounts(t, ch, dq); got != n/2 {
		t.Errorf("%s holds %d messages, want %d", dq, got, n/2)
	}
	if got, _ := queueCounts(t, ch, tq); got != n/4 {
		t.Errorf("%s holds %d messages, want %d", tq, got, n/4)
	}
}

// rawFrameOut writes one frame of type typ.
func (r *rawConn) rawFrameOut(typ byte, channel uint16, payload []byte) {
	r.t.Helper()
	var f rawBuf
	f.u8(typ).u16(channel).u32(uint32(len(payload)))
	f.Write(payload)
	f.u8(0xCE)
	if _, err := r.c.Write(f.Bytes()); err != nil {
		r.t.Fatalf("raw write: %v", err)
	}
}

// rawPublish sends basic.publish with a content header carrying only the
// delivery mode, and one body frame.
func (r *rawConn) rawPublish(channel uint16, exchange, key string, mode uint8, body []byte) {
	r.t.Helper()
	var args rawBuf
	args.u16(0).short(exchange).short(key).u8(0)
	r.send(channel, 60, 40, &args)
	var hdr rawBuf
	hdr.u16(60).u16(0)
	_ = binary.Write(&hdr.Buffer, binary.BigEndian, uint64(len(body)))
	hdr.u16(0x1000).u8(mode) // property flags: delivery-mode only
	r.rawFrameOut(2, channel, hdr.Bytes())
	if len(body) > 0 {
		r.rawFrameOut(3, channel, body)
	}
}

// TestITConfirmMixedPersistenceWireOrder checks the basic.ack frames
// themselves (amqp091-go re-sequences confirms before NotifyPublish, hiding
// their real order): every tag 1..N is acked, none is nacked, and no ack
// confirms a tag twice with a single ack. Warren also promises the order: every
// ack moves forward and a single ack confirms exactly the next tag. RabbitMQ
// 3.10 does not (it acks an unroutable publish at once, ahead of earlier
// persistent ones still on their way to disk), so that part is skipped there.
func TestITConfirmMixedPersistenceWireOrder(t *testing.T) {
	const n = 400
	u := startBroker(t)
	setup := mustChannel(t, mustDial(t, u))
	dq := uniq(t, "durable")
	mustDeclareDurableQueue(t, setup, dq, nil)
	deleteAtEnd(t, u, []string{dq}, nil)
	tq := declareQueue(t, u, setup, "transient", nil)
	unroutable := uniq(t, "nowhere")

	r := rawDial(t, u)
	r.open("guest", "guest")
	var sel rawBuf
	sel.u8(0)
	r.send(1, 85, 10, &sel)
	r.expect(85, 11)
	for i := range n {
		key, mode := mixedTarget(i, dq, tq, unroutable)
		r.rawPublish(1, "", key, mode, []byte(strconv.Itoa(i)))
	}
	var acked uint64 // highest tag acked so far
	confirmed := make([]bool, n+1)
	outstanding := n
	frames, outOfOrder := 0, 0
	for outstanding > 0 {
		f, err := r.read()
		if err != nil {
			t.Fatalf("reading confirms: %d of %d still unconfirmed (highest ack %d): %v", outstanding, n, acked, err)
		}
		if f.typ != 1 || f.class != 60 || (f.method != 80 && f.method != 120) {
			t.Fatalf("unexpected frame type %d method %d.%d while waiting for confirms", f.typ, f.class, f.method)
		}
		if len(f.args) < 9 {
			t.Fatalf("short basic.ack/nack arguments")
		}
		tag := binary.BigEndian.Uint64(f.args)
		multiple := f.args[8]&1 != 0
		if f.method == 120 {
			t.Fatalf("basic.nack tag %d multiple=%v, want only acks", tag, multiple)
		}
		frames++
		if tag == 0 || tag > n {
			t.Fatalf("basic.ack tag %d outside the %d publishes", tag, n)
		}
		inOrder := multiple && tag > acked || !multiple && tag == acked+1
		if !inOrder {
			outOfOrder++
			if !againstRabbitMQ() {
				t.Fatalf("basic.ack tag %d multiple=%v after the highest ack %d: out of order or a gap", tag, multiple, acked)
			}
		}
		if !multiple && confirmed[tag] {
			t.Fatalf("basic.ack tag %d confirmed twice", tag)
		}
		from := tag
		if multiple {
			from = 1
		}
		for k := from; k <= tag; k++ {
			if !confirmed[k] {
				confirmed[k] = true
				outstanding--
			}
		}
		acked = max(acked, tag)
	}
	t.Logf("%d publishes confirmed by %d basic.ack frames (%d out of order)", n, frames, outOfOrder)
	r.close()
	if got, _ := queueCounts(t, setup, dq); got != n/2 {
		t.Errorf("%s holds %d messages, want %d", dq, got, n/2)
	}
}

func TestITStorageDataDirInUse(t *testing.T) {
	b := newRestartBroker(t)
	lw := &testLogWriter{t: t}
	defer lw.stop()
	s2, err := server.New(b.config(lw))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s2.Shutdown(ctx)
		t.Fatalf("server.New on %s, held by a running broker, succeeded; want an error saying it is in use", b.dir)
	}
	if !strings.Contains(err.Error(), "in use") {
		t.Errorf("server.New on a data directory in use: error %q does not say it is in use", err)
	}
	if !strings.Contains(err.Error(), b.dir) {
		t.Errorf("server.New on a data directory in use: error %q does not name the directory %s", err, b.dir)
	}
	if !errors.Is(err, storage.ErrLocked) {
		t.Errorf("server.New on a data directory in use: error %v is not storage.ErrLocked", err)
	}
	// The running broker is unharmed and still owns its data.
	ch := mustConfirmChannel(t, mustDial(t, b.url))
	q := uniq(t, "q")
	mustDeclareDurableQueue(t, ch, q, nil)
	publishConfirmed(t, ch, "", q, false, persistentMsg("kept"))
	b.restart()
	ch2 := mustChannel(t, mustDial(t, b.url))
	mustGetBody(t, ch2, q, true, "kept")
}

func TestITStorageIncompatibleFormat(t *testing.T) {
	if againstRabbitMQ() {
		t.Skip("starts in-process brokers")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "FORMAT"), []byte("warren-storage 99\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lw := &testLogWriter{t: t}
	defer lw.stop()
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.DataDir = dir
	cfg.Logger = slog.New(slog.NewTextHandler(lw, nil))
	s, err := server.New(cfg)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		t.Fatalf("server.New on a data directory of format 99 succeeded; want an error")
	}
	if !errors.Is(err, storage.ErrFormat) || !strings.Contains(err.Error(), "incompatible storage format") {
		t.Errorf("server.New on a data directory of format 99: error %q, want storage.ErrFormat saying the format is incompatible", err)
	}
}
