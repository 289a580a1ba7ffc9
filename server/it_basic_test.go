package server_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestITMandatoryReturn(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	returns := ch.NotifyReturn(make(chan amqp.Return, 10))
	key := uniq(t, "unbound")
	publishConfirmed(t, ch, "amq.direct", key, true, amqp.Publishing{
		ContentType: "text/plain", Headers: amqp.Table{"h": "v"}, Body: []byte("back"),
	})
	// The return precedes the confirm, so it is already here.
	select {
	case r := <-returns:
		if r.ReplyCode != 312 || r.ReplyText != "NO_ROUTE" {
			t.Errorf("basic.return %d %q, want 312 NO_ROUTE", r.ReplyCode, r.ReplyText)
		}
		if r.Exchange != "amq.direct" || r.RoutingKey != key {
			t.Errorf("basic.return exchange %q key %q, want amq.direct %q", r.Exchange, r.RoutingKey, key)
		}
		if string(r.Body) != "back" || r.ContentType != "text/plain" || r.Headers["h"] != "v" {
			t.Errorf("returned message %q %q %v, want the published one", r.Body, r.ContentType, r.Headers)
		}
	default:
		t.Fatalf("no basic.return before the confirm")
	}
	// Not mandatory: silently dropped.
	publishConfirmed(t, ch, "amq.direct", key, false, amqp.Publishing{Body: []byte("dropped")})
	// Mandatory to the default exchange with a missing queue name also returns.
	publishConfirmed(t, ch, "", uniq(t, "noqueue"), true, amqp.Publishing{Body: []byte("back2")})
	select {
	case r := <-returns:
		if r.ReplyCode != 312 || string(r.Body) != "back2" {
			t.Fatalf("got return %d %q, want 312 back2 (nothing for the non-mandatory publish)", r.ReplyCode, r.Body)
		}
	default:
		t.Fatalf("no basic.return for a mandatory publish to the default exchange")
	}
}

