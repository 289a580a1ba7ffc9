package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server"
	"warren/server/netserve"
)

// testCluster is three in-process brokers forming one cluster over loopback.
type testCluster struct {
	t     *testing.T
	ids   []string
	dirs  []string
	peers map[string]string
	srvs  []*server.Server
	lws   []*testLogWriter
	urls  []string
}

func newTestCluster(t *testing.T, n int) *testCluster {
	t.Helper()
	if againstRabbitMQ() {
		t.Skip("starts its own cluster of in-process brokers")
	}
	tc := &testCluster{t: t, peers: map[string]string{}}
	ports, err := netserve.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("n%d", i+1)
		tc.ids = append(tc.ids, id)
		tc.dirs = append(tc.dirs, t.TempDir())
		tc.peers[id] = fmt.Sprintf("127.0.0.1:%d", ports[i])
	}
	tc.srvs = make([]*server.Server, n)
	tc.lws = make([]*testLogWriter, n)
	tc.urls = make([]string, n)
	t.Cleanup(func() {
		for i := range tc.srvs {
			tc.stop(i)
		}
	})
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = tc.startErr(i) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start %s: %v", tc.ids[i], err)
		}
	}
	return tc
}

func (tc *testCluster) startErr(i int) error {
	lw := &testLogWriter{t: tc.t}
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.DataDir = tc.dirs[i]
	cfg.NodeID = tc.ids[i]
	cfg.ClusterListen = tc.peers[tc.ids[i]]
	cfg.ClusterPeers = tc.peers
	cfg.Logger = slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", tc.ids[i])
	s, err := server.New(cfg)
	if err != nil {
		lw.stop()
		return err
	}
	if err := s.Start(); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		lw.stop()
		return err
	}
	tc.srvs[i], tc.lws[i] = s, lw
	tc.urls[i] = "amqp://guest:guest@" + s.Addr().String() + "/"
	return nil
}

func (tc *testCluster) stop(i int) {
	if tc.srvs[i] == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := tc.srvs[i].Shutdown(ctx); err != nil {
		tc.t.Errorf("shutdown %s: %v", tc.ids[i], err)
	}
	tc.lws[i].stop()
	tc.srvs[i] = nil
}

// leaderOf returns the index of the node leading the named group, or -1.
func (tc *testCluster) leaderOf(group string) int {
	for _, s := range tc.srvs {
		if s == nil {
			continue
		}
		for _, g := range s.ClusterStatus().Groups {
			if g.Name == group && g.Leader != "" {
				for i, id := range tc.ids {
					if id == g.Leader && tc.srvs[i] != nil {
						return i
					}
				}
			}
		}
	}
	return -1
}

// applied returns node i's applied index of the named group.
func (tc *testCluster) applied(i int, group string) uint64 {
	for _, g := range tc.srvs[i].ClusterStatus().Groups {
		if g.Name == group {
			return g.Applied
		}
	}
	return 0
}

// clusterWait is how long a cluster may take to elect leaders and converge.
const clusterWait = 30 * time.Second

func pollUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// declareRetry runs declare on fresh channels until it succeeds (the metadata group may still be
// electing its leader right after start).
func declareRetry(t *testing.T, c *itConn, what string, declare func(ch *amqp.Channel) error) {
	t.Helper()
	var last error
	pollUntil(t, what, clusterWait, func() bool {
		ch, err := c.Channel()
		if err != nil {
			last = err
			return false
		}
		defer ch.Close()
		last = declare(ch)
		return last == nil
	})
	if last != nil {
		t.Fatalf("%s: %v", what, last)
	}
}

