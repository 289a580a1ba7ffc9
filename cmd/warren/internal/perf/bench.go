package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// BenchConfig configures `warren perf bench`.
type BenchConfig struct {
	WarrenURI       string        // a running Warren; empty: start WarrenBin (default this executable)
	WarrenBin       string        // binary whose `serve` the bench starts when WarrenURI is empty
	RefURI          string        // the reference RabbitMQ; skipped with a note if unreachable
	RefNode         string        // RabbitMQ node name, to find its process if the port lookup fails
	Runs            int           // runs per scenario and broker (median reported)
	Scenarios       []string      // scenario ids, e.g. S1..S9
	Out             string        // Markdown file to write; empty: none
	Duration        time.Duration // publishing time of each throughput/latency run
	IdleConnections int           // S6's connection count
	Backlog         int           // S7's message count
	BacklogTimeout  time.Duration // bound on each of S7's and S8's fill and drain
	StreamMessages  int           // S8's message count
	// S10: queues declared and bound (targets are set at 10,000), channels and connections
	// declaring, the bound on each declare phase, and the queues of the large run (Warren only,
	// once per bench; not made when not above DeclareQueues).
	DeclareQueues      int
	DeclareChannels    int
	DeclareConnections int
	DeclareTimeout     time.Duration
	DeclareLargeQueues int
	CommandLine        string    // recorded in the Markdown
	Stdout             io.Writer // the result table
	Log                io.Writer // a line per run
	// rssSettleLimit bounds S10's waits for the broker's memory to settle (default 15 s); tests,
	// whose race-instrumented brokers never settle, shorten it.
	rssSettleLimit time.Duration
}

// benchMetric is one row of the result table.
type benchMetric struct {
	key         string
	label       string
	unit        string // msg/s, ms, KB, MB
	lowerBetter bool   // latency and memory: ratio is RabbitMQ/Warren
}

// benchScenario is one scenario of the fixed set.
type benchScenario struct {
	id      string
	title   string
	detail  string
	metrics []benchMetric
	bound   func(BenchConfig) time.Duration
	run     func(ctx context.Context, b *bencher, t *benchTarget) runOutcome
	// warrenOnly scenarios are not run against the reference RabbitMQ (it has no such feature).
	warrenOnly bool
	// after, if set, runs once the run's CPU use is taken and may add notes: a side measurement
	// that must not count as the broker's or the tool's load.
	after func(ctx context.Context, b *bencher, t *benchTarget, out *runOutcome)
	// section, if set, gives the scenario its own table in the report instead of rows in the
	// S1-S9 table.
	section func(r *benchReport, sc benchScenario) reportSection
}

// runOutcome is what one run of one scenario against one broker gave.
type runOutcome struct {
	values map[string]float64
	notes  []string
	err    error
	// CPU used during the run, in cores (CPU seconds per wall second); negative if unknown.
	toolCores, brokerCores float64
}

// benchTarget is a broker under test.
type benchTarget struct {
	name    string
	uri     string
	proc    *brokerProc // Warren started by the bench, restarted before every run
	node    string      // RabbitMQ node name for the process lookup
	version string
	skip    string // why it is not benchmarked
	pidErr  error
	pidVal  int
	// largeDone is set once S10's large run was made against this broker.
	largeDone bool
}

// pid finds the broker's process for memory readings.
func (t *benchTarget) pid() (int, error) {
	if t.proc != nil {
		if p := t.proc.pid(); p != 0 {
			return p, nil
		}
		return 0, errors.New("broker process not running")
	}
	if t.pidVal != 0 || t.pidErr != nil {
		return t.pidVal, t.pidErr
	}
	port, err := uriPort(t.uri)
	if err == nil {
		t.pidVal, err = pidListeningOn(port)
	}
	if err != nil && t.node != "" {
		if p, err2 := pidByCommand("beam.smp", t.node); err2 == nil {
			t.pidVal, err = p, nil
		}
	}
	t.pidErr = err
	return t.pidVal, err
}

type bencher struct {
	cfg     BenchConfig
	targets []*benchTarget
}

