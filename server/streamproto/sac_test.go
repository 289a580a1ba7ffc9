package streamproto_test

import (
	"sync"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// TestSuperStreamSingleActiveConsumersSpreadAndTakeOver: two super-stream consumers of one
// name on a 2-partition super stream each get one partition (RabbitMQ's rule: partition i goes
// to subscriber i mod n), nothing is read twice while both run; when the first closes, the
// second takes its partition over from the offset its consumer-update answer names.
func TestSuperStreamSingleActiveConsumersSpreadAndTakeOver(t *testing.T) {
	b := startBroker(t)
	e := env(t, b)
	super := streamName(t)
	if err := e.DeclareSuperStream(super, stream.NewPartitionsOptions(2)); err != nil {
		t.Fatalf("declare super stream: %v", err)
	}
	t.Cleanup(func() { _ = e.DeleteSuperStream(super) })
	var mu sync.Mutex
	got := map[string]int{} // consumer/partition -> messages
	total := 0
	consumer := func(who string) *stream.SuperStreamConsumer {
		c, err := e.NewSuperStreamConsumer(super, func(ctx stream.ConsumerContext, _ *amqp.Message) {
			mu.Lock()
			got[who+"/"+ctx.Consumer.GetStreamName()]++
			total++
			mu.Unlock()
		}, stream.NewSuperStreamConsumerOptions().SetConsumerName("app").SetSingleActiveConsumer(
			stream.NewSingleActiveConsumer(func(string, bool) stream.OffsetSpecification { return stream.OffsetSpecification{}.First() })))
		if err != nil {
			t.Fatalf("super stream consumer %s: %v", who, err)
		}
		return c
	}
	c1 := consumer("c1")
	c2 := consumer("c2")
	defer c2.Close()
	p0, p1 := super+"-0", super+"-1"
	for _, p := range []string{p0, p1} {
		publish(t, e, p, p+"-", 10)
	}
	waitTotal := func(n int) {
		t.Helper()
		deadline := time.Now().Add(waitFor)
		for {
			mu.Lock()
			now := total
			mu.Unlock()
			if now == n {
				return
			}
			if now > n || time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("%d messages read, want %d: %v", now, n, got)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitTotal(20)
	mu.Lock()
	if got["c1/"+p0] != 10 || got["c2/"+p1] != 10 {
		t.Fatalf("partitions not spread over the two consumers: %v", got)
	}
	mu.Unlock()
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	waitTotal(30)
	time.Sleep(500 * time.Millisecond) // nothing more may come
	waitTotal(30)
	mu.Lock()
	defer mu.Unlock()
	if got["c2/"+p0] != 10 {
		t.Fatalf("the remaining consumer did not take partition 0 over from first: %v", got)
	}
}
