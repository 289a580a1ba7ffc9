package perf

import (
	"bytes"
	"context"
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
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Confirmed != 4000 || res.Consumed != 4000 || res.Lost != 0 || res.Duplicates != 0 {
		t.Fatalf("confirmed %d, consumed %d, lost %d, duplicates %d: want 4000, 4000, 0, 0",
			res.Confirmed, res.Consumed, res.Lost, res.Duplicates)
	}
	if len(res.Errors) > 0 {
		t.Fatalf("client errors: %v", res.Errors)
	}
}

func TestBenchStreamScenario(t *testing.T) {
	uri := startBroker(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refURI := "amqp://guest:guest@" + ln.Addr().String() + "/"
	ln.Close()
	out := filepath.Join(t.TempDir(), "benchmarks.md")
	var stdout bytes.Buffer
	err = Bench(context.Background(), BenchConfig{
		WarrenURI: uri, RefURI: refURI, Runs: 1, Scenarios: []string{"S8"}, Out: out,
		BacklogTimeout: time.Minute, StreamMessages: 3000,
		CommandLine: "warren perf bench --test", Stdout: &stdout, Log: io.Discard,
	})
	if err != nil {
		t.Fatalf("Bench: %v", err)
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("read %s: %v", out, err)
	}
	for _, want := range []string{"S8 stream: 3,000 messages (1 KB) published with confirms, then consumed from first",
		"published (confirmed msg/s)", "consumed from first (msg/s)", "x-stream-offset=first"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("benchmarks.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(string(md), "FAILED") || strings.Contains(string(md), "consumed only") {
		t.Errorf("the stream scenario failed:\n%s", md)
	}
}
