package perf

// `warren perf stream`: throughput of RabbitMQ's stream protocol, Warren against the reference
// RabbitMQ's stream plugin in the same run. Each run publishes with confirms (then consumes
// from the first offset) a fixed number of messages per size, and reads the broker's CPU time
// from /proc/PID/stat around each phase, so the report has msg/s and broker CPU per message.

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"warren/server/netserve"
	"warren/server/streamproto/wire"
)

// DefaultStreamRefURI is the reference RabbitMQ's stream port (/work/shared/tools/rabbitmq.sh).
const DefaultStreamRefURI = "rabbitmq-stream://guest:guest@127.0.0.1:5562/%2f"

// StreamConfig is one `warren perf stream` invocation.
type StreamConfig struct {
	WarrenURI string // empty: start WarrenBin (or this executable) on free ports, fresh data per run
	WarrenBin string
	RefURI    string // empty or unreachable: Warren alone
	RefPID    int    // 0: found by the port the reference listens on
	Sizes     []int
	Messages  int // per run and size, split over the producers
	Producers int
	Consumers int // each reads every message
	Batch     int // messages per publish frame
	SubEntry  int // messages per sub-entry (1 = none)
	Window    int // unconfirmed messages per producer
	Credit    int // initial credit (chunks) per consumer
	Runs      int
	Timeout   time.Duration // bound on each phase
	Out       string        // Markdown file whose stream section is replaced (or appended); empty: none
	Stdout    io.Writer
	Log       io.Writer
}

// streamRun is one run's measurements against one broker at one size.
type streamRun struct {
	pubRate, conRate float64 // msg/s
	pubCPU, conCPU   float64 // broker ns per message; -1 unknown
	// The load client's own CPU per message (this process): what is left of the machine's cores
	// for the broker, and so the ceiling of a run, depends on it.
	pubClientCPU, conClientCPU float64
	// The live phase: producers and consumers at once (stream-perf-test's way), consumers
	// reading along from the stream's start; CPU per message published (and delivered once).
	livePub, liveCon, liveCPU float64
	err                       error
}

type streamTarget struct {
	name string
	uri  string
	proc *brokerProc
	pid  int
	skip string
}

func streamCommand() *cli.Command {
	return &cli.Command{
		Name:  "stream",
		Usage: "stream-protocol throughput (publish with confirms, consume), Warren against the reference RabbitMQ",
		Description: "Publishes --messages messages per size through the stream protocol with confirms, then\n" +
			"consumes them from the first offset, against Warren and RabbitMQ's stream plugin in turn,\n" +
			"--runs times; reports medians of msg/s and of the broker's CPU time per message.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "warren-uri", Usage: "stream `URI` of a running Warren (rabbitmq-stream://...); empty: start this binary's `serve` per run"},
			&cli.StringFlag{Name: "warren-bin", Usage: "warren binary to start when --warren-uri is empty (default: this executable)"},
			&cli.StringFlag{Name: "ref-uri", Value: DefaultStreamRefURI, Usage: "stream `URI` of the reference RabbitMQ; empty or unreachable: skipped"},
			&cli.IntFlag{Name: "ref-pid", Usage: "RabbitMQ's process id for CPU readings (default: the process listening on the ref port)"},
			&cli.StringFlag{Name: "sizes", Value: "12,1024", Usage: "message body sizes in `BYTES`, comma-separated"},
			&cli.IntFlag{Name: "messages", Value: 1000000, Usage: "messages per run and size"},
			&cli.IntFlag{Name: "producers", Value: 1, Usage: "publishing connections"},
			&cli.IntFlag{Name: "consumers", Value: 1, Usage: "consuming connections (each reads every message)"},
			&cli.IntFlag{Name: "batch", Value: 100, Usage: "messages per publish frame (stream-perf-test's --batch-size)"},
			&cli.IntFlag{Name: "sub-entry", Value: 1, Usage: "messages per sub-entry batch; 1 = none (stream-perf-test's --sub-entry-size)"},
			&cli.IntFlag{Name: "window", Value: 10000, Usage: "unconfirmed messages per producer (stream-perf-test's --confirms)"},
			&cli.IntFlag{Name: "credit", Value: 10, Usage: "initial credit per consumer, in chunks (stream-perf-test's --initial-credits)"},
			&cli.IntFlag{Name: "runs", Value: 3, Usage: "runs per broker; medians are reported"},
			&cli.DurationFlag{Name: "timeout", Value: 5 * time.Minute, Usage: "bound on each publish or consume phase"},
			&cli.StringFlag{Name: "out", Usage: "Markdown `FILE` whose stream-protocol section is replaced (appended if missing)"},
		},
		Action: func(c *cli.Context) error {
			var sizes []int
			for _, s := range strings.Split(c.String("sizes"), ",") {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || n < 1 {
					return fmt.Errorf("--sizes: bad size %q", s)
				}
				sizes = append(sizes, n)
			}
			cfg := StreamConfig{
				WarrenURI: c.String("warren-uri"), WarrenBin: c.String("warren-bin"), RefURI: c.String("ref-uri"),
				RefPID: c.Int("ref-pid"), Sizes: sizes, Messages: c.Int("messages"), Producers: c.Int("producers"),
				Consumers: c.Int("consumers"), Batch: c.Int("batch"), SubEntry: c.Int("sub-entry"), Window: c.Int("window"),
				Credit: c.Int("credit"), Runs: c.Int("runs"), Timeout: c.Duration("timeout"), Out: c.String("out"),
				Stdout: c.App.Writer, Log: c.App.ErrWriter,
			}
			ctx, stop := signalContext(c)
			defer stop()
			return StreamBench(ctx, cfg)
		},
	}
}

