package streamproto_test

// Interop: a message published over the stream protocol is read over AMQP 0-9-1 with its AMQP
// 1.0 properties and application properties mapped as RabbitMQ 4.x maps them, and the reverse;
// filter values work from both sides.

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

func amqpChannel(t *testing.T, b broker) *amqp091.Channel {
	t.Helper()
	conn, err := amqp091.Dial(b.amqpURL)
	if err != nil {
		t.Fatalf("dial %s: %v", b.amqpURL, err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// amqpConsume reads n deliveries of stream name from its first offset over AMQP 0-9-1.
func amqpConsume(t *testing.T, ch *amqp091.Channel, name string, n int, args amqp091.Table) []amqp091.Delivery {
	t.Helper()
	if err := ch.Qos(100, 0, false); err != nil {
		t.Fatal(err)
	}
	if args == nil {
		args = amqp091.Table{}
	}
	args["x-stream-offset"] = "first"
	ds, err := ch.Consume(name, "", false, false, false, false, args)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	var out []amqp091.Delivery
	deadline := time.After(waitFor)
	for len(out) < n {
		select {
		case d := <-ds:
			out = append(out, d)
			_ = d.Ack(false)
		case <-deadline:
			t.Fatalf("got %d of %d deliveries", len(out), n)
		}
	}
	return out
}

func TestStreamProtocolToAMQP091(t *testing.T) {
	b := startBroker(t)
	e := env(t, b)
	name := declare(t, e, nil)
	p, err := e.NewProducer(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	notes := p.NotifyPublishConfirmation()
	m := amqp.NewMessage([]byte("hello"))
	m.Properties = &amqp.MessageProperties{MessageID: "id-1", CorrelationID: "corr-1", ContentType: "text/plain", ReplyTo: "/queues/replies"}
	m.ApplicationProperties = map[string]any{"colour": "blue", "count": int32(7)}
	if err := p.Send(m); err != nil {
		t.Fatal(err)
	}
	select {
	case cs := <-notes:
		if !cs[0].IsConfirmed() {
			t.Fatal("not confirmed")
		}
	case <-time.After(waitFor):
		t.Fatal("no confirm")
	}
	p.Close()

	ds := amqpConsume(t, amqpChannel(t, b), name, 1, nil)
	d := ds[0]
	if string(d.Body) != "hello" || d.MessageId != "id-1" || d.CorrelationId != "corr-1" || d.ContentType != "text/plain" ||
		d.ReplyTo != "replies" {
		t.Fatalf("delivery %+v", d)
	}
	if d.Headers["colour"] != "blue" || d.Headers["count"] != int32(7) {
		t.Fatalf("headers %v", d.Headers)
	}
	if off, ok := d.Headers["x-stream-offset"].(int64); !ok || off != 0 {
		t.Fatalf("x-stream-offset %v", d.Headers["x-stream-offset"])
	}
	if d.RoutingKey != name {
		t.Fatalf("routing key %q, want the stream's name", d.RoutingKey)
	}
}

func TestAMQP091ToStreamProtocol(t *testing.T) {
	b := startBroker(t)
	e := env(t, b)
	name := declare(t, e, nil)
	ch := amqpChannel(t, b)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 1))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	err := ch.PublishWithContext(ctx, "", name, false, false, amqp091.Publishing{
		Body: []byte("from 0-9-1"), ContentType: "application/json", MessageId: "m-9", CorrelationId: "c-9",
		DeliveryMode: amqp091.Persistent, Priority: 3, Headers: amqp091.Table{"region": "eu", "x-custom": "ann"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if c := <-confirms; !c.Ack {
		t.Fatal("nacked")
	}
	var mu sync.Mutex
	var got *amqp.Message
	done := make(chan struct{})
	c, err := e.NewConsumer(name, func(_ stream.ConsumerContext, m *amqp.Message) {
		mu.Lock()
		defer mu.Unlock()
		if got == nil {
			got = m
			close(done)
		}
	}, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("nothing consumed")
	}
	mu.Lock()
	defer mu.Unlock()
	if string(got.GetData()) != "from 0-9-1" {
		t.Fatalf("body %q", got.GetData())
	}
	if got.Properties == nil || got.Properties.MessageID != "m-9" || got.Properties.CorrelationID != "c-9" ||
		got.Properties.ContentType != "application/json" {
		t.Fatalf("properties %+v", got.Properties)
	}
	if got.Header == nil || !got.Header.Durable || got.Header.Priority != 3 {
		t.Fatalf("header %+v", got.Header)
	}
	if got.ApplicationProperties["region"] != "eu" {
		t.Fatalf("application properties %v", got.ApplicationProperties)
	}
	if _, inApp := got.ApplicationProperties["x-custom"]; inApp {
		t.Fatalf("x- header in application properties: %v", got.ApplicationProperties)
	}
	if got.Annotations["x-custom"] != "ann" || got.Annotations["x-routing-key"] != name || got.Annotations["x-exchange"] != "" {
		t.Fatalf("message annotations %v", got.Annotations)
	}
}

func TestFilterValuesAcrossProtocols(t *testing.T) {
	b := startBroker(t)
	e := env(t, b)
	name := declare(t, e, nil)
	// Over the stream protocol: filter values from the application property "region".
	p, err := e.NewProducer(name, stream.NewProducerOptions().SetFilter(stream.NewProducerFilter(func(m message.StreamMessage) string {
		v, _ := m.GetApplicationProperties()["region"].(string)
		return v
	})))
	if err != nil {
		t.Fatal(err)
	}
	notes := p.NotifyPublishConfirmation()
	for _, r := range []string{"eu", "us", "eu"} {
		m := amqp.NewMessage([]byte("stream-" + r))
		m.ApplicationProperties = map[string]any{"region": r}
		if err := p.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	for n := 0; n < 3; {
		select {
		case cs := <-notes:
			n += len(cs)
		case <-time.After(waitFor):
			t.Fatal("no confirms")
		}
	}
	p.Close()
	// Over AMQP 0-9-1: x-stream-filter-value.
	ch := amqpChannel(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for _, r := range []string{"us", "eu"} {
		if err := ch.PublishWithContext(ctx, "", name, false, false, amqp091.Publishing{Body: []byte("amqp-" + r),
			Headers: amqp091.Table{"x-stream-filter-value": r, "region": r}}); err != nil {
			t.Fatal(err)
		}
	}
	// An AMQP 0-9-1 consumer with a filter: Warren filters its deliveries by each record's
	// filter value, which only AMQP 0-9-1 publishes carry (a stream-protocol publisher's value
	// is in the chunk's bloom filter alone: docs/differences.md), so it sees amqp-eu, and with
	// x-stream-match-unfiltered the stream-protocol messages too.
	ds := amqpConsume(t, ch, name, 1, amqp091.Table{"x-stream-filter": "eu"})
	if string(ds[0].Body) != "amqp-eu" {
		t.Fatalf("AMQP 0-9-1 filtered consumer got %q", ds[0].Body)
	}
	ch2 := amqpChannel(t, b)
	ds = amqpConsume(t, ch2, name, 4, amqp091.Table{"x-stream-filter": "eu", "x-stream-match-unfiltered": true})
	var got []string
	for _, d := range ds {
		got = append(got, string(d.Body))
	}
	if got[0] != "stream-eu" || got[1] != "stream-us" || got[2] != "stream-eu" || got[3] != "amqp-eu" {
		t.Fatalf("AMQP 0-9-1 consumer matching unfiltered got %v", got)
	}
	// Stream consumer with a filter: the broker skips chunks whose bloom filter has no eu
	// value; the post filter drops the rest.
	var mu sync.Mutex
	var bodies []string
	c, err := e.NewConsumer(name, func(_ stream.ConsumerContext, m *amqp.Message) {
		mu.Lock()
		bodies = append(bodies, string(m.GetData()))
		mu.Unlock()
	}, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()).
		SetFilter(stream.NewConsumerFilter([]string{"eu"}, false, func(m *amqp.Message) bool {
			return m.ApplicationProperties["region"] == "eu"
		})))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(waitFor)
	for {
		mu.Lock()
		n := len(bodies)
		mu.Unlock()
		if n >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]bool{"stream-eu": true, "amqp-eu": true}
	if len(bodies) != 3 {
		t.Fatalf("stream consumer got %v", bodies)
	}
	for _, body := range bodies {
		if !want[body] {
			t.Fatalf("stream consumer got %v", bodies)
		}
	}
}
