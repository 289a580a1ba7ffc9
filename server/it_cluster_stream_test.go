package server_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// publishClusterConfirmed is publishConfirmed with the cluster's patience: a confirm waits for
// replicas on other nodes, which a loaded machine can delay past waitFor.
func publishClusterConfirmed(t *testing.T, ch *itChan, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, msg)
	if err != nil {
		t.Fatalf("publish to %q/%q: %v", exchange, key, err)
	}
	if acked, err := dc.WaitContext(ctx); err != nil || !acked {
		t.Fatalf("publish to %q/%q: acked %v, %v", exchange, key, acked, err)
	}
}

// firstDelivery is the offset of the first delivery on d within d, or -1.
func firstDelivery(t *testing.T, d <-chan amqp.Delivery, wait time.Duration) int64 {
	t.Helper()
	select {
	case m, ok := <-d:
		if ok {
			return streamOffsetOf(t, m)
		}
	case <-time.After(wait):
	}
	return -1
}

// readStreamFrom reads stream s through url from x-stream-offset first until the delivery at
// offset last arrived; it returns the bodies by offset.
func readStreamFrom(t *testing.T, url, s string, last int64) map[int64]string {
	t.Helper()
	c := mustDial(t, url)
	defer c.Close()
	ch, d := consumeStream(t, c, s, 100, amqp.Table{"x-stream-offset": "first"})
	got := map[int64]string{}
	for {
		m := recvWithin(t, d, clusterWait)
		off := streamOffsetOf(t, m)
		got[off] = string(m.Body)
		_ = ch.Ack(m.DeliveryTag, false)
		if off >= last {
			return got
		}
	}
}

// firstOffsetOn is the offset of the first delivery from x-stream-offset first through url.
func firstOffsetOn(t *testing.T, url, s string) int64 {
	t.Helper()
	c := mustDial(t, url)
	defer c.Close()
	_, d := consumeStream(t, c, s, 1, amqp.Table{"x-stream-offset": "first"})
	return streamOffsetOf(t, recvWithin(t, d, clusterWait))
}

// TestClusterStreamReplicaState: a stream of a 3-node cluster over TCP. Every node serves the
// same records at the same offsets; a named offset stored through one node is where a consumer of
// another node resumes; retention removes the same segments on every node; and a node that was
// down while retention removed what it missed catches up from the leader's first offset.
func TestClusterStreamReplicaState(t *testing.T) {
	tc := newTestCluster(t, 3)
	c1 := mustDial(t, tc.urls[0])
	const s = "replicated.stream"
	declareRetry(t, c1, "declare the stream", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(s, true, false, false, false, amqp.Table{"x-queue-type": "stream",
			"x-initial-cluster-size": int64(3), "x-stream-max-segment-size-bytes": int64(4000), "x-max-length-bytes": int64(12000)})
		return err
	})
	body := func(i int) []byte {
		b := make([]byte, 1000)
		copy(b, "m"+strconv.Itoa(i)+"|")
		return b
	}
	pollUntil(t, "the stream has a leader", clusterWait, func() bool { return tc.leaderOf("stream '"+s+"' in vhost '/'") >= 0 })
	// A node learns of the stream when it applies the metadata entry, which a loaded node may do
	// after the declare-ok: consume on every node only once each knows it.
	for i, u := range tc.urls {
		c := mustDial(t, u)
		pollUntil(t, "the stream is known on "+tc.ids[i], clusterWait, func() bool {
			ch, err := c.Channel()
			if err != nil {
				return false
			}
			defer ch.Close()
			_, err = ch.QueueDeclarePassive(s, true, false, false, false, nil)
			return err == nil
		})
		c.Close()
	}
	// Publish through n2 (whichever node leads).
	pub := mustConfirmChannel(t, mustDial(t, tc.urls[1]))
	for i := range 40 {
		publishClusterConfirmed(t, pub, "", s, amqp.Publishing{Body: body(i)})
	}
	// Same offsets and bodies on every node; retention leaves the same first offset everywhere.
	sameEverywhere := func(last int64) {
		t.Helper()
		var first int64 = -1
		pollUntil(t, "every node starts the stream at the same offset", clusterWait, func() bool {
			f := firstOffsetOn(t, tc.urls[0], s)
			for i := 1; i < len(tc.urls); i++ {
				if tc.srvs[i] != nil && firstOffsetOn(t, tc.urls[i], s) != f {
					return false
				}
			}
			first = f
			return true
		})
		if first <= 0 {
			t.Fatalf("retention removed nothing (first offset %d) from %d KB with a 12 KB limit", first, last+1)
		}
		ref := readStreamFrom(t, tc.urls[0], s, last)
		for i := 1; i < len(tc.urls); i++ {
			got := readStreamFrom(t, tc.urls[i], s, last)
			for off := first; off <= last; off++ {
				g, ok := got[off]
				if !ok || g != ref[off] || !strings.HasPrefix(g, "m"+strconv.FormatInt(off, 10)+"|") {
					t.Fatalf("offset %d: node %s has %.8q, node %s %.8q", off, tc.ids[i], g, tc.ids[0], ref[off])
				}
			}
		}
	}
	sameEverywhere(39)

	// A named offset stored through n3 is where a consumer on n1 resumes.
	c3 := mustDial(t, tc.urls[2])
	ch3, d3 := consumeStream(t, c3, s, 100, amqp.Table{"x-stream-offset": "first", "x-stream-consumer-name": "reader"})
	var acked int64
	for {
		m := recvWithin(t, d3, clusterWait)
		acked = streamOffsetOf(t, m)
		if err := ch3.Ack(m.DeliveryTag, false); err != nil {
			t.Fatal(err)
		}
		if acked == 35 {
			break
		}
	}
	c3.Close()
	pollUntil(t, "a consumer on n1 resumes after the offset stored through n3", clusterWait, func() bool {
		c := mustDial(t, tc.urls[0])
		defer c.Close()
		_, d := consumeStream(t, c, s, 1, amqp.Table{"x-stream-consumer-name": "reader"})
		return firstDelivery(t, d, time.Second) == 36
	})

	// n3 is down while 60 more records are published and retention removes everything it had.
	tc.stop(2)
	pub = mustConfirmChannel(t, mustDial(t, tc.urls[0]))
	for i := 40; i < 100; i++ {
		publishClusterConfirmed(t, pub, "", s, amqp.Publishing{Body: body(i)})
	}
	if f := firstOffsetOn(t, tc.urls[0], s); f <= 40 {
		t.Fatalf("after 100 KB with a 12 KB limit the stream starts at %d, want past 40 (what n3 had)", f)
	}
	if err := tc.startErr(2); err != nil {
		t.Fatalf("restart n3: %v", err)
	}
	sameEverywhere(99)
	// The named offset survived on the restarted node too.
	c3 = mustDial(t, tc.urls[2])
	defer c3.Close()
	_, d3 = consumeStream(t, c3, s, 1, amqp.Table{"x-stream-consumer-name": "reader"})
	if off := streamOffsetOf(t, recvWithin(t, d3, clusterWait)); off < 36 {
		t.Fatalf("the restarted node resumes 'reader' at %d, want at least 36", off)
	}
}

