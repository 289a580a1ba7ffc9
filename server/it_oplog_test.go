package server_test

// The operators' log lines (issue 15 point 5): one line per connection opened and closed (both
// protocols), per refused login, per alarm change and per queue, stream or exchange declared or
// deleted, with who did it. The broker runs in process with its logs going to a handler passed
// in server.Config.Logger; clients drive it over TCP and the test reads the lines' fields.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"warren/server"
	"warren/server/httpapi"
)

// logRecorder is an slog handler's sink: slog's JSON handler writes each record as one line,
// which the test parses back into its fields.
type logRecorder struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines []map[string]any
}

func (r *logRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf.Write(p)
	for {
		i := bytes.IndexByte(r.buf.Bytes(), '\n')
		if i < 0 {
			break
		}
		var m map[string]any
		d := json.NewDecoder(bytes.NewReader(r.buf.Next(i + 1)))
		d.UseNumber() // large numbers (a disk limit) print as written
		if err := d.Decode(&m); err == nil {
			r.lines = append(r.lines, m)
		}
	}
	return len(p), nil
}

// find returns the first line with msg whose fields include want (compared as printed).
func (r *logRecorder) find(msg string, want map[string]string) map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
next:
	for _, l := range r.lines {
		if l["msg"] != msg {
			continue
		}
		for k, v := range want {
			if got, ok := l[k]; !ok || fmt.Sprint(got) != v {
				continue next
			}
		}
		return l
	}
	return nil
}

