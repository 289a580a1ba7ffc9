package server_test

// Component tests of the message lifecycle (issue 5), part 1: dead-lettering
// and the x-death header, TTL, argument validation, x-expires, length limits
// and priorities. Part 2 (it_lifecycle2_test.go) covers single active
// consumer, delivery limits, consumer timeouts and restarts.
//
// Every test here was checked against RabbitMQ 3.10.8 (WARREN_TEST_URL). Where
// Warren deliberately differs (docs/differences.md, issue 5) the test, or the
// assertion, is skipped against RabbitMQ with the reason.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// lcWarrenOnly skips a test when the suite runs against an external broker.
func lcWarrenOnly(t *testing.T, why string) {
	t.Helper()
	if againstRabbitMQ() {
		t.Skip("Warren-only behaviour, RabbitMQ 3.10 differs: " + why)
	}
}

// lcWaitGet polls queue with basic.get (auto-ack) until a message arrives or
// within passes.
func lcWaitGet(t *testing.T, ch *itChan, queue string, within time.Duration) amqp.Delivery {
	t.Helper()
	return lcPoll(t, ch, queue, within, true)
}

// lcPoll polls queue with basic.get until a message arrives or within passes.
func lcPoll(t *testing.T, ch *itChan, queue string, within time.Duration, autoAck bool) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		m, ok, err := ch.Get(queue, autoAck)
		if err != nil {
			t.Fatalf("basic.get %s: %v", queue, err)
		}
		if ok {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("no message in %s within %v", queue, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lcPublishAcked publishes on a confirm-mode channel and reports whether the
// broker acked (true) or nacked (false) the message.
func lcPublishAcked(t *testing.T, ch *itChan, exchange, key string, msg amqp.Publishing) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, msg)
	if err != nil {
		t.Fatalf("publish to %q/%q: %v", exchange, key, err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		t.Fatalf("waiting for the confirm of publish to %q/%q: %v", exchange, key, err)
	}
	return acked
}

// lcBodies drains queue with basic.get (auto-ack) and returns the bodies.
func lcBodies(t *testing.T, ch *itChan, queue string) []string {
	t.Helper()
	var got []string
	for {
		m, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("basic.get %s: %v", queue, err)
		}
		if !ok {
			return got
		}
		got = append(got, string(m.Body))
	}
}

func lcWantBodies(t *testing.T, ch *itChan, queue string, want ...string) {
	t.Helper()
	if got := lcBodies(t, ch, queue); !sameStrings(got, want) {
		t.Fatalf("%s holds %q, want %q", queue, got, want)
	}
}

// lcInt reads an integer header value of any AMQP integer type.
func lcInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int8:
		return int64(n), true
	case uint8:
		return int64(n), true
	case int16:
		return int64(n), true
	case uint16:
		return int64(n), true
	case int32:
		return int64(n), true
	case uint32:
		return int64(n), true
	case int64:
		return n, true
	case int:
		return int64(n), true
	}
	return 0, false
}

// lcDeath is what one x-death entry must hold.
type lcDeath struct {
	queue, reason, exchange string
	count                   int64
	keys                    []string
	origExpiration          string // "" = the entry must not have original-expiration
}

// lcDeaths returns a delivery's x-death header, which must be an array of tables.
func lcDeaths(t *testing.T, m amqp.Delivery) []amqp.Table {
	t.Helper()
	raw, ok := m.Headers["x-death"]
	if !ok {
		t.Fatalf("message %q has no x-death header; headers %v", m.Body, m.Headers)
	}
	arr, ok := raw.([]any)
	if !ok {
		t.Fatalf("x-death is %T, want an array", raw)
	}
	out := make([]amqp.Table, len(arr))
	for i, e := range arr {
		tb, ok := e.(amqp.Table)
		if !ok {
			t.Fatalf("x-death[%d] is %T, want a table", i, e)
		}
		out[i] = tb
	}
	return out
}

