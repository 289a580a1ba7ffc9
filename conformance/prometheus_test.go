package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	streamamqp "github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"warren/server/netserve"
)

// TestPrometheusServerScrapesWarren runs Debian's real Prometheus server (package prometheus)
// against the built broker and queries, through Prometheus's HTTP API, the series RabbitMQ's
// Grafana dashboards use, joined on rabbitmq_identity_info as every RabbitMQ-Overview panel
// does. promtool (same package) must accept both endpoints' expositions.
func TestPrometheusServerScrapesWarren(t *testing.T) {
	if testEnv.bin == "" {
		t.Skipf("needs its own warren process; %s is set", envAddr)
	}
	promBin, err := exec.LookPath("prometheus")
	promtool, err2 := exec.LookPath("promtool")
	if err != nil || err2 != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no prometheus or promtool on PATH; .ci/run installs Debian's prometheus")
		}
		t.Skip("no prometheus or promtool on PATH (Debian: apt-get install prometheus)")
	}
	port, err := netserve.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	exporter := fmt.Sprintf("127.0.0.1:%d", port)
	sport, err := netserve.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	b, err := launchBroker(testEnv.bin, t.TempDir(), "--prometheus-listen", exporter,
		"--stream-listen", fmt.Sprintf("127.0.0.1:%d", sport))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.stop(); err != nil {
			t.Errorf("stop broker: %v", err)
		}
	})

	// Traffic: three confirmed publishes into a queue, and the connection stays open.
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("prom.q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		dc, err := ch.PublishWithDeferredConfirm("", "prom.q", false, false, amqp.Publishing{Body: []byte("m")})
		if err != nil || !dc.Wait() {
			t.Fatalf("publish: %v", err)
		}
	}
	promTraffic(t, conn, b, fmt.Sprintf("127.0.0.1:%d", sport))

	for _, path := range []string{"/metrics", "/metrics/per-object"} {
		resp, err := http.Get("http://" + exporter + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics %s: %v\n%s", path, err, out)
		}
	}

	// Prometheus scraping both endpoints every second.
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: warren
    static_configs: [{targets: [%q]}]
  - job_name: warren-per-object
    metrics_path: /metrics/per-object
    static_configs: [{targets: [%q]}]