func (r *logRecorder) dump() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, l := range r.lines {
		j, _ := json.Marshal(l)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// expect waits (bounded) for a line with msg and the fields in want, and checks that the fields
// named in present are there and not empty.
func (r *logRecorder) expect(t *testing.T, msg string, want map[string]string, present ...string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		if l := r.find(msg, want); l != nil {
			for _, k := range present {
				if v, ok := l[k]; !ok || fmt.Sprint(v) == "" {
					t.Errorf("log line %q %v: field %q missing or empty: %v", msg, want, k, l)
				}
			}
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line %q with %v within %v; lines:\n%s", msg, want, waitFor, r.dump())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestITOperatorLogLines(t *testing.T) {
	if againstRabbitMQ() {
		t.Skip("reads Warren's own log lines")
	}
	rec := &logRecorder{}
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.StreamListen = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.DiskFreeLimit, cfg.MemoryHighWatermark = 0, 0
	cfg.Logger = slog.New(slog.NewJSONHandler(rec, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	api, err := httpapi.Listen("127.0.0.1:0", s, httpapi.Options{Version: "test", Logger: cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := api.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("server.Shutdown: %v", err)
		}
	})
	amqpURL := "amqp://guest:guest@" + s.Addr().String() + "/"

	// AMQP 0-9-1: open with a client-provided name, declare and delete, close.
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{Properties: amqp.Table{"connection_name": "oplog-amqp"}})
	if err != nil {
		t.Fatal(err)
	}
	local := conn.LocalAddr().String()
	rec.expect(t, "connection opened", map[string]string{"protocol": "amqp091", "user": "guest", "vhost": "/",
		"client_name": "oplog-amqp", "peer": local}, "conn")
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]string{"user": "guest", "via": "amqp091", "peer": local}
	with := func(m map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range by {
			out[k] = v
		}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	if _, err := ch.QueueDeclare("oplog.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "queue declared", with(map[string]string{"vhost": "/", "queue": "oplog.q", "type": "classic", "durable": "true"}), "connection")
	if _, err := ch.QueueDeclare("oplog.s", true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "stream declared", with(map[string]string{"vhost": "/", "stream": "oplog.s", "type": "stream"}), "connection")
	if err := ch.ExchangeDeclare("oplog.x", "topic", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "exchange declared", with(map[string]string{"vhost": "/", "exchange": "oplog.x", "type": "topic", "durable": "false"}), "connection")
	// A redeclaration declares nothing new: no second line.
	if _, err := ch.QueueDeclare("oplog.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete("oplog.q", false, false, false); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "queue deleted", with(map[string]string{"vhost": "/", "queue": "oplog.q"}), "connection")
	if _, err := ch.QueueDelete("oplog.s", false, false, false); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "stream deleted", with(map[string]string{"vhost": "/", "stream": "oplog.s"}))
	if err := ch.ExchangeDelete("oplog.x", false, false); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "exchange deleted", with(map[string]string{"vhost": "/", "exchange": "oplog.x"}))
	n := 0
	for _, l := range rec.snapshot() {
		if l["msg"] == "queue declared" && l["queue"] == "oplog.q" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d \"queue declared\" lines for oplog.q, want 1 (the redeclaration is not a declaration)", n)
	}

	// The HTTP API: the API's user, via http.
	base := "http://" + api.Addr().String()
	httpDo := func(method, path, body string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.SetBasicAuth("guest", "guest")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("%s %s: %s", method, path, resp.Status)
		}
	}
	httpDo("PUT", "/api/queues/%2F/oplog.h", `{"durable":true,"arguments":{"x-queue-type":"quorum"}}`)
	rec.expect(t, "queue declared", map[string]string{"queue": "oplog.h", "type": "quorum", "user": "guest", "via": "http"}, "peer")
	httpDo("DELETE", "/api/queues/%2F/oplog.h", "")
	rec.expect(t, "queue deleted", map[string]string{"queue": "oplog.h", "user": "guest", "via": "http"}, "peer")
	httpDo("PUT", "/api/exchanges/%2F/oplog.hx", `{"type":"fanout","durable":true}`)
	rec.expect(t, "exchange declared", map[string]string{"exchange": "oplog.hx", "type": "fanout", "via": "http"})
	httpDo("DELETE", "/api/exchanges/%2F/oplog.hx", "")
	rec.expect(t, "exchange deleted", map[string]string{"exchange": "oplog.hx", "via": "http"})

	// A refused AMQP login: user, peer, mechanism, reason; never the password.
	if c, err := amqp.Dial("amqp://guest:wrong-secret@" + s.Addr().String() + "/"); err == nil {
		c.Close()
		t.Fatal("a wrong password was accepted")
	}
	l := rec.expect(t, "login refused", map[string]string{"user": "guest", "mechanism": "PLAIN", "protocol": "amqp091"}, "peer", "reason")
	if strings.Contains(fmt.Sprint(l), "wrong-secret") {
		t.Errorf("the refused login's line shows the password: %v", l)
	}

	// Alarms, set and cleared, with the numbers.
	s.SetResourceLimits(1, 0)
	rec.expect(t, "memory alarm raised: publishers are blocked", map[string]string{"limit": "1"}, "rss")
	s.SetResourceLimits(0, 0)
	rec.expect(t, "memory alarm cleared", map[string]string{"limit": "0"}, "rss")
	s.SetResourceLimits(0, 1<<60)
	rec.expect(t, "disk alarm raised: publishers are blocked", map[string]string{"limit": fmt.Sprint(int64(1 << 60))}, "free", "reason")
	s.SetResourceLimits(0, 0)
	rec.expect(t, "disk alarm cleared", map[string]string{"limit": "0"}, "free")

	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "connection closed", map[string]string{"protocol": "amqp091", "user": "guest", "vhost": "/",
		"client_name": "oplog-amqp", "peer": local}, "reason")

	// The stream protocol: open, declare and delete a stream, close; a refused login.
	sa := s.StreamAddr().(*net.TCPAddr)
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetHost("127.0.0.1").SetPort(sa.Port).
		SetUser("guest").SetPassword("guest"))
	if err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "connection opened", map[string]string{"protocol": "stream", "user": "guest", "vhost": "/"}, "peer", "client_name")
	if err := env.DeclareStream("oplog.ss", nil); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "stream declared", map[string]string{"stream": "oplog.ss", "user": "guest", "via": "stream"}, "connection", "peer")
	if err := env.DeleteStream("oplog.ss"); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "stream deleted", map[string]string{"stream": "oplog.ss", "user": "guest", "via": "stream"}, "connection")
	if err := env.Close(); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "connection closed", map[string]string{"protocol": "stream", "user": "guest", "vhost": "/"}, "peer", "reason")
	if env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetHost("127.0.0.1").SetPort(sa.Port).
		SetUser("guest").SetPassword("nope").SetMaxProducersPerClient(1)); err == nil {
		env.Close()
		t.Fatal("the stream protocol accepted a wrong password")
	}
	rec.expect(t, "login refused", map[string]string{"user": "guest", "mechanism": "PLAIN", "protocol": "stream"}, "peer", "reason")
}

// snapshot copies the lines recorded so far.
func (r *logRecorder) snapshot() []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]any(nil), r.lines...)
}
