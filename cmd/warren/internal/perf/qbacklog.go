package perf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"warren/server/netserve"
)

// `warren perf quorum-backlog` fills one quorum queue on a 3-node cluster of the given binaries
// with persistent, confirmed messages, then drains it, and reports per node the peak RSS during
// each phase and the disk use of its data directory, the confirmed and received counts (checked
// by sequence number: lost and duplicates), and the fill and drain rates. Each --bin is run in
// turn on a fresh cluster, so a run compares builds on the same machine and load.

// BacklogConfig configures a quorum-backlog run.
type BacklogConfig struct {
	Bins      []string // label=path of each `warren` binary to run a cluster of
	Messages  int
	Size      int
	Producers int
	Window    int           // unconfirmed messages per producer
	Settle    time.Duration // how long to watch disk use after the drain
	Out       io.Writer
}

// BacklogResult is one binary's figures.
type BacklogResult struct {
	Label                 string
	Confirmed, Nacked     int64
	Received, Duplicates  int64
	Lost                  int64
	Redelivered           int64
	Fill, Drain           time.Duration
	PeakFill, PeakDrain   [3]uint64 // RSS bytes
	DiskFull, DiskDrained [3]int64  // bytes of each data directory
	DiskSettled           [3]int64
}

func backlogCommand() *cli.Command {
	return &cli.Command{
		Name:  "quorum-backlog",
		Usage: "fill and drain a 3-node quorum queue backlog; report per-node peak RSS, disk use, counts and rates",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "bin", Usage: "`LABEL=PATH` of a warren binary (repeat to compare builds)"},
			&cli.IntFlag{Name: "messages", Value: 1_000_000, Usage: "messages to publish"},
			&cli.IntFlag{Name: "size", Value: 1024, Usage: "body `BYTES`"},
			&cli.IntFlag{Name: "producers", Value: 4, Usage: "producer connections"},
			&cli.IntFlag{Name: "window", Value: 256, Usage: "unconfirmed messages per producer"},
			&cli.DurationFlag{Name: "settle", Value: 90 * time.Second, Usage: "watch disk use this long after the drain"},
		},
		Action: func(c *cli.Context) error {
			ctx, stop := signalContext(c)
			defer stop()
			bins := c.StringSlice("bin")
			if len(bins) == 0 {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				bins = []string{"this=" + exe}
			}
			_, err := QuorumBacklog(ctx, BacklogConfig{Bins: bins, Messages: c.Int("messages"), Size: c.Int("size"),
				Producers: c.Int("producers"), Window: c.Int("window"), Settle: c.Duration("settle"), Out: os.Stdout})
			return err
		},
	}
}

// QuorumBacklog runs the scenario for every binary and prints a table.
func QuorumBacklog(ctx context.Context, cfg BacklogConfig) ([]BacklogResult, error) {
	if cfg.Size < 16 {
		cfg.Size = 16
	}
	var results []BacklogResult
	for _, b := range cfg.Bins {
		label, path, ok := strings.Cut(b, "=")
		if !ok {
			label, path = filepath.Base(b), b
		}
		fmt.Fprintf(cfg.Out, "== %s (%s): %d messages of %d bytes, %d producers x %d unconfirmed\n",
			label, path, cfg.Messages, cfg.Size, cfg.Producers, cfg.Window)
		res, err := backlogOne(ctx, cfg, label, path)
		if err != nil {
			return results, fmt.Errorf("%s: %w", label, err)
		}
		results = append(results, res)
		printBacklog(cfg.Out, cfg, []BacklogResult{res})
	}
	printBacklog(cfg.Out, cfg, results)
	return results, nil
}

type backlogNode struct {
	id, amqpAddr, clusterAddr, dir string
	cmd                            *exec.Cmd
	log                            *os.File
	peak                           atomic.Uint64
}

func (n *backlogNode) uri() string { return "amqp://guest:guest@" + n.amqpAddr + "/" }