`, exporter, exporter)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	pport, err := netserve.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	promAddr := fmt.Sprintf("127.0.0.1:%d", pport)
	var promOut syncBuffer
	prom := exec.Command(promBin, "--config.file", filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path", filepath.Join(dir, "data"), "--web.listen-address", promAddr)
	prom.Stdout, prom.Stderr = &promOut, &promOut
	if err := startChild(prom); err != nil {
		t.Fatal(err)
	}
	promDone := make(chan error, 1)
	go func() { promDone <- prom.Wait() }()
	t.Cleanup(func() {
		_ = prom.Process.Kill()
		<-promDone
	})

	// query polls Prometheus until expr has a result whose value is want (and, if label is
	// set, whose series carries it), bounded.
	query := func(expr, want, label string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		last := ""
		for {
			select {
			case err := <-promDone:
				t.Fatalf("prometheus exited: %v\n%s", err, promOut.String())
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+promAddr+"/api/v1/query?query="+url.QueryEscape(expr), nil)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				var ans struct {
					Status string
					Data   struct {
						Result []struct {
							Metric map[string]string
							Value  [2]any
						}
					}
				}
				err = json.NewDecoder(resp.Body).Decode(&ans)
				resp.Body.Close()
				if err == nil && len(ans.Data.Result) > 0 {
					r := ans.Data.Result[0]
					last = fmt.Sprintf("%v %v", r.Metric, r.Value[1])
					if fmt.Sprint(r.Value[1]) == want && (label == "" || r.Metric[label] != "") {
						cancel()
						return
					}
				} else if err == nil {
					last = "no result"
				}
			}
			cancel()
			if time.Now().After(deadline) {
				t.Fatalf("Prometheus query %s: want %s, last answer %s (err %v)\n%s", expr, want, last, err, promOut.String())
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	query(`up{job="warren"}`, "1", "")
	query(`up{job="warren-per-object"}`, "1", "")
	query(`rabbitmq_connections{job="warren"}`, "1", "")
	// Every family issue 15 lists, with what promTraffic did.
	const agg, per = `job="warren"`, `job="warren-per-object"`
	queries := []struct{ expr, want string }{
		{`rabbitmq_connections{` + agg + `}`, "1"},
		{`rabbitmq_channels{` + agg + `}`, "4"},
		{`rabbitmq_queues{` + agg + `}`, "5"},
		{`rabbitmq_consumers{` + agg + `} >= bool 2`, "1"}, // prom.idle's, prom.s's (and the group's reader)
		{`rabbitmq_queue_messages_ready{` + per + `,vhost="/",queue="prom.q"}`, "2"},
		{`rabbitmq_queue_messages_unacked{` + per + `,vhost="/",queue="prom.q"}`, "0"},
		{`rabbitmq_queue_consumers{` + per + `,vhost="/",queue="prom.idle"}`, "1"},
		{`rabbitmq_queue_messages_published_total{` + per + `,vhost="/",queue="prom.q"}`, "3"},
		{`rabbitmq_global_messages_received_total{` + agg + `,protocol="amqp091"}`, "11"}, // 3 + 1 unroutable + 2 quorum + 5 stream
		{`rabbitmq_global_messages_received_confirm_total{` + agg + `,protocol="amqp091"}`, "11"},
		{`rabbitmq_global_messages_confirmed_total{` + agg + `,protocol="amqp091"}`, "11"},
		{`rabbitmq_global_messages_routed_total{` + agg + `,protocol="amqp091"}`, "10"},
		{`rabbitmq_global_messages_unroutable_dropped_total{` + agg + `,protocol="amqp091"}`, "1"},
		{`rabbitmq_global_messages_delivered_total{` + agg + `,protocol="amqp091"} >= bool 2`, "1"},
		{`rabbitmq_global_messages_acknowledged_total{` + agg + `,protocol="amqp091"} >= bool 1`, "1"},
		{`rabbitmq_global_messages_received_total{` + agg + `,protocol="stream"}`, "4"},
		{`rabbitmq_global_messages_confirmed_total{` + agg + `,protocol="stream"}`, "4"},
		{`rabbitmq_global_messages_dead_lettered_rejected_total{` + agg + `}`, "1"},
		{`rabbitmq_global_messages_dead_lettered_confirmed_total{` + agg + `}`, "1"},
		{`rabbitmq_global_messages_dead_lettered_expired_total{` + agg + `}`, "0"},
		{`rabbitmq_global_messages_dead_lettered_maxlen_total{` + agg + `}`, "0"},
		{`rabbitmq_global_messages_dead_lettered_delivery_limit_total{` + agg + `}`, "0"},
		{`rabbitmq_process_resident_memory_bytes{` + agg + `} > bool 0`, "1"},
		{`rabbitmq_disk_space_available_bytes{` + agg + `} > bool 0`, "1"},
		{`rabbitmq_alarms_memory_used_watermark{` + agg + `}`, "0"},
		{`rabbitmq_alarms_free_disk_space_watermark{` + agg + `}`, "0"},
		{`rabbitmq_raft_term_total{` + per + `,vhost="/",queue="prom.qq"} >= bool 1`, "1"},
		{`rabbitmq_raft_log_commit_index{` + per + `,vhost="/",queue="prom.qq"} >= bool 2`, "1"},
		{`rabbitmq_raft_log_last_applied_index{` + per + `,vhost="/",queue="prom.qq"} >= bool 2`, "1"},
		{`rabbitmq_raft_entry_commit_latency_seconds{` + per + `,vhost="/",queue="prom.qq"} > bool 0`, "1"},
		{`rabbitmq_auth_attempts_failed_total{` + agg + `,protocol="amqp091"}`, "1"},
		{`rabbitmq_auth_attempts_succeeded_total{` + agg + `,protocol="stream"} >= bool 1`, "1"},
		{`rabbitmq_auth_attempts_total{` + agg + `,protocol="amqp091"} >= bool 2`, "1"},
		// prom.s has 9 records (offsets 0-8): 5 from AMQP, 4 from the stream protocol.
		{`warren_stream_consumer_lag{` + per + `,vhost="/",queue="prom.s",consumer="live"}`, "7"}, // next offset 2 (prefetch 2)
		{`warren_stream_offset_lag{` + per + `,vhost="/",queue="prom.s",reference="ref1"}`, "7"},  // 8 - 1
		{`warren_stream_group_committed_offset{` + per + `,vhost="/",queue="prom.s",group="g1"}`, "1"},
		{`warren_stream_group_lag{` + per + `,vhost="/",queue="prom.s",group="g1"}`, "7"},
		{`warren_storage_commits_total{` + agg + `} > bool 0`, "1"},
		{`warren_storage_transactions_total{` + agg + `} > bool 0`, "1"},
		{`warren_storage_commit_round_seconds_count{` + agg + `} > bool 0`, "1"},
		{`histogram_quantile(0.99, warren_storage_commit_round_seconds_bucket{` + agg + `}) > bool 0`, "1"},
		{`warren_storage_commit_round_batches_count{` + agg + `} > bool 0`, "1"},
		{`warren_storage_commit_round_batches_sum{` + agg + `} >= bool on() warren_storage_commit_round_batches_count{` + agg + `}`, "1"},
		// RabbitMQ-Overview's join: every panel multiplies by identity_info to get the node's name.
		{`sum by (rabbitmq_node) (rabbitmq_queue_messages_ready{` + per + `,queue="prom.q"} * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{` + per + `})`, "2"},
		{`count(rabbitmq_build_info{` + agg + `})`, "1"},
	}
	for _, q := range queries {
		label := ""
		if strings.HasPrefix(q.expr, "sum by (rabbitmq_node)") {
			label = "rabbitmq_node"
		}
		query(q.expr, q.want, label)
	}
	if !strings.Contains(promOut.String(), "Server is ready to receive web requests") {
		t.Logf("prometheus output:\n%s", promOut.String())
	}
}

// promTraffic makes what TestPrometheusServerScrapesWarren's queries count, on top of the three
// confirmed publishes into prom.q: one of them got and acked; an unroutable publish; a quorum
// queue prom.qq dead-lettering into prom.dlq (two publishes, one rejected); a consumer on the
// empty prom.idle; a stream prom.s with five AMQP publishes, a live consumer that acks nothing
// (prefetch 2) and a consumer group g1 that acked two; over the stream protocol, four
// publishes into prom.s and a stored offset ref1 at 1; a refused login.
func promTraffic(t *testing.T, conn *amqp.Connection, b *broker, streamAddr string) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	pub := func(exchange, key string) {
		t.Helper()
		dc, err := ch.PublishWithDeferredConfirm(exchange, key, false, false, amqp.Publishing{Body: []byte("m")})
		if err != nil || !dc.Wait() {
			t.Fatalf("publish to %q %q: %v", exchange, key, err)
		}
	}
	getOne := func(q string) amqp.Delivery {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; {
			d, ok, err := ch.Get(q, false)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				return d
			}
			if time.Now().After(deadline) {
				t.Fatalf("nothing to get from %s", q)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := getOne("prom.q").Ack(false); err != nil {
		t.Fatal(err)
	}
	pub("amq.direct", "nowhere")
	for _, d := range []struct {
		name string
		args amqp.Table
	}{
		{"prom.dlq", amqp.Table{"x-queue-type": "quorum"}},
		{"prom.qq", amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "prom.dlq"}},
		{"prom.idle", nil},
		{"prom.s", amqp.Table{"x-queue-type": "stream"}},
	} {
		if _, err := ch.QueueDeclare(d.name, true, false, false, false, d.args); err != nil {
			t.Fatal(err)
		}
	}
	pub("", "prom.qq")
	pub("", "prom.qq")
	if err := getOne("prom.qq").Nack(false, false); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		pub("", "prom.s")
	}
	cch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cch.Consume("prom.idle", "idle", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := cch.Qos(2, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := cch.Consume("prom.s", "live", false, false, false, false, amqp.Table{"x-stream-offset": "first"}); err != nil {
		t.Fatal(err)
	}
	gch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := gch.Qos(2, 0, false); err != nil {
		t.Fatal(err)
	}
	gd, err := gch.Consume("prom.s", "gc", false, false, false, false, amqp.Table{"x-stream-consumer-group": "g1", "x-stream-offset": "first"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		select {
		case d := <-gd:
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("consumer group delivery %d", i)
		}
	}
	if c, err := amqp.Dial("amqp://guest:wrong@" + b.Addr + "/"); err == nil {
		c.Close()
		t.Fatal("a wrong password was accepted")
	}

	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri("rabbitmq-stream://guest:guest@" + streamAddr + "/%2f"))
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	prod, err := env.NewProducer("prom.s", nil)
	if err != nil {
		t.Fatal(err)
	}
	confirms := prod.NotifyPublishConfirmation()
	for i := 0; i < 4; i++ {
		if err := prod.Send(streamamqp.NewMessage([]byte("s"))); err != nil {
			t.Fatal(err)
		}
	}
	for got := 0; got < 4; {
		select {
		case cs := <-confirms:
			got += len(cs)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of 4 stream-protocol publishes confirmed", got)
		}
	}
	if err := prod.Close(); err != nil {
		t.Fatal(err)
	}
	if err := env.StoreOffset("ref1", "prom.s", 1); err != nil {
		t.Fatal(err)
	}
}
