package metrics_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"warren/server"
	"warren/server/metrics"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// rabbitmq-stream-go-client's own background goroutines outlive Environment.Close briefly.
		goleak.IgnoreAnyFunction("github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream.(*Client).heartBeat.func1"),
		goleak.IgnoreAnyFunction("github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream.(*Client).handleResponse"),
	)
}

// broker is a Warren in this process with its AMQP listener and exporter on loopback ports the
// kernel picks.
type broker struct {
	srv     *server.Server
	amqpURL string
	prom    string // http://127.0.0.1:PORT
}

func startBroker(t *testing.T) *broker {
	t.Helper()
	return startBrokerConfig(t, nil)
}

// startBrokerConfig is startBroker with the configuration adjusted by edit (nil: none).
func startBrokerConfig(t *testing.T, edit func(*server.Config)) *broker {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	if edit != nil {
		edit(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	l, err := metrics.Listen("127.0.0.1:0", srv, metrics.Options{Version: "test"})
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
	return &broker{srv: srv, amqpURL: "amqp://guest:guest@" + srv.Addr().String() + "/", prom: "http://" + l.Addr().String()}
}

// scrape fetches path and parses it with Prometheus's own text parser, which fails on anything
// a Prometheus server would refuse.
func (b *broker) scrape(t *testing.T, path string) map[string]*dto.MetricFamily {
	t.Helper()
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(b.prom + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("GET %s: Content-Type %q, want the text format", path, ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: not valid Prometheus text: %v", path, err)
	}
	return fams
}

// value is the value of the series of family name whose labels include want (nil: the only
// series); ok is false when there is none.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		match := true
		for k, v := range want {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			match = match && found
		}
		if !match {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

func mustValue(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := value(fams, name, labels)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// waitFor polls path until cond holds on its parse (bounded), and returns the last parse.
func (b *broker) waitFor(t *testing.T, path string, what string, cond func(map[string]*dto.MetricFamily) bool) map[string]*dto.MetricFamily {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		fams := b.scrape(t, path)
		if cond(fams) {
			return fams
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen on %s within 10s", what, path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGaugesFollowTraffic publishes and consumes over AMQP and checks what an operator's
// Prometheus would see: connection, channel, queue and consumer counts, queue depths, per-queue
// labels only on /metrics/per-object, and the identity and build info dashboards join on.
func TestGaugesFollowTraffic(t *testing.T) {
	b := startBroker(t)
	before := b.scrape(t, "/metrics")
	if got := mustValue(t, before, "rabbitmq_connections", nil); got != 0 {
		t.Fatalf("rabbitmq_connections = %v before any client, want 0", got)
	}

	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ch2, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"m.a", "m.b"} {
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		for _, q := range []string{"m.a", "m.b"} {
			dc, err := ch.PublishWithDeferredConfirm("", q, false, false, amqp.Publishing{Body: []byte("hello")})
			if err != nil {
				t.Fatal(err)
			}
			if !dc.Wait() {
				t.Fatal("publish nacked")
			}
		}
	}
	// One consumer on m.b holding 2 unacknowledged deliveries.
	if err := ch2.Qos(2, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch2.Consume("m.b", "c1", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	// The queue counts a delivery as unacked before the channel's delivery goroutine counts it as
	// delivered: wait for both.
	agg := b.waitFor(t, "/metrics", "2 unacked on m.b, 2 delivered", func(f map[string]*dto.MetricFamily) bool {
		v, _ := value(f, "rabbitmq_queue_messages_unacked", nil)
		d, _ := value(f, "rabbitmq_global_messages_delivered_total", map[string]string{"protocol": "amqp091"})
		return v == 2 && d == 2
	})
	for name, want := range map[string]float64{
		"rabbitmq_connections":                1,
		"rabbitmq_channels":                   2,
		"rabbitmq_queues":                     2,
		"rabbitmq_consumers":                  1,
		"rabbitmq_queue_messages_ready":       8,
		"rabbitmq_queue_messages":             10,
		"rabbitmq_queue_consumers":            1,
		"rabbitmq_queue_messages_ready_bytes": 8 * 5,
		"rabbitmq_connection_channels":        2,
	} {
		if got := mustValue(t, agg, name, nil); got != want {
			t.Errorf("/metrics %s = %v, want %v", name, got, want)
		}
	}
	// The aggregated endpoint carries no per-object labels.
	for _, name := range []string{"rabbitmq_queue_messages_ready", "rabbitmq_connection_channels", "rabbitmq_raft_term_total"} {
		for _, m := range agg[name].GetMetric() {
			if len(m.GetLabel()) != 0 {
				t.Errorf("/metrics %s has labels %v; want none", name, m.GetLabel())
			}
		}
	}
	if got := mustValue(t, agg, "rabbitmq_identity_info", map[string]string{"rabbitmq_node": b.srv.NodeName()}); got != 1 {
		t.Errorf("rabbitmq_identity_info = %v", got)
	}
	if _, ok := value(agg, "rabbitmq_build_info", map[string]string{"rabbitmq_version": "test"}); !ok {
		t.Error("no rabbitmq_build_info{rabbitmq_version=\"test\"}")
	}
	if agg["rabbitmq_identity_info"].GetType() != dto.MetricType_UNTYPED {
		t.Errorf("rabbitmq_identity_info is %v, want untyped as RabbitMQ", agg["rabbitmq_identity_info"].GetType())
	}
	if v := mustValue(t, agg, "rabbitmq_process_resident_memory_bytes", nil); v <= 0 {
		t.Errorf("rabbitmq_process_resident_memory_bytes = %v", v)
	}
	if v := mustValue(t, agg, "rabbitmq_auth_attempts_succeeded_total", map[string]string{"protocol": "amqp091"}); v != 1 {
		t.Errorf("rabbitmq_auth_attempts_succeeded_total{protocol=amqp091} = %v after one AMQP login", v)
	}
	if v := mustValue(t, agg, "rabbitmq_auth_attempts_total", map[string]string{"protocol": "http"}); v != 0 {
		t.Errorf("rabbitmq_auth_attempts_total{protocol=http} = %v without HTTP logins", v)
	}
	if v := mustValue(t, agg, "warren_storage_commits_total", nil); v < 1 {
		t.Errorf("warren_storage_commits_total = %v after declares", v)
	}
	if h := agg["warren_storage_commit_round_batches"]; h.GetType() != dto.MetricType_HISTOGRAM || h.GetMetric()[0].GetHistogram().GetSampleCount() < 1 {
		t.Errorf("warren_storage_commit_round_batches: %v", h)
	}

	per := b.scrape(t, "/metrics/per-object")
	for _, c := range []struct {
		name  string
		queue string
		want  float64
	}{
		{"rabbitmq_queue_messages_ready", "m.a", 5},
		{"rabbitmq_queue_messages_ready", "m.b", 3},
		{"rabbitmq_queue_messages_unacked", "m.a", 0},
		{"rabbitmq_queue_messages_unacked", "m.b", 2},
		{"rabbitmq_queue_consumers", "m.b", 1},
		{"rabbitmq_queue_messages", "m.a", 5},
	} {
		if got := mustValue(t, per, c.name, map[string]string{"vhost": "/", "queue": c.queue}); got != c.want {
			t.Errorf("per-object %s{queue=%q} = %v, want %v", c.name, c.queue, got, c.want)
		}
	}
	connName := conn.LocalAddr().String() + " -> " + b.srv.Addr().String()
	if got := mustValue(t, per, "rabbitmq_connection_channels", map[string]string{"connection": connName}); got != 2 {
		t.Errorf("rabbitmq_connection_channels{connection=%q} = %v, want 2", connName, got)
	}
	if got := mustValue(t, per, "rabbitmq_connections", nil); got != 1 {
		t.Errorf("per-object rabbitmq_connections = %v, want 1", got)
	}

	// Message counters, as RabbitMQ's global counters (protocol amqp091) and per channel and
	// queue on /metrics/per-object.
	amqp091 := map[string]string{"protocol": "amqp091"}
	for name, want := range map[string]float64{
		"rabbitmq_global_messages_received_total":                     10,
		"rabbitmq_global_messages_routed_total":                       10,
		"rabbitmq_global_messages_confirmed_total":                    10,
		"rabbitmq_global_messages_delivered_total":                    2,
		"rabbitmq_global_messages_delivered_consume_manual_ack_total": 2,
		"rabbitmq_global_messages_acknowledged_total":                 0,
	} {
		if got := mustValue(t, agg, name, amqp091); got != want {
			t.Errorf("/metrics %s{protocol=amqp091} = %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string]float64{
		"rabbitmq_connections_opened_total": 1,
		"rabbitmq_channels_opened_total":    2,
		"rabbitmq_queues_created_total":     2,
	} {
		if got := mustValue(t, agg, name, nil); got != want {
			t.Errorf("/metrics %s = %v, want %v", name, got, want)
		}
	}
	chName := connName + " (1)"
	if got := mustValue(t, per, "rabbitmq_channel_messages_published_total", map[string]string{"channel": chName, "vhost": "/"}); got != 10 {
		t.Errorf("rabbitmq_channel_messages_published_total{channel=%q} = %v, want 10", chName, got)
	}
	if got := mustValue(t, per, "rabbitmq_queue_messages_published_total", map[string]string{"queue": "m.a"}); got != 5 {
		t.Errorf("rabbitmq_queue_messages_published_total{queue=m.a} = %v, want 5", got)
	}

	// Acks, an unroutable publish and a dead letter move their counters.
	ch.Close()
	ch3, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch3.Publish("", "nowhere", false, false, amqp.Publishing{Body: []byte("lost")}); err != nil {
		t.Fatal(err)
	}
	if m, ok, err := ch3.Get("m.a", false); err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	} else if err := m.Reject(false); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, "/metrics", "the unroutable publish, the get and the dead letter", func(f map[string]*dto.MetricFamily) bool {
		drop, _ := value(f, "rabbitmq_global_messages_unroutable_dropped_total", amqp091)
		get, _ := value(f, "rabbitmq_global_messages_delivered_get_manual_ack_total", amqp091)
		rej, _ := value(f, "rabbitmq_global_messages_dead_lettered_rejected_total", nil)
		closed, _ := value(f, "rabbitmq_channels_closed_total", nil)
		recv, _ := value(f, "rabbitmq_global_messages_received_total", amqp091)
		return drop == 1 && get == 1 && rej == 1 && closed == 1 && recv == 11
	})

	// Closing the connection shows on the next scrape.
	conn.Close()
	b.waitFor(t, "/metrics", "no connections", func(f map[string]*dto.MetricFamily) bool {
		v, _ := value(f, "rabbitmq_connections", nil)
		c, _ := value(f, "rabbitmq_consumers", nil)
		return v == 0 && c == 0
	})
}

// TestQuorumAndStreamSeries checks the raft series of a quorum queue's group (labelled with its
// queue) and the stream log series Warren adds.
func TestQuorumAndStreamSeries(t *testing.T) {
	b := startBroker(t)
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("m.qq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("m.s", true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		for _, q := range []string{"m.qq", "m.s"} {
			dc, err := ch.PublishWithDeferredConfirm("", q, false, false, amqp.Publishing{Body: []byte("x")})
			if err != nil {
				t.Fatal(err)
			}
			if !dc.Wait() {
				t.Fatal("nacked")
			}
		}
	}
	qq := map[string]string{"vhost": "/", "queue": "m.qq"}
	per := b.waitFor(t, "/metrics/per-object", "stream records", func(f map[string]*dto.MetricFamily) bool {
		v, _ := value(f, "warren_stream_messages", map[string]string{"queue": "m.s"})
		return v == 3
	})
	if got := mustValue(t, per, "rabbitmq_queue_messages_ready", qq); got != 3 {
		t.Errorf("quorum queue ready = %v, want 3", got)
	}
	if got := mustValue(t, per, "rabbitmq_raft_log_last_applied_index", qq); got < 4 {
		t.Errorf("quorum group applied index = %v, want at least 4 (3 enqueues after its start)", got)
	}
	if got := mustValue(t, per, "rabbitmq_raft_term_total", qq); got < 1 {
		t.Errorf("quorum group term = %v", got)
	}
	if got := mustValue(t, per, "rabbitmq_raft_entry_commit_latency_seconds", qq); got <= 0 || got > 10 {
		t.Errorf("quorum group commit latency = %vs after 3 confirmed publishes", got)
	}
	if got := mustValue(t, per, "warren_raft_group_leader", qq); got != 1 {
		t.Errorf("warren_raft_group_leader = %v on a one-node cluster", got)
	}
	if got := mustValue(t, per, "warren_stream_last_offset", map[string]string{"queue": "m.s"}); got != 2 {
		t.Errorf("stream last offset = %v, want 2", got)
	}
	if _, ok := value(per, "rabbitmq_raft_term_total", map[string]string{"queue": ""}); !ok {
		t.Error("no series for the metadata group")
	}
}

// TestNamesMatchRabbitMQ checks every rabbitmq_* family served against RabbitMQ 3.10.8's own
// (testdata/rabbitmq-3.10.8.tsv, captured from its rabbitmq_prometheus): same type and help
// text, so dashboards and alert rules written for RabbitMQ read Warren's the same way.
func TestNamesMatchRabbitMQ(t *testing.T) {
	f, err := os.Open("testdata/rabbitmq-3.10.8.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ref := map[string][2]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), "\t", 3)
		if len(parts) == 3 {
			ref[parts[0]] = [2]string{parts[1], parts[2]}
		}
	}
	typeName := map[prometheus.ValueType]string{prometheus.CounterValue: "counter", prometheus.GaugeValue: "gauge", prometheus.UntypedValue: "untyped"}
	for _, info := range metrics.Catalogue() {
		if !strings.HasPrefix(info.Name, "rabbitmq_") {
			if !strings.HasPrefix(info.Name, "warren_") {
				t.Errorf("%s: neither RabbitMQ's nor warren_", info.Name)
			}
			continue
		}
		r, ok := ref[info.Name]
		if !ok {
			t.Errorf("%s is not a RabbitMQ 3.10.8 metric", info.Name)
			continue
		}
		if got := typeName[info.Type]; got != r[0] {
			t.Errorf("%s: type %s, RabbitMQ's is %s", info.Name, got, r[0])
		}
		if info.Help != r[1] {
			t.Errorf("%s: help %q, RabbitMQ's is %q", info.Name, info.Help, r[1])
		}
	}
	// The names the issue asks for by name are served.
	served := map[string]bool{}
	for _, info := range metrics.Catalogue() {
		served[info.Name] = true
	}
	for _, name := range []string{"rabbitmq_connections", "rabbitmq_channels", "rabbitmq_queues", "rabbitmq_consumers",
		"rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked", "rabbitmq_queue_consumers",
		"rabbitmq_process_resident_memory_bytes", "rabbitmq_disk_space_available_bytes",
		"rabbitmq_identity_info", "rabbitmq_build_info", "rabbitmq_auth_attempts_total"} {
		if !served[name] {
			t.Errorf("%s is not served", name)
		}
	}
}

// TestListenAddressInUse: a taken port is an error that names the address, not a silent
// exporter-less broker.
func TestListenAddressInUse(t *testing.T) {
	b := startBroker(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = metrics.Listen(ln.Addr().String(), b.srv, metrics.Options{})
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Listen on a taken port: %v", err)
	}
}

// TestOnlyMetricsPaths: other paths and methods are not the exporter's.
func TestOnlyMetricsPaths(t *testing.T) {
	b := startBroker(t)
	client := http.Client{Timeout: 10 * time.Second}
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/", http.StatusNotFound},
		{"GET", "/metrics/detailed", http.StatusNotFound},
		{"POST", "/metrics", http.StatusMethodNotAllowed},
	} {
		req, _ := http.NewRequest(c.method, b.prom+c.path, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, c.want)
		}
	}
}
