package conformance

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server/netserve"
)

// rabbitmqadminPath is RabbitMQ's own management CLI (the script a RabbitMQ node serves at
// /cli/rabbitmqadmin): $RABBITMQADMIN if set (.ci/run extracts the script from Debian's
// rabbitmq-server package without installing the server), else where that package installs it.
func rabbitmqadminPath() string {
	if p := os.Getenv("RABBITMQADMIN"); p != "" {
		return p
	}
	return "/usr/bin/rabbitmqadmin"
}

// needRabbitmqadmin skips the test when rabbitmqadmin is missing, or fails it with CI=true
// (.ci/run provides it).
func needRabbitmqadmin(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(rabbitmqadminPath()); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("rabbitmqadmin is not installed at %s (RABBITMQADMIN); .ci/run extracts it from Debian's rabbitmq-server package", rabbitmqadminPath())
		}
		t.Skipf("rabbitmqadmin is not installed at %s (set RABBITMQADMIN)", rabbitmqadminPath())
	}
}

// adminTarget is a broker the rabbitmqadmin suite drives: its management API and AMQP URL.
type adminTarget struct {
	name     string
	httpHost string
	httpPort int
	amqpURL  string
}

// TestRabbitmqadminWarren runs RabbitMQ's rabbitmqadmin against Warren for every command of
// issue 15's list: show overview; list of every object kind; declare and delete exchanges,
// queues of the three types with arguments, bindings to queues and exchanges, vhosts, users,
// permissions and policies; publish, get in each ack mode, purge, close connection, export and
// import. Each step checks what rabbitmqadmin printed.
func TestRabbitmqadminWarren(t *testing.T) {
	needRabbitmqadmin(t)
	if testEnv.bin == "" {
		t.Skipf("needs its own warren process; %s is set", envAddr)
	}
	port, err := netserve.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	b, err := launchBroker(testEnv.bin, t.TempDir(), "--http-listen", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.stop(); err != nil {
			t.Errorf("stop broker: %v", err)
		}
		if t.Failed() {
			t.Logf("broker log (last 8 KB):\n%s", tail(b.logs(), 8192))
		}
	})
	runAdminSuite(t, adminTarget{name: "Warren", httpHost: "127.0.0.1", httpPort: port, amqpURL: b.URL})
}

// TestRabbitmqadminRabbitMQ runs the same suite against the reference RabbitMQ 3.10
// (../shared/tools/rabbitmq.sh start: management on 15682, AMQP on 5682), so the suite's
// expectations are RabbitMQ's. It skips when that broker is not running.
func TestRabbitmqadminRabbitMQ(t *testing.T) {
	needRabbitmqadmin(t)
	nc, err := net.DialTimeout("tcp", "127.0.0.1:15682", time.Second)
	if err != nil {
		t.Skip("the reference RabbitMQ is not running (management port 15682)")
	}
	nc.Close()
	runAdminSuite(t, adminTarget{name: "RabbitMQ", httpHost: "127.0.0.1", httpPort: 15682, amqpURL: "amqp://guest:guest@127.0.0.1:5682/"})
}

// adminStep is one rabbitmqadmin command and the check of its output.
type adminStep struct {
	args []string
	// check returns "" when the output is right; it may be retried for a while when poll is
	// set (RabbitMQ's statistics arrive every 5 s).
	check func(out string) string
	poll  bool
}

