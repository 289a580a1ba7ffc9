package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for one writer goroutine and one reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{
		"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError,
	} {
		got, err := parseLevel(in)
		if err != nil || got != want {
			t.Errorf("parseLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "INFO", "trace", "warning"} {
		if _, err := parseLevel(bad); err == nil {
			t.Errorf("parseLevel(%q) succeeded; want an error", bad)
		}
	}
}

func TestVersionCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := newApp(&out, &errOut).Run([]string{"warren", "version"}); err != nil {
		t.Fatalf("warren version: %v", err)
	}
	if got, want := out.String(), "warren "+version+"\n"; got != want {
		t.Errorf("warren version printed %q, want %q", got, want)
	}
}

func TestServeRejectsBadInput(t *testing.T) {
	for name, args := range map[string][]string{
		"bad log level":  {"warren", "serve", "--log-level", "loud", "--data-dir", t.TempDir()},
		"extra argument": {"warren", "serve", "now", "--data-dir", t.TempDir()},
		"bad address":    {"warren", "serve", "--amqp-listen", "127.0.0.1:notaport", "--data-dir", t.TempDir()},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if err := newApp(&out, &errOut).Run(args); err == nil {
				t.Fatalf("%q succeeded; want an error", args)
			}
		})
	}
}

// TestServeFromEnvironment starts the broker with its address taken from WARREN_AMQP_LISTEN,
// connects to the address it logs, and stops it by cancelling the context as a signal would.
func TestServeFromEnvironment(t *testing.T) {
	t.Setenv("WARREN_AMQP_LISTEN", "127.0.0.1:0")
	t.Setenv("WARREN_HTTP_LISTEN", "127.0.0.1:0")
	t.Setenv("WARREN_PROMETHEUS_LISTEN", "127.0.0.1:0")
	t.Setenv("WARREN_STREAM_LISTEN", "127.0.0.1:0")
	t.Setenv("WARREN_DATA_DIR", t.TempDir())
	t.Setenv("WARREN_LOG_LEVEL", "debug")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	var logs syncBuffer
	done := make(chan error, 1)
	go func() { done <- newApp(&out, &logs).RunContext(ctx, []string{"warren", "serve"}) }()

	started := regexp.MustCompile(`msg="warren started".* amqp=(127\.0\.0\.1:\d+) http=(127\.0\.0\.1:\d+)`)
	var addr, httpAddr string
	for deadline := time.Now().Add(10 * time.Second); addr == ""; time.Sleep(10 * time.Millisecond) {
		if m := started.FindStringSubmatch(logs.String()); m != nil {
			addr, httpAddr = m[1], m[2]
		}
		select {
		case err := <-done:
			t.Fatalf("serve returned early: %v\nlogs:\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no start line logged within 10s; logs:\n%s", logs.String())
		}
	}
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	nc.Close()
	req, _ := http.NewRequest("GET", "http://"+httpAddr+"/api/overview", nil)
	req.SetBasicAuth("guest", "guest")
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatalf("HTTP API at %s: %v", httpAddr, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /api/overview: %s, want 200", resp.Status)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v after cancel; want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not return within 15s of cancel")
	}
	if !strings.Contains(logs.String(), `level=INFO msg="shutting down"`) {
		t.Errorf("no shutdown line in slog text format logged:\n%s", logs.String())
	}
}