func backlogOne(ctx context.Context, cfg BacklogConfig, label, bin string) (BacklogResult, error) {
	res := BacklogResult{Label: label}
	base, err := os.MkdirTemp("", "warren-qbacklog-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(base)
	nodes := make([]*backlogNode, 3)
	var peers []string
	ports, err := netserve.FreePorts(2 * len(nodes))
	if err != nil {
		return res, err
	}
	for i := range nodes {
		a, c := ports[2*i], ports[2*i+1]
		n := &backlogNode{id: fmt.Sprintf("n%d", i+1), amqpAddr: fmt.Sprintf("127.0.0.1:%d", a),
			clusterAddr: fmt.Sprintf("127.0.0.1:%d", c), dir: filepath.Join(base, fmt.Sprintf("n%d", i+1))}
		nodes[i] = n
		peers = append(peers, n.id+"="+n.clusterAddr)
	}
	for _, n := range nodes {
		if n.log, err = os.Create(filepath.Join(base, n.id+".log")); err != nil {
			return res, err
		}
		n.cmd = exec.Command(bin, "serve", "--amqp-listen", n.amqpAddr, "--http-listen", "", "--prometheus-listen", "", "--stream-listen", "", "--data-dir", n.dir,
			"--node-id", n.id, "--cluster-listen", n.clusterAddr, "--cluster-peers", strings.Join(peers, ","))
		n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
		if err := n.cmd.Start(); err != nil {
			return res, fmt.Errorf("start %s: %w", n.id, err)
		}
	}
	defer func() {
		for _, n := range nodes {
			if n.cmd.Process != nil {
				_ = n.cmd.Process.Kill()
				_ = n.cmd.Wait()
			}
			n.log.Close()
		}
	}()
	for _, n := range nodes {
		if err := waitDial(ctx, n.amqpAddr, 30*time.Second); err != nil {
			return res, fmt.Errorf("%s: %w", n.id, err)
		}
	}
	const queue = "backlog.q"
	if err := retryDeclare(ctx, nodes[0].uri(), queue); err != nil {
		return res, err
	}

	// RSS sampling, per phase.
	var phase atomic.Int32 // 0 fill, 1 drain
	var peaks [2][3]atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			for i, n := range nodes {
				if rss, err := readRSS(n.cmd.Process.Pid); err == nil {
					p := &peaks[phase.Load()][i]
					for {
						old := p.Load()
						if rss <= old || p.CompareAndSwap(old, rss) {
							break
						}
					}
				}
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	// Fill.
	per := cfg.Messages / cfg.Producers
	start := time.Now()
	var confirmed, nacked atomic.Int64
	errs := make(chan error, cfg.Producers)
	for p := 0; p < cfg.Producers; p++ {
		go func() { errs <- backlogProduce(ctx, nodes[0].uri(), queue, p, per, cfg, &confirmed, &nacked) }()
	}
	lastReport := time.Now()
	for done := 0; done < cfg.Producers; {
		select {
		case err := <-errs:
			if err != nil {
				return res, fmt.Errorf("produce: %w", err)
			}
			done++
		case <-time.After(5 * time.Second):
		}
		if time.Since(lastReport) >= 10*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(cfg.Out, "   fill: %d confirmed after %v, RSS %s\n", confirmed.Load(),
				time.Since(start).Round(time.Second), rssLine(nodes))
		}
	}
	res.Fill = time.Since(start)
	res.Confirmed, res.Nacked = confirmed.Load(), nacked.Load()
	for i, n := range nodes {
		res.DiskFull[i] = dirSize(n.dir)
	}
	fmt.Fprintf(cfg.Out, "   filled: %d confirmed, %d nacked in %v; disk %s\n", res.Confirmed, res.Nacked,
		res.Fill.Round(time.Millisecond), diskLine(res.DiskFull))

	// Drain.
	phase.Store(1)
	start = time.Now()
	seen := make([][]byte, cfg.Producers)
	for i := range seen {
		seen[i] = make([]byte, per/8+1)
	}
	if err := backlogDrain(ctx, nodes[0].uri(), queue, res.Confirmed, seen, &res, cfg.Out, nodes); err != nil {
		return res, err
	}
	res.Drain = time.Since(start)
	for i, n := range nodes {
		res.DiskDrained[i] = dirSize(n.dir)
	}
	// Lost: confirmed messages never received (every confirmed one has its bit; nacked ones may
	// or may not have arrived, so only the shortfall counts).
	if miss := res.Confirmed - (res.Received - res.Duplicates); miss > 0 {
		res.Lost = miss
		keep := base + "-logs"
		if err := os.MkdirAll(keep, 0o755); err == nil {
			for _, n := range nodes {
				if data, err := os.ReadFile(n.log.Name()); err == nil {
					_ = os.WriteFile(filepath.Join(keep, n.id+".log"), data, 0o644)
				}
			}
			fmt.Fprintf(cfg.Out, "   %d confirmed messages not received: node logs kept in %s\n", miss, keep)
		}
	}
	for i := range nodes {
		res.PeakFill[i], res.PeakDrain[i] = peaks[0][i].Load(), peaks[1][i].Load()
	}
	fmt.Fprintf(cfg.Out, "   drained: %d received (%d duplicates, %d redelivered) in %v; disk %s\n", res.Received,
		res.Duplicates, res.Redelivered, res.Drain.Round(time.Millisecond), diskLine(res.DiskDrained))
	if cfg.Settle > 0 {
		deadline := time.Now().Add(cfg.Settle)
		for time.Now().Before(deadline) && sleepCtx(ctx, 5*time.Second) {
		}
		for i, n := range nodes {
			res.DiskSettled[i] = dirSize(n.dir)
		}
		fmt.Fprintf(cfg.Out, "   %v after the drain: disk %s\n", cfg.Settle, diskLine(res.DiskSettled))
	}
	return res, nil
}

func rssLine(nodes []*backlogNode) string {
	var parts []string
	for _, n := range nodes {
		rss, _ := readRSS(n.cmd.Process.Pid)
		parts = append(parts, fmt.Sprintf("%s %d MB", n.id, rss>>20))
	}
	return strings.Join(parts, ", ")
}

func diskLine(d [3]int64) string {
	return fmt.Sprintf("n1 %d MB, n2 %d MB, n3 %d MB", d[0]>>20, d[1]>>20, d[2]>>20)
}

// dirSize is the disk space the files under dir take (allocated blocks: badger's files are sparse).
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n += allocated(fi)
		}
		return nil
	})
	return n
}

