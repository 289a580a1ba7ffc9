package streamproto_test

// The stream protocol in a 3-node cluster of in-process brokers over loopback TCP: metadata
// names each stream's real leader and replicas with their advertised endpoints, clients publish
// through the leader and consume from replicas, a leader's loss reaches clients as
// metadata_update, and single active consumers are one group across nodes and protocols.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"warren/server"
	"warren/server/netserve"
	"warren/server/streamproto/wire"
	"warren/stream/osiris"
)

// clusterWait bounds what a cluster takes to elect, fail over and converge.
const clusterWait = 60 * time.Second

type testNode struct {
	id, dir     string
	clusterAddr string
	streamPort  int
	srv         *server.Server
}

type testCluster struct {
	t     *testing.T
	nodes []*testNode
	peers map[string]string
	edit  func(i int, cfg *server.Config) // applied to node i's configuration at each start
}

// freeTCPPorts returns n distinct free loopback ports (netserve.FreePorts).
func freeTCPPorts(t *testing.T, n int) []int {
	t.Helper()
	ports, err := netserve.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// startCluster starts n brokers forming one cluster; each advertises host "localhost" and its
// stream port (--stream-advertised-host/-port), so metadata can be told from the listener's
// own address.
func startCluster(t *testing.T, n int) *testCluster {
	t.Helper()
	return startClusterWith(t, n, nil)
}

// startClusterWith is startCluster with edit applied to each node's configuration.
func startClusterWith(t *testing.T, n int, edit func(i int, cfg *server.Config)) *testCluster {
	t.Helper()
	if _, ok := external(); ok {
		t.Skip("starts its own cluster of in-process brokers")
	}
	tc := &testCluster{t: t, peers: map[string]string{}, edit: edit}
	ports := freeTCPPorts(t, 2*n)
	for i := range n {
		nd := &testNode{id: fmt.Sprintf("n%d", i+1), dir: t.TempDir(), streamPort: ports[2*i]}
		nd.clusterAddr = fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])
		tc.peers[nd.id] = nd.clusterAddr
		tc.nodes = append(tc.nodes, nd)
	}
	t.Cleanup(func() {
		for i := range tc.nodes {
			tc.stop(i)
		}
	})
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = tc.start(i) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start %s: %v", tc.nodes[i].id, err)
		}
	}
	return tc
}

func (tc *testCluster) start(i int) error {
	nd := tc.nodes[i]
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.StreamListen = fmt.Sprintf("127.0.0.1:%d", nd.streamPort)
	cfg.StreamAdvertisedHost = "localhost"
	cfg.StreamAdvertisedPort = nd.streamPort
	cfg.DataDir = nd.dir
	cfg.NodeID = nd.id
	cfg.ClusterListen = nd.clusterAddr
	cfg.ClusterPeers = tc.peers
	cfg.DiskFreeLimit = 0
	cfg.MemoryHighWatermark = 0
	var out io.Writer = io.Discard
	if os.Getenv("WARREN_TEST_LOG") != "" {
		out = os.Stderr
	}
	cfg.Logger = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", nd.id)
	if tc.edit != nil {
		tc.edit(i, &cfg)
	}
	s, err := server.New(cfg)
	if err != nil {
		return err
	}
	if err := s.Start(); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		return err
	}
	nd.srv = s
	return nil
}

func (tc *testCluster) stop(i int) {
	nd := tc.nodes[i]
	if nd.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := nd.srv.Shutdown(ctx); err != nil {
		tc.t.Errorf("shutdown %s: %v", nd.id, err)
	}
	nd.srv = nil
}

// broker is node i as a broker under test.
func (tc *testCluster) broker(i int) broker {
	nd := tc.nodes[i]
	return broker{streamURI: fmt.Sprintf("rabbitmq-stream://guest:guest@localhost:%d/%%2f", nd.streamPort),
		amqpURL: fmt.Sprintf("amqp://guest:guest@%s/", nd.srv.Addr()), srv: nd.srv}
}

func (tc *testCluster) index(id string) int {
	for i, nd := range tc.nodes {
		if nd.id == id {
			return i
		}
	}
	return -1
}

