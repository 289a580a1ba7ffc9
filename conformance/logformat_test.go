package conformance

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestLogFormatJSON runs the built binary with --log-format json, drives it through a
// connection, a declaration, a refused login and a close, and parses every line it wrote to
// stderr as one JSON object: what a log shipper reads. The operators' lines must be there with
// their fields.
func TestLogFormatJSON(t *testing.T) {
	if testEnv.bin == "" {
		t.Skipf("needs its own warren process; %s is set", envAddr)
	}
	b, err := launchBroker(testEnv.bin, t.TempDir(), "--log-format", "json")
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = b.stop()
		}
	})
	conn, err := amqp.DialConfig(b.URL, amqp.Config{Properties: amqp.Table{"connection_name": "logfmt"}})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("logfmt.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if c, err := amqp.Dial("amqp://guest:bad@" + b.Addr + "/"); err == nil {
		c.Close()
		t.Fatal("a wrong password was accepted")
	}
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	// The close line is written once the connection's goroutine has finished: wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(b.logs(), `"msg":"connection closed"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no connection closed line within 10s:\n%s", b.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true

	want := map[string]map[string]string{
		"warren started":    {},
		"connection opened": {"protocol": "amqp091", "user": "guest", "vhost": "/", "client_name": "logfmt"},
		"queue declared":    {"queue": "logfmt.q", "user": "guest", "via": "amqp091", "type": "classic"},
		"login refused":     {"user": "guest", "mechanism": "PLAIN", "protocol": "amqp091"},
		"connection closed": {"protocol": "amqp091", "user": "guest", "client_name": "logfmt"},
		"broker stopped":    {},
	}
	seen := map[string]bool{}
	lines := bytes.Split(bytes.TrimSpace([]byte(b.logs())), []byte("\n"))
	for i, line := range lines {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Errorf("stderr line %d is not JSON (%v): %s", i+1, err, line)
			continue
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := m[k]; !ok {
				t.Errorf("stderr line %d has no %q: %s", i+1, k, line)
			}
		}
		msg, _ := m["msg"].(string)
		fields, ok := want[msg]
		if !ok {
			continue
		}
		match := true
		for k, v := range fields {
			if s, _ := m[k].(string); s != v {
				match = false
			}
		}
		if match {
			seen[msg] = true
		}
	}
	for msg, fields := range want {
		if !seen[msg] {
			t.Errorf("no JSON line %q with %v; output:\n%s", msg, fields, b.logs())
		}
	}
	if len(lines) < len(want) {
		t.Errorf("only %d lines", len(lines))
	}

	// An unknown format is refused at start, naming the flag.
	out, err := exec.Command(testEnv.bin, "serve", "--log-format", "xml", "--data-dir", t.TempDir()).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--log-format") {
		t.Errorf("--log-format xml: err %v, output %s; want a non-zero exit naming --log-format", err, out)
	}
}