// lcCheckDeath checks one x-death entry exactly: its set of keys, their types and values.
// It returns the entry's time.
func lcCheckDeath(t *testing.T, i int, e amqp.Table, want lcDeath) time.Time {
	t.Helper()
	keys := []string{"count", "exchange", "queue", "reason", "routing-keys", "time"}
	if want.origExpiration != "" {
		keys = append(keys, "original-expiration")
	}
	sort.Strings(keys)
	var got []string
	for k := range e {
		got = append(got, k)
	}
	sort.Strings(got)
	if !sameStrings(got, keys) {
		t.Fatalf("x-death[%d] has keys %v, want exactly %v (entry %v)", i, got, keys, e)
	}
	str := func(k, w string) {
		t.Helper()
		if s, ok := e[k].(string); !ok || s != w {
			t.Fatalf("x-death[%d].%s = %#v, want longstr %q", i, k, e[k], w)
		}
	}
	str("queue", want.queue)
	str("reason", want.reason)
	str("exchange", want.exchange)
	if want.origExpiration != "" {
		str("original-expiration", want.origExpiration)
	}
	if n, ok := e["count"].(int64); !ok || n != want.count {
		t.Fatalf("x-death[%d].count = %#v (%T), want long %d", i, e["count"], e["count"], want.count)
	}
	arr, ok := e["routing-keys"].([]any)
	if !ok {
		t.Fatalf("x-death[%d].routing-keys = %#v, want an array", i, e["routing-keys"])
	}
	var rks []string
	for _, x := range arr {
		s, ok := x.(string)
		if !ok {
			t.Fatalf("x-death[%d].routing-keys holds %#v, want longstr", i, x)
		}
		rks = append(rks, s)
	}
	if !sameStrings(rks, want.keys) {
		t.Fatalf("x-death[%d].routing-keys = %q, want %q", i, rks, want.keys)
	}
	ts, ok := e["time"].(time.Time)
	if !ok {
		t.Fatalf("x-death[%d].time = %#v (%T), want a timestamp", i, e["time"], e["time"])
	}
	if d := time.Since(ts); d < -2*time.Second || d > time.Minute {
		t.Fatalf("x-death[%d].time = %v, not close to now (%v)", i, ts, time.Now())
	}
	return ts
}

// lcCheckFirstLast checks x-first-death-* and, on Warren only (RabbitMQ 3.10
// does not write them; 3.13+ and Warren do), x-last-death-*.
func lcCheckFirstLast(t *testing.T, m amqp.Delivery, firstQ, firstR, firstX, lastQ, lastR, lastX string) {
	t.Helper()
	want := map[string]string{
		"x-first-death-queue": firstQ, "x-first-death-reason": firstR, "x-first-death-exchange": firstX,
	}
	if !againstRabbitMQ() {
		want["x-last-death-queue"] = lastQ
		want["x-last-death-reason"] = lastR
		want["x-last-death-exchange"] = lastX
	}
	for k, w := range want {
		if s, ok := m.Headers[k].(string); !ok || s != w {
			t.Errorf("header %s = %#v, want %q", k, m.Headers[k], w)
		}
	}
}

// TestITLifecycleDeadLetterRejectAndNack: basic.reject and basic.nack (single
// and multiple) without requeue dead-letter with reason "rejected", routed by
// the original routing key when the queue has no x-dead-letter-routing-key.
func TestITLifecycleDeadLetterRejectAndNack(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	dlx := declareExchange(t, u, ch, "dlx", "direct", nil)
	q := declareQueue(t, u, ch, "q", amqp.Table{"x-dead-letter-exchange": dlx})
	dlq := declareQueue(t, u, ch, "dlq", nil)
	mustBind(t, ch, dlq, q, dlx, nil)
	publishBodies(t, ch, q, "r", "n", "m1", "m2")

	cch := mustChannel(t, c)
	mustGetBody(t, cch, q, false, "r").Reject(false)
	mustGetBody(t, cch, q, false, "n").Nack(false, false)
	mustGetBody(t, cch, q, false, "m1")
	m2 := mustGetBody(t, cch, q, false, "m2")
	if err := m2.Nack(true, false); err != nil {
		t.Fatalf("nack multiple: %v", err)
	}
	for _, body := range []string{"r", "n", "m1", "m2"} {
		m := lcWaitGet(t, ch, dlq, waitFor)
		if string(m.Body) != body {
			t.Fatalf("dead-letter queue delivered %q, want %q (dead-lettering keeps order)", m.Body, body)
		}
		if m.Exchange != dlx || m.RoutingKey != q {
			t.Errorf("%s: dead-lettered via %q/%q, want %q/%q", body, m.Exchange, m.RoutingKey, dlx, q)
		}
		if m.Redelivered {
			t.Errorf("%s: redelivered=true on its first delivery from the dead-letter queue", body)
		}
		d := lcDeaths(t, m)
		if len(d) != 1 {
			t.Fatalf("%s: x-death has %d entries, want 1: %v", body, len(d), d)
		}
		lcCheckDeath(t, 0, d[0], lcDeath{queue: q, reason: "rejected", exchange: "", count: 1, keys: []string{q}})
		lcCheckFirstLast(t, m, q, "rejected", "", q, "rejected", "")
	}
	expectEmpty(t, ch, q)
	expectEmpty(t, ch, dlq)
}