func TestClusterReplicatesMetadataAndServesQuorumQueues(t *testing.T) {
	tc := newTestCluster(t, 3)
	c1 := mustDial(t, tc.urls[0])
	declareRetry(t, c1, "declare exchange, quorum queue and binding on n1", func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare("orders", "topic", true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare("orders.q", true, false, false, false, quorumArgs(nil)); err != nil {
			return err
		}
		return ch.QueueBind("orders.q", "order.*", "orders", false, nil)
	})
	// Visible on the other nodes.
	for i := 1; i < 3; i++ {
		c := mustDial(t, tc.urls[i])
		pollUntil(t, "exchange and queue visible on "+tc.ids[i], clusterWait, func() bool {
			return exchangeExists(t, c, "orders") && queueExists(t, c, "orders.q")
		})
	}
	// Publish through n2, consume through n3.
	c2, c3 := mustDial(t, tc.urls[1]), mustDial(t, tc.urls[2])
	// A node applies metadata changes shortly after the proposer's reply: wait until n2 has them
	// all (its binding included) before publishing through it.
	pollUntil(t, "n2's metadata caught up", clusterWait, func() bool {
		return tc.applied(1, "metadata") >= tc.applied(0, "metadata")
	})
	pub := mustConfirmChannel(t, c2)
	for i := 0; i < 200; i++ {
		publishConfirmed(t, pub, "orders", "order.new", true, persistentMsg(fmt.Sprint(i)))
	}
	for i, c := range []*itConn{c1, c2, c3} {
		ch := mustChannel(t, c)
		pollUntil(t, fmt.Sprintf("200 messages on %s's replica", tc.ids[i]), clusterWait, func() bool {
			q, err := ch.QueueDeclarePassive("orders.q", true, false, false, false, nil)
			return err == nil && q.Messages == 200
		})
	}
	cons := mustChannel(t, c3)
	cons.Qos(20, 0, false)
	ds := mustConsume(t, cons, "orders.q", "", false, nil)
	for i := 0; i < 200; i++ {
		d := recvWithin(t, ds, clusterWait)
		if string(d.Body) != fmt.Sprint(i) {
			t.Fatalf("delivery %d: body %q (redelivered %v, tag %d), want %d in order", i, d.Body, d.Redelivered, d.DeliveryTag, i)
		}
		d.Ack(false)
	}
	pollUntil(t, "queue empty on n1 after acks on n3", clusterWait, func() bool {
		ch := mustChannel(t, c1)
		defer ch.Close()
		q, err := ch.QueueDeclarePassive("orders.q", true, false, false, false, nil)
		return err == nil && q.Messages == 0
	})
	// Deleting through n2 removes it everywhere.
	if _, err := mustChannel(t, c2).QueueDelete("orders.q", false, false, false); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "queue gone on n1", clusterWait, func() bool { return !queueExists(t, c1, "orders.q") })
}

func TestClusterQuorumFailoverLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("failover test")
	}
	tc := newTestCluster(t, 3)
	const q = "failover.q"
	group := "queue 'failover.q' in vhost '/'"
	c1 := mustDial(t, tc.urls[0])
	declareRetry(t, c1, "declare quorum queue", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(q, true, false, false, false, quorumArgs(nil))
		return err
	})
	pollUntil(t, "queue group has a leader", clusterWait, func() bool { return tc.leaderOf(group) >= 0 })
	leader := tc.leaderOf(group)
	var survivors []int
	for i := range tc.srvs {
		if i != leader {
			survivors = append(survivors, i)
		}
	}
	pubNode, consNode := survivors[0], survivors[1]
	pc := mustDial(t, tc.urls[pubNode])
	pch := mustConfirmChannel(t, pc)
	confirmed := map[string]bool{}
	publish := func(i int) bool {
		body := fmt.Sprint(i)
		conf, err := pch.PublishWithDeferredConfirm("", q, false, false, persistentMsg(body))
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ok, err := conf.WaitContext(ctx)
		if err != nil {
			t.Fatalf("confirm %d: %v", i, err)
		}
		if ok {
			confirmed[body] = true
		}
		return ok
	}
	for i := 0; i < 300; i++ {
		publish(i)
	}
	// A consumer on the other survivor holds some messages unacked when the leader goes.
	cc := mustDial(t, tc.urls[consNode])
	cch := mustChannel(t, cc)
	cch.Qos(50, 0, false)
	ds := mustConsume(t, cch, q, "", false, nil)
	got := map[string]int{}
	var held []amqp.Delivery
	for i := 0; i < 50; i++ {
		d := recvWithin(t, ds, clusterWait)
		got[string(d.Body)]++
		held = append(held, d)
	}
	tc.stop(leader)
	start := time.Now()
	for i := 300; i < 600; i++ {
		publish(i)
	}
	t.Logf("300 publishes after the leader stopped took %v", time.Since(start))
	// The unacked 50 are still ours: ack them, and everything else must arrive.
	for _, d := range held {
		if err := d.Ack(false); err != nil {
			t.Fatalf("ack after failover: %v", err)
		}
	}
	deadline := time.After(60 * time.Second)
	for len(got) < len(confirmed) {
		select {
		case d := <-ds:
			got[string(d.Body)]++
			d.Ack(false)
		case <-deadline:
			missing := 0
			for b := range confirmed {
				if got[b] == 0 {
					missing++
				}
			}
			t.Fatalf("%d confirmed messages never consumed (got %d distinct)", missing, len(got))
		}
	}
	for b := range confirmed {
		if got[b] == 0 {
			t.Fatalf("confirmed message %s lost", b)
		}
	}
	// The stopped node comes back and catches up.
	if err := tc.startErr(leader); err != nil {
		t.Fatalf("restart %s: %v", tc.ids[leader], err)
	}
	pollUntil(t, "restarted node catches up", clusterWait, func() bool {
		a, b := tc.applied(leader, group), tc.applied(survivors[0], group)
		return a > 0 && a >= b-1
	})
}