// S5's pace and message size.
const (
	s5Rate = 1000
	s5Size = 1024
)

const (
	ratesUnit = "msg/s"
	s7Fill    = "fill_rate"
	s7Drain   = "drain_rate"
)

func allScenarioIDs() []string {
	var ids []string
	for _, s := range benchScenarios() {
		ids = append(ids, s.id)
	}
	return ids
}

// benchScenarios is the fixed scenario set of `make bench`.
func benchScenarios() []benchScenario {
	short := func(c BenchConfig) time.Duration { return c.Duration + 90*time.Second }
	consumed := benchMetric{key: "consume_rate", label: "consumed msg/s", unit: ratesUnit}
	published := benchMetric{key: "publish_rate", label: "published msg/s", unit: ratesUnit}
	return []benchScenario{
		{
			id: "S1", title: "transient, 1 producer, 1 consumer, 16 B, auto-ack",
			detail:  "1 producer and 1 consumer on one classic queue (direct exchange), 16-byte transient messages, no confirms, auto-ack, unlimited rate.",
			metrics: []benchMetric{consumed, published},
			bound:   short,
			run: func(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
				c := b.base(t, "S1")
				c.Producers, c.Consumers, c.Size, c.AutoAck = 1, 1, 16, true
				return loadRun(ctx, c)
			},
		},
		{
			id: "S2", title: "transient, 2p/2c, 1 KB, manual ack, prefetch 100",
			detail:  "2 producers and 2 consumers on one classic queue, 1,024-byte transient messages, no confirms, manual ack (one per message), prefetch 100, unlimited rate.",
			metrics: []benchMetric{consumed, published},
			bound:   short,
			run: func(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
				c := b.base(t, "S2")
				c.Producers, c.Consumers, c.Size, c.QoS = 2, 2, 1024, 100
				return loadRun(ctx, c)
			},
		},
		{
			id: "S3", title: "persistent, durable, confirms (window 100), manual ack, 2p/2c, 1 KB",
			detail:  "2 producers and 2 consumers on one durable classic queue, 1,024-byte persistent messages, publisher confirms with at most 100 unconfirmed per producer, manual ack, prefetch 100.",
			metrics: []benchMetric{{key: "confirm_rate", label: "confirmed msg/s", unit: ratesUnit}, consumed},
			bound:   short,
			run: func(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
				c := b.base(t, "S3")
				c.Producers, c.Consumers, c.Size, c.QoS = 2, 2, 1024, 100
				c.Persistent, c.Confirm = true, 100
				return loadRun(ctx, c)
			},
		},
		{
			id: "S4", title: "fan-out, 1 producer to 10 queues, 10 consumers",
			detail:  "1 producer publishing to a fanout exchange bound to 10 classic queues, one consumer each; 1,024-byte transient messages, no confirms, manual ack, prefetch 100. Throughput is the messages consumed per second summed over the 10 consumers.",
			metrics: []benchMetric{{key: "consume_rate", label: "consumed msg/s (sum of 10)", unit: ratesUnit}, published},
			bound:   short,
			run: func(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
				c := b.base(t, "S4")
				c.Producers, c.Consumers, c.Queues, c.ExchangeType = 1, 10, 10, "fanout"
				c.Size, c.QoS = 1024, 100
				return loadRun(ctx, c)
			},
		},
		{
			id: "S5", title: "end-to-end latency at 1,000 msg/s",
			detail: "1 producer paced at 1,000 msg/s and 1 consumer on one classic queue, 1,024-byte transient messages, manual ack, prefetch 100. Latency is the consumer's receive time minus the send time the producer wrote into the body (same clock). Producer and consumer use the tool's lean client (`--client lean`: one goroutine per connection, one system call per publish), so that the broker's latency, not the client's goroutine hand-offs, is measured. After each Warren run the tool also times the same traffic through a bare TCP echo server in another process (`warren perf floor`); the notes give that floor, the least any broker could show on the machine.",
			metrics: []benchMetric{
				{key: "p50", label: "latency p50 (ms)", unit: "ms", lowerBetter: true},
				{key: "p99", label: "latency p99 (ms)", unit: "ms", lowerBetter: true},
			},
			bound: short,
			run: func(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
				c := b.base(t, "S5")
				c.Producers, c.Consumers, c.Size, c.QoS, c.Rate = 1, 1, s5Size, 100, s5Rate
				c.Client = clientLean
				out := loadRun(ctx, c)
				if out.err == nil && out.values["consume_rate"] < 900 {
					out.notes = append(out.notes, fmt.Sprintf("consumed only %.0f msg/s of the 1,000 asked", out.values["consume_rate"]))
				}
				return out
			},
			after: func(ctx context.Context, b *bencher, t *benchTarget, out *runOutcome) {
				if t != b.targets[0] || out.err != nil {
					return
				}
				// Once per Warren run: what the same pace and size cost with no broker at all.
				f, err := Floor(ctx, FloorConfig{Bin: b.cfg.WarrenBin, Rate: s5Rate, Size: s5Size, Duration: b.cfg.Duration})
				if err != nil {
					out.notes = append(out.notes, fmt.Sprintf("loopback floor not measured: %v", err))
					return
				}
				out.notes = append(out.notes, fmt.Sprintf("loopback floor (`warren perf floor`: same pace and size through a TCP echo server in another process): p50 %.3f ms, p99 %.3f ms",
					f.Latency.P50/1000, f.Latency.P99/1000))
			},
		},
		{
			id: "S6", title: "memory of idle connections",
			detail:  "Opens the connections (one channel each, nothing else, 32 at a time) and reads the broker's resident memory (VmRSS) before and, once it has settled, after: (after - before) / connections opened.",
			metrics: []benchMetric{{key: "kb_per_conn", label: "memory per connection (KB)", unit: "KB", lowerBetter: true}},
			bound:   func(BenchConfig) time.Duration { return 5 * time.Minute },
			run:     runIdleScenario,
		},
		{
			id: "S7", title: "backlog filled then drained",
			detail: "2 producers fill one durable classic queue with 1,024-byte persistent messages (confirms, window 100) up to the backlog size; then 2 consumers (manual ack, prefetch 100) drain it. Fill rate = confirmed msg/s; drain rate = consumed msg/s; the broker's VmRSS is sampled every 200 ms and the peak of each phase reported.",
			metrics: []benchMetric{
				{key: s7Fill, label: "fill (confirmed msg/s)", unit: ratesUnit},
				{key: s7Drain, label: "drain (consumed msg/s)", unit: ratesUnit},
				{key: "rss_fill", label: "peak RSS while filling (MB)", unit: "MB", lowerBetter: true},
				{key: "rss_drain", label: "peak RSS while draining (MB)", unit: "MB", lowerBetter: true},
			},
			bound: func(c BenchConfig) time.Duration { return 2*c.BacklogTimeout + 2*time.Minute },
			run:   runBacklogScenario,
		},
		streamScenario(),
		quorumScenario(),
		declareScenario(),
		streamReadAlong("S11", 100),
		streamReadAlong("S12", 1000),
		replicatedStreamScenario(),
		superStreamGroupScenario(),
	}
}