// leader polls until node `via` knows stream name's leader among the running nodes, and
// returns its index.
func (tc *testCluster) leader(via int, name string) int {
	tc.t.Helper()
	li := -1
	pollUntil(tc.t, "stream "+name+" has a leader", clusterWait, func() bool {
		for _, nd := range tc.nodes {
			if nd.srv != nil && nd.srv.Core().VHost("/").Queue(name) == nil {
				return false
			}
		}
		top, ok := tc.nodes[via].srv.Core().VHost("/").StreamTopology(name)
		if !ok || top.Leader == "" {
			return false
		}
		li = tc.index(top.Leader)
		return li >= 0 && tc.nodes[li].srv != nil
	})
	return li
}

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

// declareOn creates a 3-replica stream through node i's stream port.
func declareOn(t *testing.T, e *stream.Environment) string {
	t.Helper()
	name := streamName(t)
	var err error
	pollUntil(t, "declare stream "+name, clusterWait, func() bool {
		err = e.DeclareStream(name, stream.NewStreamOptions().SetMaxLengthBytes(stream.ByteCapacity{}.MB(100)))
		return err == nil || errors.Is(err, stream.StreamAlreadyExists)
	})
	return name
}

// clusterEnv opens a stream-client environment on node i.
func clusterEnv(t *testing.T, tc *testCluster, i int) *stream.Environment {
	t.Helper()
	var e *stream.Environment
	pollUntil(t, "connect to "+tc.nodes[i].id, clusterWait, func() bool {
		var err error
		e, err = stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(tc.broker(i).streamURI))
		return err == nil
	})
	t.Cleanup(func() { e.Close() })
	return e
}

// readMetadata asks node i where streams live.
func readMetadata(t *testing.T, rc *rawConn, corr uint32, streams ...string) *wire.MetadataResponse {
	t.Helper()
	rc.send(&wire.Metadata{CorrelationID: corr, Streams: streams})
	for {
		if r, ok := rc.read().(*wire.MetadataResponse); ok {
			return r
		}
	}
}

func endpointOf(r *wire.MetadataResponse, ref uint16) string {
	for _, b := range r.Brokers {
		if b.Reference == ref {
			return b.Host + ":" + strconv.Itoa(int(b.Port))
		}
	}
	return "?"
}

// TestClusterMetadataNamesLeaderAndReplicas: metadata asked of any node names the stream's
// leader and its two replicas, each with the host and port that node advertises; a stream that
// does not exist is stream_does_not_exist; open on each node advertises what the metadata says.
func TestClusterMetadataNamesLeaderAndReplicas(t *testing.T) {
	tc := startCluster(t, 3)
	e := clusterEnv(t, tc, 0)
	name := declareOn(t, e)
	li := tc.leader(0, name)
	want := func(i int) string { return "localhost:" + strconv.Itoa(tc.nodes[i].streamPort) }
	var replicas []string
	for i := range tc.nodes {
		if i != li {
			replicas = append(replicas, want(i))
		}
	}
	for via := range tc.nodes {
		rc := dialRaw(t, tc.broker(via))
		rc.open(0)
		var r *wire.MetadataResponse
		pollUntil(t, "metadata through "+tc.nodes[via].id+" lists two replicas", clusterWait, func() bool {
			r = readMetadata(t, rc, 10, name, "no-such-stream")
			return len(r.Streams) == 2 && len(r.Streams[0].Replicas) == 2
		})
		sm := r.Streams[0]
		if sm.Stream != name || sm.Code != wire.ResponseCodeOK {
			t.Fatalf("via %s: stream entry %+v", tc.nodes[via].id, sm)
		}
		if got := endpointOf(r, sm.Leader); got != want(li) {
			t.Fatalf("via %s: leader %s, want %s (%s)", tc.nodes[via].id, got, want(li), tc.nodes[li].id)
		}
		var got []string
		for _, ref := range sm.Replicas {
			got = append(got, endpointOf(r, ref))
		}
		slices.Sort(got)
		slices.Sort(replicas)
		if !slices.Equal(got, replicas) {
			t.Fatalf("via %s: replicas %v, want %v", tc.nodes[via].id, got, replicas)
		}
		if miss := r.Streams[1]; miss.Code != wire.ResponseCodeStreamDoesNotExist || miss.Leader != wire.NoLeader {
			t.Fatalf("via %s: missing stream entry %+v", tc.nodes[via].id, miss)
		}
	}
	// A replica's node restarts on another stream port: the other nodes learn the new one.
	ri := (li + 1) % 3
	asker := (li + 2) % 3
	tc.stop(ri)
	tc.nodes[ri].streamPort = freeTCPPorts(t, 1)[0]
	if err := tc.start(ri); err != nil {
		t.Fatalf("restart %s: %v", tc.nodes[ri].id, err)
	}
	rc := dialRaw(t, tc.broker(asker))
	_ = rc.nc.SetDeadline(time.Now().Add(2 * clusterWait))
	rc.open(0)
	pollUntil(t, "metadata names the restarted node's new port", clusterWait, func() bool {
		r := readMetadata(t, rc, 11, name)
		for _, ref := range r.Streams[0].Replicas {
			if endpointOf(r, ref) == want(ri) {
				return true
			}
		}
		return false
	})
}

