package server_test

// Super streams (issue 14 point 2): exchange.declare(S, "x-super-stream", {"x-partitions": N})
// creates partition streams S-0..S-{N-1} bound with keys "0".."N-1" and x-stream-partition-order;
// a publish to S goes to the partition its routing key hashes to (murmur3, seed 104729, as
// RabbitMQ's stream clients); redeclaration, deletion and bad input.

import (
	"fmt"
	"strconv"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// declareSuperStream declares super stream S with n partitions (and extra arguments) and deletes
// it at the end of the test.
func declareSuperStream(t *testing.T, url string, ch *itChan, what string, n int, extra amqp.Table) string {
	t.Helper()
	name := uniq(t, what)
	args := amqp.Table{"x-partitions": int32(n)}
	for k, v := range extra {
		args[k] = v
	}
	if err := ch.ExchangeDeclare(name, "x-super-stream", true, false, false, false, args); err != nil {
		t.Fatalf("declare super stream %s: %v", name, err)
	}
	deleteAtEnd(t, url, nil, []string{name})
	return name
}

func TestITSuperStreamTopology(t *testing.T) {
	skipWarrenOnly(t, "x-super-stream exchanges")
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustChannel(t, c)
	s := declareSuperStream(t, url, ch, "ss", 3, amqp.Table{"x-max-length-bytes": int64(1 << 30)})
	for i := range 3 {
		p := fmt.Sprintf("%s-%d", s, i)
		if !queueExists(t, c, p) {
			t.Fatalf("partition %s does not exist", p)
		}
		// Each partition is a stream: a stream argument on redeclaration is checked.
		pch := mustChannel(t, c)
		if _, err := pch.QueueDeclare(p, true, false, false, false, amqp.Table{"x-queue-type": "stream", "x-max-length-bytes": int64(1 << 30)}); err != nil {
			t.Fatalf("redeclare partition %s as a stream: %v", p, err)
		}
	}
	if queueExists(t, c, s+"-3") {
		t.Fatal("a fourth partition exists")
	}
	// Binding key "i" routes only through the super stream's hash, not by the key's name: a
	// publish with key "0" goes where murmur3("0") says (partition 2 of 3).
	pub := mustConfirmChannel(t, c)
	publishConfirmed(t, pub, s, "0", true, amqp.Publishing{Body: []byte("k0")})
	cons := mustDial(t, url)
	_, d := consumeStream(t, cons, s+"-2", 10, amqp.Table{"x-stream-offset": "first"})
	if m := recvWithin(t, d, waitFor); string(m.Body) != "k0" || m.RoutingKey != "0" || m.Exchange != s {
		t.Fatalf("partition 2 got %q (exchange %q, key %q)", m.Body, m.Exchange, m.RoutingKey)
	}
	// Redeclaring with the same arguments is fine, different ones are 406.
	if err := ch.ExchangeDeclare(s, "x-super-stream", true, false, false, false,
		amqp.Table{"x-partitions": int64(3), "x-max-length-bytes": int64(1 << 30)}); err != nil {
		t.Fatalf("redeclare with equal arguments: %v", err)
	}
	err := ch.ExchangeDeclare(s, "x-super-stream", true, false, false, false, amqp.Table{"x-partitions": int32(4), "x-max-length-bytes": int64(1 << 30)})
	checkAMQPError(t, err, amqp.PreconditionFailed,
		fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg 'x-partitions' for exchange '%s' in vhost '/': received '4' but current is '3'", s))
	ch = mustChannel(t, c)
	err = ch.ExchangeDeclare(s, "x-super-stream", true, false, false, false, amqp.Table{"x-partitions": int32(3)})
	checkAMQPError(t, err, amqp.PreconditionFailed,
		fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg 'x-max-length-bytes' for exchange '%s' in vhost '/': received none but current is '1073741824'", s))
	// exchange.delete deletes the partitions too.
	ch = mustChannel(t, c)
	if err := ch.ExchangeDelete(s, false, false); err != nil {
		t.Fatalf("exchange.delete %s: %v", s, err)
	}
	for i := range 3 {
		if queueExists(t, c, fmt.Sprintf("%s-%d", s, i)) {
			t.Fatalf("partition %d survived the deletion of its super stream", i)
		}
	}
	if exchangeExists(t, c, s) {
		t.Fatal("the super stream exchange survived")
	}
}

// TestITSuperStreamHashRouting publishes keys whose partitions RabbitMQ's stream clients
// compute (recorded from rabbitmq-stream-go-client) and checks each partition holds exactly its
// keys, in publish order per key.
func TestITSuperStreamHashRouting(t *testing.T) {
	skipWarrenOnly(t, "x-super-stream exchanges")
	url := startBroker(t)
	c := mustDial(t, url)
	ch := mustChannel(t, c)
	s := declareSuperStream(t, url, ch, "hash", 3, nil)
	want := map[string]int{"": 1, "a": 1, "ab": 0, "abc": 0, "abcd": 2, "hello": 0, "order-12345": 2,
		"customer-42": 2, "héllo wörld": 0, "0": 2, "1": 2, "2": 1}
	pub := mustConfirmChannel(t, c)
	const rounds = 20
	for r := range rounds {
		for k := range want {
			publishConfirmed(t, pub, s, k, true, amqp.Publishing{Body: []byte(k + "#" + strconv.Itoa(r))})
		}
	}
	perPartition := map[int]int{}
	for _, p := range want {
		perPartition[p] += rounds
	}
	for p := range 3 {
		n := perPartition[p]
		cons := mustDial(t, url)
		cch, d := consumeStream(t, cons, fmt.Sprintf("%s-%d", s, p), 500, amqp.Table{"x-stream-offset": "first"})
		next := map[string]int{}
		for i := range n {
			m := recvWithin(t, d, waitFor)
			if got := want[m.RoutingKey]; got != p {
				t.Fatalf("key %q (partition %d) was routed to partition %d", m.RoutingKey, got, p)
			}
			if wantBody := m.RoutingKey + "#" + strconv.Itoa(next[m.RoutingKey]); string(m.Body) != wantBody {
				t.Fatalf("partition %d, delivery %d: %q, want %q (per-key order)", p, i, m.Body, wantBody)
			}
			next[m.RoutingKey]++
			_ = cch.Ack(m.DeliveryTag, false)
		}
		noDelivery(t, d, quiet)
	}
}

func TestITSuperStreamBadInput(t *testing.T) {
	skipWarrenOnly(t, "x-super-stream exchanges")
	url := startBroker(t)
	c := mustDial(t, url)
	for _, tc := range []struct {
		args amqp.Table
		text string
	}{
		{amqp.Table{}, "a super stream needs the number of its partitions"},
		{amqp.Table{"x-partitions": "3"}, "must be an integer, got longstr"},
		{amqp.Table{"x-partitions": int32(0)}, "0 is not between 1 and 1000"},
		{amqp.Table{"x-partitions": int32(-2)}, "-2 is not between 1 and 1000"},
		{amqp.Table{"x-partitions": int32(1001)}, "1001 is not between 1 and 1000"},
	} {
		name := uniq(t, "bad")
		ch := mustChannel(t, c)
		err := ch.ExchangeDeclare(name, "x-super-stream", true, false, false, false, tc.args)
		checkAMQPError(t, err, amqp.PreconditionFailed,
			fmt.Sprintf("PRECONDITION_FAILED - invalid arg 'x-partitions' for exchange '%s' in vhost '/': %s", name, tc.text))
		if exchangeExists(t, c, name) || queueExists(t, c, name+"-0") {
			t.Fatalf("%v: a refused declaration left something behind", tc.args)
		}
	}
	// A bad stream argument: 406 with the stream's text, nothing created.
	name := uniq(t, "badarg")
	ch := mustChannel(t, c)
	err := ch.ExchangeDeclare(name, "x-super-stream", true, false, false, false, amqp.Table{"x-partitions": int32(2), "x-max-age": "ten days"})
	checkAMQPError(t, err, amqp.PreconditionFailed,
		fmt.Sprintf("PRECONDITION_FAILED - invalid arg 'x-max-age' for queue '%s-0' in vhost '/': invalid_max_age", name))
	if exchangeExists(t, c, name) || queueExists(t, c, name+"-0") {
		t.Fatal("a refused declaration left something behind")
	}
	// A partition's name taken: 406, and no partition created.
	name = uniq(t, "taken")
	ch = mustChannel(t, c)
	if _, err := ch.QueueDeclare(name+"-1", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	deleteAtEnd(t, url, []string{name + "-1"}, nil)
	err = ch.ExchangeDeclare(name, "x-super-stream", true, false, false, false, amqp.Table{"x-partitions": int32(3)})
	checkAMQPError(t, err, amqp.PreconditionFailed,
		fmt.Sprintf("PRECONDITION_FAILED - cannot declare super stream '%s' in vhost '/': queue '%s-1' already exists", name, name))
	if exchangeExists(t, c, name) || queueExists(t, c, name+"-0") || queueExists(t, c, name+"-2") {
		t.Fatal("a refused declaration left something behind")
	}
	// Non-durable: 406.
	ch = mustChannel(t, c)
	err = ch.ExchangeDeclare(uniq(t, "transient"), "x-super-stream", false, false, false, false, amqp.Table{"x-partitions": int32(1)})
	checkAMQPError(t, err, amqp.PreconditionFailed, "")
}