// base is the common configuration of a scenario's load run against t.
func (b *bencher) base(t *benchTarget, id string) RunConfig {
	name := "perf-bench-" + strings.ToLower(id)
	return RunConfig{
		URI:          t.uri,
		QueuePattern: name + "-%d",
		Exchange:     name,
		Duration:     b.cfg.Duration,
		DrainTimeout: 30 * time.Second,
	}
}

// loadRun runs cfg and turns the result into metric values and notes.
func loadRun(ctx context.Context, cfg RunConfig) runOutcome {
	predelete(cfg)
	res, err := Run(ctx, cfg)
	if err != nil {
		return runOutcome{err: err}
	}
	out := runOutcome{values: map[string]float64{
		"publish_rate": res.PublishRate,
		"confirm_rate": res.ConfirmRate,
		"consume_rate": res.ConsumeRate,
		"p50":          res.Latency.P50 / 1e3,
		"p99":          res.Latency.P99 / 1e3,
	}, notes: integrityNotes(res)}
	if res.Consumed == 0 {
		out.err = errors.New("no message was consumed")
	}
	return out
}

// integrityNotes reports lost, duplicated or unconsumed messages and client-side errors.
func integrityNotes(res *Result) []string {
	var notes []string
	if res.Lost > 0 {
		notes = append(notes, fmt.Sprintf("%s confirmed messages LOST", fmtInt(res.Lost)))
	}
	if res.Duplicates > 0 {
		notes = append(notes, fmt.Sprintf("%s duplicate deliveries", fmtInt(res.Duplicates)))
	}
	if res.Confirm == 0 && res.NotConsumed > 0 {
		notes = append(notes, fmt.Sprintf("%s published messages never consumed (no confirms, so not counted as lost)", fmtInt(res.NotConsumed)))
	}
	if res.Nacked > 0 {
		notes = append(notes, fmt.Sprintf("%s messages nacked", fmtInt(res.Nacked)))
	}
	if len(res.Errors) > 0 {
		notes = append(notes, fmt.Sprintf("%d client errors, first: %s", len(res.Errors), res.Errors[0]))
	}
	return notes
}

