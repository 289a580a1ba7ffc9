package conformance

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// dial opens an amqp091-go connection to url; it is closed when the test ends.
func dial(t testing.TB, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// assertStillServing checks that a brand-new client can connect, declare a queue, publish to
// it and get the message back: after a misbehaving client, every other client is still served.
func assertStillServing(t testing.TB, url string) {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("the broker no longer accepts a new client: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("new client: open channel: %v", err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("new client: declare queue: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	body := []byte("still serving")
	if err := ch.PublishWithContext(ctx, "", q.Name, false, false, amqp.Publishing{Body: body}); err != nil {
		t.Fatalf("new client: publish: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		msg, ok, err := ch.Get(q.Name, true)
		if err != nil {
			t.Fatalf("new client: basic.get: %v", err)
		}
		if ok {
			if string(msg.Body) != string(body) {
				t.Fatalf("new client: got body %q, want %q", msg.Body, body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("new client: the published message never arrived")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := conn.Close(); err != nil {
		t.Fatalf("new client: close: %v", err)
	}
}