// StreamBench runs the stream-protocol benchmark and prints (and writes) its report.
func StreamBench(ctx context.Context, cfg StreamConfig) error {
	if cfg.Messages < 1 || cfg.Producers < 1 || cfg.Consumers < 0 || cfg.Batch < 1 || cfg.Window < cfg.Batch || cfg.Runs < 1 {
		return fmt.Errorf("perf stream: need messages, producers, batch, runs >= 1 and window >= batch")
	}
	if cfg.Credit < 1 || cfg.Credit > 65535 {
		return fmt.Errorf("perf stream: credit %d outside 1..65535", cfg.Credit)
	}
	warren := &streamTarget{name: "warren", uri: cfg.WarrenURI}
	if cfg.WarrenURI == "" {
		p, err := newBrokerProc(cfg.WarrenBin)
		if err != nil {
			return err
		}
		defer p.close()
		warren.proc = p
	} else if pid, err := streamPID(cfg.WarrenURI); err == nil {
		warren.pid = pid
	}
	targets := []*streamTarget{warren}
	if cfg.RefURI != "" {
		ref := &streamTarget{name: "rabbitmq", uri: cfg.RefURI, pid: cfg.RefPID}
		if c, err := dialStream(cfg.RefURI); err != nil {
			ref.skip = err.Error()
			fmt.Fprintf(cfg.Log, "reference RabbitMQ skipped: %v\n", err)
			targets = append(targets, ref)
		} else {
			c.close()
			if ref.pid == 0 {
				if pid, err := streamPID(cfg.RefURI); err == nil {
					ref.pid = pid
				} else if pid, err := pidByCommand("beam.smp", "warrenref"); err == nil {
					ref.pid = pid
				}
			}
			targets = append(targets, ref)
		}
	}
	started := time.Now()
	loadStart, syncStart := loadAverage(), describeSync()
	fmt.Fprintf(cfg.Log, "disk: appending 64 KiB and fdatasyncing takes %s (median of 25)\n", syncStart)
	results := map[string]map[int][]streamRun{}
	for _, t := range targets {
		results[t.name] = map[int][]streamRun{}
	}
	for run := 1; run <= cfg.Runs && ctx.Err() == nil; run++ {
		for _, t := range targets {
			if ctx.Err() != nil {
				break
			}
			if t.skip != "" {
				continue
			}
			if t.proc != nil {
				if err := startStreamWarren(ctx, t); err != nil {
					return err
				}
			}
			for _, size := range cfg.Sizes {
				r := streamOnce(ctx, cfg, t, size, run)
				results[t.name][size] = append(results[t.name][size], r)
				fmt.Fprintf(cfg.Log, "run %d/%d %-8s %5d B: %s\n", run, cfg.Runs, t.name, size, r.describe())
			}
			if t.proc != nil {
				t.proc.stop()
			}
		}
	}
	rep := streamReport(cfg, targets, results, started, loadStart, syncStart)
	fmt.Fprint(cfg.Stdout, rep)
	if cfg.Out != "" {
		if err := replaceSection(cfg.Out, rep, streamSectionBegin, streamSectionEnd, false); err != nil {
			return err
		}
		fmt.Fprintf(cfg.Log, "wrote %s\n", cfg.Out)
	}
	return nil
}

