package server_test

// Component tests of stream queues (x-queue-type=stream) through amqp091-go
// over TCP: every x-stream-offset form, independent replaying consumers,
// tailing, retention by size and age, acks as credit, the refusals RabbitMQ
// sends for what streams cannot do, durability across a restart, and Warren's
// additions: named server-side offsets (x-stream-consumer-name) and filtering
// (as RabbitMQ 3.13+).

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// streamMsg is one stream delivery as a client sees it.
type streamMsg struct {
	offset int64
	body   string
	tag    uint64
}

// declareStream declares a durable stream named after the test and deletes it
// at the end of the test.
func declareStream(t *testing.T, url string, ch *itChan, what string, args amqp.Table) string {
	t.Helper()
	name := uniq(t, what)
	a := amqp.Table{"x-queue-type": "stream"}
	for k, v := range args {
		a[k] = v
	}
	q, err := ch.QueueDeclare(name, true, false, false, false, a)
	if err != nil {
		t.Fatalf("queue.declare stream %s: %v", name, err)
	}
	if q.Messages != 0 || q.Consumers != 0 {
		t.Fatalf("declare-ok of new stream %s: %d messages, %d consumers; want 0 and 0", name, q.Messages, q.Consumers)
	}
	deleteAtEnd(t, url, []string{name}, nil)
	return name
}

// publishStream publishes each body to stream one at a time, waiting for its
// confirm (ch must be in confirm mode), so that every message is a chunk of
// its own on both brokers.
func publishStream(t *testing.T, ch *itChan, stream string, bodies ...string) {
	t.Helper()
	for _, b := range bodies {
		publishConfirmed(t, ch, "", stream, false, amqp.Publishing{Body: []byte(b)})
	}
}

// bodiesFrom returns "m<from>" .. "m<to-1>".
func bodiesFrom(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, "m"+strconv.Itoa(i))
	}
	return out
}

// consumeStream opens a channel on c with a per-consumer prefetch and starts
// a manual-ack consumer of stream with args.
func consumeStream(t *testing.T, c *itConn, stream string, prefetch int, args amqp.Table) (*itChan, <-chan amqp.Delivery) {
	t.Helper()
	ch := mustChannel(t, c)
	if err := ch.Qos(prefetch, 0, false); err != nil {
		t.Fatalf("basic.qos %d: %v", prefetch, err)
	}
	d, err := ch.Consume(stream, "", false, false, false, false, args)
	if err != nil {
		t.Fatalf("basic.consume %s %v: %v", stream, args, err)
	}
	return ch, d
}

// streamOffsetOf returns the x-stream-offset header of a stream delivery.
func streamOffsetOf(t *testing.T, d amqp.Delivery) int64 {
	t.Helper()
	v, ok := d.Headers["x-stream-offset"]
	if !ok {
		t.Fatalf("delivery %q has no x-stream-offset header (headers %v)", d.Body, d.Headers)
	}
	n, ok := v.(int64)
	if !ok {
		t.Fatalf("delivery %q: x-stream-offset is %v (%T), want a long (int64)", d.Body, v, v)
	}
	return n
}

// recvStream receives n stream deliveries, acking each one when ack is set.
func recvStream(t *testing.T, ch *itChan, d <-chan amqp.Delivery, n int, ack bool) []streamMsg {
	t.Helper()
	out := make([]streamMsg, 0, n)
	for range n {
		m := recvWithin(t, d, waitFor)
		out = append(out, streamMsg{offset: streamOffsetOf(t, m), body: string(m.Body), tag: m.DeliveryTag})
		if ack {
			if err := ch.Ack(m.DeliveryTag, false); err != nil {
				t.Fatalf("ack %d: %v", m.DeliveryTag, err)
			}
		}
	}
	return out
}

// expectStream checks that msgs are the messages m<from>..m<from+len-1> at
// offsets equal to their index (a stream that was fresh when the test began).
func expectStream(t *testing.T, what string, msgs []streamMsg, from int) {
	t.Helper()
	for i, m := range msgs {
		want := from + i
		if m.offset != int64(want) || m.body != "m"+strconv.Itoa(want) {
			t.Fatalf("%s: delivery %d is %q at offset %d, want %q at offset %d (all: %v)",
				what, i, m.body, m.offset, "m"+strconv.Itoa(want), want, msgs)
		}
	}
}

// serverVersion returns the product and version the broker announced.
func serverVersion(c *itConn) (product, version string) {
	product, _ = c.Properties["product"].(string)
	version, _ = c.Properties["version"].(string)
	return product, version
}

// rabbitBefore reports whether c is a RabbitMQ older than major.minor.
func rabbitBefore(c *itConn, major, minor int) bool {
	product, version := serverVersion(c)
	if product != "RabbitMQ" {
		return false
	}
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma < major || ma == major && mi < minor
}

// skipWarrenOnly skips a test of a Warren extension when the suite runs against another broker.
func skipWarrenOnly(t *testing.T, what string) {
	t.Helper()
	if againstRabbitMQ() {
		t.Skipf("%s is a Warren extension (RabbitMQ has no server-side stream offsets over AMQP 0-9-1); not run with WARREN_TEST_URL", what)
	}
}

// TestITStreamOffsetFirstLastNextNumber covers x-stream-offset first, last,
// next, the default (next) and numbers of several AMQP integer types, on a log
// of one-message chunks (each publish waits for its confirm).
func TestITStreamOffsetFirstLastNextNumber(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	publishStream(t, pub, s, bodiesFrom(0, 10)...)

	// first: the whole log, in order, each delivery with its offset.
	ch, d := consumeStream(t, c, s, 100, amqp.Table{"x-stream-offset": "first"})
	expectStream(t, "first", recvStream(t, ch, d, 10, true), 0)
	noDelivery(t, d, quiet)

	// last: the first offset of the last chunk; every publish above is a chunk of its own.
	ch, d = consumeStream(t, c, s, 100, amqp.Table{"x-stream-offset": "last"})
	expectStream(t, "last", recvStream(t, ch, d, 1, true), 9)
	noDelivery(t, d, quiet)

	// Numbers, as long, int and short.
	for _, spec := range []any{int64(4), int32(7), int16(9), int64(0)} {
		ch, d = consumeStream(t, c, s, 100, amqp.Table{"x-stream-offset": spec})
		from := 0
		switch v := spec.(type) {
		case int64:
			from = int(v)
		case int32:
			from = int(v)
		case int16:
			from = int(v)
		}
		expectStream(t, fmt.Sprintf("offset %v (%T)", spec, spec), recvStream(t, ch, d, 10-from, true), from)
		noDelivery(t, d, quiet)
	}

	// next, and no x-stream-offset at all (the default is next): nothing of the existing log.
	chNext, dNext := consumeStream(t, c, s, 100, amqp.Table{"x-stream-offset": "next"})
	chDef, dDef := consumeStream(t, c, s, 100, nil)
	noDelivery(t, dNext, quiet)
	noDelivery(t, dDef, quiet)
	publishStream(t, pub, s, "m10", "m11")
	expectStream(t, "next", recvStream(t, chNext, dNext, 2, true), 10)
	expectStream(t, "default (next)", recvStream(t, chDef, dDef, 2, true), 10)
	noDelivery(t, dNext, quiet)
	noDelivery(t, dDef, quiet)
}

