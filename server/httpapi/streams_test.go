package httpapi_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// sendRaw sends a request with a raw JSON body and returns the status and the body.
func (b *broker) sendRaw(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, b.api+path, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("guest", "guest")
	req.Header.Set("Content-Type", "application/json")
	client := http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

func amqpSetup(t *testing.T, url string) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	c, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return c, ch
}

func confirmPublish(t *testing.T, ch *amqp.Channel, ex, key string, p amqp.Publishing) {
	t.Helper()
	dc, err := ch.PublishWithDeferredConfirm(ex, key, false, false, p)
	if err != nil || !dc.Wait() {
		t.Fatalf("publish: %v", err)
	}
}

func TestStreamTracking(t *testing.T) {
	b := startBroker(t)
	c, ch := amqpSetup(t, b.amqpURL)
	if _, err := ch.QueueDeclare("trk", true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		confirmPublish(t, ch, "", "trk", amqp.Publishing{Body: []byte("x"), Headers: amqp.Table{"x-publisher-id": "pub-a", "x-publishing-id": int64(i * 10)}})
	}
	cch, _ := c.Channel()
	_ = cch.Qos(10, 0, false)
	d, err := cch.Consume("trk", "", false, false, false, false, amqp.Table{"x-stream-offset": "first", "x-stream-consumer-name": "reader"})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		m := <-d
		_ = m.Ack(false)
	}
	want := map[string]any{"offsets": map[string]any{"reader": float64(2)}, "writers": map[string]any{"pub-a": float64(30)}}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var got map[string]any
		if code := b.call(t, "GET", "/api/stream/%2F/trk/tracking", nil, &got); code != 200 {
			t.Fatalf("tracking: %d", code)
		}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tracking = %v, want %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var pubs []map[string]any
	b.call(t, "GET", "/api/stream/publishers/%2F/trk", nil, &pubs)
	if len(pubs) != 1 || pubs[0]["reference"] != "pub-a" || pubs[0]["sequence"] != float64(30) {
		t.Fatalf("publishers = %v", pubs)
	}
	var cons []map[string]any
	b.call(t, "GET", "/api/stream/consumers/%2F", nil, &cons)
	if len(cons) != 1 || cons[0]["offset"] != float64(3) || cons[0]["offset_lag"] != float64(0) {
		t.Fatalf("consumers = %v", cons)
	}
	if code := b.call(t, "GET", "/api/stream/%2F/nope/tracking", nil, nil); code != 404 {
		t.Fatalf("tracking of a missing stream: %d", code)
	}
}

func TestConsumerGroupLagAndReset(t *testing.T) {
	b := startBroker(t)
	c, ch := amqpSetup(t, b.amqpURL)
	if err := ch.ExchangeDeclare("cg", "x-super-stream", true, false, false, false, amqp.Table{"x-partitions": int32(2)}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		confirmPublish(t, ch, "cg", fmt.Sprintf("key-%d", i), amqp.Publishing{Body: []byte("x")})
	}
	mch, _ := c.Channel()
	_ = mch.Qos(100, 0, false)
	d, err := mch.Consume("cg", "m1", false, false, false, false, amqp.Table{"x-stream-consumer-group": "g", "x-stream-offset": "first"})
	if err != nil {
		t.Fatal(err)
	}
	acked := 0
	for range 10 {
		m := <-d
		if acked < 4 {
			_ = m.Ack(false) // some acked, the rest held
			acked++
		}
	}
	var groups []map[string]any
	deadline := time.Now().Add(5 * time.Second)
	for {
		b.call(t, "GET", "/api/stream/consumer-groups/%2F/cg", nil, &groups)
		lag := 0.0
		owned := 0
		if len(groups) == 1 {
			for _, p := range groups[0]["partitions"].([]any) {
				pm := p.(map[string]any)
				lag += pm["lag"].(float64)
				if o, ok := pm["owner"].(map[string]any); ok && o["consumer_tag"] == "m1" {
					owned++
				}
			}
		}
		// 4 acked of 10: the lag sums to 6 (less if the acks' offsets spread)
		if owned == 2 && lag >= 6 && lag < 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer groups = %v", groups)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Moving offsets while the group has a member: 409.
	if code, body := b.sendRaw(t, "PUT", "/api/stream/consumer-groups/%2F/cg/g/offsets", `{"offset":"first"}`); code != 409 {
		t.Fatalf("reset with a member: %d %s", code, body)
	}
	if err := mch.Cancel("m1", false); err != nil {
		t.Fatal(err)
	}
	_ = mch.Close()
	deadline = time.Now().Add(5 * time.Second)
	for {
		code, body := b.sendRaw(t, "PUT", "/api/stream/consumer-groups/%2F/cg/g/offsets", `{"offset":"first"}`)
		if code == 204 {
			break
		}
		if code != 409 || time.Now().After(deadline) {
			t.Fatalf("reset: %d %s", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _ := b.sendRaw(t, "PUT", "/api/stream/consumer-groups/%2F/cg/g/offsets", `{"offset":"soon"}`); code != 400 {
		t.Fatalf("bad offset: %d", code)
	}
	if code, _ := b.sendRaw(t, "PUT", "/api/stream/consumer-groups/%2F/nope/g/offsets", `{"offset":"first"}`); code != 404 {
		t.Fatalf("missing super stream: %d", code)
	}
	// A new member starts from the first offset again: all 10.
	nch, _ := c.Channel()
	_ = nch.Qos(100, 0, false)
	d2, err := nch.Consume("cg", "m2", false, false, false, false, amqp.Table{"x-stream-consumer-group": "g"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		select {
		case m := <-d2:
			_ = m.Ack(false)
		case <-time.After(5 * time.Second):
			t.Fatalf("after the reset the new member got %d of 10", i)
		}
	}
}