// connCounts returns the number of client connections of each node.
func connCounts(tc *testCluster) []int {
	out := make([]int, len(tc.nodes))
	for i, nd := range tc.nodes {
		if nd.srv != nil {
			out[i] = nd.srv.Core().LocalConnections("/")
		}
	}
	return out
}

// TestClusterProducerOnLeaderConsumerOnReplica: rabbitmq-stream-go-client connected to a
// follower publishes through a connection to the leader (as metadata tells it) and consumes
// through a connection to a replica; every message is read back.
func TestClusterProducerOnLeaderConsumerOnReplica(t *testing.T) {
	tc := startCluster(t, 3)
	setup := clusterEnv(t, tc, 0)
	name := declareOn(t, setup)
	li := tc.leader(0, name)
	fi := (li + 1) % 3
	setup.Close()
	pollUntil(t, "no connections left", clusterWait, func() bool { return slices.Max(connCounts(tc)) == 0 })

	e := clusterEnv(t, tc, fi) // the locator connection: on the follower
	p, err := e.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("new producer: %v", err)
	}
	defer p.Close()
	pollUntil(t, "the producer's connection is on the leader", clusterWait, func() bool {
		c := connCounts(tc)
		return c[li] == 1 && c[fi] == 1
	})
	const n = 200
	confirmed := make(chan bool, n)
	notes := p.NotifyPublishConfirmation()
	go func() {
		for batch := range notes {
			for _, c := range batch {
				confirmed <- c.IsConfirmed()
			}
		}
	}()
	for i := range n {
		if err := p.Send(amqp.NewMessage([]byte("m" + strconv.Itoa(i)))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		select {
		case ok := <-confirmed:
			if !ok {
				t.Fatalf("message %d nacked", i)
			}
		case <-time.After(clusterWait):
			t.Fatalf("%d of %d confirms", i, n)
		}
	}
	before := connCounts(tc)
	bodies, _ := consume(t, e, name, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()), n)
	for i, b := range bodies {
		if b != "m"+strconv.Itoa(i) {
			t.Fatalf("message %d: %q", i, b)
		}
	}
	// consume closed its consumer; while it ran, its connection was on a replica: the leader's
	// count never grew. Check with a consumer that stays.
	c, err := e.NewConsumer(name, func(stream.ConsumerContext, *amqp.Message) {}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pollUntil(t, "the consumer's connection is on a replica", clusterWait, func() bool {
		now := connCounts(tc)
		grew := -1
		for i := range now {
			if now[i] > before[i] {
				grew = i
			}
		}
		return grew >= 0 && grew != li && now[li] == before[li]
	})
}

