package perf

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"warren/server"
)

// startStreamBroker starts an in-process broker with the stream protocol on a free port and
// returns its stream URI.
func startStreamBroker(t *testing.T) string {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.StreamListen = "127.0.0.1:0"
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
	return "rabbitmq-stream://guest:guest@" + srv.StreamAddr().String() + "/%2f"
}

// perf stream against a running broker, the reference unreachable: every phase completes (the
// consumers check each chunk's CRC and count every message), and the report replaces its own
// section of an existing page, keeping the rest.
func TestStreamBench(t *testing.T) {
	uri := startStreamBroker(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ref := "rabbitmq-stream://guest:guest@" + ln.Addr().String() + "/%2f"
	ln.Close()
	out := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := os.WriteFile(out, []byte("# Benchmarks\n\nearlier text\n\n"+streamSectionBegin+"\nold\n"+streamSectionEnd+"\n\nlater text\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	cfg := StreamConfig{WarrenURI: uri, RefURI: ref, Sizes: []int{12, 1024}, Messages: 3000, Producers: 2,
		Consumers: 2, Batch: 100, SubEntry: 1, Window: 1000, Credit: 10, Runs: 1, Timeout: time.Minute,
		Out: out, Stdout: &stdout, Log: io.Discard}
	if err := StreamBench(context.Background(), cfg); err != nil {
		t.Fatalf("StreamBench: %v", err)
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	s := string(md)
	for _, want := range []string{"earlier text", "later text", "| 12 B | published (confirmed msg/s) |",
		"| 1024 B | published (confirmed msg/s) |", "live: consumed msg/s", "- rabbitmq: skipped"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "\nold\n") || strings.Contains(s, "failed") || strings.Count(s, streamSectionBegin) != 1 {
		t.Errorf("the section was not replaced, or a run failed:\n%s", s)
	}
	// With sub-entries of 10 the same messages arrive (each sub-entry counts its records).
	cfg.SubEntry, cfg.Out, cfg.Sizes = 10, "", []int{12}
	stdout.Reset()
	if err := StreamBench(context.Background(), cfg); err != nil {
		t.Fatalf("StreamBench with sub-entries: %v", err)
	}
	if strings.Contains(stdout.String(), "failed") {
		t.Errorf("a run with sub-entries failed:\n%s", stdout.String())
	}
}
