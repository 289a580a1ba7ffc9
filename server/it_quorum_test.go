package server_test

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Quorum queues on one node: a one-voter Raft group per queue. These tests also run against
// RabbitMQ (WARREN_TEST_URL) except where they restart the broker.

func quorumArgs(extra amqp.Table) amqp.Table {
	a := amqp.Table{"x-queue-type": "quorum"}
	for k, v := range extra {
		a[k] = v
	}
	return a
}

// declareQuorum declares a durable quorum queue deleted at the end of the test.
func declareQuorum(t *testing.T, url string, ch *itChan, what string, extra amqp.Table) string {
	t.Helper()
	name := uniq(t, what)
	if _, err := ch.QueueDeclare(name, true, false, false, false, quorumArgs(extra)); err != nil {
		t.Fatalf("declare quorum queue %s: %v", name, err)
	}
	deleteAtEnd(t, url, []string{name}, nil)
	return name
}

func TestQuorumDeclareRefusals(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	cases := []struct {
		what                      string
		durable, autoDelete, excl bool
		serverNamed               bool
		text                      string
	}{
		{what: "non-durable", text: "PRECONDITION_FAILED - invalid property 'non-durable' for queue '%s' in vhost '/'"},
		{what: "exclusive", durable: true, excl: true, text: "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue '%s' in vhost '/'"},
		{what: "auto-delete", durable: true, autoDelete: true, text: "PRECONDITION_FAILED - invalid property 'auto-delete' for queue '%s' in vhost '/'"},
	}
	for _, tc := range cases {
		ch := mustChannel(t, c)
		name := uniq(t, tc.what)
		_, err := ch.QueueDeclare(name, tc.durable, tc.autoDelete, tc.excl, false, quorumArgs(nil))
		if err == nil {
			deleteAtEnd(t, url, []string{name}, nil)
			t.Fatalf("%s quorum queue declared, want 406", tc.what)
		}
		checkAMQPError(t, err, amqp.PreconditionFailed, fmt.Sprintf(tc.text, name))
	}
}

func TestQuorumPublishConsumeAck(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustConfirmChannel(t, c)
	q := declareQuorum(t, url, ch, "qq", nil)
	for i := 0; i < 10; i++ {
		publishConfirmed(t, ch, "", q, false, persistentMsg(fmt.Sprint(i)))
	}
	if n, _ := queueCounts(t, ch, q); n != 10 {
		t.Fatalf("message count = %d, want 10", n)
	}
	cch := mustChannel(t, c)
	if err := cch.Qos(2, 0, false); err != nil {
		t.Fatal(err)
	}
	ds := mustConsume(t, cch, q, "", false, nil)
	d0 := recvBody(t, ds, "0")
	recvBody(t, ds, "1")
	noDelivery(t, ds, 300*time.Millisecond) // prefetch 2 holds
	if err := d0.Ack(false); err != nil {
		t.Fatal(err)
	}
	d2 := recvBody(t, ds, "2")
	if d2.Redelivered {
		t.Fatal("first delivery marked redelivered")
	}
	if err := d2.Ack(true); err != nil { // also acks "1"
		t.Fatal(err)
	}
	for i := 3; i < 10; i++ {
		d := recvBody(t, ds, fmt.Sprint(i))
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "queue empty after acks", func() bool { n, _ := queueCounts(t, ch, q); return n == 0 })
}

func TestQuorumRequeueCountsDeliveries(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustConfirmChannel(t, c)
	q := declareQuorum(t, url, ch, "qq-requeue", nil)
	publishConfirmed(t, ch, "", q, false, persistentMsg("m"))
	cch := mustChannel(t, c)
	cch.Qos(1, 0, false)
	ds := mustConsume(t, cch, q, "", false, nil)
	d := recvBody(t, ds, "m")
	if _, ok := d.Headers["x-delivery-count"]; ok && d.Headers["x-delivery-count"] != int64(0) {
		t.Fatalf("first delivery x-delivery-count = %v", d.Headers["x-delivery-count"])
	}
	if err := d.Nack(false, true); err != nil {
		t.Fatal(err)
	}
	d = recvBody(t, ds, "m")
	if !d.Redelivered {
		t.Fatal("requeued message not marked redelivered")
	}
	if got := d.Headers["x-delivery-count"]; got != int64(1) {
		t.Fatalf("x-delivery-count = %v (%T), want 1", got, got)
	}
	d.Ack(false)
}

