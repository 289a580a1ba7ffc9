package conformance

// Idempotent stream publishing survives a crash (issue 14 point 4): the highest x-publishing-id
// stored per x-publisher-id is kept across kill -9, so a publisher that republishes after a
// restart stores nothing twice.

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestStreamDedupeAcrossRestart(t *testing.T) {
	const s = "dedupe.stream"
	n := newNode(t)
	publish := func(from, to int) {
		t.Helper()
		conn := dial(t, n.b.URL)
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(s, true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
			t.Fatal(err)
		}
		for i := from; i <= to; i++ {
			dc, err := ch.PublishWithDeferredConfirm("", s, false, false, amqp.Publishing{Body: []byte(fmt.Sprintf("m%d", i)),
				Headers: amqp.Table{"x-publisher-id": "producer-1", "x-publishing-id": int64(i)}})
			if err != nil {
				t.Fatal(err)
			}
			if !dc.Wait() {
				t.Fatalf("publish %d nacked", i)
			}
		}
	}
	publish(1, 100)
	n.restartKill() // kill -9, start again on the same data directory
	publish(50, 150)
	n.restartKill()
	publish(140, 160)
	conn := dial(t, n.b.URL)
	bodies := map[string]int{}
	count := 0
	streamReadUntil(t, conn, s, amqp.Table{"x-stream-offset": "first"}, func(d amqp.Delivery) bool {
		bodies[string(d.Body)]++
		count++
		return count < 160
	})
	for i := 1; i <= 160; i++ {
		if b := fmt.Sprintf("m%d", i); bodies[b] != 1 {
			t.Fatalf("%s stored %d times", b, bodies[b])
		}
	}
	// Nothing after m160.
	ch, _ := conn.Channel()
	_ = ch.Qos(10, 0, false)
	d, err := ch.Consume(s, "", false, false, false, false, amqp.Table{"x-stream-offset": int64(160)})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-d:
		t.Fatalf("offset 160 holds %q: a republished message was stored again", m.Body)
	case <-time.After(500 * time.Millisecond):
	}
}
