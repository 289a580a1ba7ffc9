package perf

import (
	"context"
	"time"
)

// quorumScenario is S9: S3's durable, confirmed, manually acked load, on one quorum queue with
// one producer and one consumer.
func quorumScenario() benchScenario {
	return benchScenario{
		id: "S9", title: "quorum queue, confirms (window 100), manual ack, 1p/1c, 1 KB",
		detail: "1 producer and 1 consumer on one durable quorum queue (x-queue-type=quorum; on a single node a one-member group), 1,024-byte persistent messages, publisher confirms with at most 100 unconfirmed, manual ack (one per message), prefetch 100, unlimited rate. Consumed msg/s is the headline; confirmed msg/s is the producer's view.",
		metrics: []benchMetric{
			{key: "consume_rate", label: "consumed msg/s", unit: ratesUnit},
			{key: "confirm_rate", label: "confirmed msg/s", unit: ratesUnit},
		},
		bound: func(c BenchConfig) time.Duration { return c.Duration + 90*time.Second },
		run: func(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
			return loadRun(ctx, quorumRunConfig(b.base(t, "S9")))
		},
	}
}

// quorumRunConfig sets S9's load on the scenario's base configuration.
func quorumRunConfig(c RunConfig) RunConfig {
	c.QueueType = "quorum"
	c.Producers, c.Consumers, c.Size, c.QoS = 1, 1, 1024, 100
	c.Persistent, c.Confirm = true, 100
	return c
}
