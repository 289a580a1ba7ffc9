package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// runServe starts `warren serve args...` in this process and returns its logs and a stop
// function that cancels it and returns serve's error.
func runServe(t *testing.T, args ...string) (*syncBuffer, chan error, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	logs := &syncBuffer{}
	done := make(chan error, 1)
	full := append([]string{"warren", "serve", "--amqp-listen", "127.0.0.1:0", "--http-listen", "", "--stream-listen", "", "--data-dir", t.TempDir()}, args...)
	go func() { done <- newApp(&out, logs).RunContext(ctx, full) }()
	return logs, done, cancel
}

// waitStarted waits for the start line and returns it.
func waitStarted(t *testing.T, logs *syncBuffer, done chan error) string {
	t.Helper()
	started := regexp.MustCompile(`msg="warren started".*`)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if m := started.FindString(logs.String()); m != "" {
			return m
		}
		select {
		case err := <-done:
			t.Fatalf("serve returned early: %v\nlogs:\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no start line logged within 15s; logs:\n%s", logs.String())
		}
	}
}

func stopServe(t *testing.T, done chan error, cancel context.CancelFunc) {
	t.Helper()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v after cancel", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not return within 15s of cancel")
	}
}

// TestPrometheusListenFlag: --prometheus-listen serves /metrics where it says, an empty value
// serves none, and a port in use stops the start with an error naming it.
func TestPrometheusListenFlag(t *testing.T) {
	t.Run("serves", func(t *testing.T) {
		logs, done, cancel := runServe(t, "--prometheus-listen", "127.0.0.1:0")
		line := waitStarted(t, logs, done)
		m := regexp.MustCompile(`prometheus=(127\.0\.0\.1:\d+)`).FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("start line names no prometheus address: %s", line)
		}
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + m[1] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "\nrabbitmq_connections 0\n") {
			t.Errorf("GET /metrics: %s\n%.500s", resp.Status, body)
		}
		stopServe(t, done, cancel)
	})
	t.Run("empty turns it off", func(t *testing.T) {
		logs, done, cancel := runServe(t, "--prometheus-listen", "")
		if line := waitStarted(t, logs, done); strings.Contains(line, "prometheus=") {
			t.Errorf("exporter started with an empty --prometheus-listen: %s", line)
		}
		stopServe(t, done, cancel)
	})
	t.Run("port in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		_, done, cancel := runServe(t, "--prometheus-listen", ln.Addr().String())
		defer cancel()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) || !strings.Contains(err.Error(), "in use") {
				t.Fatalf("serve with the exporter's port taken returned %v; want an error naming %s", err, ln.Addr())
			}
		case <-time.After(15 * time.Second):
			t.Fatal("serve kept running with the exporter's port taken")
		}
	})
}
