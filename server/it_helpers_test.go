package server_test

// Component-test harness: every TestIT* test drives a broker through the real
// amqp091-go client over TCP. The broker is started in process on
// 127.0.0.1:0, or, when WARREN_TEST_URL is set, the tests run against that
// broker instead (for example a reference RabbitMQ), so that the expectations
// encoded here can be checked against RabbitMQ itself.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"
)

// waitFor bounds every wait for something the broker is expected to do.
const waitFor = 5 * time.Second

// quiet is how long a test waits to be convinced that nothing more arrives.
const quiet = 150 * time.Millisecond

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// rabbitmq-stream-go-client's own background goroutines outlive Environment.Close briefly
		// (TestITOperatorLogLines).
		goleak.IgnoreAnyFunction("github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream.(*Client).heartBeat.func1"),
		goleak.IgnoreAnyFunction("github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream.(*Client).handleResponse"),
	)
}

// externalURL returns the URL of an external broker under test, if any.
func externalURL() string { return os.Getenv("WARREN_TEST_URL") }

// againstRabbitMQ reports whether the suite runs against an external broker.
func againstRabbitMQ() bool { return externalURL() != "" }

// startBroker returns the AMQP URL of the broker under test: WARREN_TEST_URL
// when set, otherwise a fresh in-process broker stopped at the end of the test.
func startBroker(t *testing.T) string {
	t.Helper()
	if u := externalURL(); u != "" {
		return u
	}
	return startInProcess(t)
}

// itConn is a client connection whose close notification was registered at
// dial time, so no server-sent connection.close can be missed.
type itConn struct {
	*amqp.Connection
	closed chan *amqp.Error
}

// itChan is a client channel whose close notification was registered right
// after it was opened.
type itChan struct {
	*amqp.Channel
	conn   *itConn
	closed chan *amqp.Error
}

// mustDial opens a connection with the client's defaults and closes it at the
// end of the test.
func mustDial(t *testing.T, url string) *itConn {
	t.Helper()
	return mustDialConfig(t, url, amqp.Config{})
}

// mustDialConfig opens a connection with cfg and closes it at the end of the test.
func mustDialConfig(t *testing.T, url string, cfg amqp.Config) *itConn {
	t.Helper()
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 10 * time.Second // amqp.Dial's default
	}
	c, err := amqp.DialConfig(url, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	ic := &itConn{Connection: c, closed: c.NotifyClose(make(chan *amqp.Error, 1))}
	t.Cleanup(func() { _ = c.Close() })
	return ic
}

// mustChannel opens a channel on c and closes it at the end of the test.
func mustChannel(t *testing.T, c *itConn) *itChan {
	t.Helper()
	ch, err := c.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	ic := &itChan{Channel: ch, conn: c, closed: ch.NotifyClose(make(chan *amqp.Error, 1))}
	t.Cleanup(func() { _ = ch.Close() })
	return ic
}

// mustConfirmChannel opens a channel in confirm mode.
func mustConfirmChannel(t *testing.T, c *itConn) *itChan {
	t.Helper()
	ch := mustChannel(t, c)
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	return ch
}

// checkAMQPError asserts that err is a server-sent *amqp.Error with the given
// code and, when text is not empty, exactly that reply text.
func checkAMQPError(t *testing.T, err error, code int, text string) {
	t.Helper()
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		t.Fatalf("error = %v (%T), want *amqp.Error %d %q", err, err, code, text)
	}
	if ae.Code != code || (text != "" && ae.Reason != text) {
		t.Fatalf("error = %d %q, want %d %q", ae.Code, ae.Reason, code, text)
	}
}

// expectChannelClosed waits for the server to close ch with code and text (text
// "" = any text) and checks that the channel's connection is still open.
func expectChannelClosed(t *testing.T, ch *itChan, code int, text string) {
	t.Helper()
	select {
	case e, ok := <-ch.closed:
		if !ok || e == nil {
			t.Fatalf("channel closed without an error, want %d %q", code, text)
		}
		checkAMQPError(t, e, code, text)
	case <-time.After(waitFor):
		t.Fatalf("channel not closed within %v, want %d %q", waitFor, code, text)
	}
	if !ch.IsClosed() {
		t.Fatalf("channel reported an error but is not closed")
	}
	if ch.conn.IsClosed() {
		t.Fatalf("channel error %d closed the whole connection", code)
	}
}

