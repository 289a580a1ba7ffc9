package ctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"
	"go.uber.org/goleak"

	"warren/cmd/warren/internal/ctl"
	"warren/server"
	"warren/server/httpapi"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// broker is a Warren in this process with its HTTP API on a port the kernel picks.
type broker struct {
	srv *server.Server
	url string
}

func startBroker(t *testing.T) *broker {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	l, err := httpapi.Listen("127.0.0.1:0", srv, httpapi.Options{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return &broker{srv: srv, url: "http://" + l.Addr().String()}
}

// run runs `warren ctl args...` against b in process and returns its output and exit code.
func (b *broker) run(t *testing.T, stdin string, args ...string) (string, int, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	app := &cli.App{
		Name: "warren", Writer: &out, ErrWriter: &errOut, Reader: strings.NewReader(stdin),
		ExitErrHandler: func(*cli.Context, error) {},
		Commands:       []*cli.Command{ctl.Command()},
	}
	err := app.Run(append([]string{"warren", "ctl"}, append(args, "--url", b.url)...))
	code := 0
	if err != nil {
		code = 1
		var ec cli.ExitCoder
		if errors.As(err, &ec) {
			code = ec.ExitCode()
		}
	}
	return out.String(), code, err
}

// ok runs a command that must succeed and returns its output.
func (b *broker) ok(t *testing.T, args ...string) string {
	t.Helper()
	out, code, err := b.run(t, "", args...)
	if code != 0 {
		t.Fatalf("warren ctl %v: exit %d: %v\n%s", args, code, err, out)
	}
	return out
}

// fails runs a command that must fail with code and returns the error's text.
func (b *broker) fails(t *testing.T, code int, args ...string) string {
	t.Helper()
	out, got, err := b.run(t, "", args...)
	if got != code {
		t.Fatalf("warren ctl %v: exit %d (%v), want %d\n%s", args, got, err, code, out)
	}
	return err.Error()
}

func TestUsersVhostsPermissions(t *testing.T) {
	b := startBroker(t)
	if got := b.ok(t, "add_user", "bob", "s3cret", "--tags", "monitoring"); got != "Adding user \"bob\" ...\n" {
		t.Errorf("add_user printed %q", got)
	}
	if got, want := b.ok(t, "list_users"), "user\ttags\nbob\t[monitoring]\nguest\t[administrator]\n"; got != want {
		t.Errorf("list_users:\n%q\nwant\n%q", got, want)
	}
	b.ok(t, "set_user_tags", "bob", "administrator", "management")
	if got, want := b.ok(t, "list_users", "--no-table-headers"), "bob\t[administrator, management]\nguest\t[administrator]\n"; got != want {
		t.Errorf("list_users after set_user_tags: %q, want %q", got, want)
	}
	// The new password works, the old one does not.
	b.ok(t, "change_password", "bob", "n3w")
	b.ok(t, "list_vhosts", "--username", "bob", "--password", "n3w")
	b.fails(t, ctl.ExitNoPerm, "list_vhosts", "--username", "bob", "--password", "s3cret")

	// As in RabbitMQ, the user who creates a vhost through the API gets full permissions in it.
	b.ok(t, "add_vhost", "v1", "--description", "test vhost")
	if got, want := b.ok(t, "list_vhosts"), "name\n/\nv1\n"; got != want {
		t.Errorf("list_vhosts: %q, want %q", got, want)
	}
	b.ok(t, "set_permissions", "-p", "v1", "bob", "^c", "^w", "^r")
	if got, want := b.ok(t, "list_permissions", "-p", "v1"), "user\tconfigure\twrite\tread\nbob\t^c\t^w\t^r\nguest\t.*\t.*\t.*\n"; got != want {
		t.Errorf("list_permissions -p v1: %q, want %q", got, want)
	}
	if got, want := b.ok(t, "list_user_permissions", "bob"), "vhost\tconfigure\twrite\tread\nv1\t^c\t^w\t^r\n"; got != want {
		t.Errorf("list_user_permissions bob: %q, want %q", got, want)
	}
	b.ok(t, "clear_permissions", "-p", "v1", "bob")
	if got := b.ok(t, "list_permissions", "-p", "v1", "-s"); got != "guest\t.*\t.*\t.*\n" {
		t.Errorf("permissions left after clear_permissions: %q", got)
	}

	// JSON for scripts.
	var users []map[string]any
	if err := json.Unmarshal([]byte(b.ok(t, "list_users", "--formatter", "json")), &users); err != nil || len(users) != 2 || users[0]["user"] != "bob" {
		t.Errorf("list_users --formatter json: %v %v", users, err)
	}

	b.ok(t, "delete_user", "bob")
	b.ok(t, "delete_vhost", "v1")
	if reason := b.fails(t, ctl.ExitSoftware, "delete_user", "bob"); !strings.Contains(reason, "404") {
		t.Errorf("deleting a missing user: %q, want the server's 404", reason)
	}
	b.fails(t, ctl.ExitUsage, "add_user", "onlyname")
	b.fails(t, ctl.ExitUsage, "list_users", "--bogus")
}

func TestQueuesAndPolicies(t *testing.T) {
	b := startBroker(t)
	conn, err := amqp.Dial("amqp://guest:guest@" + b.srv.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("c.q", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		dc, err := ch.PublishWithDeferredConfirm("", "c.q", false, false, amqp.Publishing{Body: []byte("m")})
		if err != nil || !dc.Wait() {
			t.Fatalf("publish: %v", err)
		}
	}
	if got, want := b.ok(t, "list_queues"), "name\tmessages\nc.q\t3\n"; got != want {
		t.Errorf("list_queues: %q, want %q", got, want)
	}
	// Columns by name, options after the arguments as rabbitmqctl allows.
	if got, want := b.ok(t, "list_queues", "name", "type", "durable", "messages_ready", "-p", "/"), "name\ttype\tdurable\tmessages_ready\nc.q\tquorum\ttrue\t3\n"; got != want {
		t.Errorf("list_queues with columns: %q, want %q", got, want)
	}
	if reason := b.fails(t, ctl.ExitUsage, "list_queues", "name", "nonsense"); !strings.Contains(reason, `unknown column "nonsense"`) {
		t.Errorf("unknown column: %q", reason)
	}
	if got := b.ok(t, "list_exchanges", "name", "type"); !strings.Contains(got, "amq.topic\ttopic\n") {
		t.Errorf("list_exchanges: %q", got)
	}

	b.ok(t, "set_policy", "--priority", "5", "--apply-to", "queues", "lim", "^c\\.", `{"max-length": 100}`)
	if got, want := b.ok(t, "list_policies"), "vhost\tname\tpattern\tapply-to\tdefinition\tpriority\n/\tlim\t^c\\.\tqueues\t{\"max-length\":100}\t5\n"; got != want {
		t.Errorf("list_policies: %q, want %q", got, want)
	}
	if got := b.ok(t, "list_queues", "name", "policy"); got != "name\tpolicy\nc.q\tlim\n" {
		t.Errorf("the policy does not show on the queue: %q", got)
	}
	b.ok(t, "clear_policy", "lim")
	if got := b.ok(t, "list_policies", "-s"); got != "" {
		t.Errorf("policies after clear_policy: %q", got)
	}
	b.fails(t, ctl.ExitUsage, "set_policy", "p", "^x", "not json")

	// Bindings, channels, consumers (the ops branch's endpoints).
	if err := ch.ExchangeDeclare("c.x", "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("c.q", "rk", "c.x", false, nil); err != nil {
		t.Fatal(err)
	}
	if got := b.ok(t, "list_bindings", "-s"); !strings.Contains(got, "c.x\texchange\tc.q\tqueue\trk\t{}\n") {
		t.Errorf("list_bindings: %q", got)
	}
	cch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := cch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := cch.Consume("c.q", "ctl-consumer", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := b.ok(t, "list_consumers", "queue_name", "consumer_tag", "ack_required", "prefetch_count", "-s")
		if got == "c.q\tctl-consumer\ttrue\t1\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("list_consumers: %q", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := b.ok(t, "list_channels", "user", "consumer_count", "-s"); !strings.Contains(got, "guest\t1\n") {
		t.Errorf("list_channels: %q", got)
	}
	cch.Close()
	// purge_queue takes the ready messages (the consumer's unacked one came back when its channel closed).
	b.ok(t, "purge_queue", "c.q")
	if got := b.ok(t, "list_queues", "name", "messages", "-s"); got != "c.q\t0\n" {
		t.Errorf("after purge_queue: %q", got)
	}
	if _, err := ch.QueueDeclare("c.gone", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	b.ok(t, "delete_queue", "c.gone", "--if-empty")
	if got := b.ok(t, "list_queues", "-s"); got != "c.q\t0\n" {
		t.Errorf("after delete_queue: %q", got)
	}
	b.fails(t, ctl.ExitSoftware, "delete_queue", "c.gone")

	// Connections: listed and closed with the reason the client sees.
	out := b.ok(t, "list_connections", "name", "user", "state", "-s")
	name, rest, _ := strings.Cut(strings.TrimSuffix(out, "\n"), "\t")
	if rest != "guest\trunning" {
		t.Fatalf("list_connections: %q", out)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	b.ok(t, "close_connection", name, "maintenance window")
	select {
	case e := <-closed:
		if e == nil || e.Code != 320 || !strings.Contains(e.Reason, "maintenance window") {
			t.Errorf("the client saw %v, want 320 with the reason", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("connection not closed")
	}
	if reason := b.fails(t, ctl.ExitSoftware, "close_connection", "no such connection"); !strings.Contains(reason, "404") {
		t.Errorf("closing a missing connection: %q", reason)
	}
}

func TestDefinitionsStatusHealth(t *testing.T) {
	b := startBroker(t)
	b.ok(t, "add_vhost", "exported")
	path := filepath.Join(t.TempDir(), "defs.json")
	b.ok(t, "export_definitions", path)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var defs map[string]any
	if err := json.Unmarshal(data, &defs); err != nil || defs["vhosts"] == nil {
		t.Fatalf("exported definitions: %v %.200s", err, data)
	}
	b.ok(t, "delete_vhost", "exported")
	b.ok(t, "import_definitions", path)
	if got := b.ok(t, "list_vhosts", "-s"); got != "/\nexported\n" {
		t.Errorf("vhosts after import: %q", got)
	}
	// From stdin.
	if _, code, err := b.run(t, `{"vhosts":[{"name":"fromstdin"}]}`, "import_definitions", "-"); code != 0 {
		t.Fatalf("import_definitions -: %d %v", code, err)
	}
	if got := b.ok(t, "list_vhosts", "-s"); !strings.Contains(got, "fromstdin\n") {
		t.Errorf("vhosts after import from stdin: %q", got)
	}
	if _, code, _ := b.run(t, `{"vhosts": 7}`, "import_definitions", "-"); code != ctl.ExitDataErr {
		t.Errorf("importing bad definitions exited %d, want %d", code, ctl.ExitDataErr)
	}

	if got := b.ok(t, "status"); !strings.Contains(got, "product_name\tWarren\n") || !strings.Contains(got, "object_totals.queues\t0\n") {
		t.Errorf("status:\n%s", got)
	}
	if got := b.ok(t, "cluster_status"); got != "name\ttype\trunning\n"+b.srv.NodeName()+"\tdisc\ttrue\n" {
		t.Errorf("cluster_status: %q", got)
	}
	if got := b.ok(t, "check_alarms"); got != "check_alarms passed: ok\n" {
		t.Errorf("check_alarms: %q", got)
	}
	b.srv.SetResourceLimits(1, 0) // a 1-byte memory limit raises the memory alarm
	if reason := b.fails(t, ctl.ExitUnavailable, "check_alarms"); !strings.Contains(reason, "alarms in effect") {
		t.Errorf("check_alarms with an alarm: %q", reason)
	}
	b.srv.SetResourceLimits(0, 0)
	b.ok(t, "ping")
	b.ok(t, "check_local_alarms")
	b.ok(t, "check_virtual_hosts")
	b.ok(t, "check_if_node_is_quorum_critical")
	b.ok(t, "aliveness_test", "/")
	_, port, _ := net.SplitHostPort(b.srv.Addr().String())
	b.ok(t, "check_port_listener", port)
	b.ok(t, "check_protocol_listener", "amqp")
	if reason := b.fails(t, ctl.ExitUnavailable, "check_protocol_listener", "mqtt"); !strings.Contains(reason, "503") {
		t.Errorf("check_protocol_listener mqtt: %q", reason)
	}
}

// TestUnreachable: no broker is exit 69 with the address named.
func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	b := &broker{url: "http://" + addr}
	if reason := b.fails(t, ctl.ExitUnavailable, "list_queues"); !strings.Contains(reason, addr) {
		t.Errorf("unreachable broker: %q does not name %s", reason, addr)
	}
	b.url = "ftp://x"
	b.fails(t, ctl.ExitUsage, "list_queues")
}
