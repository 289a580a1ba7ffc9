package conformance

// Durability: what survives a restart of the warren process (SIGTERM and SIGKILL), the kill -9
// crash-safety loop, a torn value-log tail, data directories that must be refused, and (with
// WARREN_BIG=1) the memory of a broker holding a backlog of a million persistent messages.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// envInt returns the integer in environment variable name, or def when it is unset.
func envInt(t testing.TB, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// TestRestartKeepsDurableState: durable exchanges, queues, bindings (queue and exchange-to-exchange)
// and the persistent messages of durable queues survive a SIGTERM restart and a kill -9 restart, in
// their order, with their properties, and come back with redelivered=true; a message unacked at
// the shutdown is back at its place; acked ones are gone after a clean stop (after a kill -9 an
// acked one may come back). Transient messages, non-durable queues and exchanges, bindings that
// involve them, and durable queues, exchanges and bindings deleted before the restart are gone.
// Queue arguments are restored, and recovered messages survive a second crash untouched.
func TestRestartKeepsDurableState(t *testing.T) {
	const (
		durX   = "durable.direct" // durable direct exchange; durQ is bound to it with key "k"
		durSrc = "durable.fanout" // durable fanout exchange bound to durX (exchange-to-exchange)
		durQ   = "durable.q"
		tmpQ   = "transient.q" // non-durable queue bound to durX with key "k"
		tmpX   = "transient.x" // non-durable fanout exchange bound to durQ
		delQ   = "deleted.q"   // durable queue deleted before the restart
		delX   = "deleted.x"   // durable exchange deleted before the restart
	)
	qArgs := amqp.Table{"x-max-length": int32(1000)}
	n := newNode(t)

	persistent := func(id string, i int) amqp.Publishing {
		return amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "text/plain", MessageId: id,
			Headers: amqp.Table{"n": int32(i)}, Timestamp: time.Unix(1700000000+int64(i), 0),
			Body: []byte(id + "|" + strings.Repeat(id, 100)), // above the 512-byte value threshold
		}
	}
	transient := func(id string) amqp.Publishing {
		return amqp.Publishing{DeliveryMode: amqp.Transient, MessageId: id, Body: []byte(id)}
	}
	// checkRecovered takes every message from durQ and checks they are exactly want (ids), in order,
	// with redelivered=true and their properties intact. Ids in optional may appear once, anywhere.
	checkRecovered := func(t *testing.T, ch *amqp.Channel, want []string, optional ...string) {
		t.Helper()
		ds := getAll(t, ch, durQ, 20*time.Second)
		var got []string
		for _, d := range ds {
			id := d.MessageId
			if slices.Contains(optional, id) {
				t.Logf("%s (acked before the kill) came back: allowed, its delete was not yet on disk", id)
				continue
			}
			got = append(got, id)
			if !d.Redelivered {
				t.Errorf("%s: redelivered=false; a message recovered from disk must have redelivered=true", id)
			}
			if d.DeliveryMode != amqp.Persistent || d.ContentType != "text/plain" {
				t.Errorf("%s: delivery mode %d, content type %q; want 2, text/plain", id, d.DeliveryMode, d.ContentType)
			}
			if !strings.HasPrefix(string(d.Body), id+"|") || len(d.Body) != len(id)*101+1 {
				t.Errorf("%s: body %q (%d bytes) damaged", id, abbrev(d.Body), len(d.Body))
			}
			if _, ok := d.Headers["n"]; !ok || d.Timestamp.IsZero() {
				t.Errorf("%s: headers %v, timestamp %v; want the published ones", id, d.Headers, d.Timestamp)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("durable queue after restart holds %q;\nwant %q", got, want)
		}
	}
	checkTopology := func(t *testing.T, conn *amqp.Connection, gone ...string) {
		t.Helper()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		if err := ch.ExchangeDeclarePassive(durX, "direct", true, false, false, false, nil); err != nil {
			t.Fatalf("durable exchange %s lost: %v", durX, err)
		}
		if err := ch.ExchangeDeclarePassive(durSrc, "fanout", true, false, false, false, nil); err != nil {
			t.Fatalf("durable exchange %s lost: %v", durSrc, err)
		}
		if _, err := ch.QueueDeclare(durQ, true, false, false, false, qArgs); err != nil {
			t.Fatalf("redeclare durable queue %s with its arguments after restart: %v", durQ, err)
		}
		for _, name := range gone {
			c, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(name, ".q") {
				_, err = c.QueueDeclarePassive(name, false, false, false, false, nil)
			} else {
				err = c.ExchangeDeclarePassive(name, "fanout", false, false, false, false, nil)
			}
			expectNotFound(t, "non-durable "+name+" after restart", err)
		}
	}

	// Phase 1: topology, messages, a clean restart.
	conn := dial(t, n.b.URL)
	ch := confirmChannel(t, conn)
	must := func(t *testing.T, what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must(t, "declare "+durX, ch.ExchangeDeclare(durX, "direct", true, false, false, false, nil))
	must(t, "declare "+durSrc, ch.ExchangeDeclare(durSrc, "fanout", true, false, false, false, nil))
	must(t, "bind "+durSrc+" -> "+durX, ch.ExchangeBind(durX, "", durSrc, false, nil))
	_, err := ch.QueueDeclare(durQ, true, false, false, false, qArgs)
	must(t, "declare "+durQ, err)
	must(t, "bind "+durQ, ch.QueueBind(durQ, "k", durX, false, nil))
	_, err = ch.QueueDeclare(tmpQ, false, false, false, false, nil)
	must(t, "declare "+tmpQ, err)
	must(t, "bind "+tmpQ, ch.QueueBind(tmpQ, "k", durX, false, nil))
	must(t, "declare "+tmpX, ch.ExchangeDeclare(tmpX, "fanout", false, false, false, false, nil))
	must(t, "bind "+durQ+" to "+tmpX, ch.QueueBind(durQ, "", tmpX, false, nil))
	// Durable things deleted before the restart must stay deleted.
	must(t, "bind "+durQ+" with key gone", ch.QueueBind(durQ, "gone", durX, false, nil))
	must(t, "unbind "+durQ+" with key gone", ch.QueueUnbind(durQ, "gone", durX, nil))
	_, err = ch.QueueDeclare(delQ, true, false, false, false, nil)
	must(t, "declare "+delQ, err)
	publishConfirmed(t, ch, "", delQ, persistent("d0", 0))
	_, err = ch.QueueDelete(delQ, false, false, false)
	must(t, "delete "+delQ, err)
	must(t, "declare "+delX, ch.ExchangeDeclare(delX, "fanout", true, false, false, false, nil))
	must(t, "delete "+delX, ch.ExchangeDelete(delX, false, false))

	// Whether the broker checks queue arguments on redeclare (then it must still do so after restart).
	argsChecked := func(t *testing.T, conn *amqp.Connection) bool {
		t.Helper()
		c, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.QueueDeclare(durQ, true, false, false, false, amqp.Table{"x-max-length": int32(999)})
		var aerr *amqp.Error
		return errors.As(err, &aerr) && aerr.Code == amqp.PreconditionFailed
	}
	checkedBefore := argsChecked(t, conn)
	if !checkedBefore {
		t.Logf("the broker accepts a redeclare of %s with another x-max-length; the restored-arguments check is skipped", durQ)
	}

	var msgs []amqp.Publishing
	for i := range 10 {
		msgs = append(msgs, persistent(fmt.Sprintf("p%d", i), i))
	}
	for i := range 5 {
		msgs = append(msgs, transient(fmt.Sprintf("t%d", i)))
	}
	publishConfirmed(t, ch, durX, "k", msgs...)
	publishConfirmed(t, ch, tmpX, "", persistent("x0", 100)) // durable queue via a transient exchange

	for i := range 3 {
		d, ok, err := ch.Get(durQ, false)
		if err != nil || !ok || d.MessageId != fmt.Sprintf("p%d", i) {
			t.Fatalf("basic.get %d: %q ok=%v err=%v; want p%d", i, d.MessageId, ok, err, i)
		}
		if i < 2 {
			must(t, "ack", d.Ack(false)) // p0 and p1 are acked; p2 stays unacked across the shutdown
		}
	}
	q, err := ch.QueueDeclarePassive(durQ, true, false, false, false, nil)
	must(t, "passive declare", err)
	if q.Messages != 13 { // p3..p9, t0..t4, x0
		t.Fatalf("%s holds %d ready messages before the restart; want 13", durQ, q.Messages)
	}

	t.Run("SIGTERM", func(t *testing.T) {
		n.restartTerm()
		conn := dial(t, n.b.URL)
		checkTopology(t, conn, tmpQ, tmpX, delQ, delX)
		ch := confirmChannel(t, conn)
		// p0, p1 acked; p2 was unacked at shutdown and is back at its place; t* were transient.
		checkRecovered(t, ch, []string{"p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "x0"})
		if checkedBefore && !argsChecked(t, conn) {
			t.Errorf("after restart, redeclaring %s with another x-max-length is accepted; before it was refused (406): its arguments were not restored", durQ)
		}
		// Both durable bindings still route: durSrc -> durX -> durQ; the removed one does not.
		publishConfirmed(t, ch, durX, "gone", persistent("unbound", 8))
		publishConfirmed(t, ch, durSrc, "k", persistent("after", 7))
		ds := getAll(t, ch, durQ, 5*time.Second)
		if len(ds) != 1 || ds[0].MessageId != "after" || ds[0].Redelivered {
			t.Errorf("published through %s -> %s -> %s (and with key \"gone\", unbound before the restart) after restart: got %q (redelivered %v); want [after] not redelivered",
				durSrc, durX, durQ, bodies(ds), len(ds) > 0 && ds[0].Redelivered)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("SIGKILL", func(t *testing.T) {
		conn := dial(t, n.b.URL)
		ch := confirmChannel(t, conn)
		_, err := ch.QueueDeclare(tmpQ, false, false, false, false, nil)
		must(t, "declare "+tmpQ, err)
		must(t, "bind "+tmpQ, ch.QueueBind(tmpQ, "k", durX, false, nil))
		var msgs []amqp.Publishing
		var want []string
		for i := range 20 {
			id := fmt.Sprintf("k%d", i)
			msgs = append(msgs, persistent(id, i))
			if i%4 == 3 {
				msgs = append(msgs, transient(fmt.Sprintf("j%d", i)))
			}
			if i > 0 {
				want = append(want, id)
			}
		}
		publishConfirmed(t, ch, durX, "k", msgs...)
		d0, ok0, err0 := ch.Get(durQ, false)
		d1, ok1, err1 := ch.Get(durQ, false)
		if err0 != nil || err1 != nil || !ok0 || !ok1 || d0.MessageId != "k0" || d1.MessageId != "k1" {
			t.Fatalf("basic.get twice: %q %v %v, %q %v %v; want k0, k1", d0.MessageId, ok0, err0, d1.MessageId, ok1, err1)
		}
		must(t, "ack k0", d0.Ack(false)) // may or may not be on disk when the kill comes
		if _, err := ch.QueueDeclarePassive(durQ, true, false, false, false, nil); err != nil {
			t.Fatal(err) // a round trip: the ack has been read by the broker
		}

		n.restartKill()
		conn = dial(t, n.b.URL)
		checkTopology(t, conn, tmpQ, tmpX)
		ch = confirmChannel(t, conn)
		checkRecovered(t, ch, want, "k0")

		// Recovered-and-untouched messages survive a second crash.
		var more []amqp.Publishing
		var ids []string
		for i := range 5 {
			id := fmt.Sprintf("m%d", i)
			more = append(more, persistent(id, i))
			ids = append(ids, id)
		}
		publishConfirmed(t, ch, durX, "k", more...)
		n.restartKill()
		n.restartKill()
		conn = dial(t, n.b.URL)
		checkTopology(t, conn, tmpQ, tmpX)
		checkRecovered(t, confirmChannel(t, conn), ids)
	})
}

// killBody is the body of message id in the kill -9 loop: the id, '|', and filler derived from it.
func killBody(id string, size int) []byte {
	b := make([]byte, 0, size)
	b = append(b, id...)
	b = append(b, '|')
	for i := 0; len(b) < size; i++ {
		b = append(b, 'a'+byte((i+len(id)+int(id[len(id)-1]))%26))
	}
	return b
}

// killHarness is the shared state of the kill -9 loop's clients.
type killHarness struct {
	queue   string
	size    int
	window  int
	ackRate int // acks per second at most

	url  atomic.Pointer[string]
	stop chan struct{}
	wg   sync.WaitGroup

	published atomic.Int64
	mu        sync.Mutex
	confirmed map[string]bool
	nacked    int
	acked     map[string]int // times the consumer acked the id
	delivered int
	errs      []string
}

func (h *killHarness) stopping() bool {
	select {
	case <-h.stop:
		return true
	default:
		return false
	}
}

// connect dials the current broker, retrying every 20 ms until it succeeds or the harness stops.
func (h *killHarness) connect() *amqp.Connection {
	for !h.stopping() {
		conn, err := amqp.DialConfig(*h.url.Load(), amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err == nil {
			return conn
		}
		select {
		case <-h.stop:
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

func (h *killHarness) fail(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.errs = append(h.errs, fmt.Sprintf(format, args...))
}

// publisher p publishes in confirm mode messages with ids <prefix><p>-<seq> and the delivery
// mode mode(seq), keeping at most window unconfirmed, reconnecting after every broker death
// until the harness stops. Confirmed ids are recorded by settle.
func (h *killHarness) publisher(p int, prefix string, mode func(seq int) uint8) {
	defer h.wg.Done()
	seq := 0
	for {
		conn := h.connect()
		if conn == nil {
			return
		}
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Confirm(false)
		}
		if err == nil {
			h.publishSession(p, ch, &seq, prefix, mode)
		}
		_ = conn.Close()
	}
}

// persistentMode is the delivery mode of every classic and quorum kill-test message.
func persistentMode(int) uint8 { return amqp.Persistent }

type outstanding struct {
	dc *amqp.DeferredConfirmation
	id string
}

func (h *killHarness) settle(o outstanding) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if o.dc.Acked() {
		h.confirmed[o.id] = true
	}
}

// isDone reports whether dc has been acked, nacked or abandoned.
func isDone(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
	}
}

func (h *killHarness) publishSession(p int, ch *amqp.Channel, seq *int, prefix string, mode func(seq int) uint8) {
	var window []outstanding
	defer func() {
		// Every pending confirmation completes: with an ack or nack, or unacked when the channel
		// closes because the broker died.
		for _, o := range window {
			select {
			case <-o.dc.Done():
				h.settle(o)
			case <-time.After(30 * time.Second):
				h.fail("publisher %s%d: no confirm, nack or channel close for %s within 30s", prefix, p, o.id)
				return
			}
		}
	}()
	for !h.stopping() {
		// Settle the confirms that arrived; when the window is full, wait for the oldest.
		for len(window) > 0 {
			if len(window) >= h.window {
				select {
				case <-window[0].dc.Done():
				case <-h.stop:
					return
				}
			} else if !isDone(window[0].dc) {
				break
			}
			h.settle(window[0])
			window = window[1:]
		}
		id := fmt.Sprintf("%s%d-%07d", prefix, p, *seq)
		dm := mode(*seq)
		*seq++
		h.published.Add(1)
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", h.queue, false, false,
			amqp.Publishing{DeliveryMode: dm, MessageId: id, Body: killBody(id, h.size)})
		if err != nil {
			return
		}
		window = append(window, outstanding{dc, id})
	}
}

// consumer consumes the queue and acks at most ackRate messages a second, reconnecting after
// every broker death until the harness stops.
func (h *killHarness) consumer() {
	defer h.wg.Done()
	interval := time.Second / time.Duration(h.ackRate)
	for {
		conn := h.connect()
		if conn == nil {
			return
		}
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Qos(100, 0, false)
		}
		var deliveries <-chan amqp.Delivery
		if err == nil {
			deliveries, err = ch.Consume(h.queue, "", false, false, false, false, nil)
		}
		next := time.Now()
	session:
		for err == nil {
			select {
			case <-h.stop:
				break session
			case d, ok := <-deliveries:
				if !ok {
					break session
				}
				h.mu.Lock()
				h.delivered++
				h.mu.Unlock()
				if time.Until(next) > 0 {
					time.Sleep(time.Until(next))
				}
				next = next.Add(interval)
				if now := time.Now(); next.Before(now) {
					next = now
				}
				if d.Ack(false) != nil {
					break session
				}
				h.mu.Lock()
				h.acked[d.MessageId]++
				h.mu.Unlock()
			}
		}
		_ = conn.Close()
	}
}

// TestKill9Loop is the crash-safety harness: four publishers publish persistent messages with
// unique ids in confirm mode to a durable queue while a consumer acks some of them; the broker is
// killed with SIGKILL 100-700 ms after each start and restarted on the same data directory,
// WARREN_KILLS times (default 20). At the end the queue is drained: every confirmed message the
// consumer did not ack must be there. Duplicates, and acked messages that come back, are allowed
// and counted.
func TestKill9Loop(t *testing.T) {
	if testing.Short() {
		t.Skip("kills the broker 20 times; skipped with -short")
	}
	kills := envInt(t, "WARREN_KILLS", 20)
	const (
		queue      = "kill9.q"
		publishers = 4
	)
	n := newNode(t)
	{
		conn := dial(t, n.b.URL)
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			t.Fatalf("declare %s: %v", queue, err)
		}
		_ = conn.Close()
	}

	h := &killHarness{
		queue: queue, size: 700, window: 64, ackRate: 1500,
		stop: make(chan struct{}), confirmed: make(map[string]bool), acked: make(map[string]int),
	}
	url := n.b.URL
	h.url.Store(&url)
	for p := range publishers {
		h.wg.Add(1)
		go h.publisher(p, "p", persistentMode)
	}
	h.wg.Add(1)
	go h.consumer()
	var stopOnce sync.Once
	signalStop := func() { stopOnce.Do(func() { close(h.stop) }) }
	stopClients := func() {
		signalStop()
		done := make(chan struct{})
		go func() { h.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatalf("the test's clients did not stop within 60s")
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
			// The last kill: the clients stop when the broker dies, so the drain below sees only
			// what the broker recovered from disk.
			signalStop()
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

	// Drain what the broker recovered after the last kill.
	conn := dial(t, n.b.URL)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	qs, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("durable queue %s after %d kills: %v", queue, kills, err)
	}
	if err := ch.Qos(1000, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "drain", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	counts := make(map[string]int)
	drained, notRedelivered, damaged := 0, 0, 0
	record := func(d amqp.Delivery) {
		drained++
		counts[d.MessageId]++
		if !d.Redelivered {
			notRedelivered++
		}
		if d.MessageId == "" || string(d.Body) != string(killBody(d.MessageId, h.size)) {
			damaged++
			if damaged <= 5 {
				t.Errorf("message %q: body %q is not the published one", d.MessageId, abbrev(d.Body))
			}
		}
	}
	drainStart := time.Now()
	idle := time.NewTimer(10 * time.Second)
drain:
	for drained < qs.Messages {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatalf("the drain consumer was closed after %d of %d messages", drained, qs.Messages)
			}
			record(d)
			if drained%500 == 0 || drained == qs.Messages {
				if err := d.Ack(true); err != nil {
					t.Fatalf("ack: %v", err)
				}
			}
			idle.Reset(10 * time.Second)
		case <-idle.C:
			t.Errorf("drain: no delivery for 10s after %d of the %d messages queue.declare-ok reported", drained, qs.Messages)
			break drain
		}
	}
	// Anything beyond what queue.declare-ok reported: deliveries already on their way, then
	// whatever basic.get still finds.
	if err := ch.Cancel("drain", false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}
	for d := range deliveries {
		record(d)
		if err := d.Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	for _, d := range getAll(t, ch, queue, time.Minute) {
		record(d)
	}
	if drained != qs.Messages {
		t.Errorf("queue.declare-ok after the last restart reported %d messages; %d were delivered", qs.Messages, drained)
	}
	drainTime := time.Since(drainStart)
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Errorf("delete %s: %v", queue, err)
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.errs {
		t.Error(e)
	}
	lost, dups, ackedBack, unconfirmedBack := 0, 0, 0, 0
	var lostIDs []string
	for id := range h.confirmed {
		if counts[id] == 0 && h.acked[id] == 0 {
			lost++
			if len(lostIDs) < 20 {
				lostIDs = append(lostIDs, id)
			}
		}
	}
	for id, c := range counts {
		if c > 1 {
			dups += c - 1
		}
		if h.acked[id] > 0 {
			ackedBack++
		}
		if !h.confirmed[id] {
			unconfirmedBack++
		}
	}
	slices.Sort(lostIDs)
	ackedTotal := 0
	for _, c := range h.acked {
		ackedTotal += c
	}
	t.Logf("kills %d in %v (%d of the broker lives between kills confirmed something; restart took %v median, %v max)",
		kills, loopTime.Round(time.Millisecond), livesWithConfirms, median(startTimes), slices.Max(startTimes))
	t.Logf("published %d, confirmed %d, delivered to the consumer %d, acked %d (%d distinct ids)",
		h.published.Load(), len(h.confirmed), h.delivered, ackedTotal, len(h.acked))
	t.Logf("recovered %d messages (%d distinct) drained in %v: lost %d, duplicates %d, acked ids that came back %d, unconfirmed ids present %d, not marked redelivered %d",
		drained, len(counts), drainTime.Round(time.Millisecond), lost, dups, ackedBack, unconfirmedBack, notRedelivered)
	if lost > 0 {
		t.Errorf("%d confirmed and never acked messages are missing after %d kills, e.g. %v", lost, kills, lostIDs)
	}
	if notRedelivered > 0 {
		t.Errorf("%d messages recovered after the last kill were delivered with redelivered=false; want true", notRedelivered)
	}
	if len(h.confirmed) == 0 {
		t.Errorf("no publish was ever confirmed: the harness tested nothing")
	}
	if livesWithConfirms < kills/2 {
		t.Errorf("only %d of %d broker lives confirmed anything before being killed: the kills did not hit confirm-mode publishing", livesWithConfirms, kills)
	}
	for id := range counts {
		if !strings.HasPrefix(id, "p") {
			t.Errorf("drained a message with unknown id %q", id)
			break
		}
	}
}

func (h *killHarness) confirmedCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.confirmed)
}

// median of ds (0 for none).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}

// tornBody is the body of message i in the torn-tail test (1.5 KB, so it lives in the value log).
func tornBody(i int) []byte {
	id := fmt.Sprintf("torn-%04d", i)
	return []byte(id + "|" + strings.Repeat(fmt.Sprintf("%04d.", i), 300))
}

// TestTornValueLogTail: after a kill -9, the newest value-log file is damaged at its tail, and the
// broker must still start, say on stderr what it found, and keep every message stored before the
// damage.
//   - garbage: junk is written right after the last intact entry, where a write was in flight
//     when the power went: only data that was never confirmed. Every confirmed message must be
//     there.
//   - truncate: the file is cut a few hundred bytes before the end of the last message's entry
//     (destroying confirmed data on purpose). The broker must start, keep every message whose
//     entry lies before the cut, and must not deliver a damaged one.
func TestTornValueLogTail(t *testing.T) {
	const (
		queue = "torn.q"
		total = 200
	)
	for _, damage := range []string{"garbage", "truncate"} {
		t.Run(damage, func(t *testing.T) {
			n := newNode(t)
			conn := dial(t, n.b.URL)
			ch := confirmChannel(t, conn)
			if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			for i := range total { // one at a time: one value-log write per message
				publishConfirmed(t, ch, "", queue, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: tornBody(i)})
			}
			n.kill9()

			path, entries, end := newestDataVlog(t, n.dir)
			ids := markedIDs(entries, "torn-")
			last := -1
			inLog := make(map[string]bool)
			for i, id := range ids {
				if id != "" {
					inLog[id] = true
					last = i
				}
			}
			if len(inLog) != total {
				t.Fatalf("%s holds %d of the %d confirmed messages (files: %s); the test expects all in the newest value log",
					path, len(inLog), total, listDir(n.dir))
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d bytes (apparent), %d entries, intact data ends at %d", filepath.Base(path), st.Size(), len(entries), end)

			mustKeep := make(map[string]bool)
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			switch damage {
			case "garbage":
				junk := []byte(strings.Repeat("\xde\xad\xbe\xef\x17", 1000))
				_, err = f.WriteAt(junk, end)
				for id := range inLog {
					mustKeep[id] = true
				}
				t.Logf("wrote %d bytes of garbage at offset %d", len(junk), end)
			case "truncate":
				cut := entries[last].end - 300
				err = f.Truncate(cut)
				for i, id := range ids {
					if id != "" && entries[i].end <= cut {
						mustKeep[id] = true
					}
				}
				t.Logf("cut the file at %d, inside the entry of %s [%d, %d)", cut, ids[last], entries[last].off, entries[last].end)
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}

			n.start()
			logs := n.b.logs()
			reported := false
			for _, line := range strings.Split(logs, "\n") {
				if (strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR")) &&
					strings.Contains(line, filepath.Base(path)) {
					reported = true
					t.Logf("the broker said: %s", line)
				}
			}
			if !reported {
				t.Errorf("no warning on stderr naming the damaged %s; log:\n%s", filepath.Base(path), tail(logs, 4096))
			}

			conn = dial(t, n.b.URL)
			ch = confirmChannel(t, conn)
			if q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
				t.Fatalf("durable queue %s after the repair: %v", queue, err)
			} else {
				t.Logf("queue.declare-ok after the repair reports %d messages", q.Messages)
			}
			ds := getAll(t, ch, queue, 30*time.Second)
			seen := make(map[string]int)
			for _, d := range ds {
				id, _, _ := strings.Cut(string(d.Body), "|")
				i, err := strconv.Atoi(strings.TrimPrefix(id, "torn-"))
				if err != nil || i < 0 || i >= total || string(d.Body) != string(tornBody(i)) {
					t.Errorf("delivered a damaged or unknown message: %q (%d bytes)", abbrev(d.Body), len(d.Body))
					continue
				}
				seen[id]++
				if !d.Redelivered {
					t.Errorf("%s: redelivered=false after recovery", id)
				}
			}
			var missing, lostDamaged []string
			for i := range total {
				id := fmt.Sprintf("torn-%04d", i)
				switch {
				case seen[id] > 1:
					t.Errorf("%s delivered %d times", id, seen[id])
				case seen[id] == 1:
				case mustKeep[id]:
					missing = append(missing, id)
				default:
					lostDamaged = append(lostDamaged, id)
				}
			}
			t.Logf("recovered %d of %d messages; %d had to be kept; lost in the damaged region: %v",
				len(seen), total, len(mustKeep), lostDamaged)
			if len(missing) > 0 {
				t.Errorf("%d messages stored before the damage are missing: %v", len(missing), missing)
			}

			// The broker keeps working on the repaired store, and the repair survives a clean restart.
			publishConfirmed(t, ch, "", queue, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: tornBody(total)})
			n.restartTerm()
			conn = dial(t, n.b.URL)
			ds = getAll(t, confirmChannel(t, conn), queue, 10*time.Second)
			if got := bodies(ds); len(got) != 1 || got[0] != string(tornBody(total)) {
				t.Errorf("after a clean restart the queue holds %d messages; want only the one published after the repair", len(got))
			}
		})
	}
}

// dirBytes sums the disk space allocated to the files in dir whose names end in suffix (value-log
// files are preallocated sparse, so their apparent size says little).
func dirBytes(dir, suffix string) int64 {
	es, _ := os.ReadDir(dir)
	var n int64
	for _, e := range es {
		fi, err := e.Info()
		if err != nil || !strings.HasSuffix(e.Name(), suffix) {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += fi.Size()
		}
	}
	return n
}

// listDir names the files in dir with their sizes, for failure messages.
func listDir(dir string) string {
	es, err := os.ReadDir(dir)
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, e := range es {
		if fi, err := e.Info(); err == nil {
			parts = append(parts, fmt.Sprintf("%s(%d)", e.Name(), fi.Size()))
		}
	}
	return strings.Join(parts, " ")
}

// TestDataDirInUse: a second `warren serve` on a data directory a running broker holds (by its
// own path or through a symlink) exits non-zero saying the directory is in use, and the first
// broker keeps serving.
func TestDataDirInUse(t *testing.T) {
	n := newNode(t)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(n.dir, link); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{n.dir, link} {
		code, out := serveToExit(t, dir, 15*time.Second)
		if code == 0 {
			t.Errorf("second warren serve on %s exited 0; want non-zero\n%s", dir, out)
		}
		if !strings.Contains(out, "in use") {
			t.Errorf("second warren serve on %s: output does not say the directory is in use:\n%s", dir, out)
		}
		if !strings.Contains(out, strconv.Itoa(n.b.PID())) {
			t.Errorf("output does not name the pid %d of the broker holding the directory:\n%s", n.b.PID(), out)
		}
		t.Logf("refused: %s", strings.TrimSpace(out))
	}
	assertStillServing(t, n.b.URL)
	// The refused starts did not take the lock away: the directory is still held.
	if code, out := serveToExit(t, n.dir, 15*time.Second); code == 0 || !strings.Contains(out, "in use") {
		t.Errorf("a third start was not refused (exit %d):\n%s", code, out)
	}
}

// TestDataDirIncompatibleFormat: a data directory whose FORMAT file names another storage format
// version, holds garbage, or is missing next to badger files makes `warren serve` exit non-zero
// with a clear message, and leaves the directory untouched: with the FORMAT file restored, the
// data is still there.
func TestDataDirIncompatibleFormat(t *testing.T) {
	n := newNode(t)
	conn := dial(t, n.b.URL)
	ch := confirmChannel(t, conn)
	if _, err := ch.QueueDeclare("format.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "", "format.q", amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("kept")})
	n.stopTerm()

	formatPath := filepath.Join(n.dir, "FORMAT")
	orig, err := os.ReadFile(formatPath)
	if err != nil {
		t.Fatalf("read the FORMAT file a broker wrote: %v (files: %s)", err, listDir(n.dir))
	}
	t.Logf("FORMAT holds %q", orig)
	cases := []struct {
		name    string
		content string // "" = remove the file
		want    []string
	}{
		{"other version", "warren-storage 99\n", []string{"incompatible storage format", "99"}},
		{"garbage", "not a warren directory\n", []string{"incompatible storage format"}},
		{"missing", "", []string{"incompatible storage format"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.content == "" {
				if err := os.Remove(formatPath); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(formatPath, []byte(c.content), 0o644); err != nil {
				t.Fatal(err)
			}
			code, out := serveToExit(t, n.dir, 15*time.Second)
			if code == 0 {
				t.Errorf("warren serve exited 0; want non-zero\n%s", out)
			}
			for _, w := range append(c.want, n.dir) {
				if !strings.Contains(out, w) {
					t.Errorf("output does not contain %q:\n%s", w, out)
				}
			}
			after, err := os.ReadFile(formatPath)
			switch {
			case c.content == "" && err == nil:
				t.Errorf("the refused start created a FORMAT file %q", after)
			case c.content != "" && string(after) != c.content:
				t.Errorf("the refused start changed the FORMAT file to %q (%v)", after, err)
			}
			t.Logf("refused: %s", strings.TrimSpace(out))
		})
	}

	if err := os.WriteFile(formatPath, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	n.start()
	conn = dial(t, n.b.URL)
	ds := getAll(t, confirmChannel(t, conn), "format.q", 5*time.Second)
	if got := bodies(ds); !slices.Equal(got, []string{"kept"}) {
		t.Errorf("with FORMAT restored, format.q holds %q; want [kept]", got)
	}
}

// TestBacklogMillion (WARREN_BIG=1): 1,000,000 persistent 1 KB messages are published with
// confirms by 4 publishers to a durable queue, then drained by one consumer with prefetch 1000
// and multiple acks. The broker's VmRSS, sampled every 200 ms, must stay under 300 MB in both
// phases, and after the drain, while the broker's value-log GC reclaims the space.
// Fill and drain rates are logged. WARREN_BIG_MESSAGES changes the count;
// WARREN_BIG_GCTRACE=1 runs the broker with GODEBUG=gctrace=1 and logs a summary of its GCs.
func TestBacklogMillion(t *testing.T) {
	if os.Getenv("WARREN_BIG") != "1" {
		t.Skip("set WARREN_BIG=1 to run (takes minutes, writes about 1.1 GB)")
	}
	const (
		queue      = "backlog.q"
		publishers = 4
		size       = 1024
		window     = 1000
		prefetch   = 1000
		ackEvery   = 500
		rssLimit   = 300 << 20
	)
	total := envInt(t, "WARREN_BIG_MESSAGES", 1_000_000)
	perPublisher := total / publishers
	total = perPublisher * publishers
	if os.Getenv("WARREN_BIG_GCTRACE") == "1" {
		// The broker inherits it and writes a line per GC to its log; summarised below.
		t.Setenv("GODEBUG", "gctrace=1")
	}
	brokerStart := time.Now()
	n := newNode(t)
	pid := n.b.PID()
	conn := dial(t, n.b.URL)
	setup, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setup.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	idleMem, _ := readMem(fmt.Sprintf("/proc/%d/status", pid))
	sampler := startRSSSampler(pid, 200*time.Millisecond, "fill", rssLimit)
	defer sampler.Stop()

	// Fill.
	fillStart := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	var confirmed atomic.Int64
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := amqp.DialConfig(n.b.URL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			ch, err := c.Channel()
			if err == nil {
				err = ch.Confirm(false)
			}
			if err != nil {
				errs <- err
				return
			}
			ctx := context.Background()
			pending := make([]*amqp.DeferredConfirmation, 0, window)
			wait := func(dc *amqp.DeferredConfirmation) error {
				ok, err := dc.WaitContext(ctx)
				if err == nil && !ok {
					err = errors.New("publish nacked or channel closed")
				}
				confirmed.Add(1)
				return err
			}
			for i := range perPublisher {
				if len(pending) == window {
					if err := wait(pending[0]); err != nil {
						errs <- fmt.Errorf("publisher %d: %w", p, err)
						return
					}
					pending = pending[1:]
				}
				id := fmt.Sprintf("b%d-%07d", p, i)
				dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false,
					amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: id, Body: killBody(id, size)})
				if err != nil {
					errs <- fmt.Errorf("publisher %d: publish %d: %w", p, i, err)
					return
				}
				pending = append(pending, dc)
			}
			for _, dc := range pending {
				if err := wait(dc); err != nil {
					errs <- fmt.Errorf("publisher %d: %w", p, err)
					return
				}
			}
		}()
	}
	progressDone := make(chan struct{})
	go func() {
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-progressDone:
				return
			case <-tick.C:
				t.Logf("fill: %d confirmed after %v, RSS %v", confirmed.Load(), time.Since(fillStart).Round(time.Second), sampler.lastRSS())
			}
		}
	}()
	wg.Wait()
	close(progressDone)
	close(errs)
	for err := range errs {
		t.Fatalf("fill: %v", err)
	}
	fillTime := time.Since(fillStart)
	sampler.setPhase("settle")
	fillSmaps := smapsRollup(pid)
	q, err := setup.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != total {
		t.Errorf("queue holds %d messages after the fill; want %d", q.Messages, total)
	}
	settled, _ := readMem(fmt.Sprintf("/proc/%d/status", pid))

	// Drain.
	sampler.setPhase("drain")
	drainStart := time.Now()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "drain", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := make([][]bool, publishers)
	for p := range seen {
		seen[p] = make([]bool, perPublisher)
	}
	got, dups, bad := 0, 0, 0
	idle := time.NewTimer(30 * time.Second)
	for got < total {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatalf("drain consumer closed after %d messages", got)
			}
			got++
			var p, i int
			if _, err := fmt.Sscanf(d.MessageId, "b%d-%d", &p, &i); err != nil || p < 0 || p >= publishers || i < 0 || i >= perPublisher ||
				len(d.Body) != size || string(d.Body[:len(d.MessageId)]) != d.MessageId {
				bad++
			} else if seen[p][i] {
				dups++
			} else {
				seen[p][i] = true
			}
			if got%ackEvery == 0 || got == total {
				if err := d.Ack(true); err != nil {
					t.Fatalf("ack: %v", err)
				}
			}
			if got%100_000 == 0 {
				t.Logf("drain: %d after %v, RSS %v", got, time.Since(drainStart).Round(time.Second), sampler.lastRSS())
			}
			idle.Reset(30 * time.Second)
		case <-idle.C:
			t.Fatalf("drain: no delivery for 30s after %d of %d", got, total)
		}
	}
	drainTime := time.Since(drainStart)
	drainSmaps := smapsRollup(pid)

	// After the drain the value log is all garbage, and the broker's background value-log GC
	// (every minute from the start) reclaims it. Keep sampling until the value-log files shrank to
	// less than half, or two GC ticks after the end of the drain have passed.
	sampler.setPhase("after drain")
	vlogDrained := dirBytes(n.dir, ".vlog")
	sinceStart := time.Since(brokerStart)
	afterUntil := brokerStart.Add((sinceStart/time.Minute + 2) * time.Minute).Add(10 * time.Second)
	reclaimed := time.Duration(-1)
	for time.Now().Before(afterUntil) {
		if dirBytes(n.dir, ".vlog") < vlogDrained/2 {
			reclaimed = time.Since(brokerStart)
			time.Sleep(5 * time.Second) // a few more samples after the GC
			break
		}
		time.Sleep(time.Second)
	}
	vlogAfter := dirBytes(n.dir, ".vlog")
	afterSmaps := smapsRollup(pid)
	peaks := sampler.Stop()

	fillRate := float64(total) / fillTime.Seconds()
	drainRate := float64(total) / drainTime.Seconds()
	t.Logf("RSS idle %v", idleMem)
	t.Logf("fill: %d messages of %d B in %v = %.0f msg/s (%.1f MB/s); peak RSS %v; after the fill %v",
		total, size, fillTime.Round(time.Millisecond), fillRate, fillRate*size/1e6, peaks["fill"], settled)
	t.Logf("drain: %v = %.0f msg/s (%.1f MB/s); peak RSS %v; duplicates %d, bad %d",
		drainTime.Round(time.Millisecond), drainRate, drainRate*size/1e6, peaks["drain"], dups, bad)
	gcNote := "not reclaimed within two GC intervals"
	if reclaimed >= 0 {
		gcNote = fmt.Sprintf("less than half left %v after the broker started", reclaimed.Round(time.Second))
	}
	t.Logf("after the drain (sampled until %v after the broker started): peak RSS %v; value-log files %d MB at the end of the drain, %d MB at the end (%s)",
		time.Since(brokerStart).Round(time.Second), peaks["after drain"], vlogDrained>>20, vlogAfter>>20, gcNote)
	for _, ph := range []string{"fill", "settle", "drain", "after drain"} {
		if peaks[ph].RSS >= rssLimit {
			t.Errorf("%s: peak RSS %v; want under %d MB", ph, peaks[ph], rssLimit>>20)
		}
	}
	if gc := gcTraceSummary(n.b.logs()); gc != "" {
		t.Logf("broker GC trace: %s", gc)
		if t.Failed() {
			var lines []string
			for _, l := range strings.Split(n.b.logs(), "\n") {
				if strings.HasPrefix(l, "gc ") {
					lines = append(lines, l)
				}
			}
			t.Logf("broker GC trace lines:\n%s", strings.Join(lines, "\n"))
		}
	}
	for ph, d := range sampler.Details() {
		t.Logf("%s: the largest resident mappings at the peak (%v):\n%s", ph, peaks[ph], d)
	}
	if t.Failed() {
		t.Logf("smaps_rollup after the fill:\n%s\nafter the drain:\n%s\nat the end:\n%s\nstatus now:\n%s",
			fillSmaps, drainSmaps, afterSmaps, procStatusMem(pid))
	}
	if bad > 0 || dups > 0 {
		t.Errorf("drain: %d damaged or unknown messages, %d duplicates", bad, dups)
	}
}