func runAdminSuite(t *testing.T, tg adminTarget) {
	var rb [4]byte
	rand.Read(rb[:])
	p := "adm-" + hex.EncodeToString(rb[:]) + "-"
	dir := t.TempDir()
	export := filepath.Join(dir, "defs.json")

	drv := startAdminDriver(t)
	run := func(args ...string) (string, error) {
		full := append([]string{"-H", tg.httpHost, "-P", strconv.Itoa(tg.httpPort), "-u", "guest", "-p", "guest"}, args...)
		return drv.run(full)
	}
	// jsonList parses rabbitmqadmin -f raw_json output.
	jsonList := func(out string) []map[string]any {
		var l []map[string]any
		_ = json.Unmarshal([]byte(strings.TrimSpace(out)), &l)
		return l
	}
	find := func(l []map[string]any, key, val string) map[string]any {
		for _, m := range l {
			if fmt.Sprint(m[key]) == val {
				return m
			}
		}
		return nil
	}
	contains := func(want string) func(string) string {
		return func(out string) string {
			if !strings.Contains(out, want) {
				return fmt.Sprintf("output lacks %q", want)
			}
			return ""
		}
	}
	listHas := func(key, val string) func(string) string {
		return func(out string) string {
			if find(jsonList(out), key, val) == nil {
				return fmt.Sprintf("no item with %s=%s", key, val)
			}
			return ""
		}
	}
	isList := func(out string) string {
		if !strings.HasPrefix(strings.TrimSpace(out), "[") {
			return "not a JSON list"
		}
		return ""
	}
	queueField := func(name, field string, want float64, atLeast bool) func(string) string {
		return func(out string) string {
			q := find(jsonList(out), "name", name)
			if q == nil {
				return "queue " + name + " not listed"
			}
			var cur any = q
			for _, k := range strings.Split(field, ".") {
				m, _ := cur.(map[string]any)
				cur = m[k]
			}
			f, ok := cur.(float64)
			if !ok || (!atLeast && f != want) || (atLeast && f < want) {
				return fmt.Sprintf("queue %s: %s = %v, want %v", name, field, cur, want)
			}
			return ""
		}
	}

	// A client connection with a consumer, for connections, channels, consumers and close.
	conn, err := amqp.Dial(tg.amqpURL)
	if err != nil {
		t.Fatalf("dial %s: %v", tg.amqpURL, err)
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))

	var connName string
	steps := []adminStep{
		{args: []string{"show", "overview"}, check: contains("rabbitmq_version")},
		{args: []string{"declare", "queue", "name=" + p + "classic", "durable=true"}, check: contains("queue declared")},
		{args: []string{"declare", "queue", "name=" + p + "quorum", "queue_type=quorum"}, check: contains("queue declared")},
		{args: []string{"declare", "queue", "name=" + p + "stream", "queue_type=stream"}, check: contains("queue declared")},
		{args: []string{"declare", "queue", "name=" + p + "args", "durable=false", `arguments={"x-max-length":10,"x-message-ttl":60000}`}, check: contains("queue declared")},
		{args: []string{"-f", "raw_json", "list", "queues"}, check: func(out string) string {
			l := jsonList(out)
			for name, typ := range map[string]string{p + "classic": "classic", p + "quorum": "quorum", p + "stream": "stream"} {
				q := find(l, "name", name)
				if q == nil || q["type"] != typ {
					return fmt.Sprintf("queue %s: %v, want type %s", name, q, typ)
				}
			}
			q := find(l, "name", p+"args")
			if q == nil {
				return "args queue missing"
			}
			if a, _ := q["arguments"].(map[string]any); a["x-max-length"] != float64(10) {
				return fmt.Sprintf("args queue arguments = %v", q["arguments"])
			}
			return ""
		}},
		{args: []string{"declare", "exchange", "name=" + p + "topic", "type=topic"}, check: contains("exchange declared")},
		{args: []string{"declare", "exchange", "name=" + p + "fanout", "type=fanout", "durable=false"}, check: contains("exchange declared")},
		{args: []string{"declare", "binding", "source=" + p + "topic", "destination=" + p + "classic", "routing_key=k.*"}, check: contains("binding declared")},
		{args: []string{"declare", "binding", "source=" + p + "topic", "destination=" + p + "fanout", "destination_type=exchange", "routing_key=e.#"}, check: contains("binding declared")},
		{args: []string{"declare", "binding", "source=" + p + "fanout", "destination=" + p + "quorum"}, check: contains("binding declared")},
		{args: []string{"-f", "raw_json", "list", "exchanges"}, check: func(out string) string {
			x := find(jsonList(out), "name", p+"topic")
			if x == nil || x["type"] != "topic" || x["durable"] != true {
				return fmt.Sprintf("topic exchange = %v", x)
			}
			return ""
		}},
		{args: []string{"-f", "raw_json", "list", "bindings"}, check: func(out string) string {
			l := jsonList(out)
			for _, want := range [][3]string{{p + "topic", p + "classic", "k.*"}, {p + "topic", p + "fanout", "e.#"}, {"", p + "classic", p + "classic"}} {
				ok := false
				for _, b := range l {
					if b["source"] == want[0] && b["destination"] == want[1] && b["routing_key"] == want[2] {
						ok = true
					}
				}
				if !ok {
					return fmt.Sprintf("binding %v missing", want)
				}
			}
			return ""
		}},
		{args: []string{"publish", "exchange=" + p + "topic", "routing_key=k.1", "payload=hello"}, check: contains("Message published")},
		{args: []string{"publish", "exchange=" + p + "topic", "routing_key=e.1", "payload=to-quorum"}, check: contains("Message published")},
		{args: []string{"publish", "routing_key=" + p + "classic", "payload=second"}, check: contains("Message published")},
		{args: []string{"publish", "exchange=" + p + "topic", "routing_key=nowhere", "payload=x"}, check: contains("NOT routed")},
		{args: []string{"publish", "routing_key=" + p + "stream", "payload=s1"}, check: contains("Message published")},
		{args: []string{"-f", "raw_json", "list", "queues"}, poll: true, check: func(out string) string {
			for _, c := range []func(string) string{
				queueField(p+"classic", "messages", 2, false), queueField(p+"quorum", "messages", 1, false),
				queueField(p+"classic", "message_stats.publish", 2, true), queueField(p+"stream", "messages", 1, false),
			} {
				if r := c(out); r != "" {
					return r
				}
			}
			return ""
		}},
		{args: []string{"-f", "raw_json", "get", "queue=" + p + "classic", "ackmode=ack_requeue_true"}, check: func(out string) string {
			m := jsonList(out)
			if len(m) != 1 || m[0]["payload"] != "hello" || m[0]["redelivered"] != false {
				return fmt.Sprintf("get = %v", m)
			}
			return ""
		}},
		{args: []string{"-f", "raw_json", "get", "queue=" + p + "classic", "ackmode=reject_requeue_true"}, check: func(out string) string {
			m := jsonList(out)
			if len(m) != 1 || m[0]["payload"] != "hello" || m[0]["redelivered"] != true {
				return fmt.Sprintf("get = %v", m)
			}
			return ""
		}},
		{args: []string{"-f", "raw_json", "get", "queue=" + p + "classic", "ackmode=ack_requeue_false", "count=5"}, check: func(out string) string {
			m := jsonList(out)
			if len(m) != 2 || m[0]["payload"] != "hello" || m[1]["payload"] != "second" {
				return fmt.Sprintf("get = %v", m)
			}
			return ""
		}},
		{args: []string{"-f", "raw_json", "list", "queues"}, poll: true, check: queueField(p+"classic", "messages", 0, false)},
		{args: []string{"-f", "raw_json", "get", "queue=" + p + "quorum", "ackmode=reject_requeue_false"}, check: func(out string) string {
			m := jsonList(out)
			if len(m) != 1 || m[0]["payload"] != "to-quorum" {
				return fmt.Sprintf("get = %v", m)
			}
			return ""
		}},
		{args: []string{"publish", "routing_key=" + p + "classic", "payload=purge-me"}, check: contains("Message published")},
		{args: []string{"purge", "queue", "name=" + p + "classic"}, check: contains("queue purged")},
		{args: []string{"-f", "raw_json", "list", "queues"}, poll: true, check: queueField(p+"classic", "messages", 0, false)},
		{args: []string{"declare", "vhost", "name=" + p + "vh"}, check: contains("vhost declared")},
		{args: []string{"-f", "raw_json", "list", "vhosts"}, check: listHas("name", p+"vh")},
		{args: []string{"declare", "user", "name=" + p + "user", "password=secret", "tags=monitoring"}, check: contains("user declared")},
		{args: []string{"-f", "raw_json", "list", "users"}, check: listHas("name", p+"user")},
		{args: []string{"declare", "permission", "vhost=" + p + "vh", "user=" + p + "user", "configure=^x", "write=.*", "read=.*"}, check: contains("permission declared")},
		{args: []string{"-f", "raw_json", "list", "permissions"}, check: func(out string) string {
			for _, m := range jsonList(out) {
				if m["user"] == p+"user" && m["vhost"] == p+"vh" && m["configure"] == "^x" {
					return ""
				}
			}
			return "permission not listed"
		}},
		{args: []string{"declare", "policy", "name=" + p + "pol", "pattern=^" + p + "classic$", `definition={"max-length":100}`, "apply-to=queues"}, check: contains("policy declared")},
		{args: []string{"-f", "raw_json", "list", "policies"}, check: listHas("name", p+"pol")},
		{args: []string{"-f", "raw_json", "list", "operator_policies"}, check: isList},
		{args: []string{"-f", "raw_json", "list", "parameters"}, check: isList},
		{args: []string{"-f", "raw_json", "list", "vhost_limits"}, check: isList},
		{args: []string{"-f", "raw_json", "list", "nodes"}, check: func(out string) string {
			l := jsonList(out)
			if len(l) == 0 || l[0]["name"] == nil || l[0]["mem_used"] == nil {
				return fmt.Sprintf("nodes = %v", l)
			}
			return ""
		}},
		{args: []string{"list", "nodes"}, check: contains("mem_used")},
		{args: []string{"-f", "raw_json", "list", "connections"}, poll: true, check: func(out string) string {
			local := ""
			for _, c := range jsonList(out) {
				if c["user"] == "guest" && fmt.Sprint(c["peer_port"]) == strconv.Itoa(conn.LocalAddr().(*net.TCPAddr).Port) {
					local, _ = c["name"].(string)
				}
			}
			if local == "" {
				return "our connection is not listed"
			}
			connName = local
			return ""
		}},
		{args: []string{"-f", "raw_json", "list", "channels"}, poll: true, check: func(out string) string {
			for _, c := range jsonList(out) {
				if cd, _ := c["connection_details"].(map[string]any); cd != nil && cd["name"] == connName {
					return ""
				}
			}
			return "our channel is not listed"
		}},
		{args: []string{"-f", "raw_json", "list", "consumers"}, poll: true, check: func(out string) string {
			for _, c := range jsonList(out) {
				if q, _ := c["queue"].(map[string]any); q != nil && q["name"] == p+"classic" && c["ack_required"] == true {
					return ""
				}
			}
			return "our consumer is not listed"
		}},
		{args: []string{"list", "connections"}, check: contains("guest")},
		{args: nil}, // close connection: its name is known only now (filled in below)
		{args: []string{"export", export}, check: contains("Exported definitions")},
		{args: []string{"import", export}, check: contains("Uploaded definitions")},
		{args: []string{"delete", "binding", "source=" + p + "topic", "destination_type=queue", "destination=" + p + "classic", "properties_key=k.*"}, check: contains("binding deleted")},
		{args: []string{"-f", "raw_json", "list", "bindings"}, check: func(out string) string {
			for _, b := range jsonList(out) {
				if b["source"] == p+"topic" && b["destination"] == p+"classic" {
					return "the deleted binding is still listed"
				}
			}
			return ""
		}},
		{args: []string{"delete", "binding", "source=" + p + "topic", "destination_type=exchange", "destination=" + p + "fanout", "properties_key=e.#"}, check: contains("binding deleted")},
		{args: []string{"delete", "policy", "name=" + p + "pol"}, check: contains("policy deleted")},
		{args: []string{"delete", "permission", "vhost=" + p + "vh", "user=" + p + "user"}, check: contains("permission deleted")},
		{args: []string{"delete", "user", "name=" + p + "user"}, check: contains("user deleted")},
		{args: []string{"delete", "vhost", "name=" + p + "vh"}, check: contains("vhost deleted")},
		{args: []string{"delete", "exchange", "name=" + p + "fanout"}, check: contains("exchange deleted")},
		{args: []string{"delete", "exchange", "name=" + p + "topic"}, check: contains("exchange deleted")},
		{args: []string{"delete", "queue", "name=" + p + "classic"}, check: contains("queue deleted")},
		{args: []string{"delete", "queue", "name=" + p + "quorum"}, check: contains("queue deleted")},
		{args: []string{"delete", "queue", "name=" + p + "stream"}, check: contains("queue deleted")},
		{args: []string{"delete", "queue", "name=" + p + "args"}, check: contains("queue deleted")},
		{args: []string{"-f", "raw_json", "list", "queues"}, check: func(out string) string {
			if strings.Contains(out, p) {
				return "deleted queues are still listed"
			}
			return ""
		}},
	}
	t.Cleanup(func() {
		for _, q := range []string{"classic", "quorum", "stream", "args"} {
			run("delete", "queue", "name="+p+q)
		}
		for _, x := range []string{"topic", "fanout"} {
			run("delete", "exchange", "name="+p+x)
		}
		run("delete", "policy", "name="+p+"pol")
		run("delete", "user", "name="+p+"user")
		run("delete", "vhost", "name="+p+"vh")
	})

	passed, total := 0, 0
	for _, st := range steps {
		if st.args == nil {
			// The consumer is opened once the queues exist; the close comes after the listings.
			st = adminStep{args: []string{"close", "connection", "name=" + connName}, check: func(out string) string {
				if !strings.Contains(out, "connection closed") {
					return "output lacks \"connection closed\""
				}
				select {
				case e := <-closed:
					if e == nil || e.Code != amqp.ConnectionForced {
						return fmt.Sprintf("the client saw %v, want 320 CONNECTION_FORCED", e)
					}
				case <-time.After(10 * time.Second):
					return "the client's connection was not closed"
				}
				return ""
			}}
		}
		if len(st.args) >= 3 && st.args[0] == "-f" && st.args[2] == "list" && st.args[3] == "connections" {
			// Now the queues exist: attach the consumer the listings look for.
			ch, err := conn.Channel()
			if err != nil {
				t.Fatalf("channel: %v", err)
			}
			if _, err := ch.Consume(p+"classic", "", false, false, false, false, nil); err != nil {
				t.Fatalf("consume: %v", err)
			}
		}
		total++
		deadline := time.Now().Add(20 * time.Second)
		var out, problem string
		for {
			o, err := run(st.args...)
			out = o
			problem = ""
			if err != nil {
				problem = fmt.Sprintf("exit status: %v", err)
			} else {
				problem = st.check(o)
			}
			if problem == "" || !st.poll || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if problem != "" {
			t.Errorf("%s: rabbitmqadmin %s: %s\noutput:\n%s", tg.name, strings.Join(st.args, " "), problem, tail(out, 2048))
			continue
		}
		passed++
	}
	t.Logf("%s: %d of %d rabbitmqadmin commands passed", tg.name, passed, total)
}