// TestClusterLeaderLossSendsMetadataUpdate: when the stream's leader node stops, a connection
// with a publisher and a subscription on a follower gets metadata_update (stream_not_available)
// once another node leads, and its publisher is gone; a rabbitmq-stream-go-client consumer on a
// replica is closed by it (reason "metadata update"), and the client recovers: a new producer
// publishes through the new leader and a new consumer goes on from where the first stopped, so
// every confirmed message is read.
func TestClusterLeaderLossSendsMetadataUpdate(t *testing.T) {
	tc := startCluster(t, 3)
	setup := clusterEnv(t, tc, 0)
	name := declareOn(t, setup)
	li := tc.leader(0, name)
	fi := (li + 1) % 3
	tc.leader(fi, name)

	rc := dialRaw(t, tc.broker(fi))
	_ = rc.nc.SetDeadline(time.Now().Add(2 * clusterWait))
	rc.open(0)
	rc.send(&wire.DeclarePublisher{CorrelationID: 20, PublisherID: 1, Stream: name})
	if r, ok := rc.read().(*wire.Response); !ok || r.Code != wire.ResponseCodeOK {
		t.Fatalf("declare publisher: %+v", r)
	}
	rc.send(&wire.Subscribe{CorrelationID: 21, SubscriptionID: 1, Stream: name, Offset: wire.OffsetSpec{Type: wire.OffsetTypeNext}, Credit: 1})
	if r, ok := rc.read().(*wire.Response); !ok || r.Code != wire.ResponseCodeOK {
		t.Fatalf("subscribe: %+v", r)
	}

	// One environment per client: the library's environments are not safe for a new client
	// while another of theirs is being closed by a metadata update.
	var mu sync.Mutex
	got := map[string]bool{}
	next := int64(0)
	handler := func(ctx stream.ConsumerContext, m *amqp.Message) {
		mu.Lock()
		got[string(m.GetData())] = true
		next = ctx.Consumer.GetOffset() + 1
		mu.Unlock()
	}
	c1, err := clusterEnv(t, tc, fi).NewConsumer(name, handler, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()))
	if err != nil {
		t.Fatal(err)
	}
	c1Closed := c1.NotifyClose()
	p1, err := clusterEnv(t, tc, fi).NewProducer(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	publishWith(t, p1, "before-", 50)

	tc.stop(li)
	deadline := time.Now().Add(clusterWait)
	for {
		if time.Now().After(deadline) {
			t.Fatal("no metadata_update after the leader's loss")
		}
		cmd := rc.read()
		if mu, ok := cmd.(*wire.MetadataUpdate); ok {
			if mu.Stream != name || mu.Code != wire.ResponseCodeStreamNotAvailable {
				t.Fatalf("metadata update %+v", mu)
			}
			break
		}
	}
	if nl := tc.leader(fi, name); nl == li {
		t.Fatalf("the stopped node still leads")
	}
	// The raw publisher went with the update, as RabbitMQ drops it.
	rc.send(&wire.Publish{PublisherID: 1, Messages: []wire.PublishedMessage{{PublishingID: 1, Data: []byte("x")}}})
	for {
		if pe, ok := rc.read().(*wire.PublishError); ok {
			if len(pe.Errors) != 1 || pe.Errors[0].Code != wire.ResponseCodePublisherDoesNotExist {
				t.Fatalf("publish error %+v", pe)
			}
			break
		}
	}
	select {
	case ev := <-c1Closed:
		if ev.Reason != stream.MetaDataUpdate {
			t.Fatalf("the consumer on a replica was closed with reason %q, want %q", ev.Reason, stream.MetaDataUpdate)
		}
	case <-time.After(clusterWait):
		t.Fatal("the consumer on a replica was not closed by the leader's move")
	}

	// Recovery, as the library's reliable clients do it: look the stream up again.
	var p2 *stream.Producer
	pollUntil(t, "a producer on the new leader", clusterWait, func() bool {
		p2, err = clusterEnv(t, tc, fi).NewProducer(name, nil)
		return err == nil
	})
	publishWith(t, p2, "after-", 50)
	mu.Lock()
	from := next
	mu.Unlock()
	c2, err := clusterEnv(t, tc, fi).NewConsumer(name, handler, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.Offset(from)))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	pollUntil(t, "every confirmed message read", clusterWait, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := range 50 {
			if !got["before-"+strconv.Itoa(i)] || !got["after-"+strconv.Itoa(i)] {
				return false
			}
		}
		return true
	})
}

