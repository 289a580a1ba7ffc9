package conformance

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// testdata/datadir-95c0196.tar.gz is a data directory written by the release before the core
// redesign (commit 95c0196: metadata in format 1, one vhost, every record under a lowercase kind),
// made by declaring through amqp091-go and stopping the broker with SIGTERM:
//   - exchanges up.x (topic) and up.x2 (fanout, alternate-exchange amq.fanout), bound up.x -> up.x2
//     with key "a.#";
//   - classic queues up.q (x-max-length 1000, bound to up.x with "a.b") and up.q2 (bound to up.x2),
//     each with the persistent messages q-0 .. q-4;
//   - a stream up.s with s-0 .. s-9, and a named consumer c1 that acknowledged offsets 0 .. 4;
//   - a quorum queue up.qq with qq-0 .. qq-2.
//
// The current binary must open it (migrating the metadata once, and saying so in its log) and
// serve all of it; a second start must not migrate again.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	if testEnv.bin == "" {
		t.Skipf("needs its own warren process; %s is set", envAddr)
	}
	dir := t.TempDir()
	extractTarGz(t, filepath.Join("testdata", "datadir-95c0196.tar.gz"), dir)
	n := &node{t: t, dir: dir}
	n.start()
	t.Cleanup(func() {
		if n.b != nil {
			_ = n.b.stop()
		}
		if t.Failed() && n.b != nil {
			t.Logf("broker log:\n%s", tail(n.b.logs(), 6<<10))
		}
	})
	if logs := n.b.logs(); !strings.Contains(logs, "metadata migrated from format 1 to format 2") {
		t.Errorf("the first start on the old data directory did not log the migration:\n%s", tail(logs, 4<<10))
	}
	checkUpgraded(t, n.b.URL, true)
	n.restartTerm()
	if logs := n.b.logs(); strings.Contains(logs, "metadata migrated") {
		t.Errorf("the second start migrated again:\n%s", tail(logs, 4<<10))
	}
	checkUpgraded(t, n.b.URL, false)
}

// checkUpgraded checks what the old release declared (first: the messages are still there, and
// are consumed; later: the queues are empty and routing still works).
func checkUpgraded(t *testing.T, url string, first bool) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	for _, x := range []struct{ name, kind string }{{"up.x", "topic"}, {"up.x2", "fanout"}} {
		if err := ch.ExchangeDeclarePassive(x.name, x.kind, true, false, false, false, nil); err != nil {
			t.Fatalf("exchange %s after the upgrade: %v", x.name, err)
		}
	}
	// Equivalence holds against the migrated arguments.
	if _, err := ch.QueueDeclare("up.q", true, false, false, false, amqp.Table{"x-max-length": int32(1000)}); err != nil {
		t.Fatalf("redeclare up.q with its arguments: %v", err)
	}
	if first {
		for _, q := range []string{"up.q", "up.q2"} {
			got := bodies(getAll(t, ch, q, 10*time.Second))
			if want := "q-0 q-1 q-2 q-3 q-4"; strings.Join(got, " ") != want {
				t.Errorf("%s after the upgrade holds %v, want %s", q, got, want)
			}
		}
		got := bodies(getAll(t, ch, "up.qq", 10*time.Second))
		if want := "qq-0 qq-1 qq-2"; strings.Join(got, " ") != want {
			t.Errorf("up.qq after the upgrade holds %v, want %s", got, want)
		}
	}
	// The bindings route: up.x -a.b-> up.q, and up.x -a.#-> up.x2 -> up.q2.
	cc := confirmChannel(t, conn)
	publishConfirmed(t, cc, "up.x", "a.b", amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("after")})
	for _, q := range []string{"up.q", "up.q2"} {
		got := bodies(getAll(t, ch, q, 10*time.Second))
		if strings.Join(got, " ") != "after" {
			t.Errorf("%s got %v from a publish to up.x after the upgrade, want [after]", q, got)
		}
	}
	// The stream: every record from the first offset, and c1 resumes after its stored offset.
	sc, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	if err := sc.Qos(20, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	readStream := func(args amqp.Table, n int) []string {
		t.Helper()
		msgs, err := sc.Consume("up.s", "", false, false, false, false, args)
		if err != nil {
			t.Fatalf("consume up.s: %v", err)
		}
		var out []string
		for len(out) < n {
			select {
			case m := <-msgs:
				out = append(out, string(m.Body))
				m.Ack(false)
			case <-time.After(10 * time.Second):
				t.Fatalf("up.s: got %v, want %d records", out, n)
			}
		}
		return out
	}
	all := readStream(amqp.Table{"x-stream-offset": "first"}, 10)
	for i, b := range all {
		if b != fmt.Sprintf("s-%d", i) {
			t.Fatalf("up.s record %d is %q, want s-%d (all: %v)", i, b, i, all)
		}
	}
	if first {
		if got := readStream(amqp.Table{"x-stream-consumer-name": "c1"}, 5); got[0] != "s-5" {
			t.Errorf("named consumer c1 resumed at %q, want s-5 (its stored offset was 4)", got[0])
		}
	}
}

// extractTarGz unpacks a .tar.gz of plain files and directories into dir.
func extractTarGz(t *testing.T, path, dir string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("gunzip %s: %v", path, err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		target := filepath.Join(dir, filepath.Clean(h.Name))
		if !strings.HasPrefix(target, filepath.Clean(dir)+string(os.PathSeparator)) && target != filepath.Clean(dir) {
			t.Fatalf("%s: entry %q leaves the directory", path, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(out, tr); err != nil {
				t.Fatal(err)
			}
			out.Close()
		}
	}
}