func waitDial(ctx context.Context, addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not accepting connections within %v: %w", limit, err)
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
}

func retryDeclare(ctx context.Context, uri, queue string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := func() error {
			c, err := amqp.Dial(uri)
			if err != nil {
				return err
			}
			defer c.Close()
			ch, err := c.Channel()
			if err != nil {
				return err
			}
			_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
			return err
		}()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("declare %s: %w", queue, err)
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// backlogProduce publishes n messages (producer id, sequence number in the first 10 bytes) with
// at most cfg.Window unconfirmed.
func backlogProduce(ctx context.Context, uri, queue string, p, n int, cfg BacklogConfig, confirmed, nacked *atomic.Int64) error {
	c, err := amqp.Dial(uri)
	if err != nil {
		return err
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	acks := ch.NotifyPublish(make(chan amqp.Confirmation, cfg.Window+1))
	slots := make(chan struct{}, cfg.Window)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for k := 0; k < n; k++ {
			cf, ok := <-acks
			if !ok {
				return
			}
			if cf.Ack {
				confirmed.Add(1)
			} else {
				nacked.Add(1)
			}
			<-slots
		}
	}()
	body := make([]byte, cfg.Size)
	for i := 0; i < n; i++ {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return errors.New("confirm channel closed")
		}
		binary.BigEndian.PutUint16(body, uint16(p))
		binary.BigEndian.PutUint64(body[2:], uint64(i))
		if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body}); err != nil {
			return err
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// drainIdle is how long the drain waits for a delivery before it gives up: a node that fell
// behind may be installing a snapshot of the whole backlog first.
const drainIdle = 10 * time.Minute

// backlogDrain consumes until want messages arrived (or nothing arrives for drainIdle), marking each
// (producer, sequence) in seen.
func backlogDrain(ctx context.Context, uri, queue string, want int64, seen [][]byte, res *BacklogResult, out io.Writer, nodes []*backlogNode) error {
	var c *amqp.Connection
	var ch *amqp.Channel
	var ds <-chan amqp.Delivery
	// attach (re)connects the consumer: a consumer can be cancelled or its channel closed by a
	// leader change; its unacked messages come back redelivered.
	attach := func() error {
		if c != nil {
			c.Close()
		}
		var err error
		if c, err = amqp.Dial(uri); err != nil {
			return err
		}
		if ch, err = c.Channel(); err != nil {
			return err
		}
		if err := ch.Qos(1000, 0, false); err != nil {
			return err
		}
		ds, err = ch.Consume(queue, "", false, false, false, false, nil)
		return err
	}
	if err := attach(); err != nil {
		return err
	}
	defer func() { c.Close() }()
	lastReport := time.Now()
	start := time.Now()
	var unacked int
	for res.Received-res.Duplicates < want {
		select {
		case d, ok := <-ds:
			if !ok {
				fmt.Fprintf(out, "   drain: consumer closed at %d received; attaching again\n", res.Received)
				if err := attach(); err != nil {
					return fmt.Errorf("attach the consumer again: %w", err)
				}
				unacked = 0
				continue
			}
			if res.Received++; res.Received == 1 {
				fmt.Fprintf(out, "   drain: first delivery after %v\n", time.Since(start).Round(time.Millisecond))
			}
			if d.Redelivered {
				res.Redelivered++
			}
			if len(d.Body) >= 10 {
				p, i := int(binary.BigEndian.Uint16(d.Body)), binary.BigEndian.Uint64(d.Body[2:])
				if p < len(seen) && int(i/8) < len(seen[p]) {
					if seen[p][i/8]&(1<<(i%8)) != 0 {
						res.Duplicates++
					}
					seen[p][i/8] |= 1 << (i % 8)
				}
			}
			if unacked++; unacked >= 100 {
				if err := d.Ack(true); err != nil {
					return err
				}
				unacked = 0
			}
		case <-time.After(drainIdle):
			fmt.Fprintf(out, "   drain: nothing for %v at %d of %d\n", drainIdle, res.Received, want)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
		if time.Since(lastReport) >= 10*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(out, "   drain: %d received after %v, RSS %s\n", res.Received, time.Since(start).Round(time.Second), rssLine(nodes))
		}
	}
	if unacked > 0 {
		_ = ch.Ack(0, true)
	}
	// Wait for the last acks to be applied: the queue is empty once a passive declare says so.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		if err != nil || (q.Messages == 0 && q.Consumers >= 0) {
			break
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			break
		}
	}
	return nil
}