// TestITStreamOffsetPastEndWaits: a numeric offset beyond the end makes the
// consumer wait for that offset; it never sees anything below it.
func TestITStreamOffsetPastEndWaits(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	publishStream(t, pub, s, bodiesFrom(0, 3)...)

	ch, d := consumeStream(t, c, s, 100, amqp.Table{"x-stream-offset": int64(6)})
	noDelivery(t, d, quiet)
	publishStream(t, pub, s, bodiesFrom(3, 6)...)
	noDelivery(t, d, quiet)
	publishStream(t, pub, s, bodiesFrom(6, 8)...)
	expectStream(t, "offset 6 reached", recvStream(t, ch, d, 2, true), 6)
	noDelivery(t, d, quiet)
}

// TestITStreamOffsetTimestampAndInterval covers an AMQP timestamp (seconds,
// chunk granularity) and interval strings ("1h", "2s", "1D") as x-stream-offset.
func TestITStreamOffsetTimestampAndInterval(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	publishStream(t, pub, s, bodiesFrom(0, 5)...)
	// Wait long enough that the first batch is more than 2 s old and a whole second lies between
	// the two batches (AMQP timestamps have a resolution of one second).
	time.Sleep(3 * time.Second)
	mid := time.Now()
	publishStream(t, pub, s, bodiesFrom(5, 10)...)

	// A timestamp: the first chunk written at or after it.
	ch, d := consumeStream(t, c, s, 100, amqp.Table{"x-stream-offset": mid})
	expectStream(t, "timestamp between the batches", recvStream(t, ch, d, 5, true), 5)
	noDelivery(t, d, quiet)
	// A timestamp before everything: the whole log.
	ch, d = consumeStream(t, c, s, 100, amqp.Table{"x-stream-offset": mid.Add(-time.Hour)})
	expectStream(t, "timestamp an hour ago", recvStream(t, ch, d, 10, true), 0)
	noDelivery(t, d, quiet)
	// A timestamp in the future: waits like next.
	_, d = consumeStream(t, c, s, 100, amqp.Table{"x-stream-offset": time.Now().Add(time.Hour)})
	noDelivery(t, d, quiet)

	// Intervals: the chunks written in the last 2 s are the second batch only.
	ch, d = consumeStream(t, c, s, 100, amqp.Table{"x-stream-offset": "2s"})
	expectStream(t, `interval "2s"`, recvStream(t, ch, d, 5, true), 5)
	noDelivery(t, d, quiet)
	for _, iv := range []string{"1h", "10m", "1D", "1Y"} {
		ch, d = consumeStream(t, c, s, 100, amqp.Table{"x-stream-offset": iv})
		expectStream(t, fmt.Sprintf("interval %q", iv), recvStream(t, ch, d, 10, true), 0)
		noDelivery(t, d, quiet)
	}
}

// TestITStreamOffsetInvalid: an unparseable x-stream-offset is a 406 channel error.
func TestITStreamOffsetInvalid(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustChannel(t, c)
	s := declareStream(t, url, ch, "s", nil)
	for _, tc := range []struct {
		spec any
		text string // "" = RabbitMQ 3.10 answers 541 INTERNAL_ERROR (a crash); Warren: any 406
	}{
		{"1x", `{invalid_stream_offset_arg,{longstr,<<"1x">>}}`},
		{"10q", `{invalid_stream_offset_arg,{longstr,<<"10q">>}}`},
		{"0s", `{invalid_stream_offset_arg,{longstr,<<"0s">>}}`},
		{"bogus", ""},
		{"-5s", ""},
		{true, ""},
		{3.5, ""},
	} {
		if tc.text == "" && againstRabbitMQ() {
			continue
		}
		bad := mustChannel(t, c)
		if err := bad.Qos(10, 0, false); err != nil {
			t.Fatalf("basic.qos: %v", err)
		}
		_, err := bad.Consume(s, "", false, false, false, false, amqp.Table{"x-stream-offset": tc.spec})
		text := ""
		if tc.text != "" {
			text = fmt.Sprintf("PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '%s' in vhost '/': %s", s, tc.text)
		}
		if err == nil {
			t.Errorf("x-stream-offset %#v: consumer accepted, want 406 %q", tc.spec, text)
			continue
		}
		checkAMQPError(t, err, amqp.PreconditionFailed, text)
		expectChannelClosed(t, bad, amqp.PreconditionFailed, text)
	}
	// A negative number is accepted (it means the first offset).
	good := mustChannel(t, c)
	if err := good.Qos(10, 0, false); err != nil {
		t.Fatalf("basic.qos: %v", err)
	}
	if _, err := good.Consume(s, "", false, false, false, false, amqp.Table{"x-stream-offset": int64(-3)}); err != nil {
		t.Errorf("x-stream-offset -3: %v, want accepted", err)
	}
	expectOpen(t, ch)
}

// TestITStreamIndependentConsumers: two consumers replay the same log at their
// own pace; neither takes anything from the other, and both tail new messages.
func TestITStreamIndependentConsumers(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	publishStream(t, pub, s, bodiesFrom(0, 20)...)

	c2 := mustDial(t, url)
	fastCh, fast := consumeStream(t, c, s, 50, amqp.Table{"x-stream-offset": "first"})
	slowCh, slow := consumeStream(t, c2, s, 3, amqp.Table{"x-stream-offset": "first"})

	// The fast one reads everything while the slow one has acked nothing.
	expectStream(t, "fast consumer", recvStream(t, fastCh, fast, 20, true), 0)
	got := recvStream(t, slowCh, slow, 3, false)
	expectStream(t, "slow consumer, first window", got, 0)
	noDelivery(t, slow, quiet)
	if err := slowCh.Ack(got[2].tag, true); err != nil {
		t.Fatalf("ack: %v", err)
	}
	expectStream(t, "slow consumer, the rest", recvStream(t, slowCh, slow, 17, true), 3)

	publishStream(t, pub, s, "m20", "m21")
	expectStream(t, "fast consumer tailing", recvStream(t, fastCh, fast, 2, true), 20)
	expectStream(t, "slow consumer tailing", recvStream(t, slowCh, slow, 2, true), 20)
	noDelivery(t, fast, quiet)
	noDelivery(t, slow, quiet)

	// Reading removed nothing: declare-ok still reports 0 messages and the log replays in full.
	if n, cons := queueCounts(t, pub, s); n != 0 || cons != 0 {
		t.Errorf("passive declare of a stream with consumers: %d messages, %d consumers; want 0 and 0 as RabbitMQ", n, cons)
	}
	if q, err := pub.QueueDeclare(s, true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
		t.Fatalf("redeclare stream: %v", err)
	} else if q.Messages != 0 || q.Consumers != 0 {
		t.Errorf("redeclare of a stream: %d messages, %d consumers; want 0 and 0 as RabbitMQ", q.Messages, q.Consumers)
	}
}