func TestClusterCatchUpAndNoMajority(t *testing.T) {
	if testing.Short() {
		t.Skip("stops nodes and waits for timeouts")
	}
	tc := newTestCluster(t, 3)
	c1 := mustDial(t, tc.urls[0])
	declareRetry(t, c1, "declare quorum queue", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare("nomajority.q", true, false, false, false, quorumArgs(nil))
		return err
	})
	// A node that was down when metadata changed catches up when it comes back.
	tc.stop(2)
	ch := mustChannel(t, c1)
	if err := ch.ExchangeDeclare("while-n3-was-down", "fanout", true, false, false, false, nil); err != nil {
		t.Fatalf("declare with 2 of 3 nodes up: %v", err)
	}
	if err := tc.startErr(2); err != nil {
		t.Fatal(err)
	}
	c3 := mustDial(t, tc.urls[2])
	pollUntil(t, "n3 sees the exchange declared while it was down", clusterWait, func() bool {
		return exchangeExists(t, c3, "while-n3-was-down")
	})
	// With two of three nodes gone, a publish to the quorum queue is nacked (never silently
	// dropped) and a new quorum queue cannot be declared.
	tc.stop(1)
	tc.stop(2)
	pch := mustConfirmChannel(t, c1)
	conf, err := pch.PublishWithDeferredConfirm("", "nomajority.q", false, false, persistentMsg("x"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ok, err := conf.WaitContext(ctx)
	if err != nil || ok {
		t.Fatalf("publish without a majority: confirmed=%v err=%v; want a nack", ok, err)
	}
	dch, err := c1.Channel()
	if err != nil {
		t.Fatal(err)
	}
	_, err = dch.QueueDeclare("never.q", true, false, false, false, quorumArgs(nil))
	if err == nil {
		t.Fatal("quorum queue declared with 1 of 3 nodes up")
	}
	checkAMQPError(t, err, amqp.InternalError, "")
	t.Logf("declare without a majority: %v", err)
}

func TestClusterClassicQueueServedByEveryNode(t *testing.T) {
	tc := newTestCluster(t, 3)
	c1 := mustDial(t, tc.urls[0])
	declareRetry(t, c1, "declare a durable classic queue on n1", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare("shared.classic", true, false, false, false, nil)
		return err
	})
	c2, c3 := mustDial(t, tc.urls[1]), mustDial(t, tc.urls[2])
	pollUntil(t, "queue visible on n2 and n3", clusterWait, func() bool {
		return queueExists(t, c2, "shared.classic") && queueExists(t, c3, "shared.classic")
	})
	// Redeclaring it on n3 finds the same queue, not a new local one.
	ch3 := mustChannel(t, c3)
	if _, err := ch3.QueueDeclare("shared.classic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	pub := mustConfirmChannel(t, c2)
	for i := 0; i < 50; i++ {
		publishConfirmed(t, pub, "", "shared.classic", true, persistentMsg(fmt.Sprint(i)))
	}
	ds := mustConsume(t, ch3, "shared.classic", "", false, nil)
	for i := 0; i < 50; i++ {
		d := recvWithin(t, ds, clusterWait)
		if string(d.Body) != fmt.Sprint(i) {
			t.Fatalf("delivery %d: %q", i, d.Body)
		}
		d.Ack(false)
	}
	// Its group has one voter, the node that declared it.
	for _, g := range tc.srvs[0].ClusterStatus().Groups {
		if g.Name == "queue 'shared.classic' in vhost '/'" && (len(g.Voters) != 1 || g.Voters[0] != "n1") {
			t.Fatalf("voters = %v, want [n1]", g.Voters)
		}
	}
}

func TestClusterClassicQueueHomeDownCancelsConsumers(t *testing.T) {
	if testing.Short() {
		t.Skip("stops a node")
	}
	tc := newTestCluster(t, 3)
	c1 := mustDial(t, tc.urls[0])
	declareRetry(t, c1, "declare a durable classic queue on n1", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare("home.n1", true, false, false, false, nil)
		return err
	})
	c2 := mustDial(t, tc.urls[1])
	pollUntil(t, "queue visible on n2", clusterWait, func() bool { return queueExists(t, c2, "home.n1") })
	ch2 := mustChannel(t, c2)
	cancels := ch2.NotifyCancel(make(chan string, 1))
	mustConsume(t, ch2, "home.n1", "on-n2", false, nil)
	tc.stop(0)
	select {
	case tag := <-cancels:
		if tag != "on-n2" {
			t.Fatalf("basic.cancel for %q", tag)
		}
	case <-time.After(clusterWait):
		t.Fatal("no basic.cancel after the queue's home node stopped")
	}
	expectOpen(t, ch2)
}
