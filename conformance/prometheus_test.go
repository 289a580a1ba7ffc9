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
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	exporter := fmt.Sprintf("127.0.0.1:%d", port)
	b, err := launchBroker(testEnv.bin, t.TempDir(), "--prometheus-listen", exporter)
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
	pport, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	promAddr := fmt.Sprintf("127.0.0.1:%d", pport)
	var promOut syncBuffer
	prom := exec.Command(promBin, "--config.file", filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path", filepath.Join(dir, "data"), "--web.listen-address", promAddr)
	prom.Stdout, prom.Stderr = &promOut, &promOut
	if err := prom.Start(); err != nil {
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
	query(`rabbitmq_queue_messages_ready{job="warren-per-object",vhost="/",queue="prom.q"}`, "3", "")
	query(`rabbitmq_global_messages_received_total{job="warren",protocol="amqp091"}`, "3", "")
	query(`rabbitmq_global_messages_confirmed_total{job="warren",protocol="amqp091"}`, "3", "")
	query(`rabbitmq_queues{job="warren"}`, "1", "")
	// RabbitMQ-Overview's join: every panel multiplies by identity_info to get the node's name.
	query(`sum by (rabbitmq_node) (rabbitmq_queue_messages_ready{job="warren"} * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{job="warren"})`,
		"3", "rabbitmq_node")
	query(`count(rabbitmq_build_info{job="warren"})`, "1", "")
	if !strings.Contains(promOut.String(), "Server is ready to receive web requests") {
		t.Logf("prometheus output:\n%s", promOut.String())
	}
}