// TestITStreamReplayAfterAck: acking removes nothing; a new consumer from first
// replays everything, even on the same channel after a cancel.
func TestITStreamReplayAfterAck(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	publishStream(t, pub, s, bodiesFrom(0, 8)...)

	ch := mustChannel(t, c)
	if err := ch.Qos(10, 0, false); err != nil {
		t.Fatalf("basic.qos: %v", err)
	}
	d, err := ch.Consume(s, "first-pass", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	expectStream(t, "first pass", recvStream(t, ch, d, 8, true), 0)
	if err := ch.Cancel("first-pass", false); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	d, err = ch.Consume(s, "second-pass", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		t.Fatalf("consume again: %v", err)
	}
	expectStream(t, "replay on the same channel", recvStream(t, ch, d, 8, true), 0)
	noDelivery(t, d, quiet)

	c2 := mustDial(t, url)
	ch2, d2 := consumeStream(t, c2, s, 10, amqp.Table{"x-stream-offset": "first"})
	expectStream(t, "replay on another connection", recvStream(t, ch2, d2, 8, true), 0)
}

// TestITStreamTailing: a consumer at the end gets each new message promptly,
// without polling delays.
func TestITStreamTailing(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	publishStream(t, pub, s, bodiesFrom(0, 3)...)

	ch, d := consumeStream(t, mustDial(t, url), s, 10, nil)
	noDelivery(t, d, quiet)
	const n = 20
	lat := make([]time.Duration, 0, n)
	for i := 3; i < 3+n; i++ {
		sent := time.Now()
		publish(t, pub, "", s, amqp.Publishing{Body: []byte("m" + strconv.Itoa(i))})
		got := recvStream(t, ch, d, 1, true)
		lat = append(lat, time.Since(sent))
		expectStream(t, "tailing", got, i)
		// Idle a little between messages so that the consumer really waits at the end.
		time.Sleep(20 * time.Millisecond)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("tailing latency: p50 %v, max %v", lat[n/2], lat[n-1])
	if lat[n/2] > 200*time.Millisecond {
		t.Errorf("tailing consumer: median publish-to-delivery %v, want well under 200ms (no polling)", lat[n/2])
	}
}

// kept is what a consumer from some x-stream-offset read up to the newest message.
type kept struct {
	offset int64 // offset of its first delivery
	index  int   // message index (m<index>) of its first delivery
	count  int   // deliveries up to the newest message
}

// readToEnd opens a consumer at spec, reads until message m<last> and cancels it. Bodies must be
// m<i> with i increasing by one and offsets increasing; Warren's offsets are dense (offset = i in a
// fresh stream), RabbitMQ's are not across segments (osiris starts each segment with a tracking chunk
// that takes an offset), so that is only checked against Warren.
func readToEnd(t *testing.T, c *itConn, s string, spec any, last int) kept {
	t.Helper()
	return readToEndGaps(t, c, s, spec, last, false)
}

// readToEndGaps is readToEnd that, when gaps is set, lets the reader jump forward: retention that
// runs while it reads may remove what it was about to read.
func readToEndGaps(t *testing.T, c *itConn, s string, spec any, last int, gaps bool) kept {
	t.Helper()
	ch, d := consumeStream(t, c, s, 1000, amqp.Table{"x-stream-offset": spec})
	defer func() { _ = ch.Close() }()
	var k kept
	prevOff, prevIdx := int64(-1), -1
	for {
		m := recvStream(t, ch, d, 1, true)[0]
		idx, err := strconv.Atoi(strings.TrimPrefix(m.body, "m"))
		if err != nil || !strings.HasPrefix(m.body, "m") {
			t.Fatalf("from %v: unexpected body %q at offset %d", spec, m.body, m.offset)
		}
		if prevOff < 0 {
			k.offset, k.index = m.offset, idx
		} else if idx != prevIdx+1 && !(gaps && idx > prevIdx) || m.offset <= prevOff {
			t.Fatalf("from %v: %q at offset %d after %q at offset %d", spec, m.body, m.offset, "m"+strconv.Itoa(prevIdx), prevOff)
		}
		if !againstRabbitMQ() && m.offset != int64(idx) {
			t.Fatalf("from %v: %q at offset %d, want offsets dense from 0 (offset %d)", spec, m.body, m.offset, idx)
		}
		prevOff, prevIdx = m.offset, idx
		k.count++
		if idx == last {
			return k
		}
	}
}

// padded is message i padded to size bytes.
func padded(i, size int) amqp.Publishing {
	b := []byte("m" + strconv.Itoa(i))
	return amqp.Publishing{Body: b, Headers: amqp.Table{"pad": strings.Repeat("x", size)}}
}

// TestITStreamRetentionBySize: with x-max-length-bytes and small segments,
// whole old segments go; consumers positioned before the first kept offset
// start at it; the newest data is all there.
func TestITStreamRetentionBySize(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	const (
		n        = 200
		msgSize  = 1000
		maxBytes = 20000
		segBytes = 5000
	)
	s := declareStream(t, url, pub, "s", amqp.Table{
		"x-max-length-bytes":              int64(maxBytes),
		"x-stream-max-segment-size-bytes": int64(segBytes),
	})
	for i := range n {
		publishConfirmed(t, pub, "", s, false, padded(i, msgSize))
	}
	var k kept
	eventually(t, "old segments removed", func() bool {
		k = readToEnd(t, c, s, "first", n-1)
		return k.index > 0
	})
	t.Logf("retention by size kept m%d..m%d from offset %d (%d messages of ~%d B; limit %d B, segments %d B)",
		k.index, n-1, k.offset, k.count, msgSize, maxBytes, segBytes)
	// Whole segments are removed, never more than needed: about the limit's worth remains, give or
	// take a segment or two.
	if b := k.count * msgSize; b < maxBytes-2*segBytes || b > maxBytes+3*segBytes {
		t.Errorf("retention by size kept %d messages (~%d B), want about %d B (the limit) give or take a segment", k.count, b, maxBytes)
	}
	// A consumer positioned before the first kept offset starts at the first one.
	for _, spec := range []any{int64(0), k.offset - 1, time.Now().Add(-time.Hour), "1h"} {
		if got := readToEnd(t, c, s, spec, n-1); got.offset != k.offset || got.index != k.index {
			t.Errorf("x-stream-offset %v: first delivery m%d at offset %d, want the first kept one, m%d at offset %d",
				spec, got.index, got.offset, k.index, k.offset)
		}
	}
	// New messages still arrive after retention.
	publishConfirmed(t, pub, "", s, false, padded(n, msgSize))
	if got := readToEnd(t, c, s, "last", n); got.index != n || got.count != 1 {
		t.Errorf("after retention, last = m%d (%d messages), want m%d alone", got.index, got.count, n)
	}
}

// TestITStreamRetentionByAge: with x-max-age "2s" and small segments, segments
// older than 2 s go (the newest segment stays), so replay from first starts
// later than offset 0, and a consumer positioned before it starts at it.
func TestITStreamRetentionByAge(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	const (
		msgSize  = 1000
		segBytes = 5000
		old      = 30
		maxAge   = 2 * time.Second
	)
	s := declareStream(t, url, pub, "s", amqp.Table{
		"x-max-age":                       "2s",
		"x-stream-max-segment-size-bytes": int64(segBytes),
	})
	var published []time.Time // confirm time of each message
	for i := range old {
		publishConfirmed(t, pub, "", s, false, padded(i, msgSize))
		published = append(published, time.Now())
	}
	// Nothing is too old yet.
	if k := readToEnd(t, c, s, "first", old-1); k.index != 0 || k.offset != 0 {
		t.Fatalf("before max-age passed, first = m%d at offset %d, want m0 at 0", k.index, k.offset)
	}
	time.Sleep(maxAge + time.Second)
	// RabbitMQ evaluates retention when it rolls a segment: write more segments until it shows.
	// Warren also applies it every few hundred milliseconds, so the first kept offset can only
	// move forward from one read to the next.
	next := old
	var k kept
	var readAt time.Time
	eventually(t, "segments older than x-max-age removed", func() bool {
		for range 10 {
			publishConfirmed(t, pub, "", s, false, padded(next, msgSize))
			published = append(published, time.Now())
			next++
		}
		readAt = time.Now()
		k = readToEndGaps(t, c, s, "first", next-1, true)
		return k.index > 0
	})
	t.Logf("retention by age kept m%d..m%d from offset %d", k.index, next-1, k.offset)
	// Messages younger than max-age (with a margin) were all kept.
	for i, at := range published {
		if readAt.Sub(at) < maxAge-500*time.Millisecond && i < k.index {
			t.Errorf("retention by age removed m%d, confirmed %v before the read (x-max-age 2s)", i, readAt.Sub(at).Round(time.Millisecond))
			break
		}
	}
	// A consumer positioned before the first kept offset starts at the first kept one (which may
	// have moved on meanwhile, but only forward).
	k0 := readToEndGaps(t, c, s, int64(0), next-1, true)
	k1 := readToEndGaps(t, c, s, "first", next-1, true)
	if k0.index == 0 || k0.offset < k.offset || k0.offset > k1.offset {
		t.Errorf("x-stream-offset 0 after retention: first delivery m%d at offset %d, want the first kept offset (%d, then %d)",
			k0.index, k0.offset, k.offset, k1.offset)
	}
}

// TestITStreamConfirmMeansWritten: once a publish to a stream is confirmed,
// the message is in the log: a consumer from "last" gets it at once, and a
// consumer from "next" does not (it is not a future message any more). This
// holds for transient messages too: a stream keeps every message.
func TestITStreamConfirmMeansWritten(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	for i := range 20 {
		mode := amqp.Transient
		if i%2 == 1 {
			mode = amqp.Persistent
		}
		body := "m" + strconv.Itoa(i)
		publishConfirmed(t, pub, "", s, false, amqp.Publishing{DeliveryMode: mode, Body: []byte(body)})
		ch, d := consumeStream(t, c, s, 10, amqp.Table{"x-stream-offset": "last"})
		m := recvWithin(t, d, waitFor)
		if off := streamOffsetOf(t, m); string(m.Body) != body || off != int64(i) {
			t.Fatalf("consumer from last right after the confirm of %q (delivery mode %d): got %q at offset %d", body, mode, m.Body, off)
		}
		_ = ch.Close()
	}
	ch, d := consumeStream(t, c, s, 10, amqp.Table{"x-stream-offset": "next"})
	noDelivery(t, d, quiet)
	publishStream(t, pub, s, "m20")
	expectStream(t, "next after confirmed publishes", recvStream(t, ch, d, 1, true), 20)
}

// TestITStreamAcksAreCredit: with prefetch 5 exactly 5 deliveries are
// outstanding; each ack lets exactly as many more through.
func TestITStreamAcksAreCredit(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	publishStream(t, pub, s, bodiesFrom(0, 20)...)

	ch, d := consumeStream(t, c, s, 5, amqp.Table{"x-stream-offset": "first"})
	got := recvStream(t, ch, d, 5, false)
	expectStream(t, "first window", got, 0)
	noDelivery(t, d, quiet)

	// One single ack: exactly one more.
	if err := ch.Ack(got[0].tag, false); err != nil {
		t.Fatalf("ack: %v", err)
	}
	more := recvStream(t, ch, d, 1, false)
	expectStream(t, "after one ack", more, 5)
	noDelivery(t, d, quiet)

	// A multiple ack of the 5 outstanding: exactly 5 more.
	if err := ch.Ack(more[0].tag, true); err != nil {
		t.Fatalf("ack multiple: %v", err)
	}
	got = recvStream(t, ch, d, 5, false)
	expectStream(t, "after a multiple ack", got, 6)
	noDelivery(t, d, quiet)

	// A multiple ack with tag 0 acknowledges everything outstanding.
	if err := ch.Ack(0, true); err != nil {
		t.Fatalf("ack all: %v", err)
	}
	expectStream(t, "rest", recvStream(t, ch, d, 5, true), 11)
	got = recvStream(t, ch, d, 4, false)
	expectStream(t, "last ones", got, 16)
	noDelivery(t, d, quiet)
}

// TestITStreamCreditReturnsInRuns: with a prefetch of 8 or more, a consumer that used its credit
// gets more once acks have returned a quarter of the prefetch, all of that quarter at once, not one
// delivery per ack (Warren's batching; RabbitMQ delivers whole chunks, which this test's one-message
// chunks would make one per ack).
func TestITStreamCreditReturnsInRuns(t *testing.T) {
	url := startBroker(t)
	skipWarrenOnly(t, "delivering a stream in runs of a quarter of the prefetch")
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	publishStream(t, pub, s, bodiesFrom(0, 70)...)

	ch, d := consumeStream(t, c, s, 40, amqp.Table{"x-stream-offset": "first"})
	got := recvStream(t, ch, d, 40, false)
	expectStream(t, "first window", got, 0)
	noDelivery(t, d, quiet)
	for i := range 9 {
		if err := ch.Ack(got[i].tag, false); err != nil {
			t.Fatalf("ack %d: %v", i, err)
		}
	}
	noDelivery(t, d, quiet) // 9 of the 10 the cursor waits for
	if err := ch.Ack(got[9].tag, false); err != nil {
		t.Fatalf("ack 9: %v", err)
	}
	expectStream(t, "after the tenth ack", recvStream(t, ch, d, 10, false), 40)
	noDelivery(t, d, quiet)
	// Acking everything returns the whole prefetch: the rest of the stream comes.
	if err := ch.Ack(0, true); err != nil {
		t.Fatalf("ack all: %v", err)
	}
	expectStream(t, "rest", recvStream(t, ch, d, 20, false), 50)
}

// TestITStreamPublisherConfirms: confirms of asynchronous publishes all come;
// the messages are all in the log, in order, with their properties.
func TestITStreamPublisherConfirms(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	x := declareExchange(t, url, pub, "x", "direct", nil)
	mustBind(t, pub, s, "k", x, nil)
	const n = 500
	publishAllConfirmed(t, pub, x, "k", n, func(i int) amqp.Publishing {
		return amqp.Publishing{Body: []byte("m" + strconv.Itoa(i)), ContentType: "text/plain", MessageId: "id" + strconv.Itoa(i),
			Headers: amqp.Table{"i": int32(i)}, DeliveryMode: amqp.Persistent}
	})
	// mandatory publishes to a stream are routed, not returned.
	returns := pub.NotifyReturn(make(chan amqp.Return, 1))
	publishConfirmed(t, pub, x, "k", true, amqp.Publishing{Body: []byte("m" + strconv.Itoa(n))})
	select {
	case r := <-returns:
		t.Fatalf("mandatory publish to a stream was returned: %d %s", r.ReplyCode, r.ReplyText)
	case <-time.After(quiet):
	}

	ch, d := consumeStream(t, c, s, 200, amqp.Table{"x-stream-offset": "first"})
	for i := 0; i <= n; i++ {
		m := recvWithin(t, d, waitFor)
		if off := streamOffsetOf(t, m); off != int64(i) || string(m.Body) != "m"+strconv.Itoa(i) {
			t.Fatalf("delivery %d: %q at offset %d", i, m.Body, off)
		}
		if m.Exchange != x || m.RoutingKey != "k" {
			t.Fatalf("delivery %d: exchange/key %q/%q, want %q/k", i, m.Exchange, m.RoutingKey, x)
		}
		if i < n && (m.ContentType != "text/plain" || m.MessageId != "id"+strconv.Itoa(i) || fmt.Sprint(m.Headers["i"]) != strconv.Itoa(i)) {
			t.Fatalf("delivery %d lost its properties: ct %q id %q headers %v", i, m.ContentType, m.MessageId, m.Headers)
		}
		if err := ch.Ack(m.DeliveryTag, false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	noDelivery(t, d, quiet)
}

// TestITStreamDeclareRefusals: what a stream cannot be, refused with 406 and
// RabbitMQ's texts, each closing only the channel.
func TestITStreamDeclareRefusals(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	name := uniq(t, "s")
	deleteAtEnd(t, url, []string{name}, nil)
	stream := amqp.Table{"x-queue-type": "stream"}
	with := func(k string, v any) amqp.Table { return amqp.Table{"x-queue-type": "stream", k: v} }
	for _, tc := range []struct {
		what                           string
		queue                          string
		durable, exclusive, autoDelete bool
		args                           amqp.Table
		text                           string
	}{
		{"non-durable", name, false, false, false, stream,
			fmt.Sprintf("PRECONDITION_FAILED - invalid property 'non-durable' for queue '%s' in vhost '/'", name)},
		{"exclusive", name, true, true, false, stream,
			fmt.Sprintf("PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue '%s' in vhost '/'", name)},
		{"auto-delete", name, true, false, true, stream,
			fmt.Sprintf("PRECONDITION_FAILED - invalid property 'auto-delete' for queue '%s' in vhost '/'", name)},
		{"server-named", "", true, false, false, stream,
			"PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue"},
		{"invalid x-max-age", name, true, false, false, with("x-max-age", "1x"),
			fmt.Sprintf("PRECONDITION_FAILED - invalid arg 'x-max-age' for queue '%s' in vhost '/': invalid_max_age", name)},
		{"zero x-max-age", name, true, false, false, with("x-max-age", "0s"),
			fmt.Sprintf("PRECONDITION_FAILED - invalid arg 'x-max-age' for queue '%s' in vhost '/': invalid_max_age", name)},
		{"integer x-max-age", name, true, false, false, with("x-max-age", int64(5)),
			fmt.Sprintf("PRECONDITION_FAILED - invalid arg 'x-max-age' for queue '%s' in vhost '/': {unacceptable_type,long}", name)},
		{"negative x-max-length-bytes", name, true, false, false, with("x-max-length-bytes", int64(-1)),
			fmt.Sprintf("PRECONDITION_FAILED - invalid arg 'x-max-length-bytes' for queue '%s' in vhost '/': {value_negative,-1}", name)},
	} {
		t.Run(tc.what, func(t *testing.T) {
			ch := mustChannel(t, c)
			_, err := ch.QueueDeclare(tc.queue, tc.durable, tc.autoDelete, tc.exclusive, false, tc.args)
			if err == nil {
				_, _ = mustChannel(t, c).QueueDelete(name, false, false, false)
				t.Fatalf("%s stream: declared, want 406 %q", tc.what, tc.text)
			}
			checkAMQPError(t, err, amqp.PreconditionFailed, tc.text)
			expectChannelClosed(t, ch, amqp.PreconditionFailed, tc.text)
		})
	}
	// Arguments of other queue types.
	for _, tc := range []struct {
		arg string
		val any
	}{
		{"x-message-ttl", int64(1000)},
		{"x-expires", int64(10000)},
		{"x-max-length", int64(10)},
		{"x-max-priority", int64(5)},
		{"x-dead-letter-exchange", "dlx"},
		{"x-overflow", "reject-publish"},
		{"x-delivery-limit", int64(3)},
		{"x-single-active-consumer", true},
		{"x-queue-mode", "lazy"},
		{"x-max-in-memory-length", int64(3)},
		{"x-queue-master-locator", "min-masters"},
		{"x-queue-version", int64(2)},
		{"x-max-in-memory-bytes", int64(5)},
		{"x-dead-letter-strategy", "at-least-once"},
		{"x-quorum-initial-group-size", int64(1)},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			ch := mustChannel(t, c)
			_, err := ch.QueueDeclare(name, true, false, false, false, with(tc.arg, tc.val))
			text := fmt.Sprintf("PRECONDITION_FAILED - invalid arg '%s' for queue '%s' in vhost '/' of queue type rabbit_stream_queue", tc.arg, name)
			if err == nil {
				_, _ = mustChannel(t, c).QueueDelete(name, false, false, false)
				t.Fatalf("stream with %s: declared, want 406 %q", tc.arg, text)
			}
			checkAMQPError(t, err, amqp.PreconditionFailed, text)
			expectChannelClosed(t, ch, amqp.PreconditionFailed, text)
		})
	}
	// None of the refused declarations created anything.
	if queueExists(t, c, name) {
		t.Errorf("a refused declaration created stream %s", name)
	}
	// The supported arguments are accepted, and so are unknown ones and those of clustering.
	ch := mustChannel(t, c)
	if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "stream",
		"x-max-age": "7D", "x-max-length-bytes": int64(1 << 30), "x-stream-max-segment-size-bytes": int64(1 << 20),
		"x-queue-leader-locator": "client-local", "x-initial-cluster-size": int64(1), "x-foo": "bar"}); err != nil {
		t.Fatalf("stream with x-max-age, x-max-length-bytes, x-stream-max-segment-size-bytes, x-queue-leader-locator, x-initial-cluster-size, x-foo: %v", err)
	}
}

