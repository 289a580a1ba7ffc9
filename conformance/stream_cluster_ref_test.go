package conformance

// The stream chaos check against RabbitMQ: the same publishers, consumer, SIGKILLs and read-back
// as TestClusterStreamChaos, on a 3-node RabbitMQ cluster this test starts from Debian's package
// (nodes wsc1..wsc3@localhost, AMQP ports 5797..5799, distribution ports 25797..25799, data under
// WARREN_RMQ_CHAOS_BASE, default /tmp/warren-rmq-stream-chaos; it never touches other RabbitMQ
// nodes on the machine). It runs only with WARREN_REF_STREAM_CHAOS=1:
//
//	WARREN_REF_STREAM_CHAOS=1 go test ./conformance -run TestRabbitMQClusterStreamChaos -v

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

type rabbitChaos struct {
	base string
	n    int
}

func (r *rabbitChaos) node(i int) string { return fmt.Sprintf("wsc%d@localhost", i+1) }
func (r *rabbitChaos) port(i int) int    { return 5797 + i }
func (r *rabbitChaos) dir(i int) string  { return filepath.Join(r.base, fmt.Sprintf("wsc%d", i+1)) }

func (r *rabbitChaos) env(i int) []string {
	d := r.dir(i)
	return append(os.Environ(),
		"RABBITMQ_NODENAME="+r.node(i),
		"RABBITMQ_NODE_PORT="+strconv.Itoa(r.port(i)),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(25797+i),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(d, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(d, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(d, "enabled_plugins"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(d, "rabbitmq"),
		"RABBITMQ_PID_FILE="+filepath.Join(d, "pid"),
	)
}

func (r *rabbitChaos) run(t *testing.T, i int, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = r.env(i)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func (r *rabbitChaos) ctl(t *testing.T, i int, args ...string) (string, error) {
	return r.run(t, i, "rabbitmqctl", append([]string{"-n", r.node(i)}, args...)...)
}

func (r *rabbitChaos) startNode(t *testing.T, i int) {
	if out, err := r.run(t, i, "rabbitmq-server", "-detached"); err != nil {
		t.Fatalf("start %s: %v\n%s", r.node(i), err, out)
	}
	deadline := time.Now().Add(120 * time.Second)
	for {
		if out, err := r.ctl(t, i, "await_startup"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("%s did not start within 120s: %v\n%s", r.node(i), err, out)
		}
		time.Sleep(time.Second)
	}
	waitPort(t, r.port(i), 60*time.Second)
}

func waitPort(t *testing.T, port int, d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("port %d does not accept within %v", port, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (r *rabbitChaos) urls() []string {
	var out []string
	for i := range r.n {
		out = append(out, fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", r.port(i)))
	}
	return out
}

func (r *rabbitChaos) name(i int) string { return r.node(i) }

// leader asks a running node for the stream's leader (rabbitmqctl list_queues name leader).
func (r *rabbitChaos) leader(t *testing.T, not int) int {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		for i := range r.n {
			if i == not {
				continue
			}
			out, err := r.ctl(t, i, "list_queues", "name", "leader", "--formatter", "json", "--quiet")
			if err != nil {
				continue
			}
			var rows []map[string]any
			if json.Unmarshal([]byte(strings.TrimSpace(out)), &rows) != nil {
				continue
			}
			for _, row := range rows {
				if row["name"] != "chaos.stream" {
					continue
				}
				l, _ := row["leader"].(string)
				for k := range r.n {
					if l == r.node(k) && k != not {
						return k
					}
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no leader for chaos.stream (other than node %d) within 60s", not)
	return -1
}

// pid is node i's beam process from its pid file, 0 if there is none or the process with that pid
// is not that node (a stale file: the pid may belong to someone else's process now).
func (r *rabbitChaos) pid(i int) int {
	b, err := os.ReadFile(filepath.Join(r.dir(i), "pid"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if n <= 0 {
		return 0
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", n))
	if err != nil || !bytes.Contains(environ, []byte("RABBITMQ_NODENAME="+r.node(i)+"\x00")) {
		return 0
	}
	return n
}

func (r *rabbitChaos) kill(t *testing.T, i int) {
	pid := r.pid(i)
	if pid <= 0 {
		t.Fatalf("no running process for %s", r.node(i))
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL %s (pid %d): %v", r.node(i), pid, err)
	}
	for range 100 {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *rabbitChaos) restart(t *testing.T, i int) {
	_ = os.Remove(filepath.Join(r.dir(i), "pid"))
	r.startNode(t, i)
}

func (r *rabbitChaos) saveLogs(int) {}

func (r *rabbitChaos) stop(t *testing.T) {
	for i := range r.n {
		if pid := r.pid(i); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// Nodes of an earlier run whose pid files are gone: found by their node name, which is this
	// test's alone.
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, f := range procs {
		environ, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for i := range r.n {
			if bytes.Contains(environ, []byte("RABBITMQ_NODENAME="+r.node(i)+"\x00")) {
				if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil && pid != os.Getpid() {
					cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(f), "cmdline"))
					if bytes.Contains(cmdline, []byte("beam.smp")) {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
		}
	}
	time.Sleep(time.Second)
	_ = os.RemoveAll(r.base)
}

// TestRabbitMQClusterStreamChaos is TestClusterStreamChaos against a RabbitMQ 3-node cluster.
func TestRabbitMQClusterStreamChaos(t *testing.T) {
	if os.Getenv("WARREN_REF_STREAM_CHAOS") != "1" {
		t.Skip("set WARREN_REF_STREAM_CHAOS=1 to run the stream chaos check against a RabbitMQ cluster this test starts")
	}
	if _, err := exec.LookPath("rabbitmq-server"); err != nil {
		t.Skip("rabbitmq-server is not installed")
	}
	base := os.Getenv("WARREN_RMQ_CHAOS_BASE")
	if base == "" {
		base = "/tmp/warren-rmq-stream-chaos"
	}
	r := &rabbitChaos{base: base, n: 3}
	r.stop(t)
	for i := range r.n {
		d := r.dir(i)
		if err := os.MkdirAll(filepath.Join(d, "mnesia"), 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.MkdirAll(filepath.Join(d, "log"), 0o755)
		_ = os.WriteFile(filepath.Join(d, "enabled_plugins"), []byte("[].\n"), 0o644)
		conf := fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n", r.port(i))
		_ = os.WriteFile(filepath.Join(d, "rabbitmq.conf"), []byte(conf), 0o644)
	}
	if out, err := exec.Command("chown", "-R", "rabbitmq:rabbitmq", base).CombinedOutput(); err != nil {
		t.Logf("chown %s: %v %s", base, err, out)
	}
	t.Cleanup(func() { r.stop(t) })
	for i := range r.n {
		r.startNode(t, i)
	}
	for i := 1; i < r.n; i++ {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", r.node(0)}, {"start_app"}} {
			if out, err := r.ctl(t, i, args...); err != nil {
				t.Fatalf("%s %v: %v\n%s", r.node(i), args, err, out)
			}
		}
	}
	declareStreamRetry(t, r.urls()[0], "chaos.stream", amqp.Table{"x-initial-cluster-size": int64(3)}, 60*time.Second)
	r.leader(t, -1)
	res := runStreamChaos(t, r, "chaos.stream")
	t.Logf("RabbitMQ: %d published, %d confirmed, %d lost, longest confirm stall %v, failover %v",
		res.published, res.confirmed, res.lost, res.longestStall.Round(time.Millisecond), res.failover.Round(time.Millisecond))
}
