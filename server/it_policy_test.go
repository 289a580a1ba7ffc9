package server_test

import (
	"net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// getWithin polls basic.get until a message arrives, or fails after waitFor.
func getWithin(t *testing.T, ch *itChan, queue string) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("basic.get %s: %v", queue, err)
		}
		if ok {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing arrived in %s within %v", queue, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func firstDeath(t *testing.T, d amqp.Delivery) amqp.Table {
	t.Helper()
	deaths, _ := d.Headers["x-death"].([]any)
	if len(deaths) == 0 {
		t.Fatalf("no x-death header: %v", d.Headers)
	}
	e, _ := deaths[0].(amqp.Table)
	return e
}

// TestITPolicyTTLAndDeadLetter: a policy gives a new queue its message TTL and dead-letter
// exchange; expired messages are dead-lettered with x-death reason expired.
func TestITPolicyTTLAndDeadLetter(t *testing.T) {
	a := startAdmin(t)
	v := a.vhost("pol")
	a.policy(v, "ttl-dlx", map[string]any{"pattern": `^src$`, "apply-to": "queues",
		"definition": map[string]any{"message-ttl": 50, "dead-letter-exchange": "", "dead-letter-routing-key": "dlq"}})
	c := mustDial(t, a.url(a.user, a.pass, v))
	ch := mustChannel(t, c)
	for _, q := range []string{"src", "dlq"} {
		if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	publish(t, ch, "", "src", amqp.Publishing{Body: []byte("dies")})
	d := getWithin(t, ch, "dlq")
	if string(d.Body) != "dies" {
		t.Fatalf("dead-lettered %q", d.Body)
	}
	if e := firstDeath(t, d); e["reason"] != "expired" || e["queue"] != "src" {
		t.Fatalf("x-death %v, want reason expired from queue src", e)
	}
	info := a.queueWithPolicy(v, "src", "ttl-dlx")
	eff, _ := info["effective_policy_definition"].(map[string]any)
	if eff["message-ttl"] != float64(50) || eff["dead-letter-routing-key"] != "dlq" {
		t.Fatalf("effective_policy_definition %v", eff)
	}
}

// TestITPolicyDeadLetterOnExistingQueue: a policy set after a queue was declared gives it a
// dead-letter exchange at once.
func TestITPolicyDeadLetterOnExistingQueue(t *testing.T) {
	a := startAdmin(t)
	v := a.vhost("pol")
	c := mustDial(t, a.url(a.user, a.pass, v))
	ch := mustChannel(t, c)
	if _, err := ch.QueueDeclare("work", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("dead", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	a.policy(v, "dlx", map[string]any{"pattern": `^work$`, "definition": map[string]any{"dead-letter-exchange": "", "dead-letter-routing-key": "dead"}})
	publish(t, ch, "", "work", amqp.Publishing{Body: []byte("rejected")})
	m := getWithin(t, ch, "work")
	_ = m
	// The get above acknowledged it; publish again and reject this time.
	publish(t, ch, "", "work", amqp.Publishing{Body: []byte("rejected")})
	deadline := time.Now().Add(waitFor)
	for {
		d, ok, err := ch.Get("work", false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if err := d.Reject(false); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("message never reached work")
		}
		time.Sleep(10 * time.Millisecond)
	}
	d := getWithin(t, ch, "dead")
	if e := firstDeath(t, d); e["reason"] != "rejected" {
		t.Fatalf("x-death %v, want reason rejected", e)
	}
}

// TestITPolicyMaxLengthOnExistingQueue: a max-length policy trims a queue that already holds
// more messages, from the head, for classic and quorum queues alike.
func TestITPolicyMaxLengthOnExistingQueue(t *testing.T) {
	a := startAdmin(t)
	v := a.vhost("pol")
	c := mustDial(t, a.url(a.user, a.pass, v))
	for _, qtype := range []string{"classic", "quorum"} {
		t.Run(qtype, func(t *testing.T) {
			ch := mustConfirmChannel(t, c)
			name := "long-" + qtype
			if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": qtype}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ch.QueueDelete(name, false, false, false) })
			for _, b := range []string{"1", "2", "3", "4", "5"} {
				publishConfirmed(t, ch, "", name, false, amqp.Publishing{Body: []byte(b)})
			}
			a.policy(v, "short-"+qtype, map[string]any{"pattern": "^" + name + "$", "definition": map[string]any{"max-length": 2}})
			eventually(t, "the queue is trimmed to 2", func() bool { n, _ := queueCounts(t, ch, name); return n == 2 })
			mustGetBody(t, ch, name, true, "4")
			mustGetBody(t, ch, name, true, "5")
		})
	}
}

// TestITPolicyPriority: of two matching policies the one with the higher priority applies.
func TestITPolicyPriority(t *testing.T) {
	a := startAdmin(t)
	v := a.vhost("pol")
	a.policy(v, "low", map[string]any{"pattern": `^capped`, "priority": 1, "definition": map[string]any{"max-length": 4}})
	a.policy(v, "high", map[string]any{"pattern": `^capped\.`, "priority": 7, "definition": map[string]any{"max-length": 2}})
	c := mustDial(t, a.url(a.user, a.pass, v))
	ch := mustConfirmChannel(t, c)
	if _, err := ch.QueueDeclare("capped.q", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"1", "2", "3", "4", "5"} {
		publishConfirmed(t, ch, "", "capped.q", false, amqp.Publishing{Body: []byte(b)})
	}
	if n, _ := queueCounts(t, ch, "capped.q"); n != 2 {
		t.Fatalf("queue holds %d messages, want 2 (policy high)", n)
	}
	a.queueWithPolicy(v, "capped.q", "high")
}

// TestITPolicyRefusals: a bad policy is 400 with the key named.
func TestITPolicyRefusals(t *testing.T) {
	a := startAdmin(t)
	v := a.vhost("pol")
	for _, tc := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"pattern": ".*", "definition": map[string]any{"message-ttl": -1}}, "Validation failed\n\n-1 is not a valid message TTL\n"},
		{map[string]any{"pattern": ".*", "definition": map[string]any{"bogus": 1}}, "Validation failed\n\n[{&lt;&lt;\"bogus\"&gt;&gt;,1}] are not recognised policy settings\n"},
		{map[string]any{"pattern": ".*", "definition": map[string]any{"max-length": "10"}}, ""},
	} {
		st, body := a.do("PUT", "/api/policies/"+url.PathEscape(v)+"/bad", tc.body)
		if st != 400 {
			t.Fatalf("PUT %v: %d %s, want 400", tc.body, st, body)
		}
		if tc.want != "" && !jsonReason(body, tc.want) {
			t.Fatalf("PUT %v: %s, want reason %q", tc.body, body, tc.want)
		}
	}
}