// publishWith sends n messages "<prefix><i>" through p and waits for their confirms.
func publishWith(t *testing.T, p *stream.Producer, prefix string, n int) {
	t.Helper()
	confirmed := make(chan bool, n)
	notes := p.NotifyPublishConfirmation()
	go func() {
		for batch := range notes {
			for _, c := range batch {
				confirmed <- c.IsConfirmed()
			}
		}
	}()
	for i := range n {
		if err := p.Send(amqp.NewMessage([]byte(prefix + strconv.Itoa(i)))); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	for i := range n {
		select {
		case ok := <-confirmed:
			if !ok {
				t.Fatalf("message %d nacked", i)
			}
		case <-time.After(clusterWait):
			t.Fatalf("%d of %d confirms", i, n)
		}
	}
}

// rawSAC is a raw connection with one single-active-consumer subscription.
type rawSAC struct {
	*rawConn
	corr uint32
}

// subscribeSAC subscribes (id 1, offset first, credit 100) as single active consumer `name`.
func subscribeSAC(t *testing.T, b broker, name, group string) *rawSAC {
	t.Helper()
	rc := dialRaw(t, b)
	_ = rc.nc.SetDeadline(time.Time{})
	rc.open(0)
	rc.send(&wire.Subscribe{CorrelationID: 30, SubscriptionID: 1, Stream: name, Offset: wire.OffsetSpec{Type: wire.OffsetTypeFirst},
		Credit: 100, Properties: []wire.Property{{Key: "single-active-consumer", Value: "true"}, {Key: "name", Value: group}}})
	s := &rawSAC{rawConn: rc}
	if r, ok := s.next(t, clusterWait).(*wire.Response); !ok || r.Code != wire.ResponseCodeOK {
		t.Fatalf("subscribe: %+v", r)
	}
	return s
}

// next returns the next frame within d (nil when none came).
func (s *rawSAC) next(t *testing.T, d time.Duration) wire.Command {
	t.Helper()
	_ = s.nc.SetReadDeadline(time.Now().Add(d))
	defer s.nc.SetReadDeadline(time.Time{})
	for {
		f, err := s.r.ReadFrame()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
			t.Fatalf("read: %v", err)
		}
		cmd, err := wire.Decode(f)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if _, hb := cmd.(*wire.Heartbeat); !hb {
			return cmd
		}
	}
}

// expectUpdate waits for consumer_update(active) and answers it with offset spec.
func (s *rawSAC) expectUpdate(t *testing.T, active bool, spec wire.OffsetSpec) {
	t.Helper()
	deadline := time.Now().Add(clusterWait)
	for time.Now().Before(deadline) {
		cmd := s.next(t, time.Until(deadline))
		switch m := cmd.(type) {
		case *wire.ConsumerUpdate:
			if m.Active != active {
				t.Fatalf("consumer update active=%v, want %v", m.Active, active)
			}
			s.send(&wire.ConsumerUpdateResponse{CorrelationID: m.CorrelationID, Code: wire.ResponseCodeOK, Offset: spec})
			return
		case *wire.Deliver:
			if active {
				t.Fatalf("a delivery before the consumer update")
			}
		case nil:
		default:
			t.Fatalf("got %T %+v, want a consumer update", cmd, cmd)
		}
	}
	t.Fatalf("no consumer update (active=%v)", active)
}

// deliveries reads deliver frames for d and returns the offsets of the records they hold.
func (s *rawSAC) deliveries(t *testing.T, d time.Duration, upTo uint64) []uint64 {
	t.Helper()
	var offs []uint64
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		cmd := s.next(t, time.Until(deadline))
		switch m := cmd.(type) {
		case nil:
			return offs
		case *wire.Deliver:
			h, err := osiris.ParseHeader(m.Chunk)
			if err != nil {
				t.Fatal(err)
			}
			for o := h.ChunkID; o < h.NextChunkID(); o++ {
				offs = append(offs, o)
			}
			s.send(&wire.Credit{SubscriptionID: 1, Credit: 1})
			if len(offs) > 0 && offs[len(offs)-1] >= upTo {
				return offs
			}
		case *wire.ConsumerUpdate:
			t.Fatalf("unexpected consumer update %+v", m)
		}
	}
	return offs
}

// publishAMQP publishes n messages to stream name through url with confirms.
func publishAMQP(t *testing.T, url, name string, n int) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", name, false, false, amqp091.Publishing{Body: []byte(strconv.Itoa(i))})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		ok, err := dc.WaitContext(ctx)
		cancel()
		if err != nil || !ok {
			t.Fatalf("publish %d: %v %v", i, ok, err)
		}
	}
}

// TestClusterSingleActiveConsumerAcrossNodes: two stream-protocol single active consumers of
// one name on two nodes: the first is active and reads, the second gets nothing until the first
// unsubscribes; then it is told it is active and reads from where its answer says.
func TestClusterSingleActiveConsumerAcrossNodes(t *testing.T) {
	tc := startCluster(t, 3)
	e := clusterEnv(t, tc, 0)
	name := declareOn(t, e)
	tc.leader(0, name)
	a := subscribeSAC(t, tc.broker(0), name, "app")
	a.expectUpdate(t, true, wire.OffsetSpec{Type: wire.OffsetTypeFirst})
	b := subscribeSAC(t, tc.broker(1), name, "app")
	publishAMQP(t, tc.broker(2).amqpURL, name, 10)
	if got := a.deliveries(t, clusterWait, 9); len(got) != 10 || got[0] != 0 {
		t.Fatalf("active consumer read %v, want offsets 0..9", got)
	}
	if cmd := b.next(t, time.Second); cmd != nil {
		t.Fatalf("the waiting consumer on another node got %T %+v", cmd, cmd)
	}
	a.send(&wire.Unsubscribe{CorrelationID: 31, SubscriptionID: 1})
	b.expectUpdate(t, true, wire.OffsetSpec{Type: wire.OffsetTypeOffset, Value: 5})
	if got := b.deliveries(t, clusterWait, 9); len(got) == 0 || got[0] > 5 || got[len(got)-1] != 9 {
		t.Fatalf("the consumer that took over read %v, want from offset 5 (its chunk) to 9", got)
	}
}

