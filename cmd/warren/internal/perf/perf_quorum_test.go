package perf

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestQuorumScenarioDefinition(t *testing.T) {
	ids := allScenarioIDs()
	if i := slices.Index(ids, "S9"); i < 0 || ids[i-1] != "S8" {
		t.Fatalf("scenario ids %v: want S9 right after S8", ids)
	}
	var sc benchScenario
	for _, s := range benchScenarios() {
		if s.id == "S9" {
			sc = s
		}
	}
	var keys []string
	for _, m := range sc.metrics {
		keys = append(keys, m.key)
	}
	if !slices.Equal(keys, []string{"consume_rate", "confirm_rate"}) {
		t.Errorf("S9 metrics %v, want consume_rate, confirm_rate", keys)
	}
	if got := sc.bound(BenchConfig{Duration: 10 * time.Second}); got <= 10*time.Second {
		t.Errorf("S9 bound %s does not exceed the run's duration", got)
	}
	c := quorumRunConfig(RunConfig{URI: "amqp://x/", QueuePattern: "perf-bench-s9-%d", Duration: time.Second})
	want := RunConfig{URI: "amqp://x/", QueuePattern: "perf-bench-s9-%d", Duration: time.Second,
		QueueType: "quorum", Producers: 1, Consumers: 1, Size: 1024, QoS: 100, Persistent: true, Confirm: 100}
	if c.QueueType != want.QueueType || c.Producers != want.Producers || c.Consumers != want.Consumers ||
		c.Size != want.Size || c.QoS != want.QoS || c.Persistent != want.Persistent || c.Confirm != want.Confirm ||
		c.AutoAck || c.Rate != 0 || c.URI != want.URI || c.QueuePattern != want.QueuePattern || c.Duration != want.Duration {
		t.Errorf("S9 run config %+v, want %+v", c, want)
	}
}

func TestBenchQuorumScenario(t *testing.T) {
	md := benchOne(t, BenchConfig{Scenarios: []string{"S9"}, Duration: 500 * time.Millisecond})
	for _, want := range []string{"S9 quorum queue, confirms (window 100), manual ack, 1p/1c, 1 KB",
		"consumed msg/s", "confirmed msg/s", "x-queue-type=quorum"} {
		if !strings.Contains(md, want) {
			t.Errorf("benchmarks.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "FAILED") || strings.Contains(md, "LOST") {
		t.Errorf("the quorum scenario failed:\n%s", md)
	}
}
