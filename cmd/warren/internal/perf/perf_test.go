package perf

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/goleak"

	"warren/server"
)

func TestMain(m *testing.M) {
	// Floor starts this executable's `perf echo-server`: let the test binary be that child.
	if len(os.Args) > 2 && os.Args[1] == "perf" && os.Args[2] == "echo-server" {
		app := &cli.App{Name: "warren", Commands: []*cli.Command{Command()}}
		if err := app.Run(append([]string{"warren"}, os.Args[1:]...)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// S10 restarts the broker the bench started: let the test binary be that broker too.
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		os.Exit(serveForTest(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}

func TestFloorThroughEchoServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveEcho(ctx, ln) }()
	res, err := Floor(context.Background(), FloorConfig{Addr: ln.Addr().String(), Rate: 2000, Size: 300, Duration: 300 * time.Millisecond})
	cancel()
	if serr := <-served; serr != nil {
		t.Errorf("echo server: %v", serr)
	}
	if err != nil {
		t.Fatalf("Floor: %v", err)
	}
	if res.Sent < 100 || res.Received != res.Sent || res.Latency.Samples != res.Sent {
		t.Fatalf("sent %d, received %d, samples %d: want every message back", res.Sent, res.Received, res.Latency.Samples)
	}
	if l := res.Latency; !(l.P50 > 0 && l.P50 <= l.P99 && l.P99 <= l.Max) {
		t.Fatalf("latency stats inconsistent: %+v", l)
	}
}

func TestFloorStartsEchoChild(t *testing.T) {
	res, err := Floor(context.Background(), FloorConfig{Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("Floor: %v", err)
	}
	if res.Sent == 0 || res.Received != res.Sent {
		t.Fatalf("sent %d, received %d", res.Sent, res.Received)
	}
}

// startBroker runs an in-process Warren on a free loopback port and returns its AMQP URI.
func startBroker(t *testing.T) string {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatalf("configure broker: %v", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatalf("start broker: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shut down broker: %v", err)
		}
	})
	return "amqp://guest:guest@" + srv.Addr().String() + "/"
}

func TestRunConfirmsNothingLost(t *testing.T) {
	uri := startBroker(t)
	var progress bytes.Buffer
	res, err := Run(context.Background(), RunConfig{
		URI: uri, Producers: 2, Consumers: 2, Size: 256, Confirm: 50, QoS: 100, Rate: 5000,
		Duration: 2 * time.Second, Progress: &syncWriter{w: &progress},
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Published == 0 || res.Consumed == 0 {
		t.Fatalf("no messages flowed: published %d, consumed %d", res.Published, res.Consumed)
	}
	if !res.LossChecked || res.Lost != 0 || res.Duplicates != 0 {
		t.Fatalf("loss check: checked %v, lost %d, duplicates %d", res.LossChecked, res.Lost, res.Duplicates)
	}
	if res.Confirmed != res.Published || res.Consumed != res.Confirmed {
		t.Fatalf("published %d, confirmed %d, consumed %d: want all equal", res.Published, res.Confirmed, res.Consumed)
	}
	if res.PublishRate <= 0 || res.ConfirmRate <= 0 || res.ConsumeRate <= 0 {
		t.Fatalf("rates: publish %v, confirm %v, consume %v", res.PublishRate, res.ConfirmRate, res.ConsumeRate)
	}
	if l := res.Latency; l.Samples != res.Consumed || !(l.P50 > 0 && l.P50 <= l.P75 && l.P75 <= l.P95 && l.P95 <= l.P99 && l.P99 <= l.Max) {
		t.Fatalf("latency stats inconsistent: %+v (consumed %d)", l, res.Consumed)
	}
	if len(res.Errors) > 0 {
		t.Fatalf("client errors: %v", res.Errors)
	}
	if !strings.Contains(progress.String(), "sent") {
		t.Errorf("no progress line in %q", progress.String())
	}
}

func TestRunFanoutMultiAckAndPMessages(t *testing.T) {
	uri := startBroker(t)
	res, err := Run(context.Background(), RunConfig{
		URI: uri, Producers: 1, Consumers: 3, Queues: 3, ExchangeType: "fanout",
		Confirm: 20, QoS: 50, MultiAckEvery: 10, PMessages: 5000, Persistent: true,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Published != 5000 || res.Confirmed != 5000 {
		t.Fatalf("published %d, confirmed %d: want 5000", res.Published, res.Confirmed)
	}
	if res.Consumed != 3*5000 || res.Lost != 0 || !res.LossChecked || res.Duplicates != 0 {
		t.Fatalf("consumed %d (want 15000), lost %d, checked %v, duplicates %d", res.Consumed, res.Lost, res.LossChecked, res.Duplicates)
	}
}

func TestRunLeanClient(t *testing.T) {
	uri := startBroker(t)
	// Bodies of 200,000 bytes span two body frames at the default frame-max of 131,072.
	for _, c := range []RunConfig{
		{Producers: 2, Consumers: 2, Queues: 2, Size: 200_000, QoS: 20, MultiAckEvery: 5, PMessages: 300},
		{Producers: 1, Consumers: 3, Queues: 3, ExchangeType: "fanout", AutoAck: true, PMessages: 2000},
		{Producers: 1, Consumers: 1, Size: 1024, QoS: 100, Rate: 1000, Duration: 500 * time.Millisecond},
	} {
		c.URI, c.Client = uri, clientLean
		res, err := Run(context.Background(), c)
		if err != nil {
			t.Fatalf("Run %+v: %v", c, err)
		}
		want := res.Published
		if c.ExchangeType == "fanout" {
			want *= uint64(c.Queues)
		}
		if res.Published == 0 || (c.PMessages > 0 && res.Published != c.PMessages*uint64(c.Producers)) {
			t.Fatalf("%+v: published %d", c, res.Published)
		}
		if res.Consumed != want || res.Duplicates != 0 || res.NotConsumed != 0 || res.Latency.Samples != want {
			t.Fatalf("%+v: published %d, consumed %d (want %d), duplicates %d, never consumed %d, latency samples %d",
				c, res.Published, res.Consumed, want, res.Duplicates, res.NotConsumed, res.Latency.Samples)
		}
		if len(res.Errors) > 0 {
			t.Fatalf("%+v: client errors: %v", c, res.Errors)
		}
	}
}

func TestRunLeanClientReportsBrokerRefusal(t *testing.T) {
	uri := startBroker(t)
	_, err := Run(context.Background(), RunConfig{
		URI: uri, Client: clientLean, Producers: 1, Consumers: 1, QueuePattern: "missing-%d", Predeclared: true, PMessages: 1,
	})
	if err == nil || !strings.Contains(err.Error(), "NOT_FOUND - no queue 'missing-1'") {
		t.Fatalf("consuming from a missing queue: got %v, want the broker's 404 text", err)
	}
}

func TestRunBacklogThenDrain(t *testing.T) {
	uri := startBroker(t)
	var phases []string
	res, err := Run(context.Background(), RunConfig{
		URI: uri, Producers: 2, Consumers: 1, Size: 1024, Confirm: 100, QoS: 100,
		PMessages: 2000, ConsumeAfterPublish: true, OnPhase: func(p string) { phases = append(phases, p) },
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Confirmed != 4000 || res.Consumed != 4000 || res.Lost != 0 {
		t.Fatalf("confirmed %d, consumed %d, lost %d: want 4000, 4000, 0", res.Confirmed, res.Consumed, res.Lost)
	}
	if got := strings.Join(phases, ","); got != "publish,drain,done" {
		t.Fatalf("phases %q", got)
	}
}

func TestRunReportsLoss(t *testing.T) {
	// Messages published to a queue that is purged as the drain starts (before the consumers
	// do) are confirmed but never consumed: the check must say so, per producer.
	uri := startBroker(t)
	res, err := Run(context.Background(), RunConfig{
		URI: uri, Producers: 2, Consumers: 1, Confirm: 10, PMessages: 100, ConsumeAfterPublish: true,
		DrainIdle: 200 * time.Millisecond,
		OnPhase: func(p string) {
			if p != "drain" {
				return
			}
			conn, err := dial(uri, "purger")
			if err != nil {
				t.Errorf("dial: %v", err)
				return
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				t.Errorf("channel: %v", err)
				return
			}
			if _, err := ch.QueuePurge("perf-q-1", false); err != nil {
				t.Errorf("purge: %v", err)
			}
		},
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Confirmed != 200 {
		t.Fatalf("confirmed %d, want 200", res.Confirmed)
	}
	if res.Lost != 200 || res.Consumed != 0 || len(res.LostByProducer) != 2 {
		t.Fatalf("lost %d (by producer %v), consumed %d: want 200 lost from both producers", res.Lost, res.LostByProducer, res.Consumed)
	}
	var sum uint64
	for _, n := range res.LostByProducer {
		sum += n
	}
	if sum != res.Lost {
		t.Fatalf("lost by producer %v does not add up to %d", res.LostByProducer, res.Lost)
	}
}

func TestRunPredeclaredDefaultExchange(t *testing.T) {
	uri := startBroker(t)
	conn, err := dial(uri, "test setup")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("mine-1", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), RunConfig{
		URI: uri, Producers: 1, Consumers: 1, QueuePattern: "mine-%d", Predeclared: true,
		Confirm: 10, PMessages: 500,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Confirmed != 500 || res.Consumed != 500 || res.Lost != 0 || len(res.Errors) > 0 {
		t.Fatalf("confirmed %d, consumed %d, lost %d, errors %v", res.Confirmed, res.Consumed, res.Lost, res.Errors)
	}
	// The queue is still there: --predeclared deletes nothing.
	if _, err := ch.QueueDeclarePassive("mine-1", false, false, false, false, nil); err != nil {
		t.Fatalf("queue gone after a predeclared run: %v", err)
	}
}

func TestCommandRunJSON(t *testing.T) {
	uri := startBroker(t)
	var stdout, stderr bytes.Buffer
	app := &cli.App{Name: "warren", Writer: &stdout, ErrWriter: &stderr, Commands: []*cli.Command{Command()}}
	args := []string{"warren", "perf", "run", "--uri", uri, "--duration", "1s", "--size", "100", "--auto-ack", "--rate", "5000", "--json"}
	if err := app.Run(args); err != nil {
		t.Fatalf("perf run: %v (stderr %s)", err, stderr.String())
	}
	var res Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, stdout.String())
	}
	if res.Size != 100 || !res.AutoAck || res.Consumed == 0 || res.Consumed != res.Published {
		t.Fatalf("unexpected result %+v", res)
	}
	// The default action of `perf` is `run`, human-readable.
	stdout.Reset()
	if err := app.Run([]string{"warren", "perf", "--uri", uri, "--pmessages", "300", "--confirm", "10", "--quiet"}); err != nil {
		t.Fatalf("perf: %v", err)
	}
	for _, want := range []string{"publish :", "confirm :", "consume :", "latency : p50", "lost 0"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("human output lacks %q:\n%s", want, stdout.String())
		}
	}
}

func TestConnectionsOnly(t *testing.T) {
	uri := startBroker(t)
	res, err := Run(context.Background(), RunConfig{URI: uri, ConnectionsOnly: 50, Duration: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if c := res.Connections; c == nil || c.Opened != 50 || c.Failed != 0 {
		t.Fatalf("connections: %+v", res.Connections)
	}
}

func TestBenchAgainstInProcessBroker(t *testing.T) {
	uri := startBroker(t)
	// A reference URI nobody listens on: the bench must skip it with a note.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refURI := "amqp://guest:guest@" + ln.Addr().String() + "/"
	ln.Close()
	out := filepath.Join(t.TempDir(), "docs", "benchmarks.md")
	var stdout bytes.Buffer
	err = Bench(context.Background(), BenchConfig{
		WarrenURI: uri, RefURI: refURI, Runs: 1, Scenarios: []string{"S5", "S6"}, Out: out,
		Duration: 500 * time.Millisecond, IdleConnections: 120, Backlog: 1000, BacklogTimeout: time.Minute,
		CommandLine: "warren perf bench --test", Stdout: &stdout,
		Log: io.Discard,
	})
	if err != nil {
		t.Fatalf("Bench: %v", err)
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("read %s: %v", out, err)
	}
	for _, want := range []string{"| Scenario | Metric | Warren | RabbitMQ | Ratio |", "S5 end-to-end latency", "latency p99 (ms)",
		"memory per connection (KB)", "RabbitMQ: skipped", "warren perf bench --test", "logical cores", "Go: go",
		"loopback floor (`warren perf floor`"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("benchmarks.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(string(md), "FAILED") {
		t.Errorf("a scenario failed:\n%s", md)
	}
	if !strings.Contains(stdout.String(), "higher is better") {
		t.Errorf("table header does not explain the ratio:\n%s", stdout.String())
	}
}

// TestReplaceSectionKeepsTheRest: a report replaces only its own marked section of the page, so
// `make bench` keeps what is written by hand and the other report's section.
func TestReplaceSectionKeepsTheRest(t *testing.T) {
	out := filepath.Join(t.TempDir(), "benchmarks.md")
	bench := func(body string) string { return benchSectionBegin + "\n" + body + "\n" + benchSectionEnd + "\n" }
	stream := func(body string) string { return streamSectionBegin + "\n" + body + "\n" + streamSectionEnd + "\n" }
	if err := os.WriteFile(out, []byte("## Notes by hand\n\nkept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		section, begin, end string
		prepend             bool
	}{
		{bench("# Benchmarks\nfirst bench"), benchSectionBegin, benchSectionEnd, true},
		{stream("first stream"), streamSectionBegin, streamSectionEnd, false},
		{bench("# Benchmarks\nsecond bench"), benchSectionBegin, benchSectionEnd, true},
		{stream("second stream"), streamSectionBegin, streamSectionEnd, false},
	}
	for _, st := range steps {
		if err := replaceSection(out, st.section, st.begin, st.end, st.prepend); err != nil {
			t.Fatal(err)
		}
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want := bench("# Benchmarks\nsecond bench") + "\n## Notes by hand\n\nkept\n\n" + stream("second stream")
	if string(md) != want {
		t.Fatalf("page:\n%s\nwant:\n%s", md, want)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	r := rand.New(rand.NewPCG(1, 2))
	vals := make([]float64, 100000)
	for i := range vals {
		v := time.Duration(math.Exp(r.NormFloat64()*1.5+12)) + time.Duration(r.IntN(100)) // ~160 µs median, wide tail
		vals[i] = float64(v)
		h.record(v)
	}
	sort.Float64s(vals)
	var s histSnapshot
	s.addFinal(&h)
	for _, q := range []float64{0.5, 0.75, 0.95, 0.99, 1} {
		want := vals[int(math.Ceil(q*float64(len(vals))))-1]
		got := float64(s.quantile(q))
		if math.Abs(got-want)/want > 0.02 {
			t.Errorf("q%.2f = %.0f, want %.0f within 2%%", q, got, want)
		}
	}
	if s.n != uint64(len(vals)) || time.Duration(s.max) != time.Duration(vals[len(vals)-1]) {
		t.Errorf("n %d max %d", s.n, s.max)
	}
	// Bucket bounds tile the value range without gaps.
	for b := 1; b < histBuckets; b++ {
		lo, _ := histBounds(b)
		plo, pw := histBounds(b - 1)
		if lo != plo+pw || histBucket(lo) != b {
			t.Fatalf("bucket %d starts at %d; previous ends at %d", b, lo, plo+pw)
		}
	}
}

func TestSeqSet(t *testing.T) {
	var s seqSet
	var wg sync.WaitGroup
	// Four writers add overlapping ranges across several chunks.
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := uint64(1); i <= 300000; i += 2 {
				s.add(i + uint64(w%2))
			}
		}(w)
	}
	wg.Wait()
	if n := s.count(); n != 300000 { // 1..300000
		t.Fatalf("count %d, want 300000", n)
	}
	if s.add(5) || !s.has(5) || s.has(400000) {
		t.Fatal("membership wrong")
	}
	var want seqSet
	for _, v := range []uint64{1, 2, 299999, 300001, 300002, 1 << 30} {
		want.add(v)
	}
	if missing := s.missingFrom(&want); missing != 3 { // 300001, 300002 and 1<<30
		t.Fatalf("missing %d, want 3", missing)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []RunConfig{
		{URI: "x", Producers: 1, Consumers: 1, QueueType: "stream", Duration: time.Second},
		{URI: "x", Producers: 1, Consumers: 1, QueueType: "stream", QoS: 10, AutoAck: true, Duration: time.Second},
		{URI: "x", Producers: 1, Consumers: 1, QoS: 10, MultiAckEvery: 20, Duration: time.Second},
		{URI: "x", Producers: 1, Consumers: 1, ExchangeType: "headers", Duration: time.Second},
		{URI: "x", Producers: 1, Consumers: 1},
		{URI: "x", Producers: 1, Consumers: 1, Client: clientLean, Confirm: 10, Duration: time.Second},
		{URI: "x", Producers: 1, Consumers: 1, ConsumerClient: "java", Duration: time.Second},
		{URI: "x", Producers: 1, Consumers: 1, Client: "java", Duration: time.Second},
	} {
		c.setDefaults()
		if err := c.validate(); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

// syncWriter serialises writes to a buffer read after the run.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// TestSyncLatencyMeasuresTheDisk checks the reports' disk line: a positive median, and no file
// left behind.
func TestSyncLatencyMeasuresTheDisk(t *testing.T) {
	dir := t.TempDir()
	d, err := syncLatency(dir, 5)
	if err != nil || d <= 0 {
		t.Fatalf("syncLatency = %v, %v; want a positive duration", d, err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("syncLatency left %d files in %s", len(left), dir)
	}
}