// queueWithPolicy reads GET /api/queues/{vhost}/{name} until it names policy (RabbitMQ's
// management API shows a queue's policy once its statistics were next collected, within
// seconds; Warren's at once).
func (a *admin) queueWithPolicy(vhost, name, policy string) map[string]any {
	a.t.Helper()
	var info map[string]any
	deadline := time.Now().Add(15 * time.Second)
	for {
		info = nil
		a.getJSON("/api/queues/"+url.PathEscape(vhost)+"/"+url.PathEscape(name), &info)
		if info["policy"] == policy {
			return info
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("queue %s: policy %v, want %s", name, info["policy"], policy)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestITPolicyRetentionOnRunningStream: a max-length-bytes policy set on a stream that already
// holds more reaches the running stream: its oldest whole segments go, so a consumer from first
// starts past offset 0; the newest message stays.
func TestITPolicyRetentionOnRunningStream(t *testing.T) {
	a := startAdmin(t)
	v := a.vhost("pol")
	c := mustDial(t, a.url(a.user, a.pass, v))
	ch := mustConfirmChannel(t, c)
	const name = "long-stream"
	if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "stream",
		"x-stream-max-segment-size-bytes": int64(4000)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.QueueDelete(name, false, false, false) })
	body := make([]byte, 1000)
	const n = 60
	for i := range n {
		body[0] = byte(i)
		publishConfirmed(t, ch, "", name, false, amqp.Publishing{Body: body})
	}
	firstOffset := func() int64 {
		cch, d := consumeStream(t, c, name, 1, amqp.Table{"x-stream-offset": "first"})
		defer cch.Close()
		select {
		case m := <-d:
			return streamOffsetOf(t, m)
		case <-time.After(waitFor):
			t.Fatal("no delivery from first")
		}
		return -1
	}
	if got := firstOffset(); got != 0 {
		t.Fatalf("before the policy the stream starts at %d, want 0", got)
	}
	a.policy(v, "small-stream", map[string]any{"pattern": "^" + name + "$", "apply-to": "queues",
		"definition": map[string]any{"max-length-bytes": 10000}})
	eventually(t, "retention removes the oldest segments", func() bool { return firstOffset() > 0 })
	if got := firstOffset(); got > n-1 {
		t.Fatalf("stream starts at %d: the newest message (offset %d) is gone", got, n-1)
	}
}
