package conformance

// Replicated streams (issue 14 point 1): one stream across a 3-node cluster, publishers and a
// consumer on different nodes, random SIGKILLs of any node (the stream's leader among them) and
// restarts. Every confirmed message is kept, confirms resume within 5 s, and every node serves the
// same messages at the same dense offsets.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// streamGroupName is the status name of stream s's coordination group in vhost "/".
func streamGroupName(s string) string { return fmt.Sprintf("stream '%s' in vhost '/'", s) }

// declareStreamRetry declares durable stream s through url, retrying while the cluster elects.
func declareStreamRetry(t testing.TB, url, s string, args amqp.Table, d time.Duration) {
	t.Helper()
	a := amqp.Table{"x-queue-type": "stream"}
	for k, v := range args {
		a[k] = v
	}
	deadline := time.Now().Add(d)
	var lastErr error
	for time.Now().Before(deadline) {
		conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			lastErr = err
			time.Sleep(200 * time.Millisecond)
			continue
		}
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDeclare(s, true, false, false, false, a)
		}
		_ = conn.Close()
		if err == nil {
			return
		}
		lastErr = err
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("declare stream %s through %s: still failing after %v: %v", s, url, d, lastErr)
}

// chaosPublisher publishes bodies "<name>-<seq>" in confirm mode with a window, moving to the
// next URL when its session ends; nacked or unsettled publishes go out again. It records every
// confirm's time to measure the longest stall.
type chaosPublisher struct {
	name   string
	urls   []string
	window int
	stop   chan struct{}
	done   chan struct{}

	mu        sync.Mutex
	confirmed map[string]bool
	ackTimes  []time.Time
	sessions  []string
	published int
}

func (p *chaosPublisher) run() {
	defer close(p.done)
	seq := 0
	var retry []string
	for i := 0; ; i++ {
		select {
		case <-p.stop:
			return
		default:
		}
		url := p.urls[i%len(p.urls)]
		conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Confirm(false)
		}
		if err != nil {
			_ = conn.Close()
			time.Sleep(50 * time.Millisecond)
			continue
		}
		start := time.Now()
		var reason string
		retry, reason = p.session(ch, &seq, retry)
		p.mu.Lock()
		p.sessions = append(p.sessions, fmt.Sprintf("%s: %v on %s: %s", p.name, time.Since(start).Round(time.Millisecond), url, reason))
		p.mu.Unlock()
		_ = conn.Close()
	}
}

type chaosPending struct {
	dc   *amqp.DeferredConfirmation
	body string
}

func (p *chaosPublisher) session(ch *amqp.Channel, seq *int, retry []string) ([]string, string) {
	var window []chaosPending
	settle := func(x chaosPending) {
		if x.dc.Acked() {
			p.mu.Lock()
			p.confirmed[x.body] = true
			p.ackTimes = append(p.ackTimes, time.Now())
			p.mu.Unlock()
			return
		}
		retry = append(retry, x.body)
	}
	defer func() {
		for _, x := range window {
			select {
			case <-x.dc.Done():
				settle(x)
			case <-time.After(30 * time.Second):
				retry = append(retry, x.body)
			}
		}
	}()
	for {
		for len(window) > 0 {
			if len(window) >= p.window {
				select {
				case <-window[0].dc.Done():
				case <-p.stop:
					return retry, "stopped"
				}
			} else if !isDone(window[0].dc) {
				break
			}
			settle(window[0])
			window = window[1:]
		}
		select {
		case <-p.stop:
			return retry, "stopped"
		default:
		}
		if ch.IsClosed() {
			return retry, "channel closed"
		}
		var body string
		if len(retry) > 0 {
			body, retry = retry[0], retry[1:]
		} else {
			body = fmt.Sprintf("%s-%07d", p.name, *seq)
			*seq++
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "chaos.stream", false, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
		cancel()
		if err != nil {
			retry = append(retry, body)
			return retry, fmt.Sprintf("publish: %v", err)
		}
		p.mu.Lock()
		p.published++
		p.mu.Unlock()
		window = append(window, chaosPending{dc, body})
	}
}

// longestStall is the longest time between two confirms (or from the first publish to the first
// confirm) while the publisher ran.
func (p *chaosPublisher) longestStall(from, to time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	last := from
	var worst time.Duration
	for _, at := range p.ackTimes {
		if at.Before(from) {
			continue
		}
		if at.After(to) {
			break
		}
		worst = max(worst, at.Sub(last))
		last = at
	}
	return max(worst, to.Sub(last))
}

// stalls lists the intervals longer than d without a confirm.
func (p *chaosPublisher) stalls(from, to time.Time, d time.Duration) [][2]time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out [][2]time.Time
	last := from
	for _, at := range p.ackTimes {
		if at.Before(from) || at.After(to) {
			continue
		}
		if at.Sub(last) > d {
			out = append(out, [2]time.Time{last, at})
		}
		last = at
	}
	return out
}

