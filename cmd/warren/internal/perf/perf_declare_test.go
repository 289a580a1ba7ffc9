package perf

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"warren/server"
)

// serveForTest is `warren serve` for the bench's tests: the real broker, in a child process
// the bench starts, stops with SIGTERM and starts again. It returns the exit status.
func serveForTest(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("amqp-listen", "127.0.0.1:0", "")
	fs.String("http-listen", "", "")
	fs.String("prometheus-listen", "", "")
	dataDir := fs.String("data-dir", "", "")
	fs.String("log-level", "warn", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := server.DefaultConfig()
	cfg.AMQPListen, cfg.DataDir = *listen, *dataDir
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv, err := server.New(cfg)
	if err == nil {
		err = srv.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func TestWindowRate(t *testing.T) {
	s := int64(time.Second)
	at := []int64{0, 1 * s, 2 * s, 4 * s, 8 * s}
	for _, c := range []struct {
		a, b int
		want float64
	}{
		{0, 2, 1},       // 2 pairs in 2 s
		{2, 4, 1.0 / 3}, // 2 pairs in 6 s
		{0, 4, 0.5},
		{3, 4, 0.25},
		{2, 2, 0}, // empty window
		{3, 2, 0}, // reversed
		{0, 5, 0}, // past the recorded completions
	} {
		if got := windowRate(at, c.a, c.b); fmt.Sprintf("%.6f", got) != fmt.Sprintf("%.6f", c.want) {
			t.Errorf("windowRate(%d, %d) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestDeclareClockWindows(t *testing.T) {
	// 10 completions 1 s apart after a 1 s start: the first 3 took 3 s, the last 3 took 3 s,
	// and the slowest-first tail shows in the last window.
	c := newDeclareClock(10, 3, 0)
	for k := 1; k <= 10; k++ {
		c.at[k] = int64(k) * int64(time.Second)
		c.which[k] = int32(11 - k)
	}
	c.at[10] = 12 * int64(time.Second) // the last one took 3 s
	c.done.Store(10)
	var res DeclareResult
	c.fill(&res)
	if res.Declared != 10 || res.Seconds != 12 {
		t.Fatalf("declared %d in %v s, want 10 in 12", res.Declared, res.Seconds)
	}
	if res.FirstRate != 1 || fmt.Sprintf("%.3f", res.LastRate) != "0.600" {
		t.Fatalf("first %v, last %v: want 1 and 3/5", res.FirstRate, res.LastRate)
	}
	// Broker CPU: 2 ms a pair over the first window; a run cut short at 7 has its last window
	// (4..7) measured from the reading at 3, the edge before it.
	c.cpu = map[int]time.Duration{0: 0, 3: 6 * time.Millisecond, 6: 9 * time.Millisecond, 7: 18 * time.Millisecond}
	if got := c.cpuPerPair(0, 3); got != 2 {
		t.Errorf("cpu per pair over 0..3 = %v, want 2", got)
	}
	if got := c.cpuPerPair(4, 7); got != 3 {
		t.Errorf("cpu per pair over 4..7 = %v, want 3 (12 ms over 3..7)", got)
	}
	if got := c.cpuPerPair(0, 5); got != 0 {
		t.Errorf("cpu per pair to an unread edge = %v, want 0", got)
	}
	// Fewer completions than the window: both windows are all of them.
	c = newDeclareClock(10, 3, 0)
	c.at[1], c.at[2] = int64(time.Second), int64(4*time.Second)
	c.done.Store(2)
	c.fill(&res)
	if res.Declared != 2 || res.FirstRate != 0.5 || res.LastRate != 0.5 {
		t.Fatalf("partial: %+v", res)
	}
}

func TestSampleNames(t *testing.T) {
	got := sampleNames("q-%d", 100, 5, "q-77")
	want := []string{"q-77", "q-1", "q-25", "q-50", "q-75", "q-100"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("sampleNames = %v, want %v", got, want)
	}
	if got := sampleNames("q-%d", 1, 10, "q-1"); len(got) != 1 {
		t.Fatalf("one queue: %v", got)
	}
}

func TestDeclareBindsEveryQueue(t *testing.T) {
	uri := startBroker(t)
	var progress bytes.Buffer
	res, err := Declare(context.Background(), DeclareConfig{
		URI: uri, Queues: 200, Channels: 8, Connections: 2, Pattern: "dq-%d", Window: 50,
		Progress: &syncWriter{w: &progress}, ProgressEvery: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("Declare: %v", err)
	}
	if res.Declared != 200 || res.TimedOut || res.FirstError != "" {
		t.Fatalf("declared %d, timed out %v, error %q", res.Declared, res.TimedOut, res.FirstError)
	}
	if !(res.Seconds > 0 && res.Rate > 0 && res.FirstRate > 0 && res.LastRate > 0) {
		t.Fatalf("rates: %+v", res)
	}
	if !strings.HasPrefix(res.Last, "dq-") {
		t.Fatalf("last queue %q", res.Last)
	}
	ctx := context.Background()
	if chk := checkQueues(ctx, uri, "dq-%d", 200, 4); chk.Err != nil || chk.Present != 200 || chk.Missing != 0 {
		t.Fatalf("after declaring: %+v", chk)
	}
	// Each queue is bound to amq.direct by its name: a message routed that way arrives.
	if err := checkBindings(ctx, uri, sampleNames("dq-%d", 200, 10, res.Last)); err != nil {
		t.Fatal(err)
	}
	if err := checkBindings(ctx, uri, []string{"dq-201"}); err == nil {
		t.Fatal("a queue never declared passed the binding check")
	}
	if !strings.Contains(progress.String(), "declare: ") {
		t.Errorf("no progress line in %q", progress.String())
	}
	if err := deleteQueues(ctx, uri, "dq-%d", 250, 4); err != nil { // 201-250 never existed
		t.Fatalf("deleteQueues: %v", err)
	}
	if chk := checkQueues(ctx, uri, "dq-%d", 200, 4); chk.Err != nil || chk.Present != 0 || chk.Missing != 200 || chk.FirstMissing != "dq-1" {
		t.Fatalf("after deleting: %+v", chk)
	}
}

func TestDeclareStopsAtTimeout(t *testing.T) {
	uri := startBroker(t)
	res, err := Declare(context.Background(), DeclareConfig{URI: uri, Queues: 1_000_000, Channels: 2, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatalf("Declare: %v", err)
	}
	if !res.TimedOut || res.Declared == 0 || res.Declared >= res.Requested {
		t.Fatalf("timed out %v, declared %d of %d", res.TimedOut, res.Declared, res.Requested)
	}
	// Every number handed out was declared: the first Declared queues exist, the next does not.
	if chk := checkQueues(context.Background(), uri, "perf-declare-%d", res.Declared+1, 2); chk.Present != res.Declared || chk.Missing != 1 {
		t.Fatalf("declared %d; check %+v", res.Declared, chk)
	}
}

func TestDeclareReportsRefusal(t *testing.T) {
	uri := startBroker(t)
	res, err := Declare(context.Background(), DeclareConfig{URI: uri, Queues: 10, Pattern: "amq.mine-%d"})
	if err == nil || res == nil || !strings.Contains(res.FirstError, "ACCESS_REFUSED") || res.Declared != 0 {
		t.Fatalf("declaring amq.* queues: result %+v, error %v; want ACCESS_REFUSED", res, err)
	}
}

func TestCommandDeclare(t *testing.T) {
	uri := startBroker(t)
	var stdout, stderr bytes.Buffer
	app := &cli.App{Name: "warren", Writer: &stdout, ErrWriter: &stderr, Commands: []*cli.Command{Command()}}
	if err := app.Run([]string{"warren", "perf", "declare", "--uri", uri, "--queues", "40", "--window", "10", "--json"}); err != nil {
		t.Fatalf("perf declare: %v (stderr %s)", err, stderr.String())
	}
	var res DeclareResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, stdout.String())
	}
	if res.Declared != 40 || res.Window != 10 || res.FirstRate <= 0 {
		t.Fatalf("result %+v", res)
	}
	// Without --keep the queues are gone again; with it they stay.
	if chk := checkQueues(context.Background(), uri, "perf-declare-%d", 40, 2); chk.Missing != 40 {
		t.Fatalf("after perf declare: %+v", chk)
	}
	stdout.Reset()
	if err := app.Run([]string{"warren", "perf", "declare", "--uri", uri, "--queues", "5", "--keep", "--quiet"}); err != nil {
		t.Fatalf("perf declare --keep: %v", err)
	}
	if !strings.Contains(stdout.String(), "declared 5 of 5 queue+bind pairs") {
		t.Errorf("human output: %q", stdout.String())
	}
	if chk := checkQueues(context.Background(), uri, "perf-declare-%d", 5, 2); chk.Present != 5 {
		t.Fatalf("after perf declare --keep: %+v", chk)
	}
}

func TestBenchDeclareScenario(t *testing.T) {
	t.Parallel() // mostly waiting for memory to settle
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The in-process broker stands in for the reference: the bench declares in it, deletes
	// leftovers first and what it declared afterwards.
	ref := startBroker(t)
	if _, err := Declare(context.Background(), DeclareConfig{URI: ref, Queues: 3, Pattern: s10Pattern}); err != nil {
		t.Fatal(err) // leftovers of an "interrupted run"
	}
	out := filepath.Join(t.TempDir(), "benchmarks.md")
	var stdout, log bytes.Buffer
	err = Bench(context.Background(), BenchConfig{
		WarrenBin: exe, RefURI: ref, Runs: 1, Scenarios: []string{"S10"}, Out: out,
		DeclareQueues: 40, DeclareLargeQueues: 50, DeclareChannels: 8, DeclareConnections: 2, DeclareTimeout: time.Minute,
		CommandLine: "warren perf bench --test", Stdout: &stdout, Log: &syncWriter{w: &log}, rssSettleLimit: 2 * time.Second,
	})
	if err != nil {
		t.Fatalf("Bench: %v", err)
	}
	mdBytes, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	md := string(mdBytes)
	for _, want := range []string{
		"## S10 object counts: 40 durable queues declared and bound, restart, memory; 50 in a large run",
		"| Metric | Warren | RabbitMQ | Ratio | Target (Warren) | Warren meets it |",
		"| pairs declared (of 40) | 40 | 40 | - | all | PASS |",
		"| queues present after restart | 40 | - | - | all declared | PASS |",
		"| time to declare 40 (s) |", "- (measured at 40)",
		"| declare rate, last 40 of 40 (pairs/s) |", "- (the windows overlap)",
		"| idle RSS per queue after declaring (KB) |", "| 50 queues: pairs declared | 50 |",
		"stopping with SIGTERM took",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("benchmarks.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "| Scenario | Metric | Warren | RabbitMQ | Ratio |") {
		t.Errorf("S10 alone still printed the S1-S9 table:\n%s", md)
	}
	for _, bad := range []string{"FAILED", "MISSING", "binding check after restart FAILED"} {
		if strings.Contains(md, bad) {
			t.Errorf("benchmarks.md says %q:\n%s\nlog:\n%s", bad, md, log.String())
		}
	}
	if !strings.Contains(stdout.String(), "Warren meets it") {
		t.Errorf("terminal table lacks the S10 section:\n%s", stdout.String())
	}
	// The reference keeps nothing of the run, leftovers included.
	if chk := checkQueues(context.Background(), ref, s10Pattern, 40, 2); chk.Err != nil || chk.Present != 0 {
		t.Fatalf("reference after the bench: %+v", chk)
	}
}
