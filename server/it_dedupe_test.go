package server_test

// Idempotent publishing to streams (issue 14 point 4): x-publisher-id and x-publishing-id
// headers; a publish whose id is not above the highest stored for its publisher is dropped and
// still confirmed.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func dedupePublishing(pid string, seq any, body string) amqp.Publishing {
	return amqp.Publishing{Body: []byte(body), Headers: amqp.Table{"x-publisher-id": pid, "x-publishing-id": seq}}
}

func TestITStreamDedupeAcrossReconnect(t *testing.T) {
	skipWarrenOnly(t, "x-publisher-id deduplication")
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "dedupe", nil)
	for i := 1; i <= 10; i++ {
		publishConfirmed(t, pub, "", s, false, dedupePublishing("p1", int64(i), fmt.Sprintf("m%d", i)))
	}
	// A new connection repeats 5..10 (acked, dropped), then goes on with 11, 12.
	c2 := mustDial(t, url)
	pub2 := mustConfirmChannel(t, c2)
	for i := 5; i <= 12; i++ {
		publishConfirmed(t, pub2, "", s, false, dedupePublishing("p1", int32(i), fmt.Sprintf("m%d", i)))
	}
	// Another publisher id is independent; no headers: never deduplicated.
	publishConfirmed(t, pub2, "", s, false, dedupePublishing("p2", int64(1), "other-1"))
	publishConfirmed(t, pub2, "", s, false, amqp.Publishing{Body: []byte("plain")})
	publishConfirmed(t, pub2, "", s, false, amqp.Publishing{Body: []byte("plain")})
	cons := mustDial(t, url)
	ch, d := consumeStream(t, cons, s, 100, amqp.Table{"x-stream-offset": "first"})
	got := recvStream(t, ch, d, 15, true)
	var bodies []string
	for _, m := range got {
		bodies = append(bodies, m.body)
	}
	want := "m1 m2 m3 m4 m5 m6 m7 m8 m9 m10 m11 m12 other-1 plain plain"
	if strings.Join(bodies, " ") != want {
		t.Fatalf("stream holds %v, want %s", bodies, want)
	}
	noDelivery(t, d, quiet)
}

func TestITStreamDedupeBadHeaders(t *testing.T) {
	skipWarrenOnly(t, "x-publisher-id deduplication")
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "dedupe-bad", nil)
	q := declareQueue(t, url, pub, "classic", nil)
	for _, tc := range []struct {
		msg  amqp.Publishing
		text string
	}{
		{dedupePublishing("p", "7", "x"), "PRECONDITION_FAILED - invalid header 'x-publishing-id': must be an integer, got longstr"},
		{dedupePublishing(strings.Repeat("p", 257), int64(1), "x"), "PRECONDITION_FAILED - invalid header 'x-publisher-id': 257 bytes, longer than 256"},
		{dedupePublishing("p", int64(-1), "x"), "PRECONDITION_FAILED - invalid header 'x-publishing-id': must not be negative, got -1"},
	} {
		ch := mustChannel(t, c)
		if err := ch.Publish("", s, false, false, tc.msg); err != nil {
			t.Fatal(err)
		}
		expectChannelClosed(t, ch, amqp.PreconditionFailed, tc.text)
		// A classic queue ignores the headers.
		ok := mustConfirmChannel(t, c)
		publishConfirmed(t, ok, "", q, false, tc.msg)
	}
	// 256 bytes is fine.
	publishConfirmed(t, pub, "", s, false, dedupePublishing(strings.Repeat("p", 256), int64(1), "long-id"))
}

// TestITSuperStreamDedupePerPartition: the highest id is kept per partition, so a publisher's
// ids may go to different partitions.
func TestITSuperStreamDedupePerPartition(t *testing.T) {
	skipWarrenOnly(t, "x-publisher-id deduplication")
	url := startBroker(t)
	c := mustDial(t, url)
	admin := mustChannel(t, c)
	s := declareSuperStream(t, url, admin, "ssdedupe", 3, nil)
	pub := mustConfirmChannel(t, c)
	for i := 1; i <= 30; i++ {
		m := dedupePublishing("p", int64(i), fmt.Sprintf("m%d", i))
		publishConfirmed(t, pub, s, fmt.Sprintf("k%d", i), true, m)
	}
	for i := 1; i <= 30; i++ { // all repeats: dropped
		m := dedupePublishing("p", int64(i), fmt.Sprintf("m%d", i))
		publishConfirmed(t, pub, s, fmt.Sprintf("k%d", i), true, m)
	}
	total := 0
	for p := range 3 {
		cons := mustDial(t, url)
		ch, d := consumeStream(t, cons, fmt.Sprintf("%s-%d", s, p), 100, amqp.Table{"x-stream-offset": "first"})
		for {
			select {
			case m := <-d:
				total++
				_ = ch.Ack(m.DeliveryTag, false)
				continue
			case <-time.After(quiet * 2):
			}
			break
		}
	}
	if total != 30 {
		t.Fatalf("the partitions hold %d messages, want 30", total)
	}
}
