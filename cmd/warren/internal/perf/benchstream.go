package perf

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// S8's metric keys.
const (
	s8Publish = "stream_publish_rate"
	s8Consume = "stream_consume_rate"
)

// streamScenario is S8: a stream filled with publisher confirms, then read from "first".
func streamScenario() benchScenario {
	return benchScenario{
		id: "S8", title: "stream: 1 KB messages published with confirms, then consumed from first",
		detail: "2 producers publish 1,024-byte messages (delivery mode 2) to one stream (x-queue-type=stream) with publisher confirms (window 100 per producer) up to the message count; then 1 consumer reads the stream from x-stream-offset=first with manual acks (one per message; acks are credit) and prefetch 1,000. Publish rate = confirmed msg/s; consume rate = msg/s from the consumer's start to its last delivery.",
		metrics: []benchMetric{
			{key: s8Publish, label: "published (confirmed msg/s)", unit: ratesUnit},
			{key: s8Consume, label: "consumed from first (msg/s)", unit: ratesUnit},
		},
		bound: func(c BenchConfig) time.Duration { return 2*c.BacklogTimeout + 2*time.Minute },
		run:   runStreamScenario,
	}
}

// runStreamScenario is S8.
func runStreamScenario(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
	c := b.base(t, "S8")
	c.QueueType, c.StreamOffset = "stream", "first"
	c.Producers, c.Consumers, c.Size, c.QoS = 2, 1, 1024, 1000
	c.Persistent, c.Confirm = true, 100
	c.PMessages = uint64(b.cfg.StreamMessages+1) / 2
	c.ConsumeAfterPublish = true
	c.Duration = b.cfg.BacklogTimeout
	c.DrainTimeout = b.cfg.BacklogTimeout
	c.DrainIdle = 5 * time.Second
	c.ConfirmTimeout = time.Minute
	predelete(c)
	res, err := Run(ctx, c)
	if err != nil {
		return runOutcome{err: err}
	}
	out := runOutcome{values: map[string]float64{s8Publish: res.ConfirmRate, s8Consume: res.ConsumeRate}, notes: integrityNotes(res)}
	want := c.PMessages * uint64(c.Producers)
	if res.Confirmed < want {
		out.notes = append(out.notes, fmt.Sprintf("published only %s of %s messages within %s", fmtInt(res.Confirmed), fmtInt(want), b.cfg.BacklogTimeout))
	}
	if res.Consumed < res.Confirmed {
		out.notes = append(out.notes, fmt.Sprintf("consumed only %s of %s messages", fmtInt(res.Consumed), fmtInt(res.Confirmed)))
	}
	if res.Confirmed == 0 || res.Consumed == 0 {
		out.err = errors.New("nothing was published or consumed")
	}
	return out
}
