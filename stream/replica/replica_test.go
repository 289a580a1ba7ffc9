package replica

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"warren/storage"
	"warren/stream"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLogger() *slog.Logger {
	if os.Getenv("REPLICA_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testCluster runs replicas of one stream on several in-process nodes. Its coordinator stands in
// for the raft group: commands are applied in one order on every running replica (and again,
// from the start, on a replica that restarts), and the test chooses the leader.
type testCluster struct {
	t      testing.TB
	opts   stream.Options
	voters []string

	mu     sync.Mutex // orders commands; guards the fields below
	cmds   [][]byte
	leader string
	nodes  map[string]*testNode
	dials  map[byte]int // connections dialled, by kind

	readTimeout, publishTimeout time.Duration // the replicas' Config.ReadTimeout, PublishTimeout
}

type testNode struct {
	c    *testCluster
	id   string
	db   *storage.DB
	ln   net.Listener
	addr string
	up   bool

	mu  sync.Mutex
	log *stream.Log
	rep *Replica
	wg  sync.WaitGroup
}

func newTestCluster(t testing.TB, n int, opts stream.Options) *testCluster {
	return newTestClusterTimeouts(t, n, opts, 0, 20*time.Second)
}

// newTestClusterTimeouts is newTestCluster with the replicas' Config.ReadTimeout (0: default)
// and Config.PublishTimeout.
func newTestClusterTimeouts(t testing.TB, n int, opts stream.Options, readTimeout, publishTimeout time.Duration) *testCluster {
	c := &testCluster{t: t, opts: opts, nodes: make(map[string]*testNode), readTimeout: readTimeout,
		publishTimeout: publishTimeout}
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		c.voters = append(c.voters, id)
		db, err := storage.Open(storage.Options{Dir: t.TempDir(), NoSync: true, Logger: testLogger(), GCInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		c.nodes[id] = &testNode{c: c, id: id, db: db}
	}
	for _, id := range c.voters {
		c.nodes[id].start()
	}
	t.Cleanup(func() {
		for _, id := range c.voters {
			c.nodes[id].stop()
			c.nodes[id].db.Close()
		}
	})
	return c
}

// coordinator is one node's view of the test cluster's coordination group.
type coordinator struct {
	c    *testCluster
	node string
}

func (co *coordinator) Propose(cmd []byte, done func([]byte, error)) {
	go func() {
		c := co.c
		c.mu.Lock()
		if !c.nodes[co.node].up {
			c.mu.Unlock()
			done(nil, errors.New("node down"))
			return
		}
		c.cmds = append(c.cmds, cmd)
		var res []byte
		for _, id := range c.voters {
			nd := c.nodes[id]
			if nd.up {
				if r := nd.rep.Apply(cmd); id == co.node {
					res = r
				}
			}
		}
		c.mu.Unlock()
		done(res, nil)
	}()
}

func (co *coordinator) Leader() string {
	co.c.mu.Lock()
	defer co.c.mu.Unlock()
	return co.c.leader
}

// transport dials other nodes' listeners; the first byte says the kind.
type transport struct {
	c    *testCluster
	self string
}

func (tr *transport) Dial(ctx context.Context, node string, kind byte) (net.Conn, error) {
	tr.c.mu.Lock()
	nd := tr.c.nodes[node]
	up, addr := nd.up, nd.addr
	selfUp := tr.c.nodes[tr.self].up
	if tr.c.dials == nil {
		tr.c.dials = make(map[byte]int)
	}
	tr.c.dials[kind]++
	tr.c.mu.Unlock()
	if !up || !selfUp {
		return nil, fmt.Errorf("node %s is down", node)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write([]byte{kind}); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// start opens the node's log and replica (replaying every coordination command) and its listener.
func (nd *testNode) start() {
	c := nd.c
	opts := c.opts
	opts.Replicated = true
	opts.Logger = testLogger().With("node", nd.id)
	var rep atomic.Pointer[Replica]
	opts.OnRetention = func(first uint64) {
		if r := rep.Load(); r != nil {
			r.Retain(first)
		}
	}
	l, err := stream.Open(nd.db, 1, opts)
	if err != nil {
		c.t.Fatalf("open log on %s: %v", nd.id, err)
	}
	r := New(Config{Log: l, Self: nd.id, Voters: c.voters, Coord: &coordinator{c: c, node: nd.id},
		Transport: &transport{c: c, self: nd.id}, Logger: opts.Logger, WriterID: nd.id + "-" + fmt.Sprint(rand.Uint32()),
		PublishTimeout: c.publishTimeout, ReadTimeout: c.readTimeout})
	rep.Store(r)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	nd.mu.Lock()
	nd.log, nd.rep, nd.ln = l, r, ln
	nd.mu.Unlock()
	nd.wg.Add(1)
	go nd.accept(ln, r)
	c.mu.Lock()
	for _, cmd := range c.cmds {
		r.Apply(cmd)
	}
	nd.addr = ln.Addr().String()
	nd.up = true
	lead := c.leader == nd.id
	c.mu.Unlock()
	if lead {
		r.LeaderChanged(true)
	}
}

func (nd *testNode) accept(ln net.Listener, r *Replica) {
	defer nd.wg.Done()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			br := bufio.NewReader(conn)
			kind, err := br.ReadByte()
			if err != nil {
				return
			}
			r.Serve(kind, conn, br)
		}()
	}
}

// stop closes the node's replica and log (a crash, as far as the others see) and its listener.
func (nd *testNode) stop() {
	c := nd.c
	c.mu.Lock()
	if !nd.up {
		c.mu.Unlock()
		return
	}
	nd.up = false
	c.mu.Unlock()
	nd.mu.Lock()
	r, ln := nd.rep, nd.ln
	nd.mu.Unlock()
	ln.Close()
	r.Close()
	nd.wg.Wait()
}

// setLeader makes id the coordination group's leader ("" none).
func (c *testCluster) setLeader(id string) {
	c.mu.Lock()
	old := c.leader
	c.leader = id
	oldUp := old != "" && c.nodes[old].up
	newUp := id != "" && c.nodes[id].up
	c.mu.Unlock()
	if oldUp && old != id {
		c.nodes[old].replica().LeaderChanged(false)
	}
	if newUp {
		c.nodes[id].replica().LeaderChanged(true)
	}
}

func (nd *testNode) replica() *Replica {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.rep
}

func (c *testCluster) node(id string) *testNode { return c.nodes[id] }

// dialled returns how many connections of kind the nodes have dialled.
func (c *testCluster) dialled(kind byte) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dials[kind]
}

// waitLeading waits until id's replica leads.
func (c *testCluster) waitLeading(id string, d time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for !c.node(id).replica().Leading() {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s does not lead within %v", id, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// errNoOutcome is publishSync's error for a publish whose outcome did not come in time.
var errNoOutcome = errors.New("no outcome within 30 s")

// publishSync publishes recs through r and waits (up to 30 s, beyond the test clusters'
// publish timeouts) for the outcome.
func publishSync(r *Replica, recs ...stream.Record) error {
	ch := make(chan error, 1)
	r.Publish(recs, func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		return errNoOutcome
	}
}

func body(i int) []byte { return []byte(fmt.Sprintf("m%08d", i)) }

// readAll reads a replica's committed records.
func readAll(t testing.TB, l *stream.Log) []stream.Entry {
	t.Helper()
	var out []stream.Entry
	for off := l.First(); off < l.Next(); {
		es, err := l.Read(nil, off, 1000)
		if err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		if len(es) == 0 {
			break
		}
		out = append(out, es...)
		off = es[len(es)-1].Offset + 1
	}
	return out
}

// waitConverged waits until every running replica has committed and durable records up to the
// leader's written end, then checks that they hold the same chunks byte for byte.
func (c *testCluster) waitConverged(d time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		c.mu.Lock()
		leader := c.leader
		c.mu.Unlock()
		want := c.node(leader).replica().Log().Written()
		ok := c.node(leader).replica().Leading()
		for _, id := range c.voters {
			nd := c.node(id)
			if !nd.up {
				continue
			}
			l := nd.replica().Log()
			if l.Next() != want || l.Written() != want {
				ok = false
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			var st []string
			for _, id := range c.voters {
				nd := c.node(id)
				if nd.up {
					l := nd.replica().Log()
					role, ep := nd.replica().Role()
					st = append(st, fmt.Sprintf("%s %s/%d written %d next %d tail %+v", id, role, ep, l.Written(), l.Next(), l.Tail()))
				}
			}
			c.t.Fatalf("replicas did not converge to %d within %v: %v", want, d, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var ref []stream.RawChunk
	for _, id := range c.voters {
		nd := c.node(id)
		if !nd.up {
			continue
		}
		l := nd.replica().Log()
		var chunks []stream.RawChunk
		for off := l.First(); off < l.Written(); {
			cs, err := l.ReadChunks(off, 1<<30)
			if err != nil {
				c.t.Fatalf("%s: read chunks at %d: %v", id, off, err)
			}
			for _, ch := range cs {
				chunks = append(chunks, ch)
				e, _ := readChunkEnd(ch.Blob)
				off = e
			}
		}
		if ref == nil {
			ref = chunks
			continue
		}
		// Compare the common range (retention may differ by a segment in flight).
		i, j := 0, 0
		for i < len(ref) && j < len(chunks) {
			a, _ := readChunkStart(ref[i].Blob)
			b, _ := readChunkStart(chunks[j].Blob)
			switch {
			case a < b:
				i++
			case b < a:
				j++
			default:
				if !bytes.Equal(ref[i].Blob, chunks[j].Blob) {
					c.t.Fatalf("%s: the chunk at offset %d differs from the first replica's", id, a)
				}
				i++
				j++
			}
		}
	}
}

func TestReplicatedPublishAndFollow(t *testing.T) {
	c := newTestCluster(t, 3, stream.Options{})
	c.setLeader("n1")
	c.waitLeading("n1", 5*time.Second)
	n := 0
	for round := range 20 {
		var wg sync.WaitGroup
		errs := make(chan error, 60)
		for _, id := range c.voters {
			r := c.node(id).replica()
			for k := range 20 {
				wg.Add(1)
				i := round*60 + n
				n++
				_ = k
				r.Publish([]stream.Record{{RoutingKey: id, Body: body(i)}}, func(err error) {
					errs <- err
					wg.Done()
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
		n = 0
	}
	c.waitConverged(10 * time.Second)
	for _, id := range c.voters {
		es := readAll(t, c.node(id).replica().Log())
		if len(es) != 1200 {
			t.Fatalf("%s has %d records, want 1200", id, len(es))
		}
		seen := make(map[string]bool)
		for i, e := range es {
			if e.Offset != uint64(i) {
				t.Fatalf("%s: record %d has offset %d", id, i, e.Offset)
			}
			if seen[string(e.Body)] {
				t.Fatalf("%s: %s stored twice", id, e.Body)
			}
			seen[string(e.Body)] = true
		}
	}
}

// TestIdleFollowerOpensNoPublishConnection: a follower node's publish pipeline connects to the
// leader when a publish goes through it, not before (an idle stream holds no forwarding
// connections and its pipelines do not tick).
func TestIdleFollowerOpensNoPublishConnection(t *testing.T) {
	c := newTestCluster(t, 3, stream.Options{})
	c.setLeader("n1")
	c.waitLeading("n1", 5*time.Second)
	// Several of a busy pipeline's ticks (50 ms): an idle one must not dial meanwhile.
	deadline := time.Now().Add(400 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := c.dialled(KindPublish); n != 0 {
			t.Fatalf("%d publish connections dialled before any publish", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := publishSync(c.node("n2").replica(), stream.Record{Body: body(1)}); err != nil {
		t.Fatalf("publish through a follower: %v", err)
	}
	if n := c.dialled(KindPublish); n != 1 {
		t.Fatalf("%d publish connections after one publish through n2, want 1", n)
	}
}

// TestPublishWithoutMajorityExpires: a publish on an idle leader (the direct path, while the
// pipeline does not tick) whose followers are gone fails at its deadline instead of waiting for
// a commit that cannot come.
func TestPublishWithoutMajorityExpires(t *testing.T) {
	c := newTestClusterTimeouts(t, 3, stream.Options{}, 0, 500*time.Millisecond)
	c.setLeader("n1")
	c.waitLeading("n1", 5*time.Second)
	if err := publishSync(c.node("n1").replica(), stream.Record{Body: body(1)}); err != nil {
		t.Fatal(err)
	}
	c.node("n2").stop()
	c.node("n3").stop()
	// The pipeline goes idle: its ticker stops.
	for deadline := time.Now().Add(5 * time.Second); c.node("n1").replica().pub.ticking.Load(); {
		if time.Now().After(deadline) {
			t.Fatal("the idle pipeline still ticks after 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := publishSync(c.node("n1").replica(), stream.Record{Body: body(2)}); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("publish without a majority (500 ms deadline): %v, want ErrNoLeader", err)
	}
}

// TestIdleFetchConnectionsStay: the followers of an idle stream keep their fetch connections.
// The leader heartbeats every third of the read timeout and each follower answers, so neither
// end's read deadline drops a connection of a stream nobody writes to (which had every idle
// stream's followers dial again every read timeout).
func TestIdleFetchConnectionsStay(t *testing.T) {
	const rt = 600 * time.Millisecond
	c := newTestClusterTimeouts(t, 3, stream.Options{}, rt, 20*time.Second)
	c.setLeader("n1")
	c.waitLeading("n1", 5*time.Second)
	if err := publishSync(c.node("n1").replica(), stream.Record{Body: body(1)}); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(10 * time.Second)
	before := c.dialled(KindFetch)
	// Five read timeouts of idleness.
	deadline := time.Now().Add(5 * rt)
	for time.Now().Before(deadline) {
		if n := c.dialled(KindFetch); n != before {
			t.Fatalf("fetch connections dialled while idle: %d, then %d", before, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Still following: a publish reaches every replica.
	if err := publishSync(c.node("n1").replica(), stream.Record{Body: body(2)}); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(10 * time.Second)
	if n := c.dialled(KindFetch); n != before {
		t.Fatalf("fetch connections dialled: %d, then %d", before, n)
	}
}

// TestReplicatedFailover publishes from every node while nodes, the leader among them, are
// stopped and restarted and the leadership moves: every confirmed record is on every replica
// at the end, once, at dense offsets, and the replicas hold the same chunks.
func TestReplicatedFailover(t *testing.T) {
	rounds := 12
	if testing.Short() {
		rounds = 4
	}
	c := newTestCluster(t, 3, stream.Options{ChunkMaxRecords: 50})
	c.setLeader("n1")
	c.waitLeading("n1", 5*time.Second)

	var (
		mu        sync.Mutex
		confirmed = make(map[string]bool)
		next      atomic.Int64
		stop      = make(chan struct{})
		wg        sync.WaitGroup
	)
	publisher := func(id string) {
		defer wg.Done()
		sem := make(chan struct{}, 32)
		for {
			select {
			case <-stop:
				for range cap(sem) {
					sem <- struct{}{}
				}
				return
			case sem <- struct{}{}:
			}
			nd := c.node(id)
			c.mu.Lock()
			up := nd.up
			c.mu.Unlock()
			if !up {
				<-sem
				time.Sleep(20 * time.Millisecond)
				continue
			}
			i := int(next.Add(1))
			b := body(i)
			nd.replica().Publish([]stream.Record{{Body: b}}, func(err error) {
				if err == nil {
					mu.Lock()
					confirmed[string(b)] = true
					mu.Unlock()
				}
				<-sem
			})
		}
	}
	for _, id := range c.voters {
		wg.Add(1)
		go publisher(id)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range rounds {
		time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond)
		victim := c.voters[rng.IntN(len(c.voters))]
		c.mu.Lock()
		leader := c.leader
		c.mu.Unlock()
		if round%3 == 0 {
			victim = leader
		}
		c.node(victim).stop()
		if victim == leader {
			var live []string
			for _, id := range c.voters {
				if id != victim {
					live = append(live, id)
				}
			}
			nl := live[rng.IntN(len(live))]
			c.setLeader(nl)
		}
		time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
		c.node(victim).start()
		mu.Lock()
		nconf := len(confirmed)
		mu.Unlock()
		t.Logf("round %d: restarted %s, confirmed %d", round, victim, nconf)
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	c.waitConverged(20 * time.Second)
	mu.Lock()
	defer mu.Unlock()
	if len(confirmed) < 100 {
		t.Fatalf("only %d records confirmed", len(confirmed))
	}
	for _, id := range c.voters {
		es := readAll(t, c.node(id).replica().Log())
		have := make(map[string]int)
		for i, e := range es {
			if e.Offset != uint64(i) {
				t.Fatalf("%s: record %d has offset %d (offsets not dense)", id, i, e.Offset)
			}
			have[string(e.Body)]++
		}
		lost := 0
		for b := range confirmed {
			if have[b] == 0 {
				lost++
			}
		}
		dups := 0
		for _, n := range have {
			if n > 1 {
				dups++
			}
		}
		if lost > 0 || dups > 0 {
			t.Fatalf("%s: %d of %d confirmed records lost, %d stored twice (%d records)", id, lost, len(confirmed), dups, len(es))
		}
		t.Logf("%s: %d records, %d confirmed, none lost or doubled", id, len(es), len(confirmed))
	}
}

func readChunkStart(b []byte) (uint64, error) {
	if len(b) < 48 {
		return 0, errors.New("short")
	}
	var v uint64
	for _, x := range b[24:32] {
		v = v<<8 | uint64(x)
	}
	return v, nil
}

func readChunkEnd(b []byte) (uint64, error) {
	s, err := readChunkStart(b)
	if err != nil {
		return 0, err
	}
	n := uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
	return s + n, nil
}

func TestDeduplicationByPublisherID(t *testing.T) {
	c := newTestCluster(t, 3, stream.Options{})
	c.setLeader("n2")
	c.waitLeading("n2", 5*time.Second)
	r := c.node("n1").replica()
	for i := 1; i <= 10; i++ {
		if err := publishSync(r, stream.Record{Body: body(i), PublisherID: "p", PublishingID: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	// Repeats, through another node: dropped, still confirmed.
	for i := 5; i <= 10; i++ {
		if err := publishSync(c.node("n3").replica(), stream.Record{Body: body(i), PublisherID: "p", PublishingID: uint64(i)}); err != nil {
			t.Fatalf("repeat %d: %v", i, err)
		}
	}
	if err := publishSync(r, stream.Record{Body: body(11), PublisherID: "p", PublishingID: 11}); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(5 * time.Second)
	// The new leader knows the publisher's sequence.
	c.setLeader("n3")
	c.waitLeading("n3", 5*time.Second)
	if err := publishSync(r, stream.Record{Body: body(3), PublisherID: "p", PublishingID: 3}); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(5 * time.Second)
	for _, id := range c.voters {
		l := c.node(id).replica().Log()
		if es := readAll(t, l); len(es) != 11 {
			t.Fatalf("%s: %d records, want 11", id, len(es))
		}
		if got := l.WriterSequence("p"); got != 11 {
			t.Fatalf("%s: publisher sequence %d, want 11", id, got)
		}
	}
}

// TestLaggingFollowerResetsAfterRetention stops a follower, publishes until retention removed
// what it missed, and restarts it: it starts over at the leader's first offset and catches up.
func TestLaggingFollowerResetsAfterRetention(t *testing.T) {
	opts := stream.Options{MaxSegmentBytes: 20_000, MaxLengthBytes: 60_000, ChunkMaxRecords: 10}
	c := newTestCluster(t, 3, opts)
	c.setLeader("n1")
	c.waitLeading("n1", 5*time.Second)
	r := c.node("n1").replica()
	pub := func(from, to int) {
		for i := from; i < to; i += 10 {
			recs := make([]stream.Record, 10)
			for k := range recs {
				recs[k] = stream.Record{Body: bytes.Repeat(body(i+k), 50), PublisherID: "w", PublishingID: uint64(i + k + 1)}
			}
			if err := publishSync(r, recs...); err != nil {
				t.Fatal(err)
			}
		}
	}
	pub(0, 200)
	c.waitConverged(5 * time.Second)
	c.node("n3").stop()
	pub(200, 1000)
	first := r.Log().First()
	if first <= 200 {
		t.Fatalf("retention kept offset %d; the test needs it gone", first)
	}
	c.node("n3").start()
	c.waitConverged(10 * time.Second)
	l3 := c.node("n3").replica().Log()
	if l3.First() < first || l3.Next() != 1000 {
		t.Fatalf("n3: first %d next %d, want >= %d and 1000", l3.First(), l3.Next(), first)
	}
	if got := l3.WriterSequence("w"); got != 1000 {
		t.Fatalf("n3: writer sequence %d after the reset, want 1000", got)
	}
	// Retention applies on every replica: the same first offset.
	pub(1000, 1300)
	c.waitConverged(10 * time.Second)
	want := r.Log().First()
	for _, id := range c.voters {
		if deadline := time.Now().Add(5 * time.Second); true {
			for c.node(id).replica().Log().First() != want && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if got := c.node(id).replica().Log().First(); got != want {
			t.Fatalf("%s: first %d, leader's %d", id, got, want)
		}
	}
}

// TestDivergentLeaderTruncates isolates a leader while it writes (nothing it writes can commit),
// elects another, and brings the old one back: it drops its uncommitted chunks and follows.
func TestDivergentLeaderTruncates(t *testing.T) {
	c := newTestCluster(t, 3, stream.Options{})
	c.setLeader("n1")
	c.waitLeading("n1", 5*time.Second)
	r1 := c.node("n1").replica()
	for i := range 10 {
		if err := publishSync(r1, stream.Record{Body: body(i)}); err != nil {
			t.Fatal(err)
		}
	}
	c.waitConverged(5 * time.Second)
	// Cut n1 off: its followers' sessions break, it cannot reach anyone.
	c.mu.Lock()
	c.nodes["n1"].up = false
	c.mu.Unlock()
	for _, id := range []string{"n2", "n3"} {
		c.node(id).replica().mu.Lock()
		for conn := range c.node(id).replica().conns {
			conn.Close()
		}
		c.node(id).replica().mu.Unlock()
	}
	r1.mu.Lock()
	for conn := range r1.conns {
		conn.Close()
	}
	r1.mu.Unlock()
	var retried, outcomes atomic.Int32
	for i := 100; i < 120; i++ {
		r1.Publish([]stream.Record{{Body: body(i)}}, func(err error) {
			if err == nil {
				retried.Add(1)
			}
			outcomes.Add(1)
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for r1.Log().Written() < 30 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if w := r1.Log().Written(); w < 30 {
		t.Fatalf("the isolated leader wrote up to %d only", w)
	}
	c.mu.Lock()
	c.leader = "n2"
	c.mu.Unlock()
	r1.LeaderChanged(false)
	c.node("n2").replica().LeaderChanged(true)
	c.waitLeading("n2", 5*time.Second)
	for i := 200; i < 205; i++ {
		if err := publishSync(c.node("n3").replica(), stream.Record{Body: body(i)}); err != nil {
			t.Fatal(err)
		}
	}
	c.mu.Lock()
	c.nodes["n1"].up = true
	c.mu.Unlock()
	for deadline := time.Now().Add(25 * time.Second); outcomes.Load() < 20; {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of the isolated leader's 20 publishes have an outcome", outcomes.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := retried.Load(); n != 20 {
		t.Fatalf("%d of the isolated leader's 20 publishes were stored through the new leader, want all", n)
	}
	c.waitConverged(20 * time.Second)
	for _, id := range c.voters {
		es := readAll(t, c.node(id).replica().Log())
		var bodies []string
		for _, e := range es {
			bodies = append(bodies, string(e.Body))
		}
		// The isolated leader's 20 publishes were retried by its pipeline on the new leader once
		// it could reach it: each stored once.
		if len(es) != 35 {
			t.Fatalf("%s: %d records %v, want 35", id, len(es), bodies)
		}
		slices.Sort(bodies)
		if i := slices.Compact(bodies); len(i) != 35 {
			t.Fatalf("%s: duplicates among %v", id, bodies)
		}
	}
}

// TestCatchUpAcrossEpochs: a follower that was down while the leadership moved twice catches up
// in large batches and records every epoch's start on its way (a batch stops at an epoch start),
// so its history, not only its chunks, matches the leader's.
func TestCatchUpAcrossEpochs(t *testing.T) {
	c := newTestCluster(t, 3, stream.Options{ChunkMaxRecords: 5})
	c.setLeader("n1")
	c.waitLeading("n1", 5*time.Second)
	c.node("n3").stop()
	pub := func(via string, from, to int) {
		for i := from; i < to; i++ {
			if err := publishSync(c.node(via).replica(), stream.Record{Body: body(i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	pub("n1", 0, 23)
	c.setLeader("n2")
	c.waitLeading("n2", 5*time.Second)
	pub("n2", 23, 51)
	c.setLeader("n1")
	c.waitLeading("n1", 5*time.Second)
	pub("n2", 51, 60)
	c.node("n3").start()
	c.waitConverged(10 * time.Second)
	want := c.node("n1").replica().Log().History()
	if got := c.node("n3").replica().Log().History(); !slices.Equal(got, want) {
		t.Fatalf("n3's epoch history %v, the leader's %v", got, want)
	}
	if len(want) < 3 {
		t.Fatalf("leader's history %v: want three epochs", want)
	}
}