// TestITStreamRedeclare: a stream is redeclared only with the same properties
// and stream arguments; the texts are RabbitMQ's.
func TestITStreamRedeclare(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustChannel(t, c)
	s := declareStream(t, url, ch, "s", amqp.Table{"x-max-age": "1D"})
	same := amqp.Table{"x-queue-type": "stream", "x-max-age": "1D"}
	if q, err := ch.QueueDeclare(s, true, false, false, false, same); err != nil {
		t.Fatalf("redeclare with the same arguments: %v", err)
	} else if q.Messages != 0 || q.Consumers != 0 {
		t.Errorf("redeclare: %d messages, %d consumers; want 0 and 0", q.Messages, q.Consumers)
	}
	prefix := fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg '%%s' for queue '%s' in vhost '/': ", s)
	for _, tc := range []struct {
		what    string
		durable bool
		args    amqp.Table
		arg     string
		detail  string
	}{
		{"no arguments", true, nil, "x-queue-type", "received none but current is the value 'stream' of type 'longstr'"},
		{"classic", true, amqp.Table{"x-queue-type": "classic", "x-max-age": "1D"}, "x-queue-type", "received 'classic' but current is 'stream'"},
		{"x-max-age missing", true, amqp.Table{"x-queue-type": "stream"}, "x-max-age", "received none but current is the value '1D' of type 'longstr'"},
		{"x-max-age different", true, amqp.Table{"x-queue-type": "stream", "x-max-age": "2D"}, "x-max-age", "received '2D' but current is '1D'"},
		{"x-max-length-bytes added", true, amqp.Table{"x-queue-type": "stream", "x-max-age": "1D", "x-max-length-bytes": int64(5)},
			"x-max-length-bytes", "received the value '5' of type 'long' but current is none"},
		{"non-durable", false, same, "durable", "received 'false' but current is 'true'"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			bad := mustChannel(t, c)
			_, err := bad.QueueDeclare(s, tc.durable, false, false, false, tc.args)
			text := fmt.Sprintf(prefix, tc.arg) + tc.detail
			if err == nil {
				t.Fatalf("redeclare (%s) accepted, want 406 %q", tc.what, text)
			}
			checkAMQPError(t, err, amqp.PreconditionFailed, text)
			expectChannelClosed(t, bad, amqp.PreconditionFailed, text)
		})
	}
}