// TestITLifecycleDeadLetterRoutingKey: x-dead-letter-routing-key replaces the
// routing keys (CC keys are not used), while x-death keeps the original keys.
func TestITLifecycleDeadLetterRoutingKey(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	dlx := declareExchange(t, u, ch, "dlx", "direct", nil)
	q := declareQueue(t, u, ch, "q", amqp.Table{"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"})
	dlq := declareQueue(t, u, ch, "dlq", nil)
	byCC := declareQueue(t, u, ch, "bycc", nil)
	byKey := declareQueue(t, u, ch, "bykey", nil)
	mustBind(t, ch, dlq, "dead", dlx, nil)
	mustBind(t, ch, byCC, "cc1", dlx, nil)
	mustBind(t, ch, byKey, q, dlx, nil)
	publishConfirmed(t, ch, "", q, false, amqp.Publishing{Headers: amqp.Table{"CC": []any{"cc1"}}, Body: []byte("x")})
	mustGetBody(t, ch, q, false, "x").Reject(false)

	m := lcWaitGet(t, ch, dlq, waitFor)
	if m.RoutingKey != "dead" || m.Exchange != dlx {
		t.Errorf("dead-lettered via %q/%q, want %q/%q", m.Exchange, m.RoutingKey, dlx, "dead")
	}
	d := lcDeaths(t, m)
	if len(d) != 1 {
		t.Fatalf("x-death has %d entries, want 1: %v", len(d), d)
	}
	lcCheckDeath(t, 0, d[0], lcDeath{queue: q, reason: "rejected", exchange: "", count: 1, keys: []string{q, "cc1"}})
	expectEmpty(t, ch, byCC)
	expectEmpty(t, ch, byKey)
	expectEmpty(t, ch, dlq)
}

// TestITLifecycleDeadLetterDefaultKeysWithCC: with no
// x-dead-letter-routing-key the message is dead-lettered with all the keys it
// was published with: routing key, CC and BCC (RabbitMQ 3.10 and 4.x alike),
// while x-death's routing-keys list only the routing key and CC keys.
func TestITLifecycleDeadLetterDefaultKeysWithCC(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	ex := declareExchange(t, u, ch, "ex", "direct", nil)
	dlx := declareExchange(t, u, ch, "dlx", "direct", nil)
	q := declareQueue(t, u, ch, "q", amqp.Table{"x-dead-letter-exchange": dlx})
	mustBind(t, ch, q, "k1", ex, nil)
	names := map[string]string{}
	for _, k := range []string{"k1", "k2", "k3"} {
		names[k] = declareQueue(t, u, ch, "dl"+k, nil)
		mustBind(t, ch, names[k], k, dlx, nil)
	}
	publishConfirmed(t, ch, ex, "k1", false, amqp.Publishing{
		Headers: amqp.Table{"CC": []any{"k2"}, "BCC": []any{"k3"}}, Body: []byte("x")})
	mustGetBody(t, ch, q, false, "x").Reject(false)

	for _, k := range []string{"k1", "k2", "k3"} {
		m := lcWaitGet(t, ch, names[k], waitFor)
		if m.RoutingKey != "k1" {
			t.Errorf("copy routed by %s: routing key %q, want k1", k, m.RoutingKey)
		}
		d := lcDeaths(t, m)
		if len(d) != 1 {
			t.Fatalf("x-death has %d entries, want 1: %v", len(d), d)
		}
		lcCheckDeath(t, 0, d[0], lcDeath{queue: q, reason: "rejected", exchange: ex, count: 1, keys: []string{"k1", "k2"}})
		if _, ok := m.Headers["BCC"]; ok {
			t.Errorf("the dead-lettered message carries a BCC header")
		}
		expectEmpty(t, ch, names[k])
	}
}

// TestITLifecycleDeadLetterTTL: queue TTL and per-message expiration
// dead-letter with reason "expired"; the lower of the two wins; x-death keeps
// the message's expiration as original-expiration and the dead-lettered copy
// has none.
func TestITLifecycleDeadLetterTTL(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	dlq := declareQueue(t, u, ch, "dlq", nil)
	dl := amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
	args := func(ttl int32) amqp.Table {
		a := amqp.Table{}
		for k, v := range dl {
			a[k] = v
		}
		if ttl >= 0 {
			a["x-message-ttl"] = ttl
		}
		return a
	}
	cases := []struct {
		name       string
		queueTTL   int32 // -1: none
		expiration string
	}{
		{"queue-ttl", 100, ""},
		{"message-expiration", -1, "100"},
		{"queue-ttl-lower", 100, "60000"},
		{"message-expiration-lower", 60000, "100"},
	}
	for _, tc := range cases {
		q := declareQueue(t, u, ch, tc.name, args(tc.queueTTL))
		start := time.Now()
		publishConfirmed(t, ch, "", q, false, amqp.Publishing{Expiration: tc.expiration, Body: []byte(tc.name)})
		m := lcWaitGet(t, ch, dlq, waitFor)
		if el := time.Since(start); el > 3*time.Second {
			t.Errorf("%s: dead-lettered after %v, want about 100 ms", tc.name, el)
		}
		if string(m.Body) != tc.name {
			t.Fatalf("dead-letter queue delivered %q, want %q", m.Body, tc.name)
		}
		if m.Expiration != "" {
			t.Errorf("%s: dead-lettered copy has expiration %q, want none", tc.name, m.Expiration)
		}
		d := lcDeaths(t, m)
		if len(d) != 1 {
			t.Fatalf("%s: x-death has %d entries, want 1: %v", tc.name, len(d), d)
		}
		lcCheckDeath(t, 0, d[0], lcDeath{queue: q, reason: "expired", exchange: "", count: 1, keys: []string{q},
			origExpiration: tc.expiration})
		lcCheckFirstLast(t, m, q, "expired", "", q, "expired", "")
		expectEmpty(t, ch, q)
	}
}