func printBacklog(w io.Writer, cfg BacklogConfig, rs []BacklogResult) {
	fmt.Fprintf(w, "\n| build | confirmed | nacked | received | lost | duplicates | fill msg/s | drain msg/s | peak RSS fill (n1/n2/n3 MB) | peak RSS drain (n1/n2/n3 MB) | disk full (MB) | disk drained (MB) | disk +%v (MB) |\n", cfg.Settle)
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	mb := func(v [3]uint64) string { return fmt.Sprintf("%d / %d / %d", v[0]>>20, v[1]>>20, v[2]>>20) }
	mbi := func(v [3]int64) string { return fmt.Sprintf("%d / %d / %d", v[0]>>20, v[1]>>20, v[2]>>20) }
	for _, r := range rs {
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %d | %.0f | %.0f | %s | %s | %s | %s | %s |\n", r.Label, r.Confirmed, r.Nacked,
			r.Received, r.Lost, r.Duplicates, float64(r.Confirmed)/r.Fill.Seconds(), float64(r.Received)/r.Drain.Seconds(),
			mb(r.PeakFill), mb(r.PeakDrain), mbi(r.DiskFull), mbi(r.DiskDrained), mbi(r.DiskSettled))
	}
}

// allocated is the space a file takes on disk (its blocks), falling back to its size.
func allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