// streamReadAll reads stream s through url from offset 0 until it saw want bodies (when want > 0)
// and then nothing new for quiet, or until d passes. It returns the bodies by offset.
func streamReadAll(t testing.TB, url, s string, want int, quiet, d time.Duration) (map[int64]string, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(1000, 0, false); err != nil {
		return nil, err
	}
	deliveries, err := ch.Consume(s, "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		return nil, err
	}
	got := make(map[int64]string)
	deadline := time.After(d)
	idle := time.NewTimer(quiet)
	defer idle.Stop()
	n := 0
	for {
		select {
		case dl, ok := <-deliveries:
			if !ok {
				return got, fmt.Errorf("consumer closed after %d deliveries", len(got))
			}
			off := streamOffsetOf(t, dl)
			if prev, dup := got[off]; dup && prev != string(dl.Body) {
				return got, fmt.Errorf("offset %d delivered twice with different bodies %q and %q", off, prev, dl.Body)
			}
			got[off] = string(dl.Body)
			n++
			if n%200 == 0 {
				_ = dl.Ack(true)
			}
			if want == 0 || len(got) >= want {
				idle.Reset(quiet)
			}
		case <-idle.C:
			if want == 0 || len(got) >= want {
				return got, nil
			}
			idle.Reset(quiet)
		case <-deadline:
			return got, fmt.Errorf("read %d messages within %v (want at least %d)", len(got), d, want)
		}
	}
}

// chaosCluster is a 3-node broker cluster the stream chaos check runs against: Warren's
// `warren serve` processes, or a RabbitMQ reference cluster (stream_cluster_ref_test.go).
type chaosCluster interface {
	urls() []string
	name(i int) string
	// leader polls until a running node names the stream's leader and returns its index; with
	// not >= 0, until the leader is another node than not.
	leader(t *testing.T, not int) int
	kill(t *testing.T, i int)    // SIGKILL node i
	restart(t *testing.T, i int) // start node i again on its data and wait until it accepts
	saveLogs(i int)              // keep node i's log before it is killed (WARREN_CHAOS_LOGDIR)
}

// warrenChaos is a Warren test cluster as a chaosCluster.
type warrenChaos struct {
	c     *testCluster
	group string
}

func (w *warrenChaos) urls() []string {
	var out []string
	for _, nd := range w.c.Nodes {
		out = append(out, nd.URL)
	}
	return out
}

func (w *warrenChaos) name(i int) string { return w.c.Nodes[i].ID }

func (w *warrenChaos) leader(t *testing.T, not int) int {
	st := pollStatus(t, 30*time.Second, w.group+" has a leader", w.c.Nodes, func(s clusterStatus) bool {
		g, ok := s.group(w.group)
		return ok && g.Leader != "" && (not < 0 || g.Leader != w.c.Nodes[not].ID)
	})
	g, _ := st.group(w.group)
	for i, nd := range w.c.Nodes {
		if nd.ID == g.Leader {
			return i
		}
	}
	t.Fatalf("leader %q is not a node of the cluster", g.Leader)
	return -1
}

func (w *warrenChaos) kill(_ *testing.T, i int) { w.c.Nodes[i].kill9() }

func (w *warrenChaos) restart(_ *testing.T, i int) {
	w.c.Nodes[i].launch()
	w.c.Nodes[i].waitAccepting(30 * time.Second)
}