// predelete removes leftovers of an earlier, interrupted run of the same scenario.
func predelete(cfg RunConfig) {
	conn, err := dial(cfg.URI, "warren-perf bench cleanup")
	if err != nil {
		return
	}
	defer conn.Close()
	n := max(cfg.Queues, 1)
	for i := 1; i <= n; i++ {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(fmt.Sprintf(cfg.QueuePattern, i), false, false, false)
			_ = ch.Close()
		}
	}
}

// runIdleScenario is S6.
func runIdleScenario(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
	pid, err := t.pid()
	if err != nil {
		return runOutcome{err: fmt.Errorf("cannot read the broker's memory: %w", err)}
	}
	if !sleepCtx(ctx, time.Second) {
		return runOutcome{err: ctx.Err()}
	}
	before, err := readRSS(pid)
	if err != nil {
		return runOutcome{err: err}
	}
	n := b.cfg.IdleConnections
	ic := openIdle(ctx, t.uri, n)
	defer ic.close()
	var out runOutcome
	if ic.res.Opened < n {
		lim := "unknown"
		if l, err := openFilesLimit(pid); err == nil {
			lim = fmtInt(l)
		}
		out.notes = append(out.notes, fmt.Sprintf("accepted only %s of %s connections (its open-files limit is %s; first error: %s); the figure is per accepted connection",
			fmtInt(uint64(ic.res.Opened)), fmtInt(uint64(n)), lim, ic.res.FirstError))
	}
	if ic.res.Opened < min(100, n) {
		out.err = fmt.Errorf("only %d connections opened: %s", ic.res.Opened, ic.res.FirstError)
		return out
	}
	after, err := settledRSS(ctx, pid)
	if err != nil {
		out.err = err
		return out
	}
	delta := float64(after) - float64(before)
	out.values = map[string]float64{"kb_per_conn": delta / float64(ic.res.Opened) / 1024}
	out.notes = append(out.notes, fmt.Sprintf("RSS %s MB -> %s MB with %s connections (opened in %.1f s)",
		fmtRate(float64(before)/(1<<20)), fmtRate(float64(after)/(1<<20)), fmtInt(uint64(ic.res.Opened)), ic.res.OpenSeconds))
	return out
}

// settledRSS polls pid's RSS every 200 ms until it changes by less than 0.5% (or 1 MiB)
// over a second, for at most 15 s, and returns the last reading.
func settledRSS(ctx context.Context, pid int) (uint64, error) {
	return settledRSSWithin(ctx, pid, 15*time.Second)
}