func TestITPublishImmediate(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	q := declareQueue(t, u, ch, "q", nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := ch.PublishWithContext(ctx, "", q, false, true, amqp.Publishing{Body: []byte("now")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	expectConnClosed(t, c, amqp.NotImplemented, "NOT_IMPLEMENTED - immediate=true")
	expectOpen(t, mustChannel(t, mustDial(t, u)))
}

func TestITServerGeneratedConsumerTag(t *testing.T) {
	// amqp091-go always sends its own consumer tag, so this uses a raw client.
	u := startBroker(t)
	r := rawDial(t, u)
	r.open("guest", "guest")
	var decl rawBuf
	const exclusive, autoDelete = 1 << 2, 1 << 3 // queue.declare flag bits
	decl.u16(0).short("").u8(exclusive | autoDelete).u32(0)
	r.send(1, 50, 10, &decl)
	f := r.expect(50, 11)
	qname := string(f.args[1 : 1+int(f.args[0])])
	tags := map[string]bool{}
	re := regexp.MustCompile(`^amq\.ctag-[A-Za-z0-9_-]{22}$`)
	for range 2 {
		var cons rawBuf
		cons.u16(0).short(qname).short("").u8(0).u32(0)
		r.send(1, 60, 20, &cons)
		f = r.expect(60, 21)
		tag := string(f.args[1 : 1+int(f.args[0])])
		if !re.MatchString(tag) {
			t.Errorf("server-generated consumer tag %q, want amq.ctag- and 22 base64url characters", tag)
		}
		if tags[tag] {
			t.Errorf("consumer tag %q generated twice", tag)
		}
		tags[tag] = true
	}
	r.close()
}

func TestITConsumerTagReuse(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	q := declareQueue(t, u, ch, "q", nil)
	mustConsume(t, ch, q, "dup", true, nil)
	_, err := ch.Consume(q, "dup", true, false, false, false, nil)
	want := "NOT_ALLOWED - attempt to reuse consumer tag 'dup'"
	checkAMQPError(t, err, amqp.NotAllowed, want)
	expectConnClosed(t, c, amqp.NotAllowed, want)
}

func TestITExclusiveConsumer(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	setup := mustChannel(t, c)
	q := declareQueue(t, u, setup, "q", nil)
	inUse := fmt.Sprintf("ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use", q)

	// A consumer exists: an exclusive consume is refused.
	ch1 := mustChannel(t, c)
	mustConsume(t, ch1, q, "plain", true, nil)
	ch2 := mustChannel(t, c)
	_, err := ch2.Consume(q, "excl", true, true, false, false, nil)
	checkAMQPError(t, err, amqp.AccessRefused, inUse)
	expectChannelClosed(t, ch2, amqp.AccessRefused, inUse)
	if err := ch1.Cancel("plain", false); err != nil {
		t.Fatal(err)
	}

	// An exclusive consumer exists: any other consume is refused, on any channel.
	ch3 := mustConfirmChannel(t, c)
	d := func() <-chan amqp.Delivery {
		d, err := ch3.Consume(q, "excl", true, true, false, false, nil)
		if err != nil {
			t.Fatalf("exclusive consume on a queue without consumers: %v", err)
		}
		return d
	}()
	for _, excl := range []bool{false, true} {
		ch := mustChannel(t, c)
		_, err := ch.Consume(q, "second", true, excl, false, false, nil)
		checkAMQPError(t, err, amqp.AccessRefused, inUse)
		expectChannelClosed(t, ch, amqp.AccessRefused, inUse)
	}
	publishBodies(t, ch3, q, "only for excl")
	recvBody(t, d, "only for excl")
}

func TestITConsumerPriorities(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	pub := mustConfirmChannel(t, c)
	q := declareQueue(t, u, pub, "q", nil)

	lowCh := mustChannel(t, c)
	highCh := mustChannel(t, c)
	if err := lowCh.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := highCh.Qos(2, 0, false); err != nil {
		t.Fatal(err)
	}
	low := mustConsume(t, lowCh, q, "low", false, amqp.Table{"x-priority": int32(1)})
	high := mustConsume(t, highCh, q, "high", false, amqp.Table{"x-priority": int32(10)})
	publishBodies(t, pub, q, "1", "2", "3", "4", "5")
	// The high-priority consumer takes what it has room for, the rest falls
	// through to the low-priority one.
	h1 := recvBody(t, high, "1")
	recvBody(t, high, "2")
	recvBody(t, low, "3")
	recvBody(t, low, "4")
	recvBody(t, low, "5")
	noDelivery(t, high, quiet)
	// With room again, the high-priority consumer gets the next message.
	if err := h1.Ack(false); err != nil {
		t.Fatal(err)
	}
	publishBodies(t, pub, q, "6")
	recvBody(t, high, "6")
	noDelivery(t, low, quiet)
}

func TestITConsumeCancel(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "q", nil)
	d := mustConsume(t, ch, q, "c", true, nil)
	publishBodies(t, ch, q, "before")
	recvBody(t, d, "before")
	if err := ch.Cancel("c", false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}
	select {
	case m, ok := <-d:
		if ok {
			t.Fatalf("delivery %q after cancel", m.Body)
		}
	case <-time.After(waitFor):
		t.Fatalf("deliveries not closed after cancel")
	}
	publishBodies(t, ch, q, "after")
	mustGetBody(t, ch, q, true, "after")
	// Cancelling an unknown tag is harmless.
	if err := ch.Cancel("never-existed", false); err != nil {
		t.Fatalf("cancel of an unknown tag: %v", err)
	}
	expectOpen(t, ch)
}

func TestITServerCancelOnQueueDelete(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	cancels := ch.NotifyCancel(make(chan string, 1))
	q := declareQueue(t, u, ch, "q", nil)
	d := mustConsume(t, ch, q, "victim", false, nil)

	other := mustChannel(t, mustDial(t, u))
	if _, err := other.QueueDelete(q, false, false, false); err != nil {
		t.Fatal(err)
	}
	select {
	case tag := <-cancels:
		if tag != "victim" {
			t.Fatalf("basic.cancel for %q, want victim", tag)
		}
	case <-time.After(waitFor):
		t.Fatalf("no basic.cancel from the server after the queue was deleted")
	}
	select {
	case _, ok := <-d:
		if ok {
			t.Fatalf("unexpected delivery")
		}
	case <-time.After(waitFor):
		t.Fatalf("deliveries not closed after the server cancelled the consumer")
	}
	// The channel stays open.
	expectOpen(t, ch)
}

func TestITBasicGet(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	q := declareQueue(t, u, ch, "q", nil)
	if _, ok, err := ch.Get(q, false); err != nil || ok {
		t.Fatalf("get on empty queue: ok=%v err=%v, want get-empty", ok, err)
	}
	publishBodies(t, ch, q, "a", "b")
	m1 := mustGetBody(t, ch, q, false, "a")
	if m1.MessageCount != 1 || m1.Redelivered || m1.Exchange != "" || m1.RoutingKey != q {
		t.Errorf("first get: count %d redelivered %v exchange %q key %q", m1.MessageCount, m1.Redelivered, m1.Exchange, m1.RoutingKey)
	}
	m2 := mustGetBody(t, ch, q, false, "b")
	if m2.MessageCount != 0 || m2.DeliveryTag != m1.DeliveryTag+1 {
		t.Errorf("second get: count %d tag %d (first tag %d)", m2.MessageCount, m2.DeliveryTag, m1.DeliveryTag)
	}
	expectEmpty(t, ch, q)
	if err := ch.Ack(m2.DeliveryTag, true); err != nil {
		t.Fatal(err)
	}
	expectOpen(t, ch)
	// Get from a missing queue is 404.
	missing := uniq(t, "missing")
	_, _, err := ch.Get(missing, true)
	want := fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", missing)
	checkAMQPError(t, err, amqp.NotFound, want)
	expectChannelClosed(t, ch, amqp.NotFound, want)
}

func TestITNackRequeueKeepsPosition(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	q := declareQueue(t, u, ch, "q", nil)
	publishBodies(t, ch, q, "1", "2", "3", "4", "5", "6")
	var got []amqp.Delivery
	for i := 1; i <= 4; i++ {
		got = append(got, mustGetBody(t, ch, q, false, fmt.Sprint(i)))
	}
	// Requeue 4 then 2: they return to their original places, 2 before 4,
	// both ahead of 5 and 6.
	if err := got[3].Nack(false, true); err != nil {
		t.Fatal(err)
	}
	if err := got[1].Nack(false, true); err != nil {
		t.Fatal(err)
	}
	if err := ch.Ack(got[0].DeliveryTag, false); err != nil {
		t.Fatal(err)
	}
	if err := ch.Ack(got[2].DeliveryTag, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		body        string
		redelivered bool
	}{{"2", true}, {"4", true}, {"5", false}, {"6", false}} {
		m := mustGetBody(t, ch, q, false, want.body)
		if m.Redelivered != want.redelivered {
			t.Errorf("message %s redelivered=%v, want %v", want.body, m.Redelivered, want.redelivered)
		}
		if err := m.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	expectEmpty(t, ch, q)
}

func TestITAckNackRejectMultiple(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	q := declareQueue(t, u, ch, "q", nil)
	publishBodies(t, ch, q, "1", "2", "3", "4", "5", "6", "7")
	var tags []uint64
	for i := 1; i <= 7; i++ {
		tags = append(tags, mustGetBody(t, ch, q, false, fmt.Sprint(i)).DeliveryTag)
	}
	// ack multiple up to 2; nack multiple 3..4 requeue; reject 5 without
	// requeue (dropped); nack multiple 6..7 without requeue (dropped).
	if err := ch.Ack(tags[1], true); err != nil {
		t.Fatal(err)
	}
	if err := ch.Nack(tags[3], true, true); err != nil {
		t.Fatal(err)
	}
	if err := ch.Reject(tags[4], false); err != nil {
		t.Fatal(err)
	}
	if err := ch.Nack(tags[6], true, false); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the 2 requeued messages back in the queue", func() bool {
		m, _ := queueCounts(t, ch, q)
		return m == 2
	})
	m3 := mustGetBody(t, ch, q, false, "3")
	m4 := mustGetBody(t, ch, q, false, "4")
	if !m3.Redelivered || !m4.Redelivered {
		t.Fatalf("requeued messages not marked redelivered")
	}
	// reject with requeue puts it back.
	if err := m4.Reject(true); err != nil {
		t.Fatal(err)
	}
	if err := m3.Ack(false); err != nil {
		t.Fatal(err)
	}
	mustGetBody(t, ch, q, true, "4")
	expectEmpty(t, ch, q)
}

func TestITUnknownDeliveryTag(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	t.Run("ack", func(t *testing.T) {
		ch := mustChannel(t, c)
		if err := ch.Ack(99, false); err != nil {
			t.Fatal(err)
		}
		expectChannelClosed(t, ch, amqp.PreconditionFailed, "PRECONDITION_FAILED - unknown delivery tag 99")
	})
	t.Run("nack multiple", func(t *testing.T) {
		ch := mustChannel(t, c)
		if err := ch.Nack(7, true, true); err != nil {
			t.Fatal(err)
		}
		expectChannelClosed(t, ch, amqp.PreconditionFailed, "PRECONDITION_FAILED - unknown delivery tag 7")
	})
	t.Run("reject", func(t *testing.T) {
		ch := mustChannel(t, c)
		if err := ch.Reject(3, true); err != nil {
			t.Fatal(err)
		}
		expectChannelClosed(t, ch, amqp.PreconditionFailed, "PRECONDITION_FAILED - unknown delivery tag 3")
	})
	t.Run("double ack", func(t *testing.T) {
		ch := mustConfirmChannel(t, c)
		q := declareQueue(t, u, ch, "q", nil)
		publishBodies(t, ch, q, "once")
		m := mustGet(t, ch, q, false)
		if err := m.Ack(false); err != nil {
			t.Fatal(err)
		}
		if err := m.Ack(false); err != nil {
			t.Fatal(err)
		}
		expectChannelClosed(t, ch, amqp.PreconditionFailed,
			fmt.Sprintf("PRECONDITION_FAILED - unknown delivery tag %d", m.DeliveryTag))
	})
	t.Run("ack of a no-ack delivery", func(t *testing.T) {
		ch := mustConfirmChannel(t, c)
		q := declareQueue(t, u, ch, "q", nil)
		publishBodies(t, ch, q, "auto")
		m := mustGet(t, ch, q, true)
		if err := ch.Ack(m.DeliveryTag, false); err != nil {
			t.Fatal(err)
		}
		expectChannelClosed(t, ch, amqp.PreconditionFailed,
			fmt.Sprintf("PRECONDITION_FAILED - unknown delivery tag %d", m.DeliveryTag))
	})
}

func TestITRecover(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	q := declareQueue(t, u, ch, "q", nil)
	d := mustConsume(t, ch, q, "c", false, nil)
	publishBodies(t, ch, q, "1", "2")
	a := recvBody(t, d, "1")
	b := recvBody(t, d, "2")
	if a.Redelivered || b.Redelivered {
		t.Fatalf("first deliveries marked redelivered")
	}
	if err := ch.Recover(true); err != nil {
		t.Fatalf("basic.recover: %v", err)
	}
	for _, want := range []string{"1", "2"} {
		m := recvBody(t, d, want)
		if !m.Redelivered {
			t.Errorf("recovered message %s not marked redelivered", want)
		}
		if m.DeliveryTag <= b.DeliveryTag {
			t.Errorf("recovered message %s has tag %d, want a new tag above %d", want, m.DeliveryTag, b.DeliveryTag)
		}
		if err := m.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	noDelivery(t, d, quiet)
	expectEmpty(t, ch, q)
}

func TestITQosPerConsumer(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "q", nil)
	publishBodies(t, ch, q, "1", "2", "3", "4", "5")
	cch := mustChannel(t, c)
	if err := cch.Qos(2, 0, false); err != nil {
		t.Fatal(err)
	}
	// Each consumer on the channel gets its own prefetch of 2.
	d1 := mustConsume(t, cch, q, "c1", false, nil)
	m1 := recvBody(t, d1, "1")
	recvBody(t, d1, "2")
	noDelivery(t, d1, quiet)
	d2 := mustConsume(t, cch, q, "c2", false, nil)
	recvBody(t, d2, "3")
	recvBody(t, d2, "4")
	noDelivery(t, d2, quiet)
	if err := m1.Ack(false); err != nil {
		t.Fatal(err)
	}
	recvBody(t, d1, "5")
	noDelivery(t, d1, quiet)
	noDelivery(t, d2, 0)
}

func TestITQosGlobal(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	pub := mustConfirmChannel(t, c)
	q1 := declareQueue(t, u, pub, "q1", nil)
	q2 := declareQueue(t, u, pub, "q2", nil)
	for i := range 4 {
		publishBodies(t, pub, q1, fmt.Sprint("a", i))
		publishBodies(t, pub, q2, fmt.Sprint("b", i))
	}
	ch := mustChannel(t, c)
	if err := ch.Qos(3, 0, true); err != nil {
		t.Fatal(err)
	}
	d1 := mustConsume(t, ch, q1, "c1", false, nil)
	d2 := mustConsume(t, ch, q2, "c2", false, nil)
	var held []amqp.Delivery
	for len(held) < 3 {
		select {
		case m := <-d1:
			held = append(held, m)
		case m := <-d2:
			held = append(held, m)
		case <-time.After(waitFor):
			t.Fatalf("only %d deliveries, want 3 across both consumers", len(held))
		}
	}
	noDelivery(t, d1, quiet)
	noDelivery(t, d2, 0)
	if err := held[0].Ack(false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d1:
	case <-d2:
	case <-time.After(waitFor):
		t.Fatalf("no delivery after an ack freed the channel's prefetch")
	}
	noDelivery(t, d1, quiet)
	noDelivery(t, d2, 0)
}

func TestITUnackedReturnOnClose(t *testing.T) {
	for _, how := range []string{"channel", "connection"} {
		t.Run(how, func(t *testing.T) {
			u := startBroker(t)
			c := mustDial(t, u)
			ch := mustConfirmChannel(t, c)
			q := declareQueue(t, u, ch, "q", nil)
			publishBodies(t, ch, q, "1", "2", "3", "4")

			cc := mustDial(t, u)
			cch := mustChannel(t, cc)
			d := mustConsume(t, cch, q, "c", false, nil)
			recvBody(t, d, "1")
			m2 := recvBody(t, d, "2")
			recvBody(t, d, "3")
			recvBody(t, d, "4")
			if err := m2.Ack(false); err != nil {
				t.Fatal(err)
			}
			// The ack is processed before the consumer's channel closes.
			if err := cch.Qos(0, 0, false); err != nil {
				t.Fatal(err)
			}
			if m, _ := queueCounts(t, ch, q); m != 0 {
				t.Fatalf("%d ready messages while all are delivered", m)
			}
			var err error
			if how == "channel" {
				err = cch.Close()
			} else {
				err = cc.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "unacked messages back in the queue", func() bool {
				m, _ := queueCounts(t, ch, q)
				return m == 3
			})
			for _, want := range []string{"1", "3", "4"} {
				if m := mustGetBody(t, ch, q, true, want); !m.Redelivered {
					t.Errorf("returned message %s not marked redelivered", want)
				}
			}
			expectEmpty(t, ch, q)
		})
	}
}

func TestITPublisherConfirms(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 100))
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	// Selecting confirm mode again is fine.
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("second confirm.select: %v", err)
	}
	q := declareQueue(t, u, ch, "q", nil)
	const n = 50
	for i := range n {
		key := q
		if i%10 == 3 {
			key = uniq(t, "unroutable") // unroutable messages are confirmed too
		}
		publish(t, ch, "", key, amqp.Publishing{Body: []byte(fmt.Sprint(i))})
	}
	for i := 1; i <= n; i++ {
		select {
		case cf := <-confirms:
			if cf.DeliveryTag != uint64(i) || !cf.Ack {
				t.Fatalf("confirmation %+v, want ack of tag %d", cf, i)
			}
		case <-time.After(waitFor):
			t.Fatalf("confirmation %d missing", i)
		}
	}
	// Deferred confirmations carry the same increasing tags.
	for i := n + 1; i <= n+3; i++ {
		dc, err := ch.PublishWithDeferredConfirm("", q, false, false, amqp.Publishing{Body: []byte("d")})
		if err != nil {
			t.Fatal(err)
		}
		if dc.DeliveryTag != uint64(i) {
			t.Errorf("deferred confirmation tag %d, want %d", dc.DeliveryTag, i)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		ok, err := dc.WaitContext(ctx)
		cancel()
		if err != nil || !ok {
			t.Fatalf("deferred confirmation %d: acked=%v err=%v", i, ok, err)
		}
		<-confirms
	}
	if m, _ := queueCounts(t, ch, q); m != n-n/10+3 {
		t.Fatalf("queue holds %d messages, want %d", m, n-n/10+3)
	}
}

