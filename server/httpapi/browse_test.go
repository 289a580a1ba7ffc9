package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// browsed is one message of a browse answer.
type browsed struct {
	ID            uint64         `json:"id"`
	DeliveryCount int            `json:"delivery_count"`
	Payload       string         `json:"payload"`
	Encoding      string         `json:"payload_encoding"`
	Redelivered   bool           `json:"redelivered"`
	RoutingKey    string         `json:"routing_key"`
	Exchange      string         `json:"exchange"`
	MessageCount  int            `json:"message_count"`
	Properties    map[string]any `json:"properties"`
}

func (b *broker) browse(t *testing.T, queue, body string) []browsed {
	t.Helper()
	code, out := b.sendRaw(t, "POST", "/api/queues/%2F/"+queue+"/browse", body)
	if code != 200 {
		t.Fatalf("browse %s: %d %s", queue, code, out)
	}
	var got []browsed
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("browse %s: %q: %v", queue, out, err)
	}
	return got
}

func payloads(ms []browsed) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.Payload)
	}
	return strings.Join(s, ",")
}

// waitDepth polls the queue's message count through the API until it is n.
func (b *broker) waitDepth(t *testing.T, queue string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var q map[string]any
		b.call(t, "GET", "/api/queues/%2F/"+queue, nil, &q)
		if q["messages"] == float64(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s: messages %v, want %d", queue, q["messages"], n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mustGet(t *testing.T, ch *amqp.Channel, queue string) amqp.Delivery {
	t.Helper()
	d, ok, err := ch.Get(queue, false)
	if err != nil || !ok {
		t.Fatalf("basic.get %s: %v %v", queue, ok, err)
	}
	return d
}

// TestBrowseChangesNothing browses classic and quorum queues over HTTP and checks over AMQP that
// the messages are still there, in order, with their delivery state as it was: a message never
// delivered is not redelivered, a requeued one keeps its count.
func TestBrowseChangesNothing(t *testing.T) {
	b := startBroker(t)
	for _, kind := range []string{"classic", "quorum"} {
		t.Run(kind, func(t *testing.T) {
			_, ch := amqpSetup(t, b.amqpURL)
			name := "browse-" + kind
			if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": kind}); err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= 3; i++ {
				confirmPublish(t, ch, "", name, amqp.Publishing{Body: []byte(fmt.Sprintf("m%d", i)), ContentType: "text/plain",
					Headers: amqp.Table{"n": int32(i)}})
			}
			b.waitDepth(t, name, 3)
			for range 2 {
				got := b.browse(t, name, `{"count": 2}`)
				if payloads(got) != "m1,m2" {
					t.Fatalf("browse: %q, want m1,m2", payloads(got))
				}
				for i, m := range got {
					if m.Redelivered || m.DeliveryCount != 0 || m.RoutingKey != name || m.MessageCount != 2-i ||
						m.Properties["content_type"] != "text/plain" || fmt.Sprint(m.Properties["headers"]) != fmt.Sprintf("map[n:%d]", i+1) {
						t.Fatalf("browsed message %d: %+v", i, m)
					}
				}
			}
			b.waitDepth(t, name, 3)
			// m1 stays first and was never delivered.
			d := mustGet(t, ch, name)
			if string(d.Body) != "m1" || d.Redelivered {
				t.Fatalf("basic.get after browse: %q redelivered=%v, want m1 not redelivered", d.Body, d.Redelivered)
			}
			// Requeue m1 (get-and-requeue): now the browse shows it redelivered once, and browsing
			// again does not count further.
			if err := d.Nack(false, true); err != nil {
				t.Fatal(err)
			}
			// A quorum queue applies the requeue after the nack returns: wait for it.
			deadline := time.Now().Add(10 * time.Second)
			for len(b.browse(t, name, `{"count": 10}`)) != 3 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			for range 2 {
				got := b.browse(t, name, `{"count": 10}`)
				if payloads(got) != "m1,m2,m3" || !got[0].Redelivered || got[0].DeliveryCount != 1 || got[1].Redelivered || got[2].Redelivered {
					t.Fatalf("browse after a requeue: %+v", got)
				}
			}
			for i, want := range []struct {
				body        string
				redelivered bool
			}{{"m1", true}, {"m2", false}, {"m3", false}} {
				d := mustGet(t, ch, name)
				if string(d.Body) != want.body || d.Redelivered != want.redelivered {
					t.Fatalf("basic.get %d: %q redelivered=%v, want %+v", i, d.Body, d.Redelivered, want)
				}
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
			}
			if got := b.browse(t, name, `{}`); len(got) != 0 {
				t.Fatalf("browse of an empty queue: %+v", got)
			}
		})
	}
}

