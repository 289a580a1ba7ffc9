package server_test

import (
	"fmt"
	"regexp"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestITServerNamedQueue(t *testing.T) {
	u := startBroker(t)
	ch := mustChannel(t, mustDial(t, u))
	seen := map[string]bool{}
	re := regexp.MustCompile(`^amq\.gen-[A-Za-z0-9_-]{22}$`)
	for range 5 {
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !re.MatchString(q.Name) {
			t.Errorf("server-named queue %q, want amq.gen- and 22 base64url characters", q.Name)
		}
		if seen[q.Name] {
			t.Errorf("server-named queue %q generated twice", q.Name)
		}
		seen[q.Name] = true
		if q.Messages != 0 || q.Consumers != 0 {
			t.Errorf("new queue reports %d messages %d consumers", q.Messages, q.Consumers)
		}
	}
}

func TestITQueueDeclareCounts(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "q", nil)
	publishBodies(t, ch, q, "1", "2", "3")

	if m, n := queueCounts(t, ch, q); m != 3 || n != 0 {
		t.Fatalf("passive declare: %d messages %d consumers, want 3 0", m, n)
	}
	// A redeclare reports the same counts.
	qq, err := ch.QueueDeclare(q, false, false, false, false, nil)
	if err != nil || qq.Messages != 3 || qq.Consumers != 0 {
		t.Fatalf("redeclare: %+v %v, want 3 messages 0 consumers", qq, err)
	}
	// Unacked messages are not counted as ready; consumers are counted.
	cch := mustChannel(t, c)
	if err := cch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	d := mustConsume(t, cch, q, "c1", false, nil)
	recvBody(t, d, "1")
	if m, n := queueCounts(t, ch, q); m != 2 || n != 1 {
		t.Fatalf("with one unacked: %d messages %d consumers, want 2 1", m, n)
	}
}

func TestITQueueDeclarePassiveMissing(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	missing := uniq(t, "missing")
	_, err := ch.QueueDeclarePassive(missing, false, false, false, false, nil)
	want := fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", missing)
	checkAMQPError(t, err, amqp.NotFound, want)
	expectChannelClosed(t, ch, amqp.NotFound, want)
	if queueExists(t, c, missing) {
		t.Fatalf("passive declare created the queue")
	}
}