func TestITConfirmAndTxExclusive(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	t.Run("confirm then tx", func(t *testing.T) {
		ch := mustConfirmChannel(t, c)
		err := ch.Tx()
		want := "PRECONDITION_FAILED - cannot switch from confirm to tx mode"
		checkAMQPError(t, err, amqp.PreconditionFailed, want)
		expectChannelClosed(t, ch, amqp.PreconditionFailed, want)
	})
	t.Run("tx then confirm", func(t *testing.T) {
		ch := mustChannel(t, c)
		if err := ch.Tx(); err != nil {
			t.Fatal(err)
		}
		err := ch.Confirm(false)
		want := "PRECONDITION_FAILED - cannot switch from tx to confirm mode"
		checkAMQPError(t, err, amqp.PreconditionFailed, want)
		expectChannelClosed(t, ch, amqp.PreconditionFailed, want)
	})
}

func TestITTxPublish(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	obs := mustChannel(t, c)
	q := declareQueue(t, u, obs, "q", nil)
	ch := mustChannel(t, c)
	if err := ch.Tx(); err != nil {
		t.Fatalf("tx.select: %v", err)
	}
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("rolled back")})
	// The tx.rollback round trip orders the publish before the check below.
	if err := ch.TxRollback(); err != nil {
		t.Fatalf("tx.rollback: %v", err)
	}
	expectEmpty(t, obs, q)

	publish(t, ch, "", q, amqp.Publishing{Body: []byte("one")})
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("two")})
	expectEmpty(t, obs, q) // nothing visible before the commit
	if err := ch.TxCommit(); err != nil {
		t.Fatalf("tx.commit: %v", err)
	}
	mustGetBody(t, obs, q, true, "one")
	mustGetBody(t, obs, q, true, "two")
	// The channel stays transactional: a commit with nothing pending is fine.
	if err := ch.TxCommit(); err != nil {
		t.Fatalf("empty tx.commit: %v", err)
	}
	// A mandatory unroutable publish in a tx is returned at commit.
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := ch.PublishWithContext(ctx, "amq.direct", uniq(t, "nobody"), true, false, amqp.Publishing{Body: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	if err := ch.TxCommit(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-returns:
		if r.ReplyCode != 312 {
			t.Fatalf("return %d, want 312", r.ReplyCode)
		}
	case <-time.After(waitFor):
		t.Fatalf("no basic.return for a mandatory unroutable publish in a transaction")
	}
}

func TestITTxAcks(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	obs := mustConfirmChannel(t, c)
	q := declareQueue(t, u, obs, "q", nil)
	publishBodies(t, obs, q, "1", "2")

	ch := mustChannel(t, c)
	if err := ch.Tx(); err != nil {
		t.Fatal(err)
	}
	m := mustGetBody(t, ch, q, false, "1")
	if err := m.Ack(false); err != nil {
		t.Fatal(err)
	}
	// Rolled back: the ack is forgotten, the message stays unacked on the
	// channel and comes back when the channel closes.
	if err := ch.TxRollback(); err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "rolled-back ack: message back in the queue", func() bool {
		n, _ := queueCounts(t, obs, q)
		return n == 2
	})

	ch = mustChannel(t, c)
	if err := ch.Tx(); err != nil {
		t.Fatal(err)
	}
	m = mustGetBody(t, ch, q, false, "1")
	if !m.Redelivered {
		t.Errorf("message returned by channel close not marked redelivered")
	}
	if err := m.Ack(false); err != nil {
		t.Fatal(err)
	}
	if err := ch.TxCommit(); err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	// Committed: the message is gone for good.
	mustGetBody(t, obs, q, true, "2")
	expectEmpty(t, obs, q)
}

