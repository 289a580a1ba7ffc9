package perf

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRunStreamFillThenReadFromFirst(t *testing.T) {
	uri := startBroker(t)
	res, err := Run(context.Background(), RunConfig{
		URI: uri, Producers: 2, Consumers: 1, Size: 1024, Confirm: 100, QoS: 500, Persistent: true,
		QueueType: "stream", StreamOffset: "first", PMessages: 2000, ConsumeAfterPublish: true,
	})
	wantAllConsumedOnce(t, res, err, 4000)
}

// wantAllConsumedOnce fails t unless the run confirmed n messages and consumed each once,
// without client errors.
func wantAllConsumedOnce(t *testing.T, res *Result, err error, n uint64) {
	t.Helper()
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Confirmed != n || res.Consumed != n || res.Lost != 0 || res.Duplicates != 0 {
		t.Fatalf("confirmed %d, consumed %d, lost %d, duplicates %d: want %d, %d, 0, 0",
			res.Confirmed, res.Consumed, res.Lost, res.Duplicates, n, n)
	}
	if len(res.Errors) > 0 {
		t.Fatalf("client errors: %v", res.Errors)
	}
}

// TestRunLeanConsumersOfASuperStreamGroup fills a 4-partition super stream through amqp091-go
// publishers with confirms and reads it back with lean consumers of one consumer group: the
// consume arguments reach the broker (every message once, from first) through ConsumerClient.
func TestRunLeanConsumersOfASuperStreamGroup(t *testing.T) {
	uri := startBroker(t)
	res, err := Run(context.Background(), RunConfig{
		URI: uri, Producers: 1, Consumers: 2, Size: 64, Confirm: 100, QoS: 100, Persistent: true,
		QueueType: "stream", StreamOffset: "first", PMessages: 2000, ConsumeAfterPublish: true,
		Exchange: "perf-test-super", Partitions: 4, ConsumerGroup: "g", ConsumerClient: clientLean,
		DrainIdle: 2 * time.Second,
	})
	wantAllConsumedOnce(t, res, err, 2000)
}

// TestReadFromFirstCountsAStream replays a stream with readFromFirst (S13's replay): it reads
// every message, and asking for more than the stream holds ends at the timeout with an error.
func TestReadFromFirstCountsAStream(t *testing.T) {
	uri := startBroker(t)
	cfg := RunConfig{
		URI: uri, Producers: 1, Size: 64, Confirm: 100, QoS: 100, Persistent: true, QueueType: "stream",
		PMessages: 3000, NoCleanup: true,
	}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("fill: %v", err)
	}
	if res.Confirmed != 3000 {
		t.Fatalf("fill: confirmed %d of 3000", res.Confirmed)
	}
	cfg.setDefaults()
	q := fmt.Sprintf(cfg.QueuePattern, 1)
	rate, err := readFromFirst(context.Background(), uri, q, 3000, time.Minute)
	if err != nil || rate <= 0 {
		t.Fatalf("readFromFirst: rate %v, %v", rate, err)
	}
	if _, err := readFromFirst(context.Background(), uri, q, 3001, 2*time.Second); err == nil {
		t.Fatal("readFromFirst of 3,001 messages from a stream of 3,000 succeeded")
	}
}

// benchOne runs the scenarios of cfg once against an in-process broker, with the reference broker
// unreachable, and returns the Markdown report.
func benchOne(t *testing.T, cfg BenchConfig) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.RefURI = "amqp://guest:guest@" + ln.Addr().String() + "/"
	ln.Close()
	cfg.WarrenURI = startBroker(t)
	cfg.Runs = 1
	cfg.Out = filepath.Join(t.TempDir(), "benchmarks.md")
	var stdout bytes.Buffer
	cfg.CommandLine, cfg.Stdout, cfg.Log = "warren perf bench --test", &stdout, io.Discard
	if err := Bench(context.Background(), cfg); err != nil {
		t.Fatalf("Bench: %v", err)
	}
	md, err := os.ReadFile(cfg.Out)
	if err != nil {
		t.Fatalf("read %s: %v", cfg.Out, err)
	}
	return string(md)
}

func TestBenchStreamScenario(t *testing.T) {
	md := benchOne(t, BenchConfig{Scenarios: []string{"S8"}, BacklogTimeout: time.Minute, StreamMessages: 3000})
	for _, want := range []string{"S8 stream: 3,000 messages (1 KB) published with confirms, then consumed from first",
		"published (confirmed msg/s)", "consumed from first (msg/s)", "x-stream-offset=first"} {
		if !strings.Contains(md, want) {
			t.Errorf("benchmarks.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "FAILED") || strings.Contains(md, "consumed only") {
		t.Errorf("the stream scenario failed:\n%s", md)
	}
}
