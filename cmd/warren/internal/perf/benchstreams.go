package perf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	wire "warren/amqp"
	"warren/server/cluster"
	"warren/server/netserve"
)

// The stream scenarios of issue 14: publishing with confirms while a consumer reads along (one
// publisher, windows 100 and 1,000; against RabbitMQ), a replicated stream on a 3-node Warren
// cluster against a single node, and a 4-partition super stream read by a 4-member consumer
// group against one stream (Warren only: RabbitMQ has neither over AMQP 0-9-1).

// Metric keys of S11-S14.
const (
	sConfirm      = "confirm_rate"
	sConsume      = "consume_rate"
	s12Single     = "single_confirm"
	s12Cluster    = "cluster_confirm"
	s12Share      = "cluster_share"
	s12ReplaySing = "single_replay"
	s12ReplayFoll = "follower_replay"
	s13Stream     = "stream_consume"
	s13Group      = "group_consume"
	s13Share      = "group_share"
)

func streamReadAlong(id string, window int) benchScenario {
	return benchScenario{
		id: id, title: fmt.Sprintf("stream: 1 publisher with confirms (window %s), a consumer reading along, 1 KB", fmtInt(uint64(window))),
		detail: fmt.Sprintf("1 producer publishes 1,024-byte persistent messages to one stream (x-queue-type=stream) with publisher confirms, at most %s unconfirmed; 1 consumer reads along from x-stream-offset=next with manual acks (one per message) and prefetch 1,000. Confirmed msg/s is the headline.", fmtInt(uint64(window))),
		metrics: []benchMetric{
			{key: sConfirm, label: "confirmed msg/s", unit: ratesUnit},
			{key: sConsume, label: "consumed msg/s", unit: ratesUnit},
		},
		bound: func(c BenchConfig) time.Duration { return c.Duration + 2*time.Minute },
		run: func(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
			c := b.base(t, id)
			c.QueueType, c.StreamOffset = "stream", "next"
			c.Producers, c.Consumers, c.Size, c.QoS = 1, 1, 1024, 1000
			c.Persistent, c.Confirm = true, window
			c.ConfirmTimeout = time.Minute
			return loadRun(ctx, c)
		},
	}
}

func replicatedStreamScenario() benchScenario {
	return benchScenario{
		id: "S13", title: "replicated stream: 3-node Warren cluster against one node (confirms, window 100, 1 KB)",
		detail: "Warren only. On the bench's single node, then on a 3-node cluster the bench starts (three `warren serve` processes on this machine, a stream with x-initial-cluster-size 3): 1 producer publishes 1,024-byte persistent messages with confirms (window 100) through the stream's leader node while 1 consumer reads along through another node; then 1 consumer reads the stream from first through a follower (prefetch 1,000, one ack per message, on the tool's lean client so that the broker bounds the rate, not amqp091-go). The share is the cluster's confirmed rate over the single node's.",
		metrics: []benchMetric{
			{key: s12Single, label: "single node: confirmed msg/s", unit: ratesUnit},
			{key: s12Cluster, label: "3 nodes: confirmed msg/s", unit: ratesUnit},
			{key: s12Share, label: "3 nodes / single node (%)", unit: "%"},
			{key: s12ReplaySing, label: "single node: replay from first (msg/s)", unit: ratesUnit},
			{key: s12ReplayFoll, label: "3 nodes: replay from first on a follower (msg/s)", unit: ratesUnit},
		},
		warrenOnly: true,
		bound:      func(c BenchConfig) time.Duration { return 2*c.Duration + 6*time.Minute },
		run:        runReplicatedStream,
	}
}

func superStreamGroupScenario() benchScenario {
	return benchScenario{
		id: "S14", title: "super stream: 4 partitions read by a 4-member consumer group, against one stream",
		detail: "Warren only. The same messages (1,024 bytes, persistent, published with confirms, window 100, by 1 producer with routing keys that vary per message) fill one stream, then a 4-partition super stream (x-super-stream); then 1 consumer reads the stream from first, and 4 consumers of one consumer group (x-stream-consumer-group, x-stream-offset first, each on its own connection) read the super stream. Consumers use the tool's lean client (prefetch 1,000, one ack per message), so that the broker bounds the rate, not amqp091-go, which used a whole core for one stream. Consumed msg/s from the consumers' start to the last delivery. The share is the group's rate over the single stream's.",
		metrics: []benchMetric{
			{key: s13Stream, label: "one stream, 1 consumer: consumed msg/s", unit: ratesUnit},
			{key: s13Group, label: "4 partitions, 4-member group: consumed msg/s", unit: ratesUnit},
			{key: s13Share, label: "group / one stream (%)", unit: "%"},
		},
		warrenOnly: true,
		bound:      func(c BenchConfig) time.Duration { return 4*c.BacklogTimeout + 4*time.Minute },
		run:        runSuperStreamGroup,
	}
}