// TestITLifecycleTTLZero: with x-message-ttl 0 a message is delivered only if
// a consumer can take it at once; otherwise it is dead-lettered at once.
func TestITLifecycleTTLZero(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	dlq := declareQueue(t, u, ch, "dlq", nil)
	q := declareQueue(t, u, ch, "q", amqp.Table{"x-message-ttl": int32(0),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	publishBodies(t, ch, q, "nobody")
	m := lcWaitGet(t, ch, dlq, waitFor)
	if string(m.Body) != "nobody" {
		t.Fatalf("dead-letter queue delivered %q, want nobody", m.Body)
	}
	lcCheckDeath(t, 0, lcDeaths(t, m)[0], lcDeath{queue: q, reason: "expired", exchange: "", count: 1, keys: []string{q}})

	cch := mustChannel(t, c)
	d := mustConsume(t, cch, q, "c", true, nil)
	publishBodies(t, ch, q, "taken")
	recvBody(t, d, "taken")
	expectEmpty(t, ch, dlq)
}

// TestITLifecycleExpiredNeverDelivered: a message that expires while the
// consumer has no credit is dead-lettered and never delivered.
func TestITLifecycleExpiredNeverDelivered(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	dlq := declareQueue(t, u, ch, "dlq", nil)
	q := declareQueue(t, u, ch, "q", amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	cch := mustChannel(t, c)
	if err := cch.Qos(1, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	d := mustConsume(t, cch, q, "c", false, nil)
	publishBodies(t, ch, q, "held")
	held := recvBody(t, d, "held")
	publishConfirmed(t, ch, "", q, false, amqp.Publishing{Expiration: "100", Body: []byte("short")})
	m := lcWaitGet(t, ch, dlq, waitFor)
	if string(m.Body) != "short" {
		t.Fatalf("dead-letter queue delivered %q, want short", m.Body)
	}
	if err := held.Ack(false); err != nil {
		t.Fatalf("ack: %v", err)
	}
	noDelivery(t, d, 3*quiet)
}

// TestITLifecycleExpiryBehindLongLived: a short-lived message behind a
// long-lived one expires on time, not when it reaches the head (Warren;
// RabbitMQ expires messages only at the head of the queue).
func TestITLifecycleExpiryBehindLongLived(t *testing.T) {
	lcWarrenOnly(t, "RabbitMQ expires a message only once it reaches the head of the queue")
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	dlq := declareQueue(t, u, ch, "dlq", nil)
	q := declareQueue(t, u, ch, "q", amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	publishConfirmed(t, ch, "", q, false, amqp.Publishing{Expiration: "3600000", Body: []byte("long")})
	start := time.Now()
	publishConfirmed(t, ch, "", q, false, amqp.Publishing{Expiration: "100", Body: []byte("short")})
	m := lcWaitGet(t, ch, dlq, waitFor)
	if el := time.Since(start); el > time.Second {
		t.Errorf("the short-lived message was dead-lettered after %v, want within 1 s of its 100 ms TTL", el)
	}
	if string(m.Body) != "short" {
		t.Fatalf("dead-letter queue delivered %q, want short", m.Body)
	}
	lcCheckDeath(t, 0, lcDeaths(t, m)[0], lcDeath{queue: q, reason: "expired", exchange: "", count: 1,
		keys: []string{q}, origExpiration: "100"})
	if n, _ := queueCounts(t, ch, q); n != 1 {
		t.Fatalf("%s holds %d messages, want 1 (the long-lived one)", q, n)
	}
	mustGetBody(t, ch, q, true, "long")
}

// TestITLifecycleXDeathSameQueueTwice: a message rejected twice by the same
// queue (which dead-letters into itself: a rejection is not a cycle) has one
// x-death entry with count 2, keeping the first death's time, exchange, keys
// and original-expiration.
func TestITLifecycleXDeathSameQueueTwice(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	name := uniq(t, "self")
	if _, err := ch.QueueDeclare(name, false, false, false, false,
		amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": name}); err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	deleteAtEnd(t, u, []string{name}, nil)
	publishConfirmed(t, ch, "", name, false, amqp.Publishing{Expiration: "600000", Body: []byte("x"),
		Headers: amqp.Table{"CC": []any{"other"}}})
	mustGetBody(t, ch, name, false, "x").Reject(false)

	first := lcPoll(t, ch, name, waitFor, false)
	if first.Expiration != "" {
		t.Errorf("after the first death: expiration %q, want none", first.Expiration)
	}
	d := lcDeaths(t, first)
	if len(d) != 1 {
		t.Fatalf("after the first death x-death has %d entries, want 1: %v", len(d), d)
	}
	want := lcDeath{queue: name, reason: "rejected", exchange: "", count: 1, keys: []string{name, "other"}, origExpiration: "600000"}
	t1 := lcCheckDeath(t, 0, d[0], want)
	// Make sure the second death happens in a later second than the first.
	for time.Now().Truncate(time.Second).Unix() <= t1.Unix() {
		time.Sleep(20 * time.Millisecond)
	}
	if err := first.Reject(false); err != nil {
		t.Fatalf("reject: %v", err)
	}

	second := lcWaitGet(t, ch, name, waitFor)
	d = lcDeaths(t, second)
	if len(d) != 1 {
		t.Fatalf("after the second death x-death has %d entries, want 1 (same queue and reason): %v", len(d), d)
	}
	want.count = 2
	t2 := lcCheckDeath(t, 0, d[0], want)
	if !t2.Equal(t1) {
		t.Errorf("x-death time after the second death = %v, want the first death's time %v", t2, t1)
	}
	lcCheckFirstLast(t, second, name, "rejected", "", name, "rejected", "")
}

// TestITLifecycleXDeathTwoQueues: a message rejected in q1 and then expired in
// q2 has two x-death entries, newest first, each exact.
func TestITLifecycleXDeathTwoQueues(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	ex := declareExchange(t, u, ch, "ex", "direct", nil)
	dlx1 := declareExchange(t, u, ch, "dlx1", "direct", nil)
	dlx2 := declareExchange(t, u, ch, "dlx2", "direct", nil)
	q1 := declareQueue(t, u, ch, "q1", amqp.Table{"x-dead-letter-exchange": dlx1})
	q2 := declareQueue(t, u, ch, "q2", amqp.Table{"x-dead-letter-exchange": dlx2, "x-message-ttl": int32(100)})
	q3 := declareQueue(t, u, ch, "q3", nil)
	mustBind(t, ch, q1, "k1", ex, nil)
	mustBind(t, ch, q2, "k2", dlx1, nil) // reached through the CC key
	mustBind(t, ch, q3, "k1", dlx2, nil)
	publishConfirmed(t, ch, ex, "k1", false, amqp.Publishing{Expiration: "60000", Body: []byte("x"),
		Headers: amqp.Table{"CC": []any{"k2"}, "BCC": []any{"k3"}, "app": "kept"}})
	mustGetBody(t, ch, q1, false, "x").Reject(false)

	m := lcWaitGet(t, ch, q3, waitFor)
	if m.Exchange != dlx2 || m.RoutingKey != "k1" {
		t.Errorf("delivered via %q/%q, want %q/k1", m.Exchange, m.RoutingKey, dlx2)
	}
	if m.Expiration != "" {
		t.Errorf("expiration %q, want none", m.Expiration)
	}
	if m.Headers["app"] != "kept" {
		t.Errorf("application header app = %#v, want kept", m.Headers["app"])
	}
	d := lcDeaths(t, m)
	if len(d) != 2 {
		t.Fatalf("x-death has %d entries, want 2: %v", len(d), d)
	}
	lcCheckDeath(t, 0, d[0], lcDeath{queue: q2, reason: "expired", exchange: dlx1, count: 1, keys: []string{"k1", "k2"}})
	lcCheckDeath(t, 1, d[1], lcDeath{queue: q1, reason: "rejected", exchange: ex, count: 1, keys: []string{"k1", "k2"},
		origExpiration: "60000"})
	lcCheckFirstLast(t, m, q1, "rejected", ex, q2, "expired", dlx1)
	for _, q := range []string{q1, q2, q3} {
		expectEmpty(t, ch, q)
	}
}

// TestITLifecycleDeadLetterCycleDropped: a message that would be dead-lettered
// back into a queue it already died in, with no rejection on the way, is
// dropped; other targets of the same dead-lettering still get it.
func TestITLifecycleDeadLetterCycleDropped(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)

	// A queue that expires into itself.
	self := uniq(t, "self")
	if _, err := ch.QueueDeclare(self, false, false, false, false, amqp.Table{"x-message-ttl": int32(50),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": self}); err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	deleteAtEnd(t, u, []string{self}, nil)

	// a expires into b, b expires into a fanout bound to a (a cycle) and to spy (no cycle).
	fan := declareExchange(t, u, ch, "fan", "fanout", nil)
	b := declareQueue(t, u, ch, "b", amqp.Table{"x-message-ttl": int32(50), "x-dead-letter-exchange": fan})
	a := declareQueue(t, u, ch, "a", amqp.Table{"x-message-ttl": int32(50),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": b})
	spy := declareQueue(t, u, ch, "spy", nil)
	mustBind(t, ch, a, "", fan, nil)
	mustBind(t, ch, spy, "", fan, nil)

	publishBodies(t, ch, self, "self")
	publishBodies(t, ch, a, "ab")
	m := lcWaitGet(t, ch, spy, waitFor)
	d := lcDeaths(t, m)
	if len(d) != 2 {
		t.Fatalf("spy copy: x-death has %d entries, want 2: %v", len(d), d)
	}
	lcCheckDeath(t, 0, d[0], lcDeath{queue: b, reason: "expired", exchange: "", count: 1, keys: []string{b}})
	lcCheckDeath(t, 1, d[1], lcDeath{queue: a, reason: "expired", exchange: "", count: 1, keys: []string{a}})
	// Neither cycle may go round: both queues stay empty (a loop would keep a message in them
	// most of the time).
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		for _, q := range []string{self, a, b} {
			if n, _ := queueCounts(t, ch, q); n != 0 {
				t.Fatalf("%s holds %d messages: the dead-letter cycle was not broken", q, n)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	expectEmpty(t, ch, spy)
}

// TestITLifecycleMissingDLXDropsSilently: dead-lettering to an exchange that
// does not exist drops the message without any error to the client.
func TestITLifecycleMissingDLXDropsSilently(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "q", amqp.Table{"x-dead-letter-exchange": uniq(t, "missing"), "x-message-ttl": int32(60000)})
	publishBodies(t, ch, q, "a", "b")
	mustGetBody(t, ch, q, false, "a").Reject(false)
	mustGetBody(t, ch, q, false, "b").Nack(false, false)
	expectOpen(t, ch)
	expectEmpty(t, ch, q)
	// An expiry into the missing exchange is just as silent.
	publishConfirmed(t, ch, "", q, false, amqp.Publishing{Expiration: "10", Body: []byte("c")})
	eventually(t, "the expired message leaves the queue", func() bool {
		n, _ := queueCounts(t, ch, q)
		return n == 0
	})
	expectOpen(t, ch)
	if c.IsClosed() {
		t.Fatalf("connection closed")
	}
}

// TestITLifecycleInvalidExpiration: a bad per-message expiration closes the
// channel with 406 and RabbitMQ's text; valid edge values are accepted.
func TestITLifecycleInvalidExpiration(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	setup := mustChannel(t, c)
	q := declareQueue(t, u, setup, "q", nil)
	bad := map[string]string{
		"abc":            "no_integer",
		" 5":             "no_integer",
		"10x":            `{leftover_string,"x"}`,
		"1.5":            `{leftover_string,".5"}`,
		"-5":             "{value_negative,-5}",
		"315360000001":   "{value_too_large,315360000001}",
		"99999999999999": "{value_too_large,99999999999999}",
	}
	for exp, why := range bad {
		t.Run("invalid "+exp, func(t *testing.T) {
			ch := mustChannel(t, c)
			publish(t, ch, "", q, amqp.Publishing{Expiration: exp, Body: []byte("x")})
			expectChannelClosed(t, ch, amqp.PreconditionFailed,
				fmt.Sprintf("PRECONDITION_FAILED - invalid expiration '%s': %s", exp, why))
		})
	}
	for _, exp := range []string{"0", "+5000", "315360000000"} {
		t.Run("valid "+exp, func(t *testing.T) {
			ch := mustConfirmChannel(t, c)
			publish(t, ch, "", q, amqp.Publishing{Expiration: exp, Body: []byte(exp)})
			expectOpen(t, ch)
		})
	}
}

// TestITLifecycleInvalidQueueArgs: invalid lifecycle arguments get 406 with
// RabbitMQ's texts.
func TestITLifecycleInvalidQueueArgs(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	cases := []struct {
		args amqp.Table
		text string // after "invalid arg '<arg>' for queue '<q>' in vhost '/': " unless whole
		arg  string
	}{
		{amqp.Table{"x-message-ttl": int32(-1)}, "{value_negative,-1}", "x-message-ttl"},
		{amqp.Table{"x-message-ttl": "abc"}, `"expected integer, got longstr"`, "x-message-ttl"},
		{amqp.Table{"x-message-ttl": int64(315360000001)}, "{value_too_large,315360000001}", "x-message-ttl"},
		{amqp.Table{"x-expires": int32(0)}, "{value_zero,0}", "x-expires"},
		{amqp.Table{"x-expires": int32(-5)}, "{value_negative,-5}", "x-expires"},
		{amqp.Table{"x-expires": int64(315360000001)}, "{value_too_large,315360000001}", "x-expires"},
		{amqp.Table{"x-max-length": int32(-1)}, "{value_negative,-1}", "x-max-length"},
		{amqp.Table{"x-max-length-bytes": int32(-1)}, "{value_negative,-1}", "x-max-length-bytes"},
		{amqp.Table{"x-max-length": "10"}, `"expected integer, got longstr"`, "x-max-length"},
		{amqp.Table{"x-max-priority": int32(256)}, "{max_value_exceeded,256}", "x-max-priority"},
		{amqp.Table{"x-max-priority": int32(-1)}, "{value_negative,-1}", "x-max-priority"},
		{amqp.Table{"x-overflow": "bogus"}, "invalid_overflow", "x-overflow"},
		{amqp.Table{"x-overflow": int32(1)}, "{unacceptable_type,signedint}", "x-overflow"},
		{amqp.Table{"x-single-active-consumer": int32(1)}, "{unacceptable_type,signedint}", "x-single-active-consumer"},
		{amqp.Table{"x-dead-letter-routing-key": "k"}, "routing_key_but_no_dlx_defined", "x-dead-letter-routing-key"},
		{amqp.Table{"x-dead-letter-exchange": "x", "x-dead-letter-routing-key": int32(3)}, "{unacceptable_type,signedint}", "x-dead-letter-routing-key"},
	}
	for _, tc := range cases {
		ch := mustChannel(t, c)
		name := uniq(t, "q")
		_, err := ch.QueueDeclare(name, false, true, false, false, tc.args)
		if err == nil {
			deleteAtEnd(t, u, []string{name}, nil)
		}
		want := fmt.Sprintf("PRECONDITION_FAILED - invalid arg '%s' for queue '%s' in vhost '/': %s", tc.arg, name, tc.text)
		if err == nil {
			t.Errorf("args %v: declared, want 406 %q", tc.args, want)
			continue
		}
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed || ae.Reason != want {
			t.Errorf("args %v: %v, want 406 %q", tc.args, err, want)
		}
	}
	// The exchange name's type is checked with a different text.
	ch := mustChannel(t, c)
	name := uniq(t, "q")
	_, err := ch.QueueDeclare(name, false, true, false, false, amqp.Table{"x-dead-letter-exchange": int32(1)})
	checkAMQPError(t, err, amqp.PreconditionFailed,
		fmt.Sprintf("PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue '%s' in vhost '/'", name))
}

// lcRoutable reports whether the default exchange can route to queue, without
// touching the queue in a way that counts as use for x-expires (a passive
// declare would): a mandatory publish comes back with basic.return when the
// queue does not exist.
func lcRoutable(t *testing.T, c *itConn, queue string) bool {
	t.Helper()
	raw, err := c.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	defer func() { _ = raw.Close() }()
	if err := raw.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	returns := raw.NotifyReturn(make(chan amqp.Return, 1))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	dc, err := raw.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{Body: []byte("probe")})
	if err != nil {
		t.Fatalf("probe publish: %v", err)
	}
	if _, err := dc.WaitContext(ctx); err != nil {
		t.Fatalf("probe confirm: %v", err)
	}
	select {
	case <-returns:
		return false
	default:
		return true
	}
}

// TestITLifecycleQueueExpires: x-expires deletes a queue left unused; a
// consumer keeps it alive, and the countdown starts when the last one leaves.
func TestITLifecycleQueueExpires(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	args := amqp.Table{"x-expires": int32(300)}

	unused := declareQueue(t, u, ch, "unused", args)
	start := time.Now()
	if !lcRoutable(t, c, unused) {
		t.Fatalf("%s gone right after its declaration", unused)
	}
	eventually(t, "the unused queue expires", func() bool { return !lcRoutable(t, c, unused) })
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Errorf("queue deleted after %v, before its x-expires of 300 ms", el)
	}

	used := declareQueue(t, u, ch, "used", args)
	cch := mustChannel(t, c)
	d := mustConsume(t, cch, used, "c", true, nil)
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if !lcRoutable(t, c, used) {
			t.Fatalf("%s expired while it had a consumer", used)
		}
		recvBody(t, d, "probe")
		time.Sleep(100 * time.Millisecond)
	}
	if err := cch.Cancel("c", false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}
	eventually(t, "the queue expires once its consumer is gone", func() bool { return !lcRoutable(t, c, used) })
}

// TestITLifecycleMaxLengthDropHead: x-max-length and x-max-length-bytes with
// the default overflow drop (and dead-letter, reason maxlen) from the head.
func TestITLifecycleMaxLengthDropHead(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	dlq := declareQueue(t, u, ch, "dlq", nil)
	dl := func(a amqp.Table) amqp.Table {
		a["x-dead-letter-exchange"] = ""
		a["x-dead-letter-routing-key"] = dlq
		return a
	}
	q := declareQueue(t, u, ch, "len", dl(amqp.Table{"x-max-length": int32(2)}))
	publishBodies(t, ch, q, "m1", "m2", "m3", "m4")
	for _, body := range []string{"m1", "m2"} {
		m := lcWaitGet(t, ch, dlq, waitFor)
		if string(m.Body) != body {
			t.Fatalf("dead-letter queue delivered %q, want %q", m.Body, body)
		}
		lcCheckDeath(t, 0, lcDeaths(t, m)[0], lcDeath{queue: q, reason: "maxlen", exchange: "", count: 1, keys: []string{q}})
		lcCheckFirstLast(t, m, q, "maxlen", "", q, "maxlen", "")
	}
	lcWantBodies(t, ch, q, "m3", "m4")

	qb := declareQueue(t, u, ch, "bytes", dl(amqp.Table{"x-max-length-bytes": int32(10)}))
	publishBodies(t, ch, qb, "aaaa", "bbbb", "cccc")
	m := lcWaitGet(t, ch, dlq, waitFor)
	if string(m.Body) != "aaaa" {
		t.Fatalf("dead-letter queue delivered %q, want aaaa", m.Body)
	}
	lcCheckDeath(t, 0, lcDeaths(t, m)[0], lcDeath{queue: qb, reason: "maxlen", exchange: "", count: 1, keys: []string{qb}})
	lcWantBodies(t, ch, qb, "bbbb", "cccc")
	expectEmpty(t, ch, dlq)
}

// TestITLifecycleRejectPublish: x-overflow reject-publish nacks publishes
// over the limits and keeps the first messages.
func TestITLifecycleRejectPublish(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	q := declareQueue(t, u, ch, "len", amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
	for i, want := range []bool{true, true, false, false} {
		if got := lcPublishAcked(t, ch, "", q, amqp.Publishing{Body: []byte(fmt.Sprint("m", i+1))}); got != want {
			t.Fatalf("publish m%d: acked=%v, want %v", i+1, got, want)
		}
	}
	mustGetBody(t, ch, q, true, "m1")
	if !lcPublishAcked(t, ch, "", q, amqp.Publishing{Body: []byte("m5")}) {
		t.Fatalf("publish m5 after room was made: nacked")
	}
	lcWantBodies(t, ch, q, "m2", "m5")

	qb := declareQueue(t, u, ch, "bytes", amqp.Table{"x-max-length-bytes": int32(8), "x-overflow": "reject-publish"})
	for _, p := range []struct {
		body string
		ack  bool
	}{{"aaaa", true}, {"bbbb", true}, {"c", false}} {
		if got := lcPublishAcked(t, ch, "", qb, amqp.Publishing{Body: []byte(p.body)}); got != p.ack {
			t.Fatalf("publish %q to a queue limited to 8 bytes: acked=%v, want %v", p.body, got, p.ack)
		}
	}
	lcWantBodies(t, ch, qb, "aaaa", "bbbb")
	expectOpen(t, ch)
}

// TestITLifecycleRejectPublishDLX: x-overflow reject-publish-dlx nacks the
// publish and dead-letters the refused message with reason maxlen.
func TestITLifecycleRejectPublishDLX(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	dlq := declareQueue(t, u, ch, "dlq", nil)
	q := declareQueue(t, u, ch, "q", amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish-dlx",
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	if !lcPublishAcked(t, ch, "", q, amqp.Publishing{Body: []byte("kept")}) {
		t.Fatalf("first publish nacked")
	}
	if lcPublishAcked(t, ch, "", q, amqp.Publishing{Body: []byte("refused")}) {
		t.Fatalf("publish over x-max-length acked, want nacked")
	}
	m := lcWaitGet(t, ch, dlq, waitFor)
	if string(m.Body) != "refused" {
		t.Fatalf("dead-letter queue delivered %q, want refused", m.Body)
	}
	lcCheckDeath(t, 0, lcDeaths(t, m)[0], lcDeath{queue: q, reason: "maxlen", exchange: "", count: 1, keys: []string{q}})
	lcWantBodies(t, ch, q, "kept")
}

// TestITLifecyclePriorities: x-max-priority delivers strictly by priority,
// FIFO within a priority, a priority above the maximum counting as the
// maximum; to basic.get and to a consumer alike.
func TestITLifecyclePriorities(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustConfirmChannel(t, c)
	msgs := []struct {
		body string
		prio uint8
	}{{"a1", 1}, {"b3", 3}, {"c0", 0}, {"d9", 9}, {"e3", 3}, {"f5", 5}, {"g0", 0}, {"h1", 1}}
	want := []string{"d9", "f5", "b3", "e3", "a1", "h1", "c0", "g0"}
	for _, mode := range []string{"get", "consume"} {
		q := declareQueue(t, u, ch, mode, amqp.Table{"x-max-priority": int32(5)})
		for _, m := range msgs {
			publishConfirmed(t, ch, "", q, false, amqp.Publishing{Priority: m.prio, Body: []byte(m.body)})
		}
		var got []string
		if mode == "get" {
			for range msgs {
				m := mustGet(t, ch, q, true)
				got = append(got, string(m.Body))
				if want := strings.TrimLeft(string(m.Body), "abcdefgh"); fmt.Sprint(m.Priority) != want {
					t.Errorf("%s: priority property %d, want %s (unchanged)", m.Body, m.Priority, want)
				}
			}
		} else {
			cch := mustChannel(t, c)
			d := mustConsume(t, cch, q, "c", true, nil)
			for range msgs {
				got = append(got, string(recvWithin(t, d, waitFor).Body))
			}
		}
		if !sameStrings(got, want) {
			t.Errorf("%s: delivered %q, want %q", mode, got, want)
		}
		expectEmpty(t, ch, q)
	}
}