// settledRSSWithin is settledRSS polling for at most limit.
func settledRSSWithin(ctx context.Context, pid int, limit time.Duration) (uint64, error) {
	deadline := time.Now().Add(limit)
	var window []uint64
	for {
		v, err := readRSS(pid)
		if err != nil {
			return 0, err
		}
		window = append(window, v)
		if len(window) > 6 {
			window = window[1:]
		}
		if len(window) == 6 {
			lo, hi := window[0], window[0]
			for _, w := range window {
				lo, hi = min(lo, w), max(hi, w)
			}
			if float64(hi-lo) < max(0.005*float64(hi), 1<<20) {
				return v, nil
			}
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 200*time.Millisecond) {
			return v, nil
		}
	}
}

// rssSampler records the peak RSS of a process per phase, sampling every 200 ms.
type rssSampler struct {
	pid   int
	mu    sync.Mutex
	phase string
	peaks map[string]uint64
	err   error
	quit  chan struct{}
	done  chan struct{}
}

func startRSSSampler(pid int) *rssSampler {
	s := &rssSampler{pid: pid, peaks: map[string]uint64{}, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-s.quit:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) sample() {
	v, err := readRSS(s.pid)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.err == nil {
			s.err = err
		}
		return
	}
	if s.phase != "" && v > s.peaks[s.phase] {
		s.peaks[s.phase] = v
	}
}

// setPhase takes a sample for the ending phase, then attributes later samples to phase.
func (s *rssSampler) setPhase(phase string) {
	s.sample()
	s.mu.Lock()
	s.phase = phase
	s.mu.Unlock()
	s.sample()
}

func (s *rssSampler) stop() {
	close(s.quit)
	<-s.done
}

// runBacklogScenario is S7.
func runBacklogScenario(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
	c := b.base(t, "S7")
	c.Producers, c.Consumers, c.Size, c.QoS = 2, 2, 1024, 100
	c.Persistent, c.Confirm = true, 100
	c.PMessages = uint64(b.cfg.Backlog+1) / 2
	c.ConsumeAfterPublish = true
	c.Duration = b.cfg.BacklogTimeout
	c.DrainTimeout = b.cfg.BacklogTimeout
	c.DrainIdle = 5 * time.Second
	c.ConfirmTimeout = time.Minute
	var sampler *rssSampler
	var notes []string
	pid, err := t.pid()
	if err != nil {
		notes = append(notes, fmt.Sprintf("no memory readings: %v", err))
	} else {
		sampler = startRSSSampler(pid)
		c.OnPhase = sampler.setPhase
	}
	predelete(c)
	res, err := Run(ctx, c)
	if sampler != nil {
		sampler.stop()
	}
	if err != nil {
		return runOutcome{err: err, notes: notes}
	}
	out := runOutcome{values: map[string]float64{s7Fill: res.ConfirmRate, s7Drain: res.ConsumeRate}, notes: append(notes, integrityNotes(res)...)}
	if sampler != nil {
		if sampler.err != nil {
			out.notes = append(out.notes, fmt.Sprintf("memory sampling: %v", sampler.err))
		}
		if v := sampler.peaks["publish"]; v > 0 {
			out.values["rss_fill"] = float64(v) / (1 << 20)
		}
		if v := sampler.peaks["drain"]; v > 0 {
			out.values["rss_drain"] = float64(v) / (1 << 20)
		}
	}
	want := uint64(b.cfg.Backlog+1) / 2 * 2
	if res.Confirmed < want {
		out.notes = append(out.notes, fmt.Sprintf("filled only %s of %s messages within %s", fmtInt(res.Confirmed), fmtInt(want), b.cfg.BacklogTimeout))
	}
	if res.Consumed < res.Confirmed {
		out.notes = append(out.notes, fmt.Sprintf("drained only %s of %s messages", fmtInt(res.Consumed), fmtInt(res.Confirmed)))
	}
	if res.Confirmed == 0 || res.Consumed == 0 {
		out.err = errors.New("nothing was filled or drained")
	}
	return out
}