func TestITTxNotTransactional(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	const want = "PRECONDITION_FAILED - channel is not transactional"
	t.Run("commit", func(t *testing.T) {
		ch := mustChannel(t, c)
		err := ch.TxCommit()
		checkAMQPError(t, err, amqp.PreconditionFailed, want)
		expectChannelClosed(t, ch, amqp.PreconditionFailed, want)
	})
	t.Run("rollback", func(t *testing.T) {
		ch := mustChannel(t, c)
		err := ch.TxRollback()
		checkAMQPError(t, err, amqp.PreconditionFailed, want)
		expectChannelClosed(t, ch, amqp.PreconditionFailed, want)
	})
}

func TestITDirectReplyTo(t *testing.T) {
	u := startBroker(t)
	const replyTo = "amq.rabbitmq.reply-to"
	server := mustConfirmChannel(t, mustDial(t, u))
	rq := declareQueue(t, u, server, "requests", nil)
	requests := mustConsume(t, server, rq, "responder", false, nil)

	client := mustChannel(t, mustDial(t, u))
	replies := mustConsume(t, client, replyTo, "replies", true, nil)
	publish(t, client, "", rq, amqp.Publishing{ReplyTo: replyTo, CorrelationId: "42", Body: []byte("ping")})

	req := recvBody(t, requests, "ping")
	if !strings.HasPrefix(req.ReplyTo, replyTo+".") {
		t.Fatalf("request reply-to %q, want it rewritten to %s.<opaque>", req.ReplyTo, replyTo)
	}
	publishConfirmed(t, server, "", req.ReplyTo, true, amqp.Publishing{CorrelationId: req.CorrelationId, Body: []byte("pong")})
	if err := req.Ack(false); err != nil {
		t.Fatal(err)
	}
	rep := recvBody(t, replies, "pong")
	if rep.CorrelationId != "42" {
		t.Errorf("reply correlation id %q, want 42", rep.CorrelationId)
	}
	if rep.RoutingKey != req.ReplyTo {
		t.Errorf("reply routing key %q, want %q", rep.RoutingKey, req.ReplyTo)
	}
}