// TestITStreamConsumeWithoutQos: a stream consumer needs a per-consumer
// prefetch; without one (or with only a global one) it gets a 406 channel error.
func TestITStreamConsumeWithoutQos(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustChannel(t, c)
	s := declareStream(t, url, ch, "s", nil)
	text := fmt.Sprintf("PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '%s' in vhost '/''", s)

	bad := mustChannel(t, c)
	_, err := bad.Consume(s, "", false, false, false, false, nil)
	checkAMQPError(t, err, amqp.PreconditionFailed, text)
	expectChannelClosed(t, bad, amqp.PreconditionFailed, text)

	bad = mustChannel(t, c)
	if err := bad.Qos(10, 0, true); err != nil {
		t.Fatalf("global basic.qos: %v", err)
	}
	_, err = bad.Consume(s, "", false, false, false, false, nil)
	checkAMQPError(t, err, amqp.PreconditionFailed, text)
	expectChannelClosed(t, bad, amqp.PreconditionFailed, text)
	expectOpen(t, ch)
}

// TestITStreamNotImplementedRefusals: no-ack consume, basic.get, queue.purge,
// basic.nack and basic.reject of a stream delivery, and consuming on a channel
// with a global qos are 540 connection errors.
func TestITStreamNotImplementedRefusals(t *testing.T) {
	url := startBroker(t)
	setup := mustDial(t, url)
	pubCh := mustConfirmChannel(t, setup)
	s := declareStream(t, url, pubCh, "s", nil)
	publishStream(t, pubCh, s, "m0", "m1")
	prefix := "NOT_IMPLEMENTED - "
	suffix := fmt.Sprintf("not supported by stream queues queue '%s' in vhost '/'", s)

	t.Run("no-ack", func(t *testing.T) {
		c := mustDial(t, url)
		ch := mustChannel(t, c)
		if err := ch.Qos(10, 0, false); err != nil {
			t.Fatalf("basic.qos: %v", err)
		}
		_, err := ch.Consume(s, "", true, false, false, false, nil)
		checkAMQPError(t, err, amqp.NotImplemented, prefix+"automatic acknowledgement "+suffix)
		expectConnClosed(t, c, amqp.NotImplemented, prefix+"automatic acknowledgement "+suffix)
	})
	t.Run("basic.get", func(t *testing.T) {
		c := mustDial(t, url)
		ch := mustChannel(t, c)
		_, _, err := ch.Get(s, false)
		checkAMQPError(t, err, amqp.NotImplemented, prefix+"basic.get "+suffix)
		expectConnClosed(t, c, amqp.NotImplemented, prefix+"basic.get "+suffix)
	})
	t.Run("queue.purge", func(t *testing.T) {
		c := mustDial(t, url)
		ch := mustChannel(t, c)
		_, err := ch.QueuePurge(s, false)
		checkAMQPError(t, err, amqp.NotImplemented, prefix+"queue.purge "+suffix)
		expectConnClosed(t, c, amqp.NotImplemented, prefix+"queue.purge "+suffix)
	})
	t.Run("global qos", func(t *testing.T) {
		c := mustDial(t, url)
		ch := mustChannel(t, c)
		if err := ch.Qos(10, 0, false); err != nil {
			t.Fatalf("basic.qos: %v", err)
		}
		if err := ch.Qos(10, 0, true); err != nil {
			t.Fatalf("global basic.qos: %v", err)
		}
		text := fmt.Sprintf("NOT_IMPLEMENTED - queue '%s' in vhost '/' does not support global qos", s)
		_, err := ch.Consume(s, "", false, false, false, false, nil)
		if err == nil {
			t.Fatalf("consume with a global qos: accepted, want 540 %q", text)
		}
		checkAMQPError(t, err, amqp.NotImplemented, text)
		expectConnClosed(t, c, amqp.NotImplemented, text)
	})
	for _, op := range []string{"nack", "reject"} {
		t.Run(op, func(t *testing.T) {
			c := mustDial(t, url)
			ch, d := consumeStream(t, c, s, 10, amqp.Table{"x-stream-offset": "first"})
			m := recvWithin(t, d, waitFor)
			if op == "nack" {
				_ = ch.Nack(m.DeliveryTag, false, true)
			} else {
				_ = ch.Reject(m.DeliveryTag, false)
			}
			expectConnClosed(t, c, amqp.NotImplemented, prefix+"basic.nack and basic.reject "+suffix)
		})
	}
	// The stream itself is intact.
	c := mustDial(t, url)
	ch, d := consumeStream(t, c, s, 10, amqp.Table{"x-stream-offset": "first"})
	expectStream(t, "after the refusals", recvStream(t, ch, d, 2, true), 0)
}