func TestITQueueEquivalence(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	setup := mustChannel(t, c)
	q := declareQueue(t, u, setup, "q", amqp.Table{"x-max-length": int32(10)})
	d := uniq(t, "durable")
	deleteAtEnd(t, u, []string{d}, nil)
	if _, err := setup.QueueDeclare(d, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	prefix := func(arg, name string) string {
		return fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg '%s' for queue '%s' in vhost '/': ", arg, name)
	}
	cases := []struct {
		name                string
		durable, autoDelete bool
		args                amqp.Table
		want                string
	}{
		{q, true, false, amqp.Table{"x-max-length": int32(10)},
			prefix("durable", q) + "received 'true' but current is 'false'"},
		{d, false, false, nil,
			prefix("durable", d) + "received 'false' but current is 'true'"},
		{q, false, true, amqp.Table{"x-max-length": int32(10)},
			prefix("auto_delete", q) + "received 'true' but current is 'false'"},
		{q, false, false, amqp.Table{"x-max-length": int32(20)},
			prefix("x-max-length", q) + "received '20' but current is '10'"},
		{q, false, false, nil,
			prefix("x-max-length", q) + "received none but current is the value '10' of type 'signedint'"},
		{d, true, false, amqp.Table{"x-max-length": int32(5)},
			prefix("x-max-length", d) + "received the value '5' of type 'signedint' but current is none"},
	}
	for _, tc := range cases {
		ch := mustChannel(t, c)
		_, err := ch.QueueDeclare(tc.name, tc.durable, tc.autoDelete, false, false, tc.args)
		checkAMQPError(t, err, amqp.PreconditionFailed, tc.want)
		expectChannelClosed(t, ch, amqp.PreconditionFailed, tc.want)
	}
	ch := mustChannel(t, c)
	// Unknown x-arguments are ignored, and integer widths compare equal.
	if _, err := ch.QueueDeclare(q, false, false, false, false,
		amqp.Table{"x-max-length": int64(10), "x-unknown": "whatever"}); err != nil {
		t.Fatalf("equivalent redeclare: %v", err)
	}
	// A passive declare checks nothing but existence.
	if _, err := ch.QueueDeclarePassive(q, true, true, false, false, nil); err != nil {
		t.Fatalf("passive redeclare: %v", err)
	}
}

func TestITExclusiveQueue(t *testing.T) {
	u := startBroker(t)
	owner := mustDial(t, u)
	och := mustConfirmChannel(t, owner)
	q := uniq(t, "excl")
	if _, err := och.QueueDeclare(q, false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	deleteAtEnd(t, u, []string{q}, nil)
	publishBodies(t, och, q, "m")
	// The owner can use it from any of its channels.
	och2 := mustChannel(t, owner)
	if _, err := och2.QueueDeclarePassive(q, false, false, true, false, nil); err != nil {
		t.Fatalf("owner passive declare from another channel: %v", err)
	}

	// A binding for the other connection's unbind to find.
	if err := och.QueueBind(q, "k", "amq.direct", false, nil); err != nil {
		t.Fatal(err)
	}

	other := mustDial(t, u)
	locked := fmt.Sprintf("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '%s' in vhost '/'. "+
		"It could be originally declared on another connection or the exclusive property value does not match "+
		"that of the original declaration.", q)
	ops := []struct {
		name string
		do   func(ch *itChan) error
	}{
		{"declare", func(ch *itChan) error {
			_, err := ch.QueueDeclare(q, false, false, true, false, nil)
			return err
		}},
		{"declare non-exclusive", func(ch *itChan) error {
			_, err := ch.QueueDeclare(q, false, false, false, false, nil)
			return err
		}},
		{"passive declare", func(ch *itChan) error {
			_, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
			return err
		}},
		{"consume", func(ch *itChan) error {
			_, err := ch.Consume(q, "c", false, false, false, false, nil)
			return err
		}},
		{"get", func(ch *itChan) error {
			_, _, err := ch.Get(q, false)
			return err
		}},
		{"bind", func(ch *itChan) error { return ch.QueueBind(q, "other", "amq.direct", false, nil) }},
		{"unbind", func(ch *itChan) error { return ch.QueueUnbind(q, "k", "amq.direct", nil) }},
		{"purge", func(ch *itChan) error {
			_, err := ch.QueuePurge(q, false)
			return err
		}},
		{"delete", func(ch *itChan) error {
			_, err := ch.QueueDelete(q, false, false, false)
			return err
		}},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			ch := mustChannel(t, other)
			err := op.do(ch)
			checkAMQPError(t, err, amqp.ResourceLocked, locked)
			expectChannelClosed(t, ch, amqp.ResourceLocked, locked)
		})
	}
	// Publishing to it from another connection is allowed.
	pch := mustConfirmChannel(t, other)
	publishBodies(t, pch, q, "from other")
	if m, _ := queueCounts(t, och, q); m != 2 {
		t.Fatalf("exclusive queue holds %d messages, want 2", m)
	}

	// It dies with its connection.
	if err := owner.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "exclusive queue deleted with its connection", func() bool {
		return !queueExists(t, other, q)
	})
}

func TestITAutoDeleteQueue(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	q := uniq(t, "ad")
	deleteAtEnd(t, u, []string{q}, nil)
	if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// Never had a consumer: stays.
	if !queueExists(t, c, q) {
		t.Fatalf("auto-delete queue vanished before any consumer")
	}
	mustConsume(t, ch, q, "c1", true, nil)
	mustConsume(t, ch, q, "c2", true, nil)
	if err := ch.Cancel("c1", false); err != nil {
		t.Fatal(err)
	}
	if !queueExists(t, c, q) {
		t.Fatalf("auto-delete queue deleted while it still has a consumer")
	}
	if err := ch.Cancel("c2", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, "auto-delete queue deleted after its last consumer", func() bool {
		return !queueExists(t, c, q)
	})

	// Also when the last consumer's channel closes.
	if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	cch := mustChannel(t, c)
	mustConsume(t, cch, q, "c3", false, nil)
	if err := cch.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "auto-delete queue deleted when its consumer's channel closed", func() bool {
		return !queueExists(t, c, q)
	})
}