// expectConnClosed waits for the server to close c with code and text (text ""
// = any text).
func expectConnClosed(t *testing.T, c *itConn, code int, text string) {
	t.Helper()
	select {
	case e, ok := <-c.closed:
		if !ok || e == nil {
			t.Fatalf("connection closed without an error, want %d %q", code, text)
		}
		checkAMQPError(t, e, code, text)
	case <-time.After(waitFor):
		t.Fatalf("connection not closed within %v, want %d %q", waitFor, code, text)
	}
	deadline := time.Now().Add(waitFor)
	for !c.IsClosed() {
		if time.Now().After(deadline) {
			t.Fatalf("connection reported an error but is not closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// expectOpen checks that ch (and its connection) still work with a round trip.
func expectOpen(t *testing.T, ch *itChan) {
	t.Helper()
	if _, err := ch.QueueDeclare("", false, true, true, false, nil); err != nil {
		t.Fatalf("channel should still work: %v", err)
	}
}

// recvWithin waits up to d for one delivery.
func recvWithin(t *testing.T, deliveries <-chan amqp.Delivery, d time.Duration) amqp.Delivery {
	t.Helper()
	select {
	case m, ok := <-deliveries:
		if !ok {
			t.Fatalf("delivery channel closed while waiting for a delivery")
		}
		return m
	case <-time.After(d):
		t.Fatalf("no delivery within %v", d)
	}
	return amqp.Delivery{}
}

// recvBody waits for one delivery and checks its body.
func recvBody(t *testing.T, deliveries <-chan amqp.Delivery, want string) amqp.Delivery {
	t.Helper()
	m := recvWithin(t, deliveries, waitFor)
	if string(m.Body) != want {
		t.Fatalf("delivered body %q, want %q", m.Body, want)
	}
	return m
}

// noDelivery fails if anything is delivered within d.
func noDelivery(t *testing.T, deliveries <-chan amqp.Delivery, d time.Duration) {
	t.Helper()
	select {
	case m, ok := <-deliveries:
		if !ok {
			t.Fatalf("delivery channel closed, want it open and silent")
		}
		t.Fatalf("unexpected delivery %q (tag %d)", m.Body, m.DeliveryTag)
	case <-time.After(d):
	}
}

// uniq returns a name unique to this test and this run, so that tests can share
// one external broker and be rerun against it.
func uniq(t *testing.T, what string) string {
	n := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	if len(n) > 150 {
		n = n[:150]
	}
	return "it." + n + "." + what + "." + strconv.FormatInt(time.Now().UnixNano()%1_000_000_007, 36)
}

// deleteAtEnd deletes the named queues and exchanges when the test ends, over
// a fresh connection (an external broker is shared between runs).
func deleteAtEnd(t *testing.T, url string, queues, exchanges []string) {
	t.Helper()
	t.Cleanup(func() {
		c, err := amqp.Dial(url)
		if err != nil {
			t.Logf("cleanup dial: %v", err)
			return
		}
		defer func() { _ = c.Close() }()
		for _, q := range queues {
			ch, err := c.Channel()
			if err != nil {
				return
			}
			_, _ = ch.QueueDelete(q, false, false, false)
			_ = ch.Close()
		}
		for _, x := range exchanges {
			ch, err := c.Channel()
			if err != nil {
				return
			}
			_ = ch.ExchangeDelete(x, false, false)
			_ = ch.Close()
		}
	})
}

// declareQueue declares a plain transient queue named after the test and
// deletes it at the end of the test.
func declareQueue(t *testing.T, url string, ch *itChan, what string, args amqp.Table) string {
	t.Helper()
	name := uniq(t, what)
	if _, err := ch.QueueDeclare(name, false, false, false, false, args); err != nil {
		t.Fatalf("queue.declare %s: %v", name, err)
	}
	deleteAtEnd(t, url, []string{name}, nil)
	return name
}

// declareExchange declares an exchange named after the test and deletes it at
// the end of the test.
func declareExchange(t *testing.T, url string, ch *itChan, what, kind string, args amqp.Table) string {
	t.Helper()
	name := uniq(t, what)
	if err := ch.ExchangeDeclare(name, kind, false, false, false, false, args); err != nil {
		t.Fatalf("exchange.declare %s %s: %v", name, kind, err)
	}
	deleteAtEnd(t, url, nil, []string{name})
	return name
}

func mustBind(t *testing.T, ch *itChan, queue, key, exchange string, args amqp.Table) {
	t.Helper()
	if err := ch.QueueBind(queue, key, exchange, false, args); err != nil {
		t.Fatalf("queue.bind %s -[%s]-> %s: %v", exchange, key, queue, err)
	}
}

// publish publishes body (async, no confirm).
func publish(t *testing.T, ch *itChan, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := ch.PublishWithContext(ctx, exchange, key, false, false, msg); err != nil {
		t.Fatalf("publish to %q/%q: %v", exchange, key, err)
	}
}

// publishConfirmed publishes on a confirm-mode channel and waits for the ack.
func publishConfirmed(t *testing.T, ch *itChan, exchange, key string, mandatory bool, msg amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, false, msg)
	if err != nil {
		t.Fatalf("publish to %q/%q: %v", exchange, key, err)
	}
	if dc == nil {
		t.Fatalf("publishConfirmed needs a channel in confirm mode")
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		t.Fatalf("waiting for the confirm of publish to %q/%q: %v", exchange, key, err)
	}
	if !acked {
		t.Fatalf("publish to %q/%q was nacked", exchange, key)
	}
}

// publishBodies publishes each body to the default exchange with key queue
// and waits for the confirms (ch must be in confirm mode).
func publishBodies(t *testing.T, ch *itChan, queue string, bodies ...string) {
	t.Helper()
	for _, b := range bodies {
		publishConfirmed(t, ch, "", queue, false, amqp.Publishing{Body: []byte(b)})
	}
}

// mustGet fetches one message, which must exist.
func mustGet(t *testing.T, ch *itChan, queue string, autoAck bool) amqp.Delivery {
	t.Helper()
	m, ok, err := ch.Get(queue, autoAck)
	if err != nil {
		t.Fatalf("basic.get %s: %v", queue, err)
	}
	if !ok {
		t.Fatalf("basic.get %s: queue empty, want a message", queue)
	}
	return m
}

// mustGetBody fetches one message and checks its body.
func mustGetBody(t *testing.T, ch *itChan, queue string, autoAck bool, want string) amqp.Delivery {
	t.Helper()
	m := mustGet(t, ch, queue, autoAck)
	if string(m.Body) != want {
		t.Fatalf("basic.get %s: body %q, want %q", queue, m.Body, want)
	}
	return m
}

// expectEmpty checks that basic.get finds nothing in queue.
func expectEmpty(t *testing.T, ch *itChan, queue string) {
	t.Helper()
	m, ok, err := ch.Get(queue, true)
	if err != nil {
		t.Fatalf("basic.get %s: %v", queue, err)
	}
	if ok {
		t.Fatalf("basic.get %s: got %q, want get-empty", queue, m.Body)
	}
}

// mustConsume starts a consumer with an explicit tag.
func mustConsume(t *testing.T, ch *itChan, queue, tag string, autoAck bool, args amqp.Table) <-chan amqp.Delivery {
	t.Helper()
	d, err := ch.Consume(queue, tag, autoAck, false, false, false, args)
	if err != nil {
		t.Fatalf("basic.consume %s: %v", queue, err)
	}
	return d
}

// queueCounts returns the message and consumer counts of a passive declare.
func queueCounts(t *testing.T, ch *itChan, queue string) (messages, consumers int) {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("passive queue.declare %s: %v", queue, err)
	}
	return q.Messages, q.Consumers
}

// eventually polls cond until it holds or waitFor passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true within %v", what, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// queueExists reports whether queue exists, using a throwaway channel (a
// passive declare of a missing queue closes its channel).
func queueExists(t *testing.T, c *itConn, queue string) bool {
	t.Helper()
	ch, err := c.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	defer func() { _ = ch.Close() }()
	_, err = ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	return existsResult(t, err)
}

// exchangeExists reports whether exchange exists, using a throwaway channel.
func exchangeExists(t *testing.T, c *itConn, exchange string) bool {
	t.Helper()
	ch, err := c.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	defer func() { _ = ch.Close() }()
	err = ch.ExchangeDeclarePassive(exchange, "direct", false, false, false, false, nil)
	return existsResult(t, err)
}

func existsResult(t *testing.T, err error) bool {
	t.Helper()
	if err == nil {
		return true
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return false
	}
	if errors.As(err, &ae) && ae.Code == amqp.ResourceLocked {
		return true // another connection's exclusive queue
	}
	t.Fatalf("passive declare: %v", err)
	return false
}

// routedTo publishes a unique message through exchange with key and headers on
// a confirm-mode channel, then reports which of queues received it (each
// queue is drained of that message).
func routedTo(t *testing.T, ch *itChan, exchange, key string, headers amqp.Table, queues []string) []string {
	t.Helper()
	body := fmt.Sprintf("%s|%s|%d", exchange, key, time.Now().UnixNano())
	publishConfirmed(t, ch, exchange, key, false, amqp.Publishing{Headers: headers, Body: []byte(body)})
	var got []string
	for _, q := range queues {
		m, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatalf("basic.get %s: %v", q, err)
		}
		if !ok {
			continue
		}
		if string(m.Body) != body {
			t.Fatalf("queue %s held %q, want %q", q, m.Body, body)
		}
		got = append(got, q)
		if _, ok, _ := ch.Get(q, true); ok {
			t.Fatalf("queue %s received the message twice", q)
		}
	}
	return got
}

func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