// TestITStreamNamedOffsetResume: a consumer named with x-stream-consumer-name
// has its highest contiguous acked offset stored; reconnecting with the same
// name and no x-stream-offset resumes right after it (Warren extension).
func TestITStreamNamedOffsetResume(t *testing.T) {
	skipWarrenOnly(t, "x-stream-consumer-name")
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	publishStream(t, pub, s, bodiesFrom(0, 10)...)
	named := func(extra amqp.Table) amqp.Table {
		a := amqp.Table{"x-stream-consumer-name": "reader-1"}
		for k, v := range extra {
			a[k] = v
		}
		return a
	}

	// A name never seen and no x-stream-offset: starts at next, as an unnamed consumer.
	c1 := mustDial(t, url)
	_, d := consumeStream(t, c1, s, 20, named(nil))
	noDelivery(t, d, quiet)
	_ = c1.Close()

	// From first: ack 0..4 and 6, leave 5 and 7.. unacked; disconnect.
	c1 = mustDial(t, url)
	ch1, d := consumeStream(t, c1, s, 20, named(amqp.Table{"x-stream-offset": "first"}))
	got := recvStream(t, ch1, d, 10, false)
	expectStream(t, "named consumer from first", got, 0)
	for _, i := range []int{0, 1, 2, 3, 4, 6} {
		if err := ch1.Ack(got[i].tag, false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	expectOpen(t, ch1) // a round trip: the acks were processed
	_ = c1.Close()

	// Same name, no offset: resumes right after the highest contiguous acked offset (4).
	c2 := mustDial(t, url)
	ch2, d := consumeStream(t, c2, s, 20, named(nil))
	got = recvStream(t, ch2, d, 5, true)
	expectStream(t, "resumed after reconnect", got, 5)
	noDelivery(t, d, quiet)
	// Tailing under a name moves the stored offset too.
	publishStream(t, pub, s, "m10")
	expectStream(t, "named consumer tailing", recvStream(t, ch2, d, 1, true), 10)
	expectOpen(t, ch2)
	_ = c2.Close()

	// Another name is independent; an explicit x-stream-offset wins over the stored one.
	c3 := mustDial(t, url)
	ch3, d := consumeStream(t, c3, s, 20, amqp.Table{"x-stream-consumer-name": "reader-2", "x-stream-offset": int64(8)})
	expectStream(t, "other name from 8", recvStream(t, ch3, d, 3, true), 8)
	ch3b, d3b := consumeStream(t, c3, s, 20, named(amqp.Table{"x-stream-offset": "first"}))
	expectStream(t, "explicit first under a stored name", recvStream(t, ch3b, d3b, 11, false), 0)
	_ = c3.Close()

	// Consuming from first without acking moved nothing: reader-1 still resumes at 11.
	c4 := mustDial(t, url)
	_, d = consumeStream(t, c4, s, 20, named(nil))
	noDelivery(t, d, quiet)
	publishStream(t, pub, s, "m11")
	m := recvWithin(t, d, waitFor)
	if off := streamOffsetOf(t, m); off != 11 {
		t.Fatalf("reader-1 resumed at offset %d (%q), want 11", off, m.Body)
	}

	// A name that is not a string is refused.
	bad := mustChannel(t, c4)
	if err := bad.Qos(10, 0, false); err != nil {
		t.Fatalf("basic.qos: %v", err)
	}
	_, err := bad.Consume(s, "", false, false, false, false, amqp.Table{"x-stream-consumer-name": int32(5)})
	checkAMQPError(t, err, amqp.PreconditionFailed, "")
}

// TestITStreamNamedOffsetAfterRestart: stored offsets, every message and the
// offsets themselves survive a broker restart.
func TestITStreamNamedOffsetAfterRestart(t *testing.T) {
	b := newRestartBroker(t)
	c := mustDial(t, b.url)
	pub := mustConfirmChannel(t, c)
	s := uniq(t, "s")
	mustDeclareDurableQueue(t, pub, s, amqp.Table{"x-queue-type": "stream"})
	publishStream(t, pub, s, bodiesFrom(0, 10)...)
	args := amqp.Table{"x-stream-consumer-name": "reader", "x-stream-offset": "first"}
	ch, d := consumeStream(t, c, s, 20, args)
	got := recvStream(t, ch, d, 10, false)
	if err := ch.Ack(got[6].tag, true); err != nil {
		t.Fatalf("ack: %v", err)
	}
	expectOpen(t, ch)

	b.restart()

	c2 := mustDial(t, b.url)
	ch2, d2 := consumeStream(t, c2, s, 20, amqp.Table{"x-stream-consumer-name": "reader"})
	expectStream(t, "named consumer after restart", recvStream(t, ch2, d2, 3, true), 7)
	noDelivery(t, d2, quiet)
	expectOpen(t, ch2)

	b.restart()

	c3 := mustDial(t, b.url)
	ch3, d3 := consumeStream(t, c3, s, 20, amqp.Table{"x-stream-consumer-name": "reader"})
	noDelivery(t, d3, quiet)
	pub3 := mustConfirmChannel(t, c3)
	publishStream(t, pub3, s, "m10")
	expectStream(t, "after a second restart", recvStream(t, ch3, d3, 1, true), 10)
}

// TestITStreamDurableAcrossRestart: every confirmed message keeps its offset
// across a restart, new ones continue the numbering, and a retention cut
// stays cut.
func TestITStreamDurableAcrossRestart(t *testing.T) {
	b := newRestartBroker(t)
	c := mustDial(t, b.url)
	pub := mustConfirmChannel(t, c)
	s := uniq(t, "s")
	r := uniq(t, "r")
	mustDeclareDurableQueue(t, pub, s, amqp.Table{"x-queue-type": "stream"})
	mustDeclareDurableQueue(t, pub, r, amqp.Table{"x-queue-type": "stream",
		"x-max-length-bytes": int64(20000), "x-stream-max-segment-size-bytes": int64(5000)})
	const n = 300
	// Asynchronous publishes: chunks of several messages.
	publishAllConfirmed(t, pub, "", s, n, func(i int) amqp.Publishing {
		return amqp.Publishing{Body: []byte("m" + strconv.Itoa(i)), Headers: amqp.Table{"i": int64(i)}}
	})
	for i := range 100 {
		publishConfirmed(t, pub, "", r, false, padded(i, 1000))
	}
	var rKept kept
	eventually(t, "retention on "+r, func() bool {
		rKept = readToEnd(t, c, r, "first", 99)
		return rKept.index > 0
	})

	b.restart()

	c2 := mustDial(t, b.url)
	ch, d := consumeStream(t, c2, s, 100, amqp.Table{"x-stream-offset": "first"})
	for i := range n {
		m := recvWithin(t, d, waitFor)
		if off := streamOffsetOf(t, m); off != int64(i) || string(m.Body) != "m"+strconv.Itoa(i) || m.Headers["i"] != int64(i) {
			t.Fatalf("after restart delivery %d: %q at offset %d headers %v", i, m.Body, off, m.Headers)
		}
		if err := ch.Ack(m.DeliveryTag, false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	noDelivery(t, d, quiet)
	pub2 := mustConfirmChannel(t, c2)
	publishStream(t, pub2, s, "m"+strconv.Itoa(n))
	expectStream(t, "first publish after restart", recvStream(t, ch, d, 1, true), n)

	if got := readToEnd(t, c2, r, "first", 99); got != rKept {
		t.Errorf("after restart the retained stream starts at m%d (offset %d), want m%d (offset %d) as before",
			got.index, got.offset, rKept.index, rKept.offset)
	}
}

// TestITStreamFilter: x-stream-filter-value on publish; consumers with
// x-stream-filter (string or array) and x-stream-match-unfiltered (RabbitMQ
// 3.13+). RabbitMQ filters per chunk with a Bloom filter; every message here
// is a chunk of its own, so both brokers deliver exactly the matching ones.
func TestITStreamFilter(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	if rabbitBefore(c, 3, 13) {
		_, v := serverVersion(c)
		t.Skipf("stream filtering needs RabbitMQ 3.13 or later; the broker is %s", v)
	}
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	values := []string{"red", "blue", "", "green", "red", "", "blue"}
	for i, v := range values {
		msg := amqp.Publishing{Body: []byte("m" + strconv.Itoa(i))}
		if v != "" {
			msg.Headers = amqp.Table{"x-stream-filter-value": v}
		}
		publishConfirmed(t, pub, "", s, false, msg)
	}
	offsets := func(msgs []streamMsg) []int64 {
		var out []int64
		for _, m := range msgs {
			if m.body != "m"+strconv.FormatInt(m.offset, 10) {
				t.Fatalf("offset %d holds %q", m.offset, m.body)
			}
			out = append(out, m.offset)
		}
		return out
	}
	for _, tc := range []struct {
		what string
		args amqp.Table
		want []int64
	}{
		{"string filter", amqp.Table{"x-stream-filter": "red"}, []int64{0, 4}},
		{"array filter", amqp.Table{"x-stream-filter": []any{"red", "green"}}, []int64{0, 3, 4}},
		{"match-unfiltered true", amqp.Table{"x-stream-filter": "blue", "x-stream-match-unfiltered": true}, []int64{1, 2, 5, 6}},
		{"match-unfiltered false", amqp.Table{"x-stream-filter": "blue", "x-stream-match-unfiltered": false}, []int64{1, 6}},
		{"no filter", nil, []int64{0, 1, 2, 3, 4, 5, 6}},
	} {
		args := amqp.Table{"x-stream-offset": "first"}
		for k, v := range tc.args {
			args[k] = v
		}
		ch, d := consumeStream(t, c, s, 2, args) // a small prefetch: skipped messages must not use credit
		got := offsets(recvStream(t, ch, d, len(tc.want), true))
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: offsets %v, want %v", tc.what, got, tc.want)
		}
		noDelivery(t, d, quiet)
		_ = ch.Close()
	}

	// A filtered consumer tails too.
	ch, d := consumeStream(t, c, s, 10, amqp.Table{"x-stream-filter": "green"})
	publishConfirmed(t, pub, "", s, false, amqp.Publishing{Body: []byte("m7"), Headers: amqp.Table{"x-stream-filter-value": "red"}})
	publishConfirmed(t, pub, "", s, false, amqp.Publishing{Body: []byte("m8"), Headers: amqp.Table{"x-stream-filter-value": "green"}})
	if got := offsets(recvStream(t, ch, d, 1, true)); got[0] != 8 {
		t.Errorf("filtered tailing consumer got offset %d, want 8", got[0])
	}
	noDelivery(t, d, quiet)
}

// TestITStreamNamedFilteredResume: a named, filtered consumer stores offsets
// past the messages the filter skipped (Warren extension).
func TestITStreamNamedFilteredResume(t *testing.T) {
	skipWarrenOnly(t, "x-stream-consumer-name")
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	for i, v := range []string{"a", "b", "b", "a", "b"} {
		publishConfirmed(t, pub, "", s, false, amqp.Publishing{Body: []byte("m" + strconv.Itoa(i)), Headers: amqp.Table{"x-stream-filter-value": v}})
	}
	c1 := mustDial(t, url)
	ch, d := consumeStream(t, c1, s, 10, amqp.Table{"x-stream-consumer-name": "fa", "x-stream-offset": "first", "x-stream-filter": "a"})
	got := recvStream(t, ch, d, 2, true)
	if got[0].offset != 0 || got[1].offset != 3 {
		t.Fatalf("filtered named consumer: offsets %d, %d, want 0, 3", got[0].offset, got[1].offset)
	}
	expectOpen(t, ch)
	_ = c1.Close()
	publishConfirmed(t, pub, "", s, false, amqp.Publishing{Body: []byte("m5"), Headers: amqp.Table{"x-stream-filter-value": "a"}})
	// Resumes after offset 4 (skipped b's count as done), so 5 is the next one, not a replay of 4.
	c2 := mustDial(t, url)
	ch2, d2 := consumeStream(t, c2, s, 10, amqp.Table{"x-stream-consumer-name": "fa", "x-stream-filter": "a"})
	if got := recvStream(t, ch2, d2, 1, true); got[0].offset != 5 {
		t.Fatalf("resumed filtered named consumer at offset %d, want 5", got[0].offset)
	}
	noDelivery(t, d2, quiet)
}

// TestITStreamDeleteCancelsConsumers: deleting a stream cancels its consumers
// (basic.cancel) and a new stream of the same name starts at offset 0.
func TestITStreamDeleteCancelsConsumers(t *testing.T) {
	url := startBroker(t)
	c := mustDial(t, url)
	pub := mustConfirmChannel(t, c)
	s := declareStream(t, url, pub, "s", nil)
	publishStream(t, pub, s, "m0", "m1")
	ch, d := consumeStream(t, mustDial(t, url), s, 10, amqp.Table{"x-stream-offset": "first"})
	cancels := ch.NotifyCancel(make(chan string, 1))
	recvStream(t, ch, d, 2, true)
	if _, err := pub.QueueDelete(s, false, false, false); err != nil {
		t.Fatalf("delete stream: %v", err)
	}
	select {
	case <-cancels:
	case <-time.After(waitFor):
		t.Fatalf("no basic.cancel within %v after the stream was deleted", waitFor)
	}
	if _, err := pub.QueueDeclare(s, true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
		t.Fatalf("redeclare: %v", err)
	}
	publishStream(t, pub, s, "m0")
	ch2, d2 := consumeStream(t, c, s, 10, amqp.Table{"x-stream-offset": "first"})
	expectStream(t, "recreated stream", recvStream(t, ch2, d2, 1, true), 0)
	noDelivery(t, d2, quiet)
}
