package conformance

// Cluster tests: three warren processes form one Raft cluster (see cluster_helpers_test.go).
// A quorum queue survives SIGKILL of its leader's process without losing a confirmed message,
// metadata declared on one node is usable on another, and nodes started with different peer
// lists refuse each other loudly.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server/netserve"
)

// failoverHarness is the shared state of the failover test's publisher and consumer. Each keeps
// a list of AMQP URLs in order of preference and moves to the next one when a session fails.
type failoverHarness struct {
	queue   string
	window  int // unconfirmed publishes at most
	pubURLs []string
	conURLs []string
	begin   time.Time

	stopPubOnce, stopConOnce sync.Once
	stopPub, stopCon         chan struct{}
	pubDone, conDone         chan struct{}

	killAt      atomic.Int64 // UnixNano of the leader's SIGKILL; 0 before
	recoveredAt atomic.Int64 // UnixNano of the first ack of a message published after killAt
	blockedAt   atomic.Int64 // UnixNano since which the publisher waits on a full window; 0 if not

	mu           sync.Mutex
	published    int          // basic.publish calls, republications included
	confirmed    map[int]bool // sequence numbers the broker acked
	nacked       int          // basic.nack while the channel stayed open
	lostInFlight int          // unsettled when their channel or connection closed
	republished  int
	received     map[int]int // sequence number -> deliveries to the consumer
	deliveries   int
	redelivered  int
	events       []string // session changes, for the report
	errs         []string
}

func newFailoverHarness(queue string, pubURLs, conURLs []string) *failoverHarness {
	return &failoverHarness{
		queue:     queue,
		window:    100,
		pubURLs:   pubURLs,
		conURLs:   conURLs,
		begin:     time.Now(),
		stopPub:   make(chan struct{}),
		stopCon:   make(chan struct{}),
		pubDone:   make(chan struct{}),
		conDone:   make(chan struct{}),
		confirmed: make(map[int]bool),
		received:  make(map[int]int),
	}
}

func closedChan(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (h *failoverHarness) event(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.events) < 200 {
		h.events = append(h.events, fmt.Sprintf("%6.2fs ", time.Since(h.begin).Seconds())+fmt.Sprintf(format, args...))
	}
}

func (h *failoverHarness) fail(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.errs) < 50 {
		h.errs = append(h.errs, fmt.Sprintf(format, args...))
	}
}