// startStreamWarren starts the bench's Warren with a stream listener on a free port.
func startStreamWarren(ctx context.Context, t *streamTarget) error {
	port, err := netserve.FreePort()
	if err != nil {
		return err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	t.proc.extra = []string{"--stream-listen", addr}
	if err := t.proc.start(ctx); err != nil {
		return err
	}
	t.uri = "rabbitmq-stream://guest:guest@" + addr + "/%2f"
	t.pid = t.proc.pid()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := dialStream(t.uri)
		if err == nil {
			c.close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("warren's stream listener %s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func streamPID(uri string) (int, error) {
	addr, _, _, _, err := parseStreamURI(uri)
	if err != nil {
		return 0, err
	}
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return 0, err
	}
	return pidListeningOn(port)
}

func (r streamRun) describe() string {
	if r.err != nil {
		return "failed: " + r.err.Error()
	}
	return fmt.Sprintf("published %s msg/s (broker %s/msg, client %s/msg), consumed %s msg/s (broker %s/msg, client %s/msg); live: published %s msg/s, consumed %s msg/s (broker %s/msg)",
		fmtMsgs(r.pubRate), fmtCPU(r.pubCPU), fmtCPU(r.pubClientCPU), fmtMsgs(r.conRate), fmtCPU(r.conCPU), fmtCPU(r.conClientCPU),
		fmtMsgs(r.livePub), fmtMsgs(r.liveCon), fmtCPU(r.liveCPU))
}

func fmtCPU(ns float64) string {
	if ns < 0 {
		return "?"
	}
	return fmt.Sprintf("%.2f µs", ns/1000)
}

func fmtMsgs(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	return b.String()
}

// cpuSpan measures a broker's CPU time over a phase.
func cpuSpan(pid int) func(n int) float64 {
	if pid <= 0 {
		return func(int) float64 { return -1 }
	}
	before, err := procCPU(pid)
	if err != nil {
		return func(int) float64 { return -1 }
	}
	return func(n int) float64 {
		after, err := procCPU(pid)
		if err != nil || n == 0 {
			return -1
		}
		return float64(after-before) / float64(n)
	}
}

// streamOnce runs one publish phase and one consume phase on a new stream, then the live phase
// on another.
func streamOnce(ctx context.Context, cfg StreamConfig, t *streamTarget, size, run int) streamRun {
	r := streamSequential(ctx, cfg, t, size, run)
	if r.err != nil || cfg.Consumers == 0 || ctx.Err() != nil {
		return r
	}
	l := streamLive(cfg, t, size, run)
	if l.err != nil {
		return streamRun{err: fmt.Errorf("live phase: %w", l.err)}
	}
	r.livePub, r.liveCon, r.liveCPU = l.livePub, l.liveCon, l.liveCPU
	return r
}

// withStream creates a stream, runs fn on it and deletes it.
func withStream(t *streamTarget, name string, fn func() streamRun) (r streamRun) {
	admin, err := dialStream(t.uri)
	if err != nil {
		return streamRun{err: err}
	}
	defer admin.close()
	if code, err := admin.request(&wire.CreateStream{CorrelationID: admin.nextCorr(), Stream: name}); err != nil || code != wire.ResponseCodeOK {
		return streamRun{err: fmt.Errorf("create stream %s: %v %v", name, code, err)}
	}
	r = fn()
	if _, err := admin.request(&wire.DeleteStream{CorrelationID: admin.nextCorr(), Stream: name}); err != nil && r.err == nil {
		r.err = fmt.Errorf("delete stream: %w", err)
	}
	return r
}

// streamLive publishes and consumes at once: consumers subscribe from the first offset of the
// empty stream before the producers start.
func streamLive(cfg StreamConfig, t *streamTarget, size, run int) streamRun {
	name := fmt.Sprintf("perf-stream-live-%d-%d-%d", size, run, time.Now().UnixNano())
	return withStream(t, name, func() (r streamRun) {
		body := amqp10Body(size)
		per := cfg.Messages / cfg.Producers
		total := per * cfg.Producers
		var pconns, cconns []*streamConn
		defer func() {
			for _, c := range append(pconns, cconns...) {
				c.close()
			}
		}()
		for range cfg.Producers {
			c, err := dialStream(t.uri)
			if err != nil {
				return streamRun{err: err}
			}
			pconns = append(pconns, c)
		}
		for range cfg.Consumers {
			c, err := dialStream(t.uri)
			if err != nil {
				return streamRun{err: err}
			}
			cconns = append(cconns, c)
		}
		cpu := cpuSpan(t.pid)
		start := time.Now()
		deadline := start.Add(cfg.Timeout)
		var wg sync.WaitGroup
		cerrs := make([]error, len(cconns))
		var mu sync.Mutex
		var conTook time.Duration
		for i, c := range cconns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cerrs[i] = streamConsumer(c, name, total, uint16(cfg.Credit), deadline)
				mu.Lock()
				conTook = max(conTook, time.Since(start))
				mu.Unlock()
			}()
		}
		perrs := make([]error, len(pconns))
		var pwg sync.WaitGroup
		for i, c := range pconns {
			pwg.Add(1)
			go func() {
				defer pwg.Done()
				perrs[i] = streamPublisher(c, name, per, cfg.Batch, cfg.SubEntry, cfg.Window, body, deadline)
			}()
		}
		pwg.Wait()
		pubTook := time.Since(start)
		wg.Wait()
		r.liveCPU = cpu(total)
		r.livePub = float64(total) / pubTook.Seconds()
		r.liveCon = float64(total*cfg.Consumers) / conTook.Seconds()
		for _, e := range append(perrs, cerrs...) {
			if e != nil {
				return streamRun{err: e}
			}
		}
		return r
	})
}