// streamFillAndRead publishes n messages (c describes the stream or super stream) and reads them
// back from first with consumers consumers: it returns the confirm and consume rates.
func streamFillAndRead(ctx context.Context, c RunConfig, n uint64, consumers int) (*Result, error) {
	c.Producers, c.Consumers, c.Size, c.QoS = 1, consumers, 1024, 1000
	c.Persistent, c.Confirm = true, 100
	c.ConsumerClient = clientLean // the broker's read rate, not amqp091-go's (see readFromFirst)
	c.QueueType, c.StreamOffset = "stream", "first"
	c.PMessages = n
	c.ConsumeAfterPublish = true
	c.Duration = 0
	c.ConfirmTimeout = time.Minute
	c.DrainIdle = 5 * time.Second
	return Run(ctx, c)
}

func runSuperStreamGroup(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
	n := uint64(b.cfg.StreamMessages)
	out := runOutcome{values: map[string]float64{}}
	c := b.base(t, "S14")
	c.DrainTimeout = b.cfg.BacklogTimeout
	predelete(c)
	res, err := streamFillAndRead(ctx, c, n, 1)
	if err != nil {
		return runOutcome{err: fmt.Errorf("one stream: %w", err)}
	}
	out.values[s13Stream] = res.ConsumeRate
	out.notes = append(out.notes, integrityNotes(res)...)
	g := b.base(t, "S14")
	g.Exchange = "perf-bench-s14-super"
	g.Partitions, g.ConsumerGroup = 4, "perf-bench-group"
	g.DrainTimeout = b.cfg.BacklogTimeout
	deleteExchange(g.URI, g.Exchange)
	res, err = streamFillAndRead(ctx, g, n, 4)
	if err != nil {
		return runOutcome{err: fmt.Errorf("super stream: %w", err), values: out.values}
	}
	out.values[s13Group] = res.ConsumeRate
	out.notes = append(out.notes, integrityNotes(res)...)
	if out.values[s13Stream] > 0 {
		out.values[s13Share] = 100 * out.values[s13Group] / out.values[s13Stream]
	}
	if res.Consumed < n {
		out.notes = append(out.notes, fmt.Sprintf("the group consumed only %s of %s", fmtInt(res.Consumed), fmtInt(n)))
	}
	return out
}

func deleteExchange(uri, name string) {
	conn, err := dial(uri, "warren-perf bench cleanup")
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_ = ch.ExchangeDelete(name, false, false)
		_ = ch.Close()
	}
}

// readFromFirst reads stream s through uri from first until n messages arrived, acking each;
// it returns the rate from its first delivery to its last. It reads with the lean client, so
// that the rate is the broker's: amqp091-go's consumer uses a whole core here at well under
// what the broker can send.
func readFromFirst(ctx context.Context, uri, s string, n uint64, timeout time.Duration) (float64, error) {
	l, err := dialLean(uri, "warren-perf replay")
	if err != nil {
		return 0, err
	}
	defer l.abort()
	if err := l.consume(s, 1000, false, wire.Table{"x-stream-offset": "first"}); err != nil {
		return 0, err
	}
	_ = l.conn.SetReadDeadline(time.Now().Add(timeout))
	stop := context.AfterFunc(ctx, l.abort)
	defer stop()
	var first time.Time
	for got := uint64(0); got < n; got++ {
		tag, _, err := l.next()
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, fmt.Errorf("read %d of %d: %w", got, n, err)
		}
		if got == 0 {
			first = time.Now()
		}
		if err := l.ack(tag, false); err != nil {
			return 0, err
		}
	}
	secs := time.Since(first).Seconds()
	if secs <= 0 {
		return 0, errors.New("no time measured")
	}
	return float64(n-1) / secs, nil
}

// benchCluster is a 3-node Warren cluster the bench starts.
type benchCluster struct {
	nodes    []*brokerProc
	clusters []string // cluster addresses
}

func startBenchCluster(ctx context.Context, bin string, n int) (*benchCluster, error) {
	ports, err := netserve.FreePorts(2 * n)
	if err != nil {
		return nil, err
	}
	bc := &benchCluster{}
	var peers []string
	for i := range n {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2*i+1]))
		bc.clusters = append(bc.clusters, addr)
		peers = append(peers, fmt.Sprintf("n%d=%s", i+1, addr))
	}
	for i := range n {
		p, err := newBrokerProc(bin)
		if err != nil {
			bc.close()
			return nil, err
		}
		p.name, p.port = fmt.Sprintf("-n%d", i+1), ports[2*i]
		p.extra = []string{"--node-id", fmt.Sprintf("n%d", i+1), "--cluster-listen", bc.clusters[i], "--cluster-peers", strings.Join(peers, ",")}
		bc.nodes = append(bc.nodes, p)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, p := range bc.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.start(ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		bc.close()
		return nil, fmt.Errorf("start a %d-node cluster: %w", n, err)
	}
	return bc, nil
}