// connect dials the URLs in turn, starting with urls[first%len], until one accepts or stop closes.
func (h *failoverHarness) connect(urls []string, first int, stop chan struct{}) (*amqp.Connection, string) {
	for i := first; ; i++ {
		if closedChan(stop) {
			return nil, ""
		}
		url := urls[i%len(urls)]
		conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err == nil {
			return conn, url
		}
		if (i+1)%len(urls) == first%len(urls) { // tried them all: pause before the next round
			select {
			case <-stop:
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// publisher publishes persistent messages whose bodies are sequence numbers, in confirm mode,
// until stopPub closes. Messages nacked or unsettled when a session ends are published again,
// with the same sequence number, in the next session.
func (h *failoverHarness) publisher() {
	defer close(h.pubDone)
	next := 0
	var retry []int
	failures := 0
	for !closedChan(h.stopPub) {
		conn, url := h.connect(h.pubURLs, failures, h.stopPub)
		if conn == nil {
			return
		}
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Confirm(false)
		}
		if err == nil {
			_, err = ch.QueueDeclarePassive(h.queue, true, false, false, false, nil)
		}
		if err != nil {
			failures++
			h.event("publisher: session on %s failed to start: %v", url, err)
			_ = conn.Close()
			select {
			case <-h.stopPub:
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		h.event("publisher: session on %s", url)
		var reason string
		retry, reason = h.publishSession(ch, &next, retry)
		h.event("publisher: session on %s ended: %s", url, reason)
		_ = conn.Close()
		failures++ // the node may be gone: start the next round with the next URL
	}
}

type pendingPublish struct {
	dc  *amqp.DeferredConfirmation
	seq int
	at  time.Time
}

// publishSession publishes on ch until the channel fails or stopPub closes, and returns the
// sequence numbers to publish again and why it ended.
func (h *failoverHarness) publishSession(ch *amqp.Channel, next *int, pending []int) (retry []int, reason string) {
	retry = pending
	var window []pendingPublish
	settle := func(p pendingPublish) {
		if p.dc.Acked() {
			h.mu.Lock()
			h.confirmed[p.seq] = true
			h.mu.Unlock()
			if k := h.killAt.Load(); k != 0 && p.at.UnixNano() > k {
				h.recoveredAt.CompareAndSwap(0, time.Now().UnixNano())
			}
			return
		}
		h.mu.Lock()
		if ch.IsClosed() {
			h.lostInFlight++
		} else {
			h.nacked++
		}
		h.mu.Unlock()
		retry = append(retry, p.seq)
	}
	defer func() {
		// Every pending confirmation completes: acked, nacked, or unacked when the channel closes.
		deadline := time.After(30 * time.Second)
		for i, p := range window {
			select {
			case <-p.dc.Done():
				settle(p)
			case <-deadline:
				h.fail("publisher: %d publishes (from seq %d) got no confirm, nack or channel close within 30s of the end of their session (%s)",
					len(window)-i, p.seq, reason)
				for _, q := range window[i:] {
					retry = append(retry, q.seq)
				}
				return
			}
		}
	}()
	for {
		// Settle the confirms that arrived; when the window is full, wait for the oldest.
		for len(window) > 0 {
			if len(window) >= h.window {
				h.blockedAt.Store(time.Now().UnixNano())
				select {
				case <-window[0].dc.Done():
					h.blockedAt.Store(0)
				case <-h.stopPub:
					h.blockedAt.Store(0)
					return retry, "stopped"
				}
			} else if !isDone(window[0].dc) {
				break
			}
			settle(window[0])
			window = window[1:]
		}
		if closedChan(h.stopPub) {
			return retry, "stopped"
		}
		if ch.IsClosed() {
			return retry, "channel closed"
		}
		var seq int
		republish := len(retry) > 0
		if republish {
			seq, retry = retry[0], retry[1:]
		} else {
			seq = *next
			*next++
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", h.queue, false, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(strconv.Itoa(seq))})
		cancel()
		if err != nil {
			retry = append(retry, seq)
			return retry, fmt.Sprintf("publish: %v", err)
		}
		h.mu.Lock()
		h.published++
		if republish {
			h.republished++
		}
		h.mu.Unlock()
		window = append(window, pendingPublish{dc, seq, time.Now()})
	}
}

// consumer consumes the queue with prefetch 50 and manual acks, recording every body, until
// stopCon closes; it reconnects (to the next URL) whenever its session ends.
func (h *failoverHarness) consumer() {
	defer close(h.conDone)
	failures := 0
	for !closedChan(h.stopCon) {
		conn, url := h.connect(h.conURLs, failures, h.stopCon)
		if conn == nil {
			return
		}
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Qos(50, 0, false)
		}
		var deliveries <-chan amqp.Delivery
		if err == nil {
			deliveries, err = ch.Consume(h.queue, "", false, false, false, false, nil)
		}
		if err != nil {
			failures++
			h.event("consumer: session on %s failed to start: %v", url, err)
			_ = conn.Close()
			select {
			case <-h.stopCon:
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		h.event("consumer: session on %s", url)
		reason := h.consumeSession(deliveries)
		h.event("consumer: session on %s ended: %s", url, reason)
		_ = conn.Close()
		failures++
	}
}

func (h *failoverHarness) consumeSession(deliveries <-chan amqp.Delivery) string {
	for {
		select {
		case <-h.stopCon:
			return "stopped"
		case d, ok := <-deliveries:
			if !ok {
				return "deliveries closed (consumer cancelled, channel or connection closed)"
			}
			seq, err := strconv.Atoi(string(d.Body))
			h.mu.Lock()
			h.deliveries++
			if d.Redelivered {
				h.redelivered++
			}
			if err == nil {
				h.received[seq]++
			}
			h.mu.Unlock()
			if err != nil {
				h.fail("consumer: body %q is not a sequence number", abbrev(d.Body))
			}
			if err := d.Ack(false); err != nil {
				return fmt.Sprintf("ack: %v", err)
			}
		}
	}
}

// stopPublisher stops publishing and waits (bounded) until the publisher settled its window.
func (h *failoverHarness) stopPublisher(t testing.TB) {
	t.Helper()
	h.stopPubOnce.Do(func() { close(h.stopPub) })
	select {
	case <-h.pubDone:
	case <-time.After(45 * time.Second):
		t.Fatalf("the publisher did not stop within 45s")
	}
}

// stopConsumer stops the consumer and waits (bounded) until it has closed its connection.
func (h *failoverHarness) stopConsumer(t testing.TB) {
	t.Helper()
	h.stopConOnce.Do(func() { close(h.stopCon) })
	select {
	case <-h.conDone:
	case <-time.After(15 * time.Second):
		t.Fatalf("the consumer did not stop within 15s")
	}
}

func (h *failoverHarness) confirmedCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.confirmed)
}

// missing returns how many confirmed sequence numbers the consumer has not received, and up
// to 20 of them.
func (h *failoverHarness) missing() (int, []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	var some []int
	for seq := range h.confirmed {
		if h.received[seq] == 0 {
			n++
			if len(some) < 20 {
				some = append(some, seq)
			}
		}
	}
	slices.Sort(some)
	return n, some
}

// TestClusterQuorumFailover runs confirm-mode publishing and a consumer against a quorum queue on
// a 3-node cluster, SIGKILLs the queue leader's process, measures how long publishes stay
// unconfirmed, restarts the killed node, and checks that every confirmed message is consumed and
// that the restarted node's copy of the queue catches up.
func TestClusterQuorumFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills a 3-node cluster; skipped with -short")
	}
	const q = "cluster.failover"
	group := quorumGroupName(q)
	c := newTestCluster(t, 3)
	c.startAll(30 * time.Second)

	declareQuorumQueue(t, c.Nodes[0].URL, q, 30*time.Second)
	st := pollStatus(t, 30*time.Second, "group "+group+" has a leader", c.Nodes, func(s clusterStatus) bool {
		g, ok := s.group(group)
		return ok && g.Leader != ""
	})
	g, _ := st.group(group)
	if len(g.Voters) != 3 {
		t.Errorf("group %s has voters %v (status of node %s); want all 3 nodes", group, g.Voters, st.Node)
	}
	leader := c.node(g.Leader)

	// The consumer goes through n3 (n2 if n3 leads), the publisher through the remaining node, so
	// that neither client is on the leader; they still reconnect elsewhere if the leader moves.
	consNode := c.Nodes[2]
	if consNode == leader {
		consNode = c.Nodes[1]
	}
	var pubNode *clusterNode
	for _, nd := range c.Nodes {
		if nd != leader && nd != consNode {
			pubNode = nd
			break
		}
	}
	prefer := func(first *clusterNode) []string {
		urls := []string{first.URL}
		for _, nd := range c.Nodes {
			if nd != first {
				urls = append(urls, nd.URL)
			}
		}
		return urls
	}
	t.Logf("queue leader %s; publisher on %s, consumer on %s", leader.ID, pubNode.ID, consNode.ID)

	h := newFailoverHarness(q, prefer(pubNode), prefer(consNode))
	go h.publisher()
	go h.consumer()
	t.Cleanup(func() {
		h.stopPublisher(t)
		h.stopConsumer(t)
		if t.Failed() {
			h.mu.Lock()
			t.Logf("client events:\n%s", strings.Join(h.events, "\n"))
			h.mu.Unlock()
		}
	})

	// ~2 s of traffic before the kill.
	time.Sleep(2 * time.Second)
	if !pollUntil(15*time.Second, func() bool { return h.confirmedCount() > 0 }) {
		t.Fatalf("no publish to quorum queue %s was confirmed within 17s of traffic", q)
	}
	beforeKill := h.confirmedCount()
	if beforeKill < 1000 {
		t.Logf("note: only %d publishes confirmed before the kill (expected some thousands)", beforeKill)
	}

	// Kill whichever node leads the queue now.
	st = pollStatus(t, 10*time.Second, "group "+group+" has a leader before the kill", c.Nodes, func(s clusterStatus) bool {
		g, ok := s.group(group)
		return ok && g.Leader != ""
	})
	g, _ = st.group(group)
	leader = c.node(g.Leader)
	h.killAt.Store(time.Now().UnixNano())
	leader.kill9()
	killAt := time.Now()
	t.Logf("SIGKILLed queue leader %s after %d confirmed publishes", leader.ID, beforeKill)
	var survivors []*clusterNode
	for _, nd := range c.Nodes {
		if nd != leader {
			survivors = append(survivors, nd)
		}
	}

	// Publishes made after the kill must be confirmed again within 10 s: a new leader was elected.
	if !pollUntil(10*time.Second, func() bool { return h.recoveredAt.Load() != 0 }) {
		blocked := "not blocked on a full window"
		if b := h.blockedAt.Load(); b != 0 {
			blocked = fmt.Sprintf("blocked on a full window of %d unconfirmed publishes for %v", h.window, time.Since(time.Unix(0, b)).Round(time.Millisecond))
		}
		var leaders []string
		for _, nd := range survivors {
			if s, err := nd.status(); err == nil {
				if g, ok := s.group(group); ok {
					leaders = append(leaders, fmt.Sprintf("%s sees leader %q", nd.ID, g.Leader))
				}
			} else {
				leaders = append(leaders, err.Error())
			}
		}
		t.Fatalf("no publish made after SIGKILL of queue leader %s was confirmed within 10s (publisher %s); survivors: %v",
			leader.ID, blocked, leaders)
	}
	failover := time.Duration(h.recoveredAt.Load() - h.killAt.Load())
	st = pollStatus(t, 10*time.Second, "a surviving node leads group "+group, survivors, func(s clusterStatus) bool {
		g, ok := s.group(group)
		return ok && g.Leader != "" && g.Leader != leader.ID
	})
	g, _ = st.group(group)
	t.Logf("publishes confirmed again %v after the kill; new queue leader %s", failover.Round(time.Millisecond), g.Leader)

	// ~2 s more traffic, then the killed node comes back with the same data and flags.
	time.Sleep(time.Until(killAt.Add(failover + 2*time.Second)))
	restartAt := time.Now()
	leader.launch()
	leader.waitAccepting(30 * time.Second)
	pollStatus(t, 30*time.Second, "restarted node "+leader.ID+" is up in the members list of the survivors", survivors,
		func(s clusterStatus) bool {
			m, ok := s.member(leader.ID)
			return ok && m.Up
		})
	t.Logf("restarted %s: up again %v after its launch", leader.ID, time.Since(restartAt).Round(time.Millisecond))

	// Stop publishing; every confirmed message must reach the consumer.
	h.stopPublisher(t)
	confirmed := h.confirmedCount()
	drainStart := time.Now()
	drained := pollUntil(60*time.Second, func() bool { n, _ := h.missing(); return n == 0 })
	drainTime := time.Since(drainStart)
	h.stopConsumer(t)

	h.mu.Lock()
	for _, e := range h.errs {
		t.Error(e)
	}
	dups, unconfirmedSeen := 0, 0
	for seq, n := range h.received {
		dups += n - 1
		if !h.confirmed[seq] {
			unconfirmedSeen++
		}
	}
	t.Logf("published %d (%d republished), confirmed %d distinct, nacked %d, unsettled at a session end %d",
		h.published, h.republished, len(h.confirmed), h.nacked, h.lostInFlight)
	t.Logf("consumer: %d deliveries (%d redelivered), %d distinct, %d duplicates, %d unconfirmed seqs received; drain after publishing stopped took %v",
		h.deliveries, h.redelivered, len(h.received), dups, unconfirmedSeen, drainTime.Round(time.Millisecond))
	t.Logf("failover: publishes confirmed again %v after SIGKILL of the leader", failover.Round(time.Millisecond))
	t.Logf("client events:\n%s", strings.Join(h.events, "\n"))
	h.mu.Unlock()
	if !drained {
		n, some := h.missing()
		t.Errorf("LOST: %d of %d confirmed messages were not consumed within 60s after publishing stopped, e.g. seqs %v", n, confirmed, some)
	}

	// The restarted node's copy of the queue catches up with the leader's.
	deadline := time.Now().Add(30 * time.Second)
	var lastR, lastL uint64
	var lastLeader string
	var lastErr error
	for {
		caught := func() bool {
			s, err := leader.status()
			if err != nil {
				lastErr = err
				return false
			}
			g, ok := s.group(group)
			if !ok {
				lastErr = fmt.Errorf("restarted node %s does not list group %s: %s", leader.ID, group, s.groupNames())
				return false
			}
			lastR, lastLeader = g.Applied, g.Leader
			if g.Leader == "" {
				lastErr = fmt.Errorf("restarted node %s knows no leader for %s", leader.ID, group)
				return false
			}
			if g.Leader == leader.ID {
				return true
			}
			ls, err := c.node(g.Leader).status()
			if err != nil {
				lastErr = err
				return false
			}
			lg, ok := ls.group(group)
			if !ok {
				lastErr = fmt.Errorf("leader %s does not list group %s", g.Leader, group)
				return false
			}
			lastL = lg.Applied
			// The leader's index was read after the restarted node's: equal or behind means caught up.
			s, err = leader.status()
			if err != nil {
				lastErr = err
				return false
			}
			if g, ok := s.group(group); ok {
				lastR = g.Applied
			}
			return lastR >= lastL
		}()
		if caught {
			t.Logf("restarted node %s applied index %d of group %s, leader %s at %d", leader.ID, lastR, group, lastLeader, lastL)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted node %s did not catch up on group %s within 30s: its applied index %d, leader %q at %d (last error: %v)",
				leader.ID, group, lastR, lastLeader, lastL, lastErr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestClusterMetadataReplicated declares an exchange, a quorum queue and a binding through node 1
// and uses them through node 2.
func TestClusterMetadataReplicated(t *testing.T) {
	const (
		q   = "cluster.meta.q"
		x   = "cluster.meta.x"
		key = "cluster.meta.key"
	)
	c := newTestCluster(t, 3)
	c.startAll(30 * time.Second)
	n1, n2 := c.Nodes[0], c.Nodes[1]

	declareQuorumQueue(t, n1.URL, q, 30*time.Second)
	conn1 := dial(t, n1.URL)
	ch1, err := conn1.Channel()
	if err != nil {
		t.Fatalf("node n1: open channel: %v", err)
	}
	if err := ch1.ExchangeDeclare(x, "direct", true, false, false, false, nil); err != nil {
		t.Fatalf("node n1: declare exchange %s: %v", x, err)
	}
	if err := ch1.QueueBind(q, key, x, false, nil); err != nil {
		t.Fatalf("node n1: bind %s to %s with key %s: %v", q, x, key, err)
	}

	// Replication to node 2 is asynchronous: poll with passive declarations (a refusal closes
	// the channel, so each attempt uses a new one).
	conn2 := dial(t, n2.URL)
	passive := func(what string, declare func(*amqp.Channel) error) {
		t.Helper()
		var lastErr error
		ok := pollUntil(10*time.Second, func() bool {
			ch, err := conn2.Channel()
			if err != nil {
				lastErr = err
				return false
			}
			defer ch.Close()
			lastErr = declare(ch)
			return lastErr == nil
		})
		if !ok {
			t.Fatalf("%s declared through node n1 is not visible through node n2 within 10s: %v", what, lastErr)
		}
	}
	passive("exchange "+x, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(x, "direct", true, false, false, false, nil)
	})
	passive("quorum queue "+q, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err
	})

	// Publish through node 2 (mandatory, confirmed) until the binding routes the message.
	ch2 := confirmChannel(t, conn2)
	returns := ch2.NotifyReturn(make(chan amqp.Return, 16))
	body := ""
	deadline := time.Now().Add(10 * time.Second)
	for attempt := 1; ; attempt++ {
		body = fmt.Sprintf("via n2, attempt %d", attempt)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		dc, err := ch2.PublishWithDeferredConfirmWithContext(ctx, x, key, true, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
		if err != nil {
			cancel()
			t.Fatalf("node n2: publish to %s: %v", x, err)
		}
		acked, err := dc.WaitContext(ctx)
		cancel()
		if err != nil || !acked {
			t.Fatalf("node n2: publish to %s with key %s was not confirmed (acked %v, err %v)", x, key, acked, err)
		}
		var returned *amqp.Return
		select {
		case r := <-returns:
			returned = &r
		case <-time.After(100 * time.Millisecond):
		}
		if returned == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node n2: publishes to %s with key %s are still returned unroutable (%d %s) 10s after the binding was declared on n1",
				x, key, returned.ReplyCode, returned.ReplyText)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The message is in the quorum queue; fetch it through node 1.
	var got amqp.Delivery
	ok := pollUntil(10*time.Second, func() bool {
		m, ok, err := ch1.Get(q, true)
		if err != nil {
			t.Fatalf("node n1: basic.get from %s: %v", q, err)
		}
		got = m
		return ok
	})
	if !ok {
		t.Fatalf("the message published through node n2 to %s (key %s) never arrived in quorum queue %s (basic.get through n1 for 10s)", x, key, q)
	}
	if string(got.Body) != body {
		t.Errorf("node n1: got %q from %s; want %q", got.Body, q, body)
	}
}

// TestClusterPeersDisagree starts n1 and n2 with the same peer list and n3 with one naming an
// extra member; at least one side must log "cluster peers disagree".
func TestClusterPeersDisagree(t *testing.T) {
	const want = "cluster peers disagree"
	c := newTestCluster(t, 3)
	ports, err := netserve.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	odd := c.Nodes[2]
	odd.peers += fmt.Sprintf(",n4=127.0.0.1:%d", ports[0])
	for _, nd := range c.Nodes {
		nd.launch()
	}
	var found []string
	start := time.Now()
	ok := pollUntil(15*time.Second, func() bool {
		found = found[:0]
		exited := 0
		for _, nd := range c.Nodes {
			if strings.Contains(nd.b.logs(), want) {
				found = append(found, nd.ID)
			}
			if nd.b.exitedEarly() != nil {
				exited++
			}
		}
		return len(found) > 0 || exited == len(c.Nodes)
	})
	if !ok || len(found) == 0 {
		var states []string
		for _, nd := range c.Nodes {
			state := "running"
			if err := nd.b.exitedEarly(); err != nil {
				state = err.Error()
			}
			states = append(states, nd.ID+": "+state)
		}
		t.Fatalf("no node logged %q (waited %v of at most 15s); %s was started with --cluster-peers %s, the others with %s; processes: %v\n%s",
			want, time.Since(start).Round(time.Millisecond), odd.ID, odd.peers, c.Nodes[0].peers, states, clusterContractHint)
	}
	t.Logf("%q logged by %v", want, found)
}
