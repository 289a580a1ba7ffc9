package metrics_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"
	streamamqp "github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"warren/server"
)

// TestStreamProtocolAndLagSeries: the stream protocol's traffic counts under protocol="stream"
// (publishes, confirms, deliveries, subscriptions, logins); stream readers' lag is served per
// reader on /metrics/per-object (an AMQP consumer, a stored offset, a consumer group's
// partitions); confirm-mode publishes and a quorum queue's confirmed dead letters have their
// RabbitMQ counters.
func TestStreamProtocolAndLagSeries(t *testing.T) {
	b := startBrokerConfig(t, func(c *server.Config) { c.StreamListen = "127.0.0.1:0" })
	sa := b.srv.StreamAddr().(*net.TCPAddr)
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetHost("127.0.0.1").SetPort(sa.Port))
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	if err := env.DeclareStream("lag.s", nil); err != nil {
		t.Fatal(err)
	}
	prod, err := env.NewProducer("lag.s", nil)
	if err != nil {
		t.Fatal(err)
	}
	confirms := prod.NotifyPublishConfirmation()
	for i := 0; i < 10; i++ {
		if err := prod.Send(streamamqp.NewMessage([]byte(fmt.Sprint(i)))); err != nil {
			t.Fatal(err)
		}
	}
	for got := 0; got < 10; {
		select {
		case cs := <-confirms:
			got += len(cs)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of 10 stream publishes confirmed", got)
		}
	}
	if err := prod.Close(); err != nil {
		t.Fatal(err)
	}
	// A stream-protocol subscription that reads everything, and a stored offset at 3.
	read := make(chan struct{}, 10)
	sub, err := env.NewConsumer("lag.s", func(stream.ConsumerContext, *streamamqp.Message) { read <- struct{}{} },
		stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for i := 0; i < 10; i++ {
		select {
		case <-read:
		case <-time.After(10 * time.Second):
			t.Fatalf("stream subscription read %d of 10", i)
		}
	}
	if err := env.StoreOffset("ref1", "lag.s", 3); err != nil {
		t.Fatal(err)
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
	// An AMQP consumer on lag.s that acks nothing (prefetch 2): lag 10 - 2.
	if err := ch.Qos(2, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Consume("lag.s", "live", false, false, false, false, amqp.Table{"x-stream-offset": "first"}); err != nil {
		t.Fatal(err)
	}
	// A consumer group on lag.s (a stream is a one-partition group) acks 4 messages and stays.
	gch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := gch.Qos(4, 0, false); err != nil {
		t.Fatal(err)
	}
	gd, err := gch.Consume("lag.s", "gc", false, false, false, false, amqp.Table{"x-stream-consumer-group": "g1", "x-stream-offset": "first"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		select {
		case d := <-gd:
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("group delivery %d", i)
		}
	}
	// Confirm-mode publishes into a quorum queue that dead-letters into another; one rejected.
	cch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cch.QueueDeclare("lag.dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cch.QueueDeclare("lag.qq", true, false, false, false, amqp.Table{"x-queue-type": "quorum",
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "lag.dlq"}); err != nil {
		t.Fatal(err)
	}
	if err := cch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		dc, err := cch.PublishWithDeferredConfirm("", "lag.qq", false, false, amqp.Publishing{Body: []byte("x")})
		if err != nil || !dc.Wait() {
			t.Fatalf("publish: %v", err)
		}
	}
	var m amqp.Delivery
	deadline := time.Now().Add(10 * time.Second)
	for {
		var ok bool
		m, ok, err = cch.Get("lag.qq", false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no message to reject")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := m.Nack(false, false); err != nil {
		t.Fatal(err)
	}

	v := func(f map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
		x, _ := value(f, name, labels)
		return x
	}
	stream := map[string]string{"protocol": "stream"}
	agg := b.waitFor(t, "/metrics", "stream-protocol counters and confirmed dead letters", func(f map[string]*dto.MetricFamily) bool {
		return v(f, "rabbitmq_global_messages_received_total", stream) == 10 &&
			v(f, "rabbitmq_global_messages_confirmed_total", stream) == 10 &&
			v(f, "rabbitmq_global_messages_delivered_total", stream) >= 10 &&
			v(f, "rabbitmq_global_messages_dead_lettered_confirmed_total", nil) == 1
	})
	for name, want := range map[string]float64{
		"rabbitmq_global_messages_received_confirm_total":           10,
		"rabbitmq_global_messages_routed_total":                     10,
		"rabbitmq_global_messages_delivered_consume_auto_ack_total": 10,
		"rabbitmq_global_consumers":                                 1,
		"rabbitmq_auth_attempts_succeeded_total":                    1,
	} {
		if got := v(agg, name, stream); got < want {
			t.Errorf("%s{protocol=\"stream\"} = %v, want at least %v", name, got, want)
		}
	}
	// The producer is closed; the AMQP channel that published into lag.qq is open.
	if got := v(agg, "rabbitmq_global_publishers", map[string]string{"protocol": "amqp091"}); got != 1 {
		t.Errorf("AMQP publishers = %v, want 1 (the channel that published)", got)
	}
	if _, ok := value(agg, "rabbitmq_global_publishers", stream); !ok {
		t.Error("no rabbitmq_global_publishers{protocol=\"stream\"}")
	}
	if got := v(agg, "rabbitmq_global_messages_received_confirm_total", map[string]string{"protocol": "amqp091"}); got != 2 {
		t.Errorf("AMQP confirm-mode publishes = %v, want 2", got)
	}
	if got := v(agg, "rabbitmq_global_messages_dead_lettered_rejected_total", nil); got != 1 {
		t.Errorf("dead_lettered_rejected = %v, want 1", got)
	}

	per := b.waitFor(t, "/metrics/per-object", "stream readers' lag", func(f map[string]*dto.MetricFamily) bool {
		_, okc := value(f, "warren_stream_consumer_lag", map[string]string{"queue": "lag.s", "consumer": "live"})
		c, okg := value(f, "warren_stream_group_committed_offset", map[string]string{"queue": "lag.s", "group": "g1"})
		return okc && okg && c >= 3
	})
	if got := mustValue(t, per, "warren_stream_offset_lag", map[string]string{"vhost": "/", "queue": "lag.s", "reference": "ref1"}); got != 6 {
		t.Errorf("stored offset lag = %v, want 9 - 3 = 6", got)
	}
	if got := mustValue(t, per, "warren_stream_consumer_lag", map[string]string{"vhost": "/", "queue": "lag.s", "consumer": "live"}); got != 8 {
		t.Errorf("consumer lag = %v, want 10 - 2 = 8", got)
	}
	committed := mustValue(t, per, "warren_stream_group_committed_offset", map[string]string{"vhost": "/", "queue": "lag.s", "group": "g1"})
	if got := mustValue(t, per, "warren_stream_group_lag", map[string]string{"vhost": "/", "queue": "lag.s", "group": "g1"}); got != 9-committed {
		t.Errorf("group lag = %v with committed %v, want %v", got, committed, 9-committed)
	}
	// The stream-protocol subscription read all 10: lag 0, tagged "subscription N on CONN".
	subs := 0
	for _, m := range per["warren_stream_consumer_lag"].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "consumer" && strings.HasPrefix(lp.GetValue(), "subscription ") {
				subs++
				if m.GetGauge().GetValue() != 0 {
					t.Errorf("stream-protocol subscription %q lag = %v, want 0", lp.GetValue(), m.GetGauge().GetValue())
				}
			}
		}
	}
	if subs != 1 {
		t.Errorf("%d stream-protocol subscriptions in warren_stream_consumer_lag, want 1", subs)
	}
	if _, ok := value(per, "warren_stream_offset_lag", map[string]string{"reference": "g1"}); ok {
		t.Error("the group's committed offset is served as a stored offset too")
	}
	if _, ok := agg["warren_stream_consumer_lag"]; ok {
		t.Error("per-reader lag is on the aggregated endpoint")
	}
}