func TestITQueueBindUnbind(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	x := declareExchange(t, u, ch, "x", "direct", nil)
	q := declareQueue(t, u, ch, "q", nil)
	mustBind(t, ch, q, "k", x, nil)
	mustBind(t, ch, q, "k", x, nil) // binding twice is idempotent
	if got := routedTo(t, ch, x, "k", nil, []string{q}); len(got) != 1 {
		t.Fatalf("bound queue did not receive the message")
	}
	if err := ch.QueueUnbind(q, "k", x, nil); err != nil {
		t.Fatalf("unbind: %v", err)
	}
	if got := routedTo(t, ch, x, "k", nil, []string{q}); len(got) != 0 {
		t.Fatalf("unbound queue still receives")
	}
	// Unbinding what is not bound is fine.
	if err := ch.QueueUnbind(q, "k", x, nil); err != nil {
		t.Fatalf("unbind of a missing binding: %v", err)
	}

	// An explicit empty binding key is an empty key, even for the queue
	// declared last on the channel.
	mustBind(t, ch, q, "", x, nil)
	if got := routedTo(t, ch, x, "", nil, []string{q}); len(got) != 1 {
		t.Fatalf("binding with an empty key did not route an empty key")
	}
	if got := routedTo(t, ch, x, q, nil, []string{q}); len(got) != 0 {
		t.Fatalf("binding with an empty key routed the queue's name")
	}
	// The spec's shortcut: an empty queue name means the queue declared last
	// on the channel, and then an empty key means that queue's name.
	last, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("", "", x, false, nil); err != nil {
		t.Fatalf("bind with the last-declared-queue shortcut: %v", err)
	}
	if got := routedTo(t, ch, x, last.Name, nil, []string{q, last.Name}); !sameStrings(got, []string{last.Name}) {
		t.Fatalf("shortcut binding: key %s reached %v, want the last declared queue", last.Name, got)
	}

	missingX := uniq(t, "nox")
	t.Run("missing exchange", func(t *testing.T) {
		ch := mustChannel(t, c)
		err := ch.QueueBind(q, "k", missingX, false, nil)
		want := fmt.Sprintf("NOT_FOUND - no exchange '%s' in vhost '/'", missingX)
		checkAMQPError(t, err, amqp.NotFound, want)
		expectChannelClosed(t, ch, amqp.NotFound, want)
	})
	missingQ := uniq(t, "noq")
	t.Run("missing queue", func(t *testing.T) {
		ch := mustChannel(t, c)
		err := ch.QueueBind(missingQ, "k", x, false, nil)
		want := fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", missingQ)
		checkAMQPError(t, err, amqp.NotFound, want)
		expectChannelClosed(t, ch, amqp.NotFound, want)
	})
}

func TestITQueuePurge(t *testing.T) {
	u := startBroker(t)
	ch := mustConfirmChannel(t, mustDial(t, u))
	q := declareQueue(t, u, ch, "q", nil)
	publishBodies(t, ch, q, "1", "2", "3", "4")
	held := mustGetBody(t, ch, q, false, "1")
	n, err := ch.QueuePurge(q, false)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("purge returned %d, want 3 (the unacked message is not purged)", n)
	}
	expectEmpty(t, ch, q)
	// The unacked message survives the purge and can be requeued.
	if err := held.Nack(false, true); err != nil {
		t.Fatal(err)
	}
	m := mustGetBody(t, ch, q, true, "1")
	if !m.Redelivered {
		t.Fatalf("requeued message not marked redelivered")
	}
	if n, err := ch.QueuePurge(q, false); err != nil || n != 0 {
		t.Fatalf("purge of an empty queue: %d %v", n, err)
	}
}

func TestITQueueDelete(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "q", nil)
	publishBodies(t, ch, q, "1", "2", "3")

	t.Run("if-empty", func(t *testing.T) {
		ch := mustChannel(t, c)
		_, err := ch.QueueDelete(q, false, true, false)
		want := fmt.Sprintf("PRECONDITION_FAILED - queue '%s' in vhost '/' not empty", q)
		checkAMQPError(t, err, amqp.PreconditionFailed, want)
		expectChannelClosed(t, ch, amqp.PreconditionFailed, want)
	})
	cch := mustChannel(t, c)
	if err := cch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	mustConsume(t, cch, q, "c", false, nil)
	t.Run("if-unused", func(t *testing.T) {
		ch := mustChannel(t, c)
		_, err := ch.QueueDelete(q, true, false, false)
		want := fmt.Sprintf("PRECONDITION_FAILED - queue '%s' in vhost '/' in use", q)
		checkAMQPError(t, err, amqp.PreconditionFailed, want)
		expectChannelClosed(t, ch, amqp.PreconditionFailed, want)
	})
	if err := cch.Cancel("c", false); err != nil {
		t.Fatal(err)
	}
	if err := cch.Close(); err != nil { // requeues the unacked message
		t.Fatal(err)
	}
	ch = mustChannel(t, c)
	n, err := ch.QueueDelete(q, true, false, false)
	if err != nil {
		t.Fatalf("delete if-unused without consumers: %v", err)
	}
	if n != 3 {
		t.Fatalf("delete returned %d messages, want 3", n)
	}
	if queueExists(t, c, q) {
		t.Fatalf("queue exists after delete")
	}
	// Deleting a missing queue is not an error and reports 0.
	if n, err := ch.QueueDelete(q, false, false, false); err != nil || n != 0 {
		t.Fatalf("delete of a missing queue: %d %v", n, err)
	}
	// Deleting an empty queue with if-empty works.
	e := declareQueue(t, u, ch, "empty", nil)
	if _, err := ch.QueueDelete(e, true, true, false); err != nil {
		t.Fatalf("delete if-empty of an empty queue: %v", err)
	}
}