// TestClusterConsumerGroupAcrossNodes: members of one group on different nodes share a super
// stream's partitions, one owner each, and every message is delivered once.
func TestClusterConsumerGroupAcrossNodes(t *testing.T) {
	tc := newTestCluster(t, 3)
	c1 := mustDial(t, tc.urls[0])
	const s = "orders"
	declareRetry(t, c1, "declare the super stream", func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(s, "x-super-stream", true, false, false, false, amqp.Table{"x-partitions": int64(2)})
	})
	type member struct {
		ch *itChan
		d  <-chan amqp.Delivery
	}
	var members []member
	for _, url := range []string{tc.urls[1], tc.urls[2]} {
		c := mustDial(t, url)
		var m member
		var err error
		pollUntil(t, "join the group", clusterWait, func() bool {
			m.ch = mustChannel(t, c)
			if err = m.ch.Qos(100, 0, false); err != nil {
				return false
			}
			m.d, err = m.ch.Consume(s, "", false, false, false, false, amqp.Table{"x-stream-consumer-group": "g", "x-stream-offset": "first"})
			return err == nil
		})
		members = append(members, m)
	}
	for p := range 2 {
		g := "stream '" + s + "-" + strconv.Itoa(p) + "' in vhost '/'"
		pollUntil(t, "the partition has a leader", clusterWait, func() bool { return tc.leaderOf(g) >= 0 })
	}
	pub := mustConfirmChannel(t, c1)
	const n = 200
	for i := range n {
		publishClusterConfirmed(t, pub, s, "key-"+strconv.Itoa(i), amqp.Publishing{Body: []byte(strconv.Itoa(i))})
	}
	seen := map[string]int{}
	owner := map[string]int{} // partition -> member
	deadline := time.After(clusterWait)
	for len(seen) < n {
		for i, m := range members {
			select {
			case d := <-m.d:
				part, _ := d.Headers["x-stream-partition"].(string)
				if o, ok := owner[part]; ok && o != i {
					t.Fatalf("partition %q delivered to members %d and %d", part, o, i)
				}
				owner[part] = i
				seen[string(d.Body)]++
				if seen[string(d.Body)] > 1 {
					t.Fatalf("message %s delivered twice", d.Body)
				}
				_ = m.ch.Ack(d.DeliveryTag, false)
			case <-time.After(10 * time.Millisecond):
			case <-deadline:
				t.Fatalf("received %d of %d messages", len(seen), n)
			}
		}
	}
	if len(owner) != 2 || owner[s+"-0"] == owner[s+"-1"] {
		t.Fatalf("partition owners %v: want one partition per member", owner)
	}
}