func (w *warrenChaos) saveLogs(i int) {
	nd := w.c.Nodes[i]
	if dir := os.Getenv("WARREN_CHAOS_LOGDIR"); dir != "" && nd.b != nil {
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.log", nd.ID, nd.lives)), []byte(nd.b.logs()), 0o644)
	}
}

// TestClusterStreamChaos: a stream on three nodes; two confirm-mode publishers (on n2 and n3 by
// preference) and a consumer (on n1) run while a random node, the stream's leader every third
// time, is SIGKILLed and restarted, WARREN_STREAM_CHAOS_KILLS times (default 6). Afterwards
// every node serves the same bodies at the same offsets 0..N-1, every confirmed body among them,
// the consumer saw every confirmed body, and no publisher waited more than 5 s for a confirm.
func TestClusterStreamChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("kills nodes of a 3-node cluster repeatedly; skipped with -short")
	}
	const s = "chaos.stream"
	group := streamGroupName(s)
	c := newTestCluster(t, 3)
	c.startAll(30 * time.Second)
	declareStreamRetry(t, c.Nodes[0].URL, s, nil, 30*time.Second)
	st := pollStatus(t, 30*time.Second, group+" has a leader", c.Nodes, func(s clusterStatus) bool {
		g, ok := s.group(group)
		return ok && g.Leader != ""
	})
	if g, _ := st.group(group); len(g.Voters) != 3 {
		t.Errorf("stream group has voters %v, want the 3 nodes (x-initial-cluster-size defaults to 3)", g.Voters)
	}
	w := &warrenChaos{c: c, group: group}
	res := runStreamChaos(t, w, s)
	t.Logf("Warren: %d published, %d confirmed, %d lost, longest confirm stall %v, failover %v",
		res.published, res.confirmed, res.lost, res.longestStall.Round(time.Millisecond), res.failover.Round(time.Millisecond))
	for i := range c.Nodes {
		w.saveLogs(i)
	}
}

// chaosResult is what runStreamChaos measured.
type chaosResult struct {
	published, confirmed, lost int
	longestStall, failover     time.Duration
}

