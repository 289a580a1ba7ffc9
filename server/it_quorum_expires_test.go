package server_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// expiresWait bounds how long an unused queue with a short x-expires may take to go: RabbitMQ
// checks a quorum queue's expiry on its tick (every 5 s in 3.10).
const expiresWait = 20 * time.Second

// pollGone waits until probe reports the queue gone and returns when that was seen.
func pollGone(t *testing.T, what string, probe func() bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(expiresWait)
	for probe() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still there after %v", what, expiresWait)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Now()
}

// A quorum queue with x-expires is deleted once it has been unused (no consumer, no basic.get)
// for the period, not before; a consumer keeps it, and the period starts again when it leaves.
// Passive declarations do not renew a quorum queue's lease (RabbitMQ 3.10.8 agrees).
func TestITQuorumQueueExpires(t *testing.T) {
	u := startBroker(t)
	c := mustDial(t, u)
	ch := mustChannel(t, c)
	const ttl = 1500 * time.Millisecond
	args := quorumArgs(amqp.Table{"x-expires": int32(ttl / time.Millisecond)})

	unused := uniq(t, "unused")
	if _, err := ch.QueueDeclare(unused, true, false, false, false, args); err != nil {
		t.Fatalf("declare %s: %v", unused, err)
	}
	deleteAtEnd(t, u, []string{unused}, nil)
	declared := time.Now()
	gone := pollGone(t, "an unused quorum queue with x-expires", func() bool { return lcRoutable(t, c, unused) })
	if el := gone.Sub(declared); el < ttl-100*time.Millisecond {
		t.Errorf("quorum queue deleted %v after its declaration, before its x-expires of %v", el, ttl)
	}

	polled := uniq(t, "polled")
	if _, err := ch.QueueDeclare(polled, true, false, false, false, args); err != nil {
		t.Fatalf("declare %s: %v", polled, err)
	}
	deleteAtEnd(t, u, []string{polled}, nil)
	pollGone(t, "a quorum queue declared passively over and over", func() bool { return queueExists(t, c, polled) })

	used := uniq(t, "used")
	if _, err := ch.QueueDeclare(used, true, false, false, false, args); err != nil {
		t.Fatalf("declare %s: %v", used, err)
	}
	deleteAtEnd(t, u, []string{used}, nil)
	cch := mustChannel(t, c)
	d := mustConsume(t, cch, used, "keeper", true, nil)
	until := time.Now().Add(3 * ttl)
	for time.Now().Before(until) {
		if !lcRoutable(t, c, used) {
			t.Fatalf("%s expired while it had a consumer", used)
		}
		recvBody(t, d, "probe")
		time.Sleep(200 * time.Millisecond)
	}
	if err := cch.Cancel("keeper", false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}
	cancelled := time.Now()
	gone = pollGone(t, "a quorum queue whose consumer left", func() bool { return lcRoutable(t, c, used) })
	if el := gone.Sub(cancelled); el < ttl-100*time.Millisecond {
		t.Errorf("quorum queue deleted %v after its consumer left, before its x-expires of %v", el, ttl)
	}
}