// streamSequential publishes, then consumes from the first offset, on a new stream.
func streamSequential(ctx context.Context, cfg StreamConfig, t *streamTarget, size, run int) (r streamRun) {
	name := fmt.Sprintf("perf-stream-%d-%d-%d", size, run, time.Now().UnixNano())
	admin, err := dialStream(t.uri)
	if err != nil {
		return streamRun{err: err}
	}
	defer admin.close()
	if code, err := admin.request(&wire.CreateStream{CorrelationID: admin.nextCorr(), Stream: name}); err != nil || code != wire.ResponseCodeOK {
		return streamRun{err: fmt.Errorf("create stream %s: %v %v", name, code, err)}
	}
	defer func() {
		if _, err := admin.request(&wire.DeleteStream{CorrelationID: admin.nextCorr(), Stream: name}); err != nil && r.err == nil {
			r.err = fmt.Errorf("delete stream: %w", err)
		}
	}()
	body := amqp10Body(size)
	per := cfg.Messages / cfg.Producers
	total := per * cfg.Producers
	conns := make([]*streamConn, cfg.Producers)
	for i := range conns {
		if conns[i], err = dialStream(t.uri); err != nil {
			return streamRun{err: err}
		}
		defer conns[i].close()
	}
	cpu, ccpu := cpuSpan(t.pid), cpuSpan(os.Getpid())
	start := time.Now()
	deadline := start.Add(cfg.Timeout)
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = streamPublisher(c, name, per, cfg.Batch, cfg.SubEntry, cfg.Window, body, deadline)
		}()
	}
	wg.Wait()
	took := time.Since(start)
	r.pubCPU, r.pubClientCPU = cpu(total), ccpu(total)
	r.pubRate = float64(total) / took.Seconds()
	for _, e := range errs {
		if e != nil {
			return streamRun{err: e}
		}
	}
	if cfg.Consumers == 0 || ctx.Err() != nil {
		return r
	}
	cconns := make([]*streamConn, cfg.Consumers)
	for i := range cconns {
		if cconns[i], err = dialStream(t.uri); err != nil {
			return streamRun{err: err}
		}
		defer cconns[i].close()
	}
	cpu, ccpu = cpuSpan(t.pid), cpuSpan(os.Getpid())
	start = time.Now()
	deadline = start.Add(cfg.Timeout)
	errs = make([]error, len(cconns))
	for i, c := range cconns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = streamConsumer(c, name, total, uint16(cfg.Credit), deadline)
		}()
	}
	wg.Wait()
	took = time.Since(start)
	n := total * cfg.Consumers
	r.conCPU, r.conClientCPU = cpu(n), ccpu(n)
	r.conRate = float64(n) / took.Seconds()
	for _, e := range errs {
		if e != nil {
			return streamRun{err: e}
		}
	}
	return r
}