// sleepCtx sleeps for d and reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// serverVersion connects to uri and returns the broker's product and version.
func serverVersion(uri string) (string, error) {
	conn, err := amqp.DialConfig(uri, amqp.Config{Locale: "en_US", Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	product, _ := conn.Properties["product"].(string)
	version, _ := conn.Properties["version"].(string)
	return strings.TrimSpace(product + " " + version), nil
}

// Bench runs the scenario set and writes the table (to cfg.Stdout and, if cfg.Out is set,
// as Markdown with the machine's description). Scenario failures are reported in the table;
// Bench returns an error only when nothing can be measured or the file cannot be written.
func Bench(ctx context.Context, cfg BenchConfig) error {
	if cfg.Runs < 1 {
		return errors.New("--runs must be at least 1")
	}
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	var scenarios []benchScenario
	known := map[string]benchScenario{}
	for _, s := range benchScenarios() {
		known[s.id] = s
	}
	for _, id := range cfg.Scenarios {
		s, ok := known[id]
		if !ok {
			return fmt.Errorf("unknown scenario %q (have %s)", id, strings.Join(allScenarioIDs(), ", "))
		}
		scenarios = append(scenarios, s)
	}
	if len(scenarios) == 0 {
		return errors.New("no scenario selected")
	}
	// The broker the bench starts inherits this limit, so 10,000 connections fit in both.
	if err := raiseFileLimit(); err != nil {
		fmt.Fprintf(cfg.Log, "warning: %v\n", err)
	}
	b := &bencher{cfg: cfg}

	warren := &benchTarget{name: "Warren", uri: cfg.WarrenURI}
	if cfg.WarrenURI == "" {
		proc, err := newBrokerProc(cfg.WarrenBin)
		if err != nil {
			return err
		}
		defer proc.close()
		if err := proc.start(ctx); err != nil {
			return fmt.Errorf("start Warren: %w", err)
		}
		warren.proc = proc
		warren.uri = proc.uri
	}
	if v, err := serverVersion(warren.uri); err != nil {
		return fmt.Errorf("Warren at %s is not reachable: %w", redact(warren.uri), err)
	} else {
		warren.version = v
	}
	b.targets = append(b.targets, warren)

	ref := &benchTarget{name: "RabbitMQ", uri: cfg.RefURI, node: cfg.RefNode}
	if cfg.RefURI == "" {
		ref.skip = "no --ref-uri given"
	} else if v, err := serverVersion(cfg.RefURI); err != nil {
		ref.skip = fmt.Sprintf("not reachable at %s: %v", redact(cfg.RefURI), err)
	} else {
		ref.version = v
		b.targets = append(b.targets, ref)
	}
	if ref.skip != "" {
		fmt.Fprintf(cfg.Log, "reference RabbitMQ skipped: %s\n", ref.skip)
	}

	started := time.Now()
	loadStart, syncStart := loadAverage(), describeSync()
	fmt.Fprintf(cfg.Log, "disk: appending 64 KiB and fdatasyncing takes %s (median of 25)\n", syncStart)
	results := map[string]map[string][]runOutcome{}
	for _, sc := range scenarios {
		results[sc.id] = map[string][]runOutcome{}
		for run := 1; run <= cfg.Runs; run++ {
			for _, t := range b.targets {
				if ctx.Err() != nil {
					break
				}
				if sc.warrenOnly && t != warren {
					continue
				}
				out := b.runOne(ctx, sc, t)
				results[sc.id][t.name] = append(results[sc.id][t.name], out)
				fmt.Fprintf(cfg.Log, "%s run %d/%d %-8s %s\n", sc.id, run, cfg.Runs, t.name, describeOutcome(sc, out))
				sleepCtx(ctx, time.Second) // let the broker settle between runs
			}
		}
	}
	rep := &benchReport{
		cfg: cfg, scenarios: scenarios, results: results, warren: warren, ref: ref,
		machine: describeMachine(), date: started.UTC(), took: time.Since(started),
		interrupted: ctx.Err() != nil, loadStart: loadStart, loadEnd: loadAverage(),
		syncStart: syncStart, syncEnd: describeSync(),
	}
	fmt.Fprint(cfg.Stdout, rep.table())
	if cfg.Out != "" {
		section := benchSectionBegin + "\n" + rep.markdown() + benchSectionEnd + "\n"
		if err := replaceSection(cfg.Out, section, benchSectionBegin, benchSectionEnd, true); err != nil {
			return err
		}
		fmt.Fprintf(cfg.Log, "wrote %s\n", cfg.Out)
	}
	return nil
}

// runOne runs a scenario once against t, restarting a bench-started Warren first, and bounds
// the run in time: past its bound the bench-started broker is stopped (which ends the run);
// a run against an external broker that hangs is abandoned and reported.
func (b *bencher) runOne(ctx context.Context, sc benchScenario, t *benchTarget) runOutcome {
	if t.proc != nil {
		t.proc.stop()
		if err := t.proc.start(ctx); err != nil {
			return runOutcome{err: fmt.Errorf("restart Warren: %w", err)}
		}
		t.uri = t.proc.uri
	}
	bound := sc.bound(b.cfg)
	rctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	done := make(chan runOutcome, 1)
	go func() {
		began := time.Now()
		tool0 := selfCPU()
		pid, pidErr := t.pid()
		var broker0 time.Duration
		if pidErr == nil {
			broker0, pidErr = procCPU(pid)
		}
		out := sc.run(rctx, b, t)
		wall := time.Since(began).Seconds()
		out.toolCores, out.brokerCores = (selfCPU()-tool0).Seconds()/wall, -1
		if pidErr == nil {
			if broker1, err := procCPU(pid); err == nil {
				out.brokerCores = (broker1 - broker0).Seconds() / wall
			}
		}
		if sc.after != nil {
			sc.after(rctx, b, t, &out)
		}
		done <- out
	}()
	hard := time.NewTimer(bound + 30*time.Second)
	defer hard.Stop()
	select {
	case out := <-done:
		return out
	case <-hard.C:
	}
	if t.proc != nil {
		t.proc.stop()
		out := <-done
		out.err = fmt.Errorf("did not finish within %s (broker stopped): %v", bound+30*time.Second, out.err)
		return out
	}
	return runOutcome{err: fmt.Errorf("did not finish within %s; abandoned", bound+30*time.Second)}
}

func describeOutcome(sc benchScenario, out runOutcome) string {
	var parts []string
	for _, m := range sc.metrics {
		if v, ok := out.values[m.key]; ok {
			parts = append(parts, fmt.Sprintf("%s %s", m.label, fmtValue(m, v)))
		}
	}
	if out.err != nil {
		parts = append(parts, "ERROR: "+out.err.Error())
	}
	parts = append(parts, out.notes...)
	cpu := fmt.Sprintf("CPU: tool %.2f cores", out.toolCores)
	if out.brokerCores >= 0 {
		cpu += fmt.Sprintf(", broker %.2f cores", out.brokerCores)
	}
	parts = append(parts, cpu)
	return strings.Join(parts, "; ")
}

// fmtValue formats a metric value for the table.
func fmtValue(m benchMetric, v float64) string {
	switch m.unit {
	case ratesUnit:
		return fmtRate(v)
	case "ms":
		if v < 1 {
			return fmt.Sprintf("%.3f", v)
		}
		return fmt.Sprintf("%.2f", v)
	case "KB":
		return fmt.Sprintf("%.1f", v)
	case pairsUnit:
		return fmtRate(v)
	case secondsUnit:
		return fmt.Sprintf("%.2f", v)
	case cpuUnit:
		return fmt.Sprintf("%.3f", v)
	case countUnit:
		return fmtInt(uint64(v + 0.5))
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// median returns the median of the metric over the successful runs that measured it.
func median(outs []runOutcome, key string) (float64, int) {
	var vs []float64
	for _, o := range outs {
		if o.err != nil {
			continue
		}
		if v, ok := o.values[key]; ok {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return 0, 0
	}
	sort.Float64s(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2], n
	}
	return (vs[n/2-1] + vs[n/2]) / 2, n
}

// ratio is the "higher is better for Warren" ratio of two medians.
func ratio(m benchMetric, warren, ref float64) (float64, bool) {
	if warren <= 0 || ref <= 0 {
		return 0, false
	}
	if m.lowerBetter {
		return ref / warren, true
	}
	return warren / ref, true
}