func TestITDirectReplyToErrors(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	const replyTo = "amq.rabbitmq.reply-to"
	t.Run("manual ack consume", func(t *testing.T) {
		ch := mustChannel(t, c)
		_, err := ch.Consume(replyTo, "r", false, false, false, false, nil)
		want := "PRECONDITION_FAILED - reply consumer cannot acknowledge"
		checkAMQPError(t, err, amqp.PreconditionFailed, want)
		expectChannelClosed(t, ch, amqp.PreconditionFailed, want)
	})
	t.Run("publish without a reply consumer", func(t *testing.T) {
		ch := mustChannel(t, c)
		q := declareQueue(t, u, ch, "q", nil)
		publish(t, ch, "", q, amqp.Publishing{ReplyTo: replyTo, Body: []byte("x")})
		expectChannelClosed(t, ch, amqp.PreconditionFailed, "PRECONDITION_FAILED - fast reply consumer does not exist")
	})
}

func TestITLargeMessage(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "q", nil)
	body := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range body {
		body[i] = byte(rng.Uint32())
	}
	publishConfirmed(t, ch, "", q, false, amqp.Publishing{Body: body})
	d := mustConsume(t, mustChannel(t, c), q, "c", true, nil)
	m := recvWithin(t, d, waitFor)
	if !bytes.Equal(m.Body, body) {
		t.Fatalf("1 MiB body changed in transit (got %d bytes)", len(m.Body))
	}
	// A body just past a multiple of the frame size.
	publishConfirmed(t, ch, "", q, false, amqp.Publishing{Body: body[:3*131072+17]})
	m = recvWithin(t, d, waitFor)
	if !bytes.Equal(m.Body, body[:3*131072+17]) {
		t.Fatalf("frame-boundary body changed in transit")
	}
}