// TestBrowseStream reads a stream's records from its first offset and from a given one; a
// consumer from "first" still gets them all.
func TestBrowseStream(t *testing.T) {
	b := startBroker(t)
	c, ch := amqpSetup(t, b.amqpURL)
	if _, err := ch.QueueDeclare("browse-s", true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		confirmPublish(t, ch, "", "browse-s", amqp.Publishing{Body: []byte(fmt.Sprintf("r%d", i))})
	}
	deadline := time.Now().Add(5 * time.Second)
	var got []browsed
	for {
		got = b.browse(t, "browse-s", `{"count": 10}`)
		if len(got) == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if payloads(got) != "r0,r1,r2" || got[0].ID != 0 || got[2].ID != 2 || got[0].MessageCount != 2 {
		t.Fatalf("browse of a stream: %+v", got)
	}
	if h, _ := got[1].Properties["headers"].(map[string]any); h["x-stream-offset"] != float64(1) {
		t.Fatalf("browsed record's headers: %v", got[1].Properties)
	}
	if from := b.browse(t, "browse-s", `{"count": 10, "offset": 1}`); payloads(from) != "r1,r2" {
		t.Fatalf("browse from offset 1: %+v", from)
	}
	cch, _ := c.Channel()
	_ = cch.Qos(10, 0, false)
	ds, err := cch.Consume("browse-s", "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		select {
		case d := <-ds:
			if string(d.Body) != fmt.Sprintf("r%d", i) {
				t.Fatalf("consumer got %q at %d", d.Body, i)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("consumer got %d of 3 records after the browse", i)
		}
	}
	// Bad input.
	for _, bad := range []struct{ path, body string }{
		{"/api/queues/%2F/browse-s/browse", `{"count": 0}`},
		{"/api/queues/%2F/browse-s/browse", `{"count": "x"}`},
		{"/api/queues/%2F/browse-s/browse", `{"offset": -1}`},
		{"/api/queues/%2F/browse-s/browse", `{"encoding": "hex"}`},
		{"/api/queues/%2F/browse-s/redrive", `{"ids": [1]}`},
		{"/api/queues/%2F/browse-s/redrive", `{}`},
	} {
		if code, body := b.sendRaw(t, "POST", bad.path, bad.body); code != 400 {
			t.Errorf("POST %s %s: %d %s, want 400", bad.path, bad.body, code, body)
		}
	}
	if code, _ := b.sendRaw(t, "POST", "/api/queues/%2F/nope/browse", `{}`); code != 404 {
		t.Errorf("browse of a missing queue: %d, want 404", code)
	}
}

// TestRedriveSelected dead-letters four messages, shows their x-death in a browse, redrives two of
// them and checks that exactly those arrived back in the source queue while the others stay in
// the dead-letter queue, in order and never delivered.
func TestRedriveSelected(t *testing.T) {
	b := startBroker(t)
	for _, kind := range []string{"classic", "quorum"} {
		t.Run(kind, func(t *testing.T) {
			_, ch := amqpSetup(t, b.amqpURL)
			src, dlq := "src-"+kind, "dlq-"+kind
			if _, err := ch.QueueDeclare(dlq, true, false, false, false, amqp.Table{"x-queue-type": kind}); err != nil {
				t.Fatal(err)
			}
			if _, err := ch.QueueDeclare(src, true, false, false, false, amqp.Table{"x-queue-type": kind,
				"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}); err != nil {
				t.Fatal(err)
			}
			for _, body := range []string{"a", "b", "c", "d"} {
				confirmPublish(t, ch, "", src, amqp.Publishing{Body: []byte(body), DeliveryMode: 2})
			}
			b.waitDepth(t, src, 4)
			for range 4 {
				if err := mustGet(t, ch, src).Reject(false); err != nil {
					t.Fatal(err)
				}
			}
			b.waitDepth(t, dlq, 4)
			got := b.browse(t, dlq, `{"count": 10}`)
			if payloads(got) != "a,b,c,d" {
				t.Fatalf("browse of the dead-letter queue: %q", payloads(got))
			}
			h, _ := got[0].Properties["headers"].(map[string]any)
			deaths, _ := h["x-death"].([]any)
			if len(deaths) != 1 {
				t.Fatalf("x-death of a dead letter: %v", h)
			}
			death := deaths[0].(map[string]any)
			if death["queue"] != src || death["reason"] != "rejected" || death["count"] != float64(1) ||
				death["exchange"] != "" || fmt.Sprint(death["routing-keys"]) != "["+src+"]" || death["time"] == nil {
				t.Fatalf("x-death entry: %v", death)
			}
			body := fmt.Sprintf(`{"ids": [%d, %d]}`, got[1].ID, got[3].ID)
			code, out := b.sendRaw(t, "POST", "/api/queues/%2F/"+dlq+"/redrive", body)
			var res struct {
				Moved, Failed int
				Results       []map[string]any
			}
			if code != 200 || json.Unmarshal([]byte(out), &res) != nil || res.Moved != 2 || res.Failed != 0 {
				t.Fatalf("redrive: %d %s", code, out)
			}
			if r := res.Results[0]; r["exchange"] != "" || fmt.Sprint(r["routing_keys"]) != "["+src+"]" {
				t.Fatalf("redrive result: %v", r)
			}
			b.waitDepth(t, src, 2)
			b.waitDepth(t, dlq, 2)
			// Moving one again finds nothing: it is no longer in the dead-letter queue.
			code, out = b.sendRaw(t, "POST", "/api/queues/%2F/"+dlq+"/redrive", fmt.Sprintf(`{"ids": [%d]}`, got[1].ID))
			if code != 200 || !strings.Contains(out, `"moved":0`) || !strings.Contains(out, "not ready") {
				t.Fatalf("second redrive of the same message: %d %s", code, out)
			}
			for _, want := range []struct{ queue, body string }{{src, "b"}, {src, "d"}, {dlq, "a"}, {dlq, "c"}} {
				d := mustGet(t, ch, want.queue)
				if string(d.Body) != want.body || d.Redelivered {
					t.Fatalf("basic.get %s: %q redelivered=%v, want %q not redelivered", want.queue, d.Body, d.Redelivered, want.body)
				}
				if want.queue == src {
					// The redriven message keeps its history.
					if ds, _ := d.Headers["x-death"].([]any); len(ds) != 1 {
						t.Fatalf("redriven message's headers: %v", d.Headers)
					}
				}
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
			}
			// A message without x-death cannot be redriven and stays.
			confirmPublish(t, ch, "", dlq, amqp.Publishing{Body: []byte("plain")})
			b.waitDepth(t, dlq, 1)
			plain := b.browse(t, dlq, `{}`)
			code, out = b.sendRaw(t, "POST", "/api/queues/%2F/"+dlq+"/redrive", fmt.Sprintf(`{"ids": [%d]}`, plain[0].ID))
			if code != 200 || !strings.Contains(out, `"failed":1`) || !strings.Contains(out, "x-death") {
				t.Fatalf("redrive without x-death: %d %s", code, out)
			}
			b.waitDepth(t, dlq, 1)
		})
	}
}

// sendAs makes a request as user with a raw JSON body.
func (b *broker) sendAs(t *testing.T, user, pass, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, b.api+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(user, pass)
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

// TestRedriveTargets redrives through the original exchange (reaching every queue its keys route
// to), to the source queue only, and as users who may not read the dead-letter queue or write to
// the original exchange.
func TestRedriveTargets(t *testing.T) {
	b := startBroker(t)
	_, ch := amqpSetup(t, b.amqpURL)
	for _, x := range []struct{ name, kind string }{{"shop", "direct"}, {"dlx", "fanout"}} {
		if err := ch.ExchangeDeclare(x.name, x.kind, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	queues := map[string]amqp.Table{"orders": {"x-dead-letter-exchange": "dlx"}, "audit": nil, "orders-dlq": nil}
	for name, args := range queues {
		if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
			t.Fatal(err)
		}
	}
	for _, bd := range [][2]string{{"orders", "shop"}, {"audit", "shop"}, {"orders-dlq", "dlx"}} {
		if err := ch.QueueBind(bd[0], "new", bd[1], false, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, body := range []string{"m1", "m2"} {
		confirmPublish(t, ch, "shop", "new", amqp.Publishing{Body: []byte(body)})
	}
	b.waitDepth(t, "orders", 2)
	if _, err := ch.QueuePurge("audit", false); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := mustGet(t, ch, "orders").Reject(false); err != nil {
			t.Fatal(err)
		}
	}
	b.waitDepth(t, "orders-dlq", 2)
	got := b.browse(t, "orders-dlq", `{}`)
	if payloads(got) != "m1,m2" {
		t.Fatalf("dead letters: %+v", got)
	}
	m1, m2 := got[0].ID, got[1].ID

	// ops may read everything but write only to the default exchange; nobody may read nothing.
	for _, u := range []struct{ name, read, write string }{{"ops", ".*", "^amq\\.default$"}, {"nobody", "^$", ".*"}} {
		if code := b.send(t, "PUT", "/api/users/"+u.name, map[string]any{"password": "pw", "tags": "management"}, nil); code != 201 {
			t.Fatalf("create user %s: %d", u.name, code)
		}
		if code := b.send(t, "PUT", "/api/permissions/%2F/"+u.name, map[string]any{"configure": "", "write": u.write, "read": u.read}, nil); code != 201 {
			t.Fatalf("permissions of %s: %d", u.name, code)
		}
	}
	if code, out := b.sendAs(t, "nobody", "pw", "POST", "/api/queues/%2F/orders-dlq/browse", `{}`); code != 401 {
		t.Fatalf("browse without read permission: %d %s", code, out)
	}
	if code, out := b.sendAs(t, "nobody", "pw", "POST", "/api/queues/%2F/orders-dlq/redrive", fmt.Sprintf(`{"ids": [%d]}`, m1)); code != 401 {
		t.Fatalf("redrive without read permission: %d %s", code, out)
	}
	code, out := b.sendAs(t, "ops", "pw", "POST", "/api/queues/%2F/orders-dlq/redrive", fmt.Sprintf(`{"ids": [%d]}`, m1))
	if code != 200 || !strings.Contains(out, `"failed":1`) || !strings.Contains(out, "access to exchange 'shop'") {
		t.Fatalf("redrive without write permission on shop: %d %s", code, out)
	}
	// It stays, returned (so now redelivered), at its place.
	if got := b.browse(t, "orders-dlq", `{}`); payloads(got) != "m1,m2" || !got[0].Redelivered || got[1].Redelivered {
		t.Fatalf("after a refused redrive: %+v", got)
	}
	// ops may send it to its source queue through the default exchange.
	code, out = b.sendAs(t, "ops", "pw", "POST", "/api/queues/%2F/orders-dlq/redrive", fmt.Sprintf(`{"ids": [%d], "to_source_queue": true}`, m1))
	if code != 200 || !strings.Contains(out, `"moved":1`) || !strings.Contains(out, `"routing_keys":["orders"]`) {
		t.Fatalf("redrive to the source queue: %d %s", code, out)
	}
	b.waitDepth(t, "orders", 1)
	b.waitDepth(t, "audit", 0)
	// Through the original exchange and keys, m2 reaches audit too.
	code, out = b.sendRaw(t, "POST", "/api/queues/%2F/orders-dlq/redrive", fmt.Sprintf(`{"ids": [%d]}`, m2))
	if code != 200 || !strings.Contains(out, `"moved":1`) || !strings.Contains(out, `"exchange":"shop"`) {
		t.Fatalf("redrive through shop: %d %s", code, out)
	}
	b.waitDepth(t, "orders", 2)
	b.waitDepth(t, "audit", 1)
	b.waitDepth(t, "orders-dlq", 0)
	for _, want := range []string{"m1", "m2"} {
		if d := mustGet(t, ch, "orders"); string(d.Body) != want {
			t.Fatalf("orders: %q, want %q", d.Body, want)
		}
	}
}