func streamMedian(vs []float64) float64 {
	if len(vs) == 0 {
		return -1
	}
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func streamReport(cfg StreamConfig, targets []*streamTarget, results map[string]map[int][]streamRun, started time.Time, loadStart, syncStart string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n## Stream protocol throughput (issue 17)\n\n", streamSectionBegin)
	fmt.Fprintf(&b, "Generated by `warren perf stream` (`make bench-stream`, part of `make bench`) on %s; it took %s.\n\n",
		started.UTC().Format("2006-01-02 15:04 UTC"), time.Since(started).Round(time.Second))
	m := describeMachine()
	fmt.Fprintf(&b, "- Machine: %s, %d logical cores; load average when it started: %s, when it ended: %s\n", m.CPU, m.Cores, loadStart, loadAverage())
	fmt.Fprintf(&b, "- Disk: appending 64 KiB and fdatasyncing took %s when it started and %s when it ended (median of 25; Warren syncs before it confirms, RabbitMQ does not, so the publish ratios move with it)\n", syncStart, describeSync())
	fmt.Fprintf(&b, "- Load: %d producer(s) publish %s messages per run and size with confirms (at most %d unconfirmed per producer), "+
		"%d messages per publish frame, sub-entry size %d; then %d consumer(s) read them all from `first` with an initial credit of %d chunks and one credit back per chunk, checking each chunk's CRC. "+
		"Live: the same on a new stream with the consumers subscribed (from the start) before the producers begin, as stream-perf-test runs; consumed msg/s is over the time from the start to the last delivery. "+
		"Bodies are AMQP 1.0 messages with one data section of the given size, as stream-perf-test sends. "+
		"The load client is Warren's own (on server/streamproto/wire, one connection per producer and consumer) and shares the machine's cores with the broker.\n",
		cfg.Producers, fmtMsgs(float64(cfg.Messages/cfg.Producers*cfg.Producers)), cfg.Window, cfg.Batch, max(1, cfg.SubEntry), cfg.Consumers, cfg.Credit)
	for _, t := range targets {
		switch {
		case t.proc != nil:
			fmt.Fprintf(&b, "- warren: `serve` started by the tool for every run (fresh data directory, streams fsynced before confirms)\n")
		case t.skip != "":
			fmt.Fprintf(&b, "- %s: skipped (%s)\n", t.name, t.skip)
		default:
			fmt.Fprintf(&b, "- %s: %s, running throughout (pid %d)\n", t.name, redactURI(t.uri), t.pid)
		}
	}
	fmt.Fprintf(&b, "- Broker CPU per message: the broker process's user+system time (/proc/PID/stat) over the phase, divided by the messages of the phase. "+
		"Load client CPU per message: the same for the tool's own process; with the broker's, it bounds a phase's rate on this machine at cores / (broker + client CPU per message).\n\n")
	fmt.Fprintf(&b, "Median of %d runs; ratio: Warren/RabbitMQ for rates, RabbitMQ/Warren for CPU (higher is better for Warren).\n\n", cfg.Runs)
	b.WriteString("| Size | Metric | Warren | RabbitMQ | Ratio |\n|---|---|---:|---:|---:|\n")
	type metric struct {
		name string
		get  func(streamRun) float64
		fmt  func(float64) string
		cpu  bool
		// noRatio: a figure of the load client, not of the broker.
		noRatio bool
	}
	metrics := []metric{
		{"published (confirmed msg/s)", func(r streamRun) float64 { return r.pubRate }, fmtMsgs, false, false},
		{"broker CPU per published message", func(r streamRun) float64 { return r.pubCPU }, fmtCPU, true, false},
		{"consumed msg/s", func(r streamRun) float64 { return r.conRate }, fmtMsgs, false, false},
		{"broker CPU per consumed message", func(r streamRun) float64 { return r.conCPU }, fmtCPU, true, false},
		{"load client CPU per published message", func(r streamRun) float64 { return r.pubClientCPU }, fmtCPU, true, true},
		{"load client CPU per consumed message", func(r streamRun) float64 { return r.conClientCPU }, fmtCPU, true, true},
		{"live: published (confirmed msg/s)", func(r streamRun) float64 { return r.livePub }, fmtMsgs, false, false},
		{"live: consumed msg/s", func(r streamRun) float64 { return r.liveCon }, fmtMsgs, false, false},
		{"live: broker CPU per message (published and consumed)", func(r streamRun) float64 { return r.liveCPU }, fmtCPU, true, false},
	}
	med := func(name string, size int, m metric) (float64, bool) {
		var vs []float64
		for _, r := range results[name][size] {
			if r.err == nil && m.get(r) >= 0 {
				vs = append(vs, m.get(r))
			}
		}
		return streamMedian(vs), len(vs) > 0
	}
	for _, size := range cfg.Sizes {
		for i, m := range metrics {
			label := ""
			if i == 0 {
				label = fmt.Sprintf("%d B", size)
			}
			w, wok := med("warren", size, m)
			rr, rok := med("rabbitmq", size, m)
			ws, rs, ratio := "-", "-", "-"
			if wok {
				ws = m.fmt(w)
			}
			if rok {
				rs = m.fmt(rr)
			}
			if wok && rok && w > 0 && rr > 0 && !m.noRatio {
				if m.cpu {
					ratio = fmt.Sprintf("%.2fx", rr/w)
				} else {
					ratio = fmt.Sprintf("%.2fx", w/rr)
				}
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", label, m.name, ws, rs, ratio)
		}
	}
	b.WriteString("\nAll runs:\n\n")
	for _, t := range targets {
		for _, size := range cfg.Sizes {
			for i, r := range results[t.name][size] {
				fmt.Fprintf(&b, "- %s %d B run %d: %s\n", t.name, size, i+1, r.describe())
			}
		}
	}
	fmt.Fprintf(&b, "%s\n", streamSectionEnd)
	return b.String()
}

func redactURI(uri string) string {
	if i := strings.Index(uri, "@"); i > 0 {
		if j := strings.Index(uri, "://"); j > 0 && j < i {
			return uri[:j+3] + "…" + uri[i:]
		}
	}
	return uri
}