func TestITEmptyBody(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	q := declareQueue(t, u, ch, "q", nil)
	publishConfirmed(t, ch, "", q, false, amqp.Publishing{MessageId: "empty"})
	m := mustGet(t, ch, q, true)
	if len(m.Body) != 0 || m.MessageId != "empty" {
		t.Fatalf("empty message arrived as body %q id %q", m.Body, m.MessageId)
	}
	d := mustConsume(t, ch, q, "c", true, nil)
	publishConfirmed(t, ch, "", q, false, amqp.Publishing{})
	if m := recvWithin(t, d, waitFor); len(m.Body) != 0 {
		t.Fatalf("empty message delivered with body %q", m.Body)
	}
}

func TestITPropertiesRoundTrip(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	q := declareQueue(t, u, ch, "q", nil)
	ts := time.Unix(1700000000, 0)
	headers := amqp.Table{
		"bool":      true,
		"int8":      int8(-8),
		"uint8":     byte(200),
		"int16":     int16(-1600),
		"uint16":    uint16(60000),
		"int32":     int32(-320000),
		"uint32":    uint32(4000000000),
		"int64":     int64(-6400000000000),
		"float32":   float32(1.5),
		"float64":   float64(-2.25),
		"decimal":   amqp.Decimal{Scale: 2, Value: 12345},
		"string":    "héllo",
		"bytes":     []byte{0, 1, 2, 0xff},
		"array":     []any{"a", int32(1), true, []any{int64(2)}, amqp.Table{"in": "array"}},
		"timestamp": ts,
		"table":     amqp.Table{"nested": amqp.Table{"deep": int32(7)}, "s": "t"},
		"void":      nil,
		"":          "empty key",
	}
	pub := amqp.Publishing{
		Headers:         headers,
		ContentType:     "application/json",
		ContentEncoding: "gzip",
		DeliveryMode:    amqp.Persistent,
		Priority:        5,
		CorrelationId:   "corr",
		ReplyTo:         "reply.here",
		Expiration:      "600000",
		MessageId:       "mid",
		Timestamp:       ts,
		Type:            "kind",
		UserId:          "guest",
		AppId:           "app",
		Body:            []byte("props"),
	}
	publishConfirmed(t, ch, "", q, false, pub)
	check := func(how string, m amqp.Delivery) {
		t.Helper()
		got := amqp.Publishing{
			Headers: m.Headers, ContentType: m.ContentType, ContentEncoding: m.ContentEncoding,
			DeliveryMode: m.DeliveryMode, Priority: m.Priority, CorrelationId: m.CorrelationId,
			ReplyTo: m.ReplyTo, Expiration: m.Expiration, MessageId: m.MessageId,
			Timestamp: m.Timestamp, Type: m.Type, UserId: m.UserId, AppId: m.AppId, Body: m.Body,
		}
		if !reflect.DeepEqual(got, pub) {
			for k, v := range pub.Headers {
				if !reflect.DeepEqual(m.Headers[k], v) {
					t.Errorf("%s: header %q = %#v (%T), want %#v (%T)", how, k, m.Headers[k], m.Headers[k], v, v)
				}
			}
			got.Headers, pub.Headers = nil, nil
			if !reflect.DeepEqual(got, pub) {
				t.Errorf("%s: properties\n got %+v\nwant %+v", how, got, pub)
			}
			pub.Headers = headers
		}
	}
	check("basic.get", mustGet(t, ch, q, true))
	d := mustConsume(t, ch, q, "c", true, nil)
	publishConfirmed(t, ch, "", q, false, pub)
	check("basic.deliver", recvWithin(t, d, waitFor))
}
