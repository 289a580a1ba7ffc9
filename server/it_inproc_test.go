package server_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"warren/server"
)

// testLogWriter forwards log lines to t.Log until the broker has shut down
// (t.Log after the test has finished would panic).
type testLogWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testLogWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
}

// startInProcess starts a broker on 127.0.0.1:0 with a temporary data
// directory and debug logs in the test log; it is shut down when the test ends.
func startInProcess(t *testing.T) string {
	t.Helper()
	return startInProcessConfig(t, nil)
}

// startInProcessConfig is startInProcess with the configuration adjusted by edit (nil: none).
func startInProcessConfig(t *testing.T, edit func(*server.Config)) string {
	t.Helper()
	lw := &testLogWriter{t: t}
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.Logger = slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if edit != nil {
		edit(&cfg)
	}
	s, err := server.New(cfg)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	if err := s.Start(); err != nil {
		t.Fatalf("server.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("server.Shutdown: %v", err)
		}
		lw.stop()
	})
	return "amqp://guest:guest@" + s.Addr().String() + "/"
}