func TestQuorumDeliveryLimitDeadLetters(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustConfirmChannel(t, c)
	dlq := declareQueue(t, url, ch, "qq-dlq", nil)
	q := declareQuorum(t, url, ch, "qq-limited", amqp.Table{"x-delivery-limit": int32(1),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	publishConfirmed(t, ch, "", q, false, persistentMsg("poison"))
	cch := mustChannel(t, c)
	cch.Qos(1, 0, false)
	ds := mustConsume(t, cch, q, "", false, nil)
	for i := 0; i < 2; i++ {
		d := recvBody(t, ds, "poison")
		if err := d.Reject(true); err != nil {
			t.Fatal(err)
		}
	}
	dch := mustChannel(t, c)
	dd := mustConsume(t, dch, dlq, "", true, nil)
	d := recvBody(t, dd, "poison")
	deaths, _ := d.Headers["x-death"].([]any)
	if len(deaths) == 0 {
		t.Fatalf("dead letter without x-death: %v", d.Headers)
	}
	death, _ := deaths[0].(amqp.Table)
	if death["reason"] != "delivery_limit" || death["queue"] != q {
		t.Fatalf("x-death = %v, want reason delivery_limit from %s", death, q)
	}
	noDelivery(t, ds, 200*time.Millisecond)
}

func TestQuorumGetPurgeAndTTL(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustConfirmChannel(t, c)
	q := declareQuorum(t, url, ch, "qq-get", nil)
	publishBodies(t, ch, q, "a", "b", "c")
	d := mustGetBody(t, ch, q, false, "a")
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	n, err := ch.QueuePurge(q, false)
	if err != nil || n != 2 {
		t.Fatalf("purge = %d, %v; want 2", n, err)
	}
	expectEmpty(t, ch, q)

	dlq := declareQueue(t, url, ch, "qq-ttl-dlq", nil)
	tq := declareQuorum(t, url, ch, "qq-ttl", amqp.Table{"x-message-ttl": int32(100),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	publishConfirmed(t, ch, "", tq, false, persistentMsg("old"))
	dd := mustConsume(t, mustChannel(t, c), dlq, "", true, nil)
	got := recvBody(t, dd, "old")
	deaths, _ := got.Headers["x-death"].([]any)
	if len(deaths) == 0 || deaths[0].(amqp.Table)["reason"] != "expired" {
		t.Fatalf("x-death = %v, want reason expired", got.Headers["x-death"])
	}
}

func TestQuorumRejectPublishNacks(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustConfirmChannel(t, c)
	q := declareQuorum(t, url, ch, "qq-full", amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	publishConfirmed(t, ch, "", q, false, persistentMsg("1"))
	conf, err := ch.PublishWithDeferredConfirm("", q, false, false, persistentMsg("2"))
	if err != nil {
		t.Fatal(err)
	}
	ok, err := conf.WaitContext(t.Context())
	if err != nil || ok {
		t.Fatalf("publish over the limit confirmed = %v, %v; want a nack", ok, err)
	}
}

func TestQuorumSurvivesRestart(t *testing.T) {
	b := newRestartBroker(t)
	c := mustDial(t, b.url)
	ch := mustConfirmChannel(t, c)
	name := uniq(t, "qq-restart")
	if _, err := ch.QueueDeclare(name, true, false, false, false, quorumArgs(nil)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		publishConfirmed(t, ch, "", name, false, persistentMsg(fmt.Sprint(i)))
	}
	// One message unacked when the broker stops: it must come back, redelivered.
	cch := mustChannel(t, c)
	cch.Qos(1, 0, false)
	ds := mustConsume(t, cch, name, "", false, nil)
	recvBody(t, ds, "0")
	c.Close()
	b.restart()
	c2 := mustDial(t, b.url)
	ch2 := mustChannel(t, c2)
	eventually(t, "100 messages back after restart", func() bool {
		q, err := ch2.QueueDeclarePassive(name, true, false, false, false, nil)
		return err == nil && q.Messages == 100
	})
	ds2 := mustConsume(t, ch2, name, "", false, nil)
	d := recvBody(t, ds2, "0")
	if !d.Redelivered {
		t.Fatal("message unacked at shutdown not marked redelivered")
	}
}

func TestQuorumDeliveryLimitDefaultAndNone(t *testing.T) {
	if againstRabbitMQ() {
		t.Skip("RabbitMQ 3.10 has no default delivery limit and refuses -1 (4.x behaviour)")
	}
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustConfirmChannel(t, c)
	for _, tc := range []struct {
		args    amqp.Table
		returns int // requeues before the message is gone
	}{
		{nil, 21}, // default 20: the 21st return drops it
		{amqp.Table{"x-delivery-limit": int32(-1)}, 30}, // no limit: still there after 30
	} {
		q := declareQuorum(t, url, ch, "qq-limit", tc.args)
		publishConfirmed(t, ch, "", q, false, persistentMsg("m"))
		for i := 0; i < tc.returns; i++ {
			d := mustGetBody(t, ch, q, false, "m")
			if err := d.Reject(true); err != nil {
				t.Fatal(err)
			}
		}
		want := 0
		if tc.args != nil {
			want = 1
		}
		eventually(t, "message count after the returns", func() bool { n, _ := queueCounts(t, ch, q); return n == want })
	}
}

// TestQuorumConsumerTimeout: as in RabbitMQ 4.3, a quorum queue consumer that holds a delivery
// longer than x-consumer-timeout gets basic.cancel and its message goes back to the queue; the
// channel stays open.
func TestQuorumConsumerTimeout(t *testing.T) {
	if againstRabbitMQ() {
		t.Skip("RabbitMQ 3.10 closes the channel with 406 instead (4.3 cancels the consumer)")
	}
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustConfirmChannel(t, c)
	q := declareQuorum(t, url, ch, "qq-timeout", amqp.Table{"x-consumer-timeout": int32(300)})
	cch := mustChannel(t, c)
	cancels := cch.NotifyCancel(make(chan string, 2))
	da := mustConsume(t, cch, q, "a", false, nil)
	publishConfirmed(t, ch, "", q, false, persistentMsg("held"))
	start := time.Now()
	recvBody(t, da, "held")
	select {
	case tag := <-cancels:
		if tag != "a" {
			t.Fatalf("basic.cancel for %q, want a", tag)
		}
	case <-time.After(waitFor):
		t.Fatalf("no basic.cancel within %v of a 300 ms consumer timeout", waitFor)
	}
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Errorf("consumer cancelled after %v, before its 300 ms timeout", el)
	}
	db := mustConsume(t, cch, q, "b", false, nil)
	m := recvBody(t, db, "held")
	if !m.Redelivered {
		t.Error("message of the timed-out consumer not marked redelivered")
	}
	m.Ack(false)
	expectOpen(t, cch)
}