// runStreamChaos runs the check on stream s of cluster cc (declared, with a leader): two
// publishers, a consumer, WARREN_STREAM_CHAOS_KILLS (default 6) SIGKILLs of random nodes, the
// leader every third time, then everything read back through every node.
func runStreamChaos(t *testing.T, cc chaosCluster, s string) chaosResult {
	kills := envInt(t, "WARREN_STREAM_CHAOS_KILLS", 6)
	nodes := cc.urls()
	prefer := func(i int) []string {
		var urls []string
		for k := range nodes {
			urls = append(urls, nodes[(i+k)%len(nodes)])
		}
		return urls
	}
	pubs := []*chaosPublisher{
		{name: "p2", urls: prefer(1), window: 100},
		{name: "p3", urls: prefer(2), window: 100},
	}
	for _, p := range pubs {
		p.stop, p.done, p.confirmed = make(chan struct{}), make(chan struct{}), make(map[string]bool)
		go p.run()
	}
	stopPubs := func() {
		for _, p := range pubs {
			select {
			case <-p.stop:
			default:
				close(p.stop)
			}
		}
		for _, p := range pubs {
			select {
			case <-p.done:
			case <-time.After(60 * time.Second):
				t.Errorf("publisher %s did not stop within 60s", p.name)
			}
		}
	}
	defer stopPubs()

	// The consumer follows along on n1 (then elsewhere), resuming after the last offset it saw.
	var (
		cmu      sync.Mutex
		consumed = make(map[string]bool)
		lastOff  = int64(-1)
		cstop    = make(chan struct{})
		cdone    = make(chan struct{})
		cevents  []string
	)
	go func() {
		defer close(cdone)
		urls := prefer(0)
		for i := 0; ; i++ {
			select {
			case <-cstop:
				return
			default:
			}
			conn, err := amqp.DialConfig(urls[i%len(urls)], amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
			if err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			ch, err := conn.Channel()
			if err == nil {
				err = ch.Qos(500, 0, false)
			}
			var deliveries <-chan amqp.Delivery
			if err == nil {
				cmu.Lock()
				from := lastOff + 1
				cmu.Unlock()
				deliveries, err = ch.Consume(s, "", false, false, false, false, amqp.Table{"x-stream-offset": from})
			}
			if err != nil {
				_ = conn.Close()
				time.Sleep(100 * time.Millisecond)
				continue
			}
			n := 0
		session:
			for {
				select {
				case <-cstop:
					_ = conn.Close()
					return
				case d, ok := <-deliveries:
					if !ok {
						break session
					}
					off := streamOffsetOf(t, d)
					cmu.Lock()
					if off != lastOff+1 {
						cevents = append(cevents, fmt.Sprintf("offset %d after %d", off, lastOff))
					}
					lastOff = max(lastOff, off)
					consumed[string(d.Body)] = true
					cmu.Unlock()
					if n++; n%100 == 0 {
						_ = d.Ack(true)
					}
				}
			}
			_ = conn.Close()
		}
	}()

	begin := time.Now()
	time.Sleep(2 * time.Second)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 14))
	leaderKills := 0
	type leaderKill struct {
		at        time.Time
		elected   time.Duration // until a running node names another leader
		newLeader string
	}
	var lkills []leaderKill
	for k := range kills {
		var victim int
		if k%3 == 0 {
			victim = cc.leader(t, -1)
			leaderKills++
		} else {
			victim = rng.IntN(len(nodes))
		}
		confirmedBefore := 0
		for _, p := range pubs {
			p.mu.Lock()
			confirmedBefore += len(p.confirmed)
			p.mu.Unlock()
		}
		cc.saveLogs(victim)
		isLeader := k%3 == 0
		killedAt := time.Now()
		cc.kill(t, victim)
		t.Logf("kill %d: SIGKILL %s at %s (%d confirmed so far)", k+1, cc.name(victim), killedAt.Format("15:04:05.000"), confirmedBefore)
		if isLeader {
			nl := cc.leader(t, victim)
			lk := leaderKill{at: killedAt, elected: time.Since(killedAt), newLeader: cc.name(nl)}
			lkills = append(lkills, lk)
			t.Logf("kill %d: %s leads the stream %v after the leader's SIGKILL", k+1, lk.newLeader, lk.elected.Round(time.Millisecond))
		}
		time.Sleep(time.Duration(1000+rng.IntN(2000)) * time.Millisecond)
		cc.restart(t, victim)
		time.Sleep(time.Duration(1000+rng.IntN(1500)) * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	end := time.Now()
	stopPubs()

	var res chaosResult
	total := 0
	confirmed := make(map[string]bool)
	for _, p := range pubs {
		p.mu.Lock()
		for b := range p.confirmed {
			confirmed[b] = true
		}
		total += p.published
		p.mu.Unlock()
		stall := p.longestStall(begin, end)
		res.longestStall = max(res.longestStall, stall)
		t.Logf("publisher %s: %d published, %d confirmed, longest confirm stall %v", p.name, p.published, len(p.confirmed), stall.Round(time.Millisecond))
		for _, st := range p.stalls(begin, end, 2*time.Second) {
			t.Logf("publisher %s: no confirm from %s to %s", p.name, st[0].Format("15:04:05.000"), st[1].Format("15:04:05.000"))
		}
		if stall >= 5*time.Second {
			p.mu.Lock()
			t.Errorf("publisher %s waited %v for a confirm (want < 5s); sessions:\n%s", p.name, stall.Round(time.Millisecond), strings.Join(p.sessions, "\n"))
			p.mu.Unlock()
		}
	}
	if len(confirmed) < 1000 {
		t.Fatalf("only %d publishes were confirmed in %v", len(confirmed), end.Sub(begin))
	}
	// Failover as publishers see it: the longest time without any confirm (of either publisher)
	// across each leader kill.
	var acks []time.Time
	for _, p := range pubs {
		p.mu.Lock()
		acks = append(acks, p.ackTimes...)
		p.mu.Unlock()
	}
	slices.SortFunc(acks, func(a, b time.Time) int { return a.Compare(b) })
	var worstFailover time.Duration
	for _, lk := range lkills {
		gap := time.Duration(0)
		for i := 1; i < len(acks); i++ {
			if acks[i].After(lk.at) && acks[i-1].Before(lk.at.Add(time.Second)) {
				gap = max(gap, acks[i].Sub(acks[i-1]))
			}
			if acks[i-1].After(lk.at.Add(10 * time.Second)) {
				break
			}
		}
		worstFailover = max(worstFailover, gap)
		t.Logf("leader kill at %s: new leader %s after %v; longest gap between confirms across it %v", lk.at.Format("15:04:05.000"),
			lk.newLeader, lk.elected.Round(time.Millisecond), gap.Round(time.Millisecond))
	}
	t.Logf("failover: longest confirm gap across a leader kill %v", worstFailover.Round(time.Millisecond))
	res.failover = worstFailover

	// The consumer catches up with everything confirmed.
	if !pollUntil(60*time.Second, func() bool {
		cmu.Lock()
		defer cmu.Unlock()
		for b := range confirmed {
			if !consumed[b] {
				return false
			}
		}
		return true
	}) {
		cmu.Lock()
		n := 0
		for b := range confirmed {
			if !consumed[b] {
				n++
			}
		}
		cmu.Unlock()
		t.Errorf("the following consumer is missing %d of %d confirmed messages", n, len(confirmed))
	}
	close(cstop)
	<-cdone
	cmu.Lock()
	if len(cevents) > 0 {
		t.Logf("consumer offset jumps (a reconnect resumes after the last offset seen): %v", cevents[:min(len(cevents), 10)])
	}
	cmu.Unlock()

	// Every node serves the same messages at the same dense offsets.
	var ref map[int64]string
	var refNode string
	// The nodes are read at once, each bounded by 90 s plus 0.4 ms a message (a long run of a
	// fast broker has millions).
	reads := make([]map[int64]string, len(nodes))
	readErrs := make([]error, len(nodes))
	var rwg sync.WaitGroup
	readStart := time.Now()
	for i, url := range nodes {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			reads[i], readErrs[i] = streamReadAll(t, url, s, len(confirmed), 3*time.Second,
				90*time.Second+time.Duration(len(confirmed))*400*time.Microsecond)
		}()
	}
	rwg.Wait()
	t.Logf("read back through %d nodes in %v", len(nodes), time.Since(readStart).Round(time.Second))
	for i := range nodes {
		nd := struct{ ID string }{cc.name(i)}
		got, err := reads[i], readErrs[i]
		if err != nil {
			t.Fatalf("read the stream through %s: %v", nd.ID, err)
		}
		lost := 0
		var some []string
		bodies := make(map[string]bool, len(got))
		for _, b := range got {
			bodies[b] = true
		}
		for b := range confirmed {
			if !bodies[b] {
				lost++
				if len(some) < 10 {
					some = append(some, b)
				}
			}
		}
		offs := make([]int64, 0, len(got))
		for o := range got {
			offs = append(offs, o)
		}
		slices.Sort(offs)
		if len(offs) > 0 && (offs[0] != 0 || offs[len(offs)-1] != int64(len(offs)-1)) {
			t.Errorf("node %s: offsets %d..%d for %d messages: not dense from 0", nd.ID, offs[0], offs[len(offs)-1], len(offs))
		}
		t.Logf("node %s: %d messages at offsets 0..%d, %d of %d confirmed missing", nd.ID, len(got), len(got)-1, lost, len(confirmed))
		res.lost = max(res.lost, lost)
		if lost > 0 {
			t.Errorf("LOST on node %s: %d of %d confirmed messages, e.g. %v", nd.ID, lost, len(confirmed), some)
		}
		if ref == nil {
			ref, refNode = got, nd.ID
			continue
		}
		if len(got) != len(ref) {
			t.Errorf("node %s has %d messages, node %s %d", nd.ID, len(got), refNode, len(ref))
		}
		diff := 0
		for o, b := range ref {
			if got[o] != b {
				if diff < 5 {
					t.Errorf("offset %d: node %s has %q, node %s %q", o, refNode, b, nd.ID, got[o])
				}
				diff++
			}
		}
		if diff > 0 {
			t.Errorf("%d offsets differ between node %s and node %s", diff, refNode, nd.ID)
		}
	}
	t.Logf("%d kills (%d of the stream leader) over %v; %d published, %d distinct confirmed", kills, leaderKills,
		end.Sub(begin).Round(time.Second), total, len(confirmed))
	res.published, res.confirmed = total, len(confirmed)
	return res
}
