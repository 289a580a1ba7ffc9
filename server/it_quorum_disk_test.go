package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server"
)

// A quorum queue keeps the bodies of its first 4,096 ready messages in memory and the rest in
// records on disk; these tests put a backlog well beyond that window through a restart and
// through a follower's catch-up from a snapshot, and check what a consumer sees: every body,
// in order, with the redelivered flags of the messages that were returned.

// backlogBeyondWindow is larger than the replica's in-memory window (4,096 ready messages).
const backlogBeyondWindow = 6000

// backlogBody is message i's body: long enough to tell truncation from the real thing.
func backlogBody(i int) string { return fmt.Sprintf("m%05d-%s", i, strings.Repeat("x", 200)) }

// publishRange publishes messages from..to-1 with confirms, a window of 500 at a time.
func publishRange(t *testing.T, ch *itChan, queue string, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for lo := from; lo < to; lo += 500 {
		var confs []*amqp.DeferredConfirmation
		for i := lo; i < min(lo+500, to); i++ {
			c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, persistentMsg(backlogBody(i)))
			if err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
			confs = append(confs, c)
		}
		for k, c := range confs {
			ok, err := c.WaitContext(ctx)
			if err != nil || !ok {
				t.Fatalf("publish %d: confirmed=%v err=%v", lo+k, ok, err)
			}
		}
	}
}

// returnTwo takes messages 0..2 with basic.get on a fresh channel, acks 0, rejects 1 with
// requeue and leaves 2 unacked when the channel closes: 1 and 2 are then ready again,
// redelivered, ahead of 3.
func returnTwo(t *testing.T, c *itConn, queue string) {
	t.Helper()
	ch := mustChannel(t, c)
	d0 := mustGetBody(t, ch, queue, false, backlogBody(0))
	d1 := mustGetBody(t, ch, queue, false, backlogBody(1))
	mustGetBody(t, ch, queue, false, backlogBody(2))
	if err := d0.Ack(false); err != nil {
		t.Fatal(err)
	}
	if err := d1.Reject(true); err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
}

// drainBacklog consumes the queue through url and checks that it holds messages 1..total-1 in
// order, 1 and 2 redelivered and the others not.
func drainBacklog(t *testing.T, url, queue string, total int) {
	t.Helper()
	c := mustDial(t, url)
	ch := mustChannel(t, c)
	eventually(t, fmt.Sprintf("%d messages ready", total-1), func() bool {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, quorumArgs(nil))
		return err == nil && q.Messages == total-1
	})
	if err := ch.Qos(500, 0, false); err != nil {
		t.Fatal(err)
	}
	ds := mustConsume(t, ch, queue, "drain", false, nil)
	for i := 1; i < total; i++ {
		d := recvWithin(t, ds, 30*time.Second)
		if got, want := string(d.Body), backlogBody(i); got != want {
			t.Fatalf("delivery %d: body %.12q (%d bytes), want %.12q (%d bytes)", i, got, len(got), want, len(want))
		}
		if want := i <= 2; d.Redelivered != want {
			t.Fatalf("message %d: redelivered=%v, want %v", i, d.Redelivered, want)
		}
		if i%100 == 0 || i == total-1 {
			if err := d.Ack(true); err != nil {
				t.Fatal(err)
			}
		}
	}
	noDelivery(t, ds, 200*time.Millisecond)
}

// snapshotQueue has node s snapshot the named queue of the default vhost now.
func snapshotQueue(t *testing.T, s *server.Server, name string) {
	t.Helper()
	q := s.Core().VHost("/").Queue(name)
	if q == nil {
		t.Fatalf("queue %s not found", name)
	}
	if err := q.Snapshot(); err != nil {
		t.Fatalf("snapshot of %s: %v", name, err)
	}
}

// TestQuorumBacklogBeyondWindowSurvivesRestart: a backlog beyond the in-memory window, a snapshot
// and a log tail after it come back after a restart, in order, with their redelivered flags.
func TestQuorumBacklogBeyondWindowSurvivesRestart(t *testing.T) {
	b := newRestartBroker(t)
	c := mustDial(t, b.url)
	ch := mustConfirmChannel(t, c)
	name := uniq(t, "qq-backlog")
	if _, err := ch.QueueDeclare(name, true, false, false, false, quorumArgs(nil)); err != nil {
		t.Fatal(err)
	}
	publishRange(t, ch, name, 0, backlogBeyondWindow)
	returnTwo(t, c, name)
	snapshotQueue(t, b.srv, name)
	publishRange(t, ch, name, backlogBeyondWindow, backlogBeyondWindow+100) // the log tail
	c.Close()
	b.restart()
	drainBacklog(t, b.url, name, backlogBeyondWindow+100)
}

// TestClusterFollowerCatchesUpFromSnapshot: a follower that was down while a backlog beyond the
// window was published and the others snapshotted (truncating their logs) catches up from the
// snapshot plus the log tail, and serves every body from its own store to a consumer attached
// through it, in order, with the redelivered flags.
func TestClusterFollowerCatchesUpFromSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes a large backlog on three nodes")
	}
	tc := newTestCluster(t, 3)
	c1 := mustDial(t, tc.urls[0])
	name := "follower-catchup.q"
	declareRetry(t, c1, "declare quorum queue", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, quorumArgs(nil))
		return err
	})
	group := fmt.Sprintf("queue '%s' in vhost '/'", name)
	ch := mustConfirmChannel(t, c1)
	publishRange(t, ch, name, 0, 100)
	returnTwo(t, c1, name)
	pollUntil(t, "n3 applied what n1 did", clusterWait, func() bool { return tc.applied(2, group) >= tc.applied(0, group) })
	tc.stop(2)

	publishRange(t, ch, name, 100, backlogBeyondWindow)
	for i := 0; i < 2; i++ {
		snapshotQueue(t, tc.srvs[i], name)
	}
	publishRange(t, ch, name, backlogBeyondWindow, backlogBeyondWindow+50) // the log tail
	if err := tc.startErr(2); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "n3 catches up", clusterWait, func() bool { return tc.applied(2, group) >= tc.applied(0, group) })
	drainBacklog(t, tc.urls[2], name, backlogBeyondWindow+50)
}