// TestClusterSingleActiveConsumerAcrossProtocols: a stream-protocol single active consumer and
// an AMQP 0-9-1 x-stream-consumer-group member of the same name on the same stream, on
// different nodes, are one group: one is active at a time, and each hands over to the other
// where it left off (the stream consumer's stored offset; the AMQP member's acknowledged one).
func TestClusterSingleActiveConsumerAcrossProtocols(t *testing.T) {
	tc := startCluster(t, 3)
	e := clusterEnv(t, tc, 0)
	name := declareOn(t, e)
	tc.leader(0, name)
	const group = "app"

	a := subscribeSAC(t, tc.broker(0), name, group)
	a.expectUpdate(t, true, wire.OffsetSpec{Type: wire.OffsetTypeFirst})

	conn, err := amqp091.Dial(tc.broker(1).amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(100, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(name, "amqp-member", false, false, false, false, amqp091.Table{"x-stream-consumer-group": group})
	if err != nil {
		t.Fatalf("group consume: %v", err)
	}
	publishAMQP(t, tc.broker(2).amqpURL, name, 5)
	if got := a.deliveries(t, clusterWait, 4); len(got) != 5 {
		t.Fatalf("the active stream consumer read %v, want offsets 0..4", got)
	}
	select {
	case d := <-ds:
		t.Fatalf("the waiting AMQP member got offset %v while the stream consumer is active", d.Headers["x-stream-offset"])
	case <-time.After(time.Second):
	}
	// The stream consumer stores where it is and leaves: the AMQP member goes on after it.
	a.send(&wire.StoreOffset{Reference: group, Stream: name, Offset: 4})
	pollUntil(t, "the stored offset is on the AMQP member's node", clusterWait, func() bool {
		off, _, ok := tc.nodes[1].srv.Core().VHost("/").StreamTracking(name)
		return ok && off[group] == 4
	})
	a.send(&wire.Unsubscribe{CorrelationID: 31, SubscriptionID: 1})
	publishAMQP(t, tc.broker(2).amqpURL, name, 5)
	for want := int64(5); want < 10; want++ {
		select {
		case d := <-ds:
			if off, _ := d.Headers["x-stream-offset"].(int64); off != want {
				t.Fatalf("AMQP member got offset %v, want %d", d.Headers["x-stream-offset"], want)
			}
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		case <-time.After(clusterWait):
			t.Fatalf("AMQP member got nothing at offset %d after the stream consumer left", want)
		}
	}
	// A stream consumer joins on a third node and waits; the AMQP member cancels after its acks
	// are committed, and the stream consumer takes over right after them.
	c := subscribeSAC(t, tc.broker(2), name, group)
	if cmd := c.next(t, time.Second); cmd != nil {
		t.Fatalf("the waiting stream consumer got %T %+v while the AMQP member is active", cmd, cmd)
	}
	pollUntil(t, "the AMQP member's acks are committed", clusterWait, func() bool {
		off, _, _ := tc.nodes[2].srv.Core().VHost("/").StreamTracking(name)
		return off[group] == 9
	})
	if err := ch.Cancel("amqp-member", false); err != nil {
		t.Fatal(err)
	}
	c.expectUpdate(t, true, wire.OffsetSpec{Type: wire.OffsetTypeNone})
	publishAMQP(t, tc.broker(0).amqpURL, name, 3)
	if got := c.deliveries(t, clusterWait, 12); len(got) == 0 || got[0] > 10 || got[len(got)-1] != 12 || slices.Contains(got, 9) {
		t.Fatalf("the stream consumer that took over read %v, want from offset 10 to 12", got)
	}
}