// adminDriverPy runs rabbitmqadmin's own code once per line of JSON arguments on stdin, in one
// Python process: the shared machine makes each interpreter start cost seconds, and the script
// re-executed per command behaves as a fresh process would (its module state is rebuilt).
const adminDriverPy = `
import sys, io, json, contextlib, traceback
path = sys.argv[1]
code = compile(open(path).read(), path, 'exec')
for line in sys.stdin:
    argv = json.loads(line)
    out = io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            ns = {'__name__': 'rabbitmqadmin', '__file__': path}
            exec(code, ns)
            sys.argv = [path] + argv
            ns['main']()
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            status = 1
    sys.stdout.write(json.dumps({"status": status, "output": out.getvalue()}) + "\n")
    sys.stdout.flush()
`

// adminDriver is a running adminDriverPy.
type adminDriver struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startAdminDriver(t *testing.T) *adminDriver {
	t.Helper()
	cmd := exec.Command("python3", "-c", adminDriverPy, rabbitmqadminPath())
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := startChild(cmd); err != nil {
		t.Skipf("cannot run python3: %v", err)
	}
	d := &adminDriver{cmd: cmd, in: in, out: bufio.NewReader(outp)}
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return d
}

// run executes one rabbitmqadmin command line and returns what it printed; a non-zero exit
// status is an error.
func (d *adminDriver) run(args []string) (string, error) {
	line, _ := json.Marshal(args)
	if _, err := d.in.Write(append(line, '\n')); err != nil {
		return "", fmt.Errorf("rabbitmqadmin driver: %w", err)
	}
	type result struct {
		Status int    `json:"status"`
		Output string `json:"output"`
	}
	done := make(chan result, 1)
	go func() {
		var r result
		l, err := d.out.ReadBytes('\n')
		if err != nil || json.Unmarshal(l, &r) != nil {
			r = result{Status: -1, Output: "driver: " + fmt.Sprint(err)}
		}
		done <- r
	}()
	select {
	case r := <-done:
		if r.Status != 0 {
			return r.Output, fmt.Errorf("exit status %d", r.Status)
		}
		return r.Output, nil
	case <-time.After(60 * time.Second):
		d.cmd.Process.Kill()
		return "", fmt.Errorf("rabbitmqadmin did not answer within 60 s")
	}
}