func (bc *benchCluster) close() {
	for _, p := range bc.nodes {
		p.close()
	}
}

// streamLeader asks the cluster which node leads stream s's coordination group (its stream
// leader), by index.
func (bc *benchCluster) streamLeader(ctx context.Context, s string) (int, error) {
	name := fmt.Sprintf("stream '%s' in vhost '/'", s)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, addr := range bc.clusters {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := cluster.Admin(rctx, addr, cluster.AdminRequest{Op: "status"})
			cancel()
			if err != nil || resp.Status == nil {
				continue
			}
			for _, g := range resp.Status.Groups {
				if g.Name == name && g.Leader != "" {
					if i, err := strconv.Atoi(strings.TrimPrefix(g.Leader, "n")); err == nil && i >= 1 && i <= len(bc.nodes) {
						return i - 1, nil
					}
				}
			}
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return 0, ctx.Err()
		}
	}
	return 0, fmt.Errorf("no leader for stream %s within 30s", s)
}

func runReplicatedStream(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
	out := runOutcome{values: map[string]float64{}}
	// The single node (the bench's Warren, fresh).
	c := b.base(t, "S13")
	c.QueueType, c.StreamOffset = "stream", "next"
	c.Producers, c.Consumers, c.Size, c.QoS = 1, 1, 1024, 1000
	c.Persistent, c.Confirm = true, 100
	c.ConfirmTimeout = time.Minute
	c.NoCleanup = true
	predelete(c)
	res, err := Run(ctx, c)
	if err != nil {
		return runOutcome{err: fmt.Errorf("single node: %w", err)}
	}
	out.values[s12Single] = res.ConfirmRate
	out.notes = append(out.notes, integrityNotes(res)...)
	q := fmt.Sprintf(c.QueuePattern, 1)
	if rate, err := readFromFirst(ctx, c.URI, q, res.Confirmed, 5*time.Minute); err == nil {
		out.values[s12ReplaySing] = rate
	} else {
		out.notes = append(out.notes, fmt.Sprintf("single-node replay: %v", err))
	}
	predelete(c)

	// The cluster.
	bin := b.cfg.WarrenBin
	if t.proc != nil {
		bin = t.proc.bin
	}
	bc, err := startBenchCluster(ctx, bin, 3)
	if err != nil {
		return runOutcome{err: err, values: out.values, notes: out.notes}
	}
	defer bc.close()
	cc := c
	cc.URI = bc.nodes[0].uri
	cc.StreamArgs = amqp.Table{"x-initial-cluster-size": int64(3)}
	// Declare first (retrying while the cluster elects), then find the stream's leader.
	var declErr error
	for try := 0; try < 100; try++ {
		if declErr = declareStreamOn(cc.URI, q, cc.StreamArgs); declErr == nil {
			break
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			break
		}
	}
	if declErr != nil {
		return runOutcome{err: fmt.Errorf("declare the replicated stream: %w", declErr), values: out.values, notes: out.notes}
	}
	leader, err := bc.streamLeader(ctx, q)
	if err != nil {
		return runOutcome{err: err, values: out.values, notes: out.notes}
	}
	follower := (leader + 1) % len(bc.nodes)
	cc.URI, cc.ConsumerURI = bc.nodes[leader].uri, bc.nodes[follower].uri
	cc.Predeclared = true
	cc.Exchange = ""
	res, err = Run(ctx, cc)
	if err != nil {
		return runOutcome{err: fmt.Errorf("3 nodes: %w", err), values: out.values, notes: out.notes}
	}
	out.values[s12Cluster] = res.ConfirmRate
	out.notes = append(out.notes, integrityNotes(res)...)
	out.notes = append(out.notes, fmt.Sprintf("3 nodes: publisher on n%d (the stream's leader), consumer on n%d", leader+1, follower+1))
	if out.values[s12Single] > 0 {
		out.values[s12Share] = 100 * out.values[s12Cluster] / out.values[s12Single]
	}
	replayOn := (leader + 2) % len(bc.nodes)
	if rate, err := readFromFirst(ctx, bc.nodes[replayOn].uri, q, res.Confirmed, 5*time.Minute); err == nil {
		out.values[s12ReplayFoll] = rate
		out.notes = append(out.notes, fmt.Sprintf("replay from first through follower n%d", replayOn+1))
	} else {
		out.notes = append(out.notes, fmt.Sprintf("follower replay: %v", err))
	}
	return out
}

func declareStreamOn(uri, s string, args amqp.Table) error {
	conn, err := dial(uri, "warren-perf setup")
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	a := amqp.Table{"x-queue-type": "stream"}
	for k, v := range args {
		a[k] = v
	}
	_, err = ch.QueueDeclare(s, true, false, false, false, a)
	return err
}
