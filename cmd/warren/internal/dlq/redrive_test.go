package dlq

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"
	"go.uber.org/goleak"

	"warren/server"
)

// refURLEnv names the environment variable with the URL of a reference RabbitMQ; when set, every
// broker test also runs against it.
const refURLEnv = "WARREN_DLQ_REF_URL"

// waitFor bounds every wait for the broker.
const waitFor = 10 * time.Second

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// forEachBroker runs fn against an in-process Warren and, when WARREN_DLQ_REF_URL is set, against
// that broker too.
func forEachBroker(t *testing.T, fn func(t *testing.T, b *broker)) {
	t.Run("warren", func(t *testing.T) { fn(t, startWarren(t)) })
	if u := os.Getenv(refURLEnv); u != "" {
		t.Run("reference", func(t *testing.T) { fn(t, dialBroker(t, u, true)) })
	}
}

// broker is a broker under test with an admin channel.
type broker struct {
	url    string
	ref    bool
	conn   *amqp.Connection
	prefix string // unique per test, for names on a shared reference broker
}

func startWarren(t *testing.T) *broker {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return dialBroker(t, fmt.Sprintf("amqp://guest:guest@%s/", srv.Addr()), false)
}

func dialBroker(t *testing.T, url string, ref bool) *broker {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	b := &broker{url: url, ref: ref, conn: conn,
		prefix: fmt.Sprintf("dlqtest-%s-%d", regexp.MustCompile(`\W+`).ReplaceAllString(t.Name(), "-"), time.Now().UnixNano()%1e6)}
	t.Cleanup(func() { conn.Close() })
	return b
}

// name returns a name unique to the test.
func (b *broker) name(s string) string { return b.prefix + "." + s }

// ch opens a channel closed at the end of the test.
func (b *broker) ch(t *testing.T) *amqp.Channel {
	t.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	t.Cleanup(func() { ch.Close() })
	return ch
}

func (b *broker) declareQueue(t *testing.T, name string, args amqp.Table) {
	t.Helper()
	ch := b.ch(t)
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("declare queue %s: %v", name, err)
	}
	t.Cleanup(func() {
		if ch, err := b.conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
			ch.Close()
		}
	})
}

func (b *broker) declareExchange(t *testing.T, name, kind string) {
	t.Helper()
	ch := b.ch(t)
	if err := ch.ExchangeDeclare(name, kind, true, false, false, false, nil); err != nil {
		t.Fatalf("declare exchange %s: %v", name, err)
	}
	t.Cleanup(func() {
		if ch, err := b.conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(name, false, false)
			ch.Close()
		}
	})
}

func (b *broker) bind(t *testing.T, queue, key, exchange string) {
	t.Helper()
	if err := b.ch(t).QueueBind(queue, key, exchange, false, nil); err != nil {
		t.Fatalf("bind %s to %s with %q: %v", queue, exchange, key, err)
	}
}

// publish publishes confirmed messages.
func (b *broker) publish(t *testing.T, exchange, key string, msgs ...amqp.Publishing) {
	t.Helper()
	ch := b.ch(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirm(exchange, key, false, false, m)
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		ok, err := dc.WaitContext(ctx)
		cancel()
		if err != nil || !ok {
			t.Fatalf("publish not confirmed: ok=%v err=%v", ok, err)
		}
	}
}

// count returns the number of ready messages in a queue.
func (b *broker) count(t *testing.T, queue string) int {
	t.Helper()
	q, err := b.ch(t).QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("passive declare %s: %v", queue, err)
	}
	return q.Messages
}

// waitCount waits until a queue holds n ready messages.
func (b *broker) waitCount(t *testing.T, queue string, n int) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		got := b.count(t, queue)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s holds %d messages, want %d", queue, got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get takes n messages from a queue (acknowledging them), waiting for them to arrive.
func (b *broker) get(t *testing.T, queue string, n int) []amqp.Delivery {
	t.Helper()
	ch := b.ch(t)
	var out []amqp.Delivery
	deadline := time.Now().Add(waitFor)
	for len(out) < n {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if ok {
			out = append(out, d)
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d messages from %s, want %d", len(out), queue, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return out
}

// peek returns the message at the head of a queue and leaves it there.
func (b *broker) peek(t *testing.T, queue string) amqp.Delivery {
	t.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	defer ch.Close() // returns the message to the queue
	d, ok, err := ch.Get(queue, false)
	if err != nil || !ok {
		t.Fatalf("get from %s: ok=%v err=%v", queue, ok, err)
	}
	return d
}

// reject takes n messages from a queue and rejects them without requeue (dead-lettering them).
func (b *broker) reject(t *testing.T, queue string, n int) {
	t.Helper()
	ch := b.ch(t)
	deadline := time.Now().Add(waitFor)
	for got := 0; got < n; {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if !ok {
			if time.Now().After(deadline) {
				t.Fatalf("got %d messages from %s to reject, want %d", got, queue, n)
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err := d.Reject(false); err != nil {
			t.Fatalf("reject: %v", err)
		}
		got++
	}
}

// topology is a source queue bound to an exchange, dead-lettering into a DLQ through a fanout DLX.
type topology struct {
	exchange, src, dlx, dlq string
}

func (b *broker) setup(t *testing.T, srcArgs amqp.Table) topology {
	t.Helper()
	tp := topology{exchange: b.name("x"), src: b.name("src"), dlx: b.name("dlx"), dlq: b.name("dlq")}
	b.declareExchange(t, tp.exchange, "direct")
	b.declareExchange(t, tp.dlx, "fanout")
	b.declareQueue(t, tp.dlq, nil)
	b.bind(t, tp.dlq, "", tp.dlx)
	args := amqp.Table{"x-dead-letter-exchange": tp.dlx}
	for k, v := range srcArgs {
		args[k] = v
	}
	b.declareQueue(t, tp.src, args)
	b.bind(t, tp.src, "k", tp.exchange)
	return tp
}

func msg(body string) amqp.Publishing {
	return amqp.Publishing{
		Body:         []byte(body),
		DeliveryMode: amqp.Persistent,
		ContentType:  "text/plain",
		MessageId:    "id-" + body,
		Headers:      amqp.Table{"app-header": "kept"},
	}
}

func bodies(ds []amqp.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = string(d.Body)
	}
	sort.Strings(out)
	return out
}

func redrive(t *testing.T, b *broker, opts Options) (*Result, error) {
	t.Helper()
	opts.URI = b.url
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitFor)
	defer cancel()
	return Redrive(ctx, opts)
}

func TestRedriveRoundTrip(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b *broker) {
		tp := b.setup(t, nil)
		b.publish(t, tp.exchange, "k", msg("a"), msg("b"), msg("c"))
		b.reject(t, tp.src, 3)
		b.waitCount(t, tp.dlq, 3)

		// A dry run first: the messages come back to the DLQ as redeliveries.
		if _, err := redrive(t, b, Options{Queue: tp.dlq, DryRun: true}); err != nil {
			t.Fatalf("dry run: %v", err)
		}
		b.waitCount(t, tp.dlq, 3)
		res, err := redrive(t, b, Options{Queue: tp.dlq})
		if err != nil {
			t.Fatalf("Redrive: %v", err)
		}
		if res.Moved != 3 || res.Failed != 0 {
			t.Fatalf("moved %d, failed %d; want 3, 0", res.Moved, res.Failed)
		}
		want := Group{Reason: "rejected", SourceQueue: tp.src, Target: fmt.Sprintf("exchange %q, routing key \"k\"", tp.exchange),
			Movable: true, Count: 3, Moved: 3}
		if len(res.Groups) != 1 || *res.Groups[0] != want {
			t.Fatalf("groups %+v, want [%+v]", res.Groups, want)
		}
		if n := b.count(t, tp.dlq); n != 0 {
			t.Fatalf("DLQ holds %d messages after the redrive, want 0", n)
		}

		// The messages are back in the source queue, properties and history kept.
		got := b.get(t, tp.src, 3)
		if !reflect.DeepEqual(bodies(got), []string{"a", "b", "c"}) {
			t.Fatalf("source queue gave %v", bodies(got))
		}
		for _, d := range got {
			if d.MessageId != "id-"+string(d.Body) || d.ContentType != "text/plain" || d.DeliveryMode != amqp.Persistent ||
				d.Headers["app-header"] != "kept" {
				t.Errorf("properties not kept: %+v", d)
			}
			if d.Headers["x-first-death-queue"] != tp.src || d.Headers["x-first-death-reason"] != "rejected" {
				t.Errorf("x-first-death headers not kept: %v", d.Headers)
			}
			if _, ok := d.Headers["CC"]; ok {
				t.Errorf("CC header added for a single routing key: %v", d.Headers)
			}
			if _, ok := d.Headers["x-delivery-count"]; ok {
				t.Errorf("x-delivery-count on a first delivery: %v", d.Headers)
			}
		}
		if b.count(t, tp.dlq) != 0 {
			t.Fatal("DLQ not empty")
		}
	})
}

// TestRedriveSecondCycle rejects a redriven message again: its x-death history goes on.
func TestRedriveSecondCycle(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b *broker) {
		tp := b.setup(t, nil)
		b.publish(t, tp.exchange, "k", msg("a"))
		b.reject(t, tp.src, 1)
		b.waitCount(t, tp.dlq, 1)
		if _, err := redrive(t, b, Options{Queue: tp.dlq}); err != nil {
			t.Fatalf("Redrive: %v", err)
		}
		b.reject(t, tp.src, 1)
		b.waitCount(t, tp.dlq, 1)
		d := b.peek(t, tp.dlq)
		deaths, _ := d.Headers["x-death"].([]any)
		t.Logf("x-death after two cycles: %v", deaths)
		if len(deaths) == 0 {
			t.Fatalf("no x-death after the second death: %v", d.Headers)
		}
		e, _ := deaths[0].(amqp.Table)
		if e["queue"] != tp.src || e["reason"] != "rejected" {
			t.Fatalf("newest x-death entry %v", e)
		}
		// RabbitMQ before 4.0 (and Warren) continue the history a publisher hands in; 4.x starts over.
		if c, _ := e["count"].(int64); c != 2 {
			t.Errorf("x-death count %v after two deaths in the same queue, want 2", e["count"])
		}
		// Redrive again: it goes back to the source once more.
		if _, err := redrive(t, b, Options{Queue: tp.dlq}); err != nil {
			t.Fatalf("second Redrive: %v", err)
		}
		b.get(t, tp.src, 1)
	})
}

func TestRedriveCC(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b *broker) {
		tp := b.setup(t, nil) // src is bound with key "k"
		other := b.name("other")
		b.declareQueue(t, other, nil)
		b.bind(t, other, "o", tp.exchange)
		// Published with key "z" (routes nowhere) and CC ["k"]: it reaches src through the CC key.
		m := msg("cc")
		m.Headers["CC"] = []any{"k"}
		b.publish(t, tp.exchange, "z", m)
		b.reject(t, tp.src, 1)
		b.waitCount(t, tp.dlq, 1)

		res, err := redrive(t, b, Options{Queue: tp.dlq, DryRun: true})
		if err != nil {
			t.Fatalf("dry run: %v", err)
		}
		wantTarget := fmt.Sprintf(`exchange %q, routing keys "z", "k"`, tp.exchange)
		if len(res.Groups) != 1 || res.Groups[0].Target != wantTarget {
			t.Fatalf("groups %+v, want target %s", res.Groups, wantTarget)
		}
		if _, err := redrive(t, b, Options{Queue: tp.dlq}); err != nil {
			t.Fatalf("Redrive: %v", err)
		}
		d := b.get(t, tp.src, 1)[0]
		if !reflect.DeepEqual(d.Headers["CC"], []any{"k"}) {
			t.Errorf("CC header %v, want [k]", d.Headers["CC"])
		}
		if n := b.count(t, other); n != 0 {
			t.Errorf("other queue got %d messages", n)
		}
	})
}

func TestRedriveTo(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b *broker) {
		tp := b.setup(t, nil)
		parking := b.name("parking")
		b.declareQueue(t, parking, nil)
		m := msg("cc")
		m.Headers["CC"] = []any{"k"} // must not be kept: it would also route to a queue named "k"
		b.publish(t, tp.exchange, "k", msg("a"), msg("b"), m)
		b.reject(t, tp.src, 3)
		b.waitCount(t, tp.dlq, 3)
		// A message without x-death can be moved with --to.
		b.publish(t, "", tp.dlq, msg("plain"))

		res, err := redrive(t, b, Options{Queue: tp.dlq, To: parking})
		if err != nil {
			t.Fatalf("Redrive: %v", err)
		}
		if res.Moved != 4 || res.Failed != 0 {
			t.Fatalf("moved %d, failed %d; want 4, 0", res.Moved, res.Failed)
		}
		got := b.get(t, parking, 4)
		if !reflect.DeepEqual(bodies(got), []string{"a", "b", "cc", "plain"}) {
			t.Fatalf("parking queue gave %v", bodies(got))
		}
		for _, d := range got {
			if _, ok := d.Headers["CC"]; ok {
				t.Errorf("CC header kept with --to: %v", d.Headers)
			}
		}
		if n := b.count(t, tp.src); n != 0 {
			t.Errorf("source queue got %d messages", n)
		}
		if n := b.count(t, tp.dlq); n != 0 {
			t.Errorf("DLQ holds %d messages", n)
		}
	})
}

func TestRedriveLimit(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b *broker) {
		tp := b.setup(t, nil)
		b.publish(t, tp.exchange, "k", msg("1"), msg("2"), msg("3"), msg("4"), msg("5"))
		b.reject(t, tp.src, 5)
		b.waitCount(t, tp.dlq, 5)
		res, err := redrive(t, b, Options{Queue: tp.dlq, Limit: 2})
		if err != nil {
			t.Fatalf("Redrive: %v", err)
		}
		if res.Moved != 2 || res.Failed != 0 || res.Remaining != 3 {
			t.Fatalf("moved %d, failed %d, remaining %d; want 2, 0, 3", res.Moved, res.Failed, res.Remaining)
		}
		b.waitCount(t, tp.dlq, 3)
		if got := bodies(b.get(t, tp.src, 2)); !reflect.DeepEqual(got, []string{"1", "2"}) {
			t.Errorf("moved %v, want the two oldest", got)
		}
	})
}

func TestRedriveDryRun(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b *broker) {
		tp := b.setup(t, nil)
		// Two more sources dead-lettering into the same DLQ: one by overflow (reason maxlen), one
		// by TTL (reason expired).
		capped, ttl := b.name("cap"), b.name("ttl")
		b.declareQueue(t, capped, amqp.Table{"x-dead-letter-exchange": tp.dlx, "x-max-length": int32(1)})
		b.declareQueue(t, ttl, amqp.Table{"x-dead-letter-exchange": tp.dlx, "x-message-ttl": int32(1)})
		b.publish(t, tp.exchange, "k", msg("r1"), msg("r2"), msg("r3"))
		b.reject(t, tp.src, 3)
		b.waitCount(t, tp.dlq, 3)
		b.publish(t, "", capped, msg("m1"), msg("m2"), msg("m3"))
		b.waitCount(t, tp.dlq, 5)
		b.publish(t, "", ttl, msg("t1"))
		b.waitCount(t, tp.dlq, 6)
		b.publish(t, "", tp.dlq, msg("plain"))

		res, err := redrive(t, b, Options{Queue: tp.dlq, DryRun: true})
		if err != nil {
			t.Fatalf("dry run: %v", err)
		}
		if res.Moved != 6 || res.Failed != 1 || res.Ready != 7 || res.Remaining != 7 {
			t.Fatalf("would move %d, fail %d of %d, remaining %d; want 6, 1 of 7, 7", res.Moved, res.Failed, res.Ready, res.Remaining)
		}
		want := []Group{
			{Target: "cannot move: cannot tell where it came from: no x-death header (use --to QUEUE)", Count: 1},
			{Reason: "maxlen", SourceQueue: capped, Target: fmt.Sprintf(`default exchange, routing key %q`, capped), Movable: true, Count: 2},
			{Reason: "rejected", SourceQueue: tp.src, Target: fmt.Sprintf(`exchange %q, routing key "k"`, tp.exchange), Movable: true, Count: 3},
			{Reason: "expired", SourceQueue: ttl, Target: fmt.Sprintf(`default exchange, routing key %q`, ttl), Movable: true, Count: 1},
		}
		var got []Group
		for _, g := range res.Groups {
			got = append(got, *g)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("groups\n%+v\nwant\n%+v", got, want)
		}
		var out bytes.Buffer
		if err := Report(&out, res); err != nil {
			t.Fatal(err)
		}
		t.Logf("dry-run report:\n%s", out.String())
		for _, re := range []string{
			`(?m)^\s+3\s+rejected\s+` + regexp.QuoteMeta(tp.src) + `\s+exchange "` + regexp.QuoteMeta(tp.exchange) + `", routing key "k"$`,
			`(?m)^\s+2\s+maxlen\s+` + regexp.QuoteMeta(capped) + `\s+default exchange, routing key "` + regexp.QuoteMeta(capped) + `"$`,
			`(?m)^\s+1\s+expired\s+` + regexp.QuoteMeta(ttl) + `\s+default exchange, routing key "` + regexp.QuoteMeta(ttl) + `"$`,
			`(?m)^\s+1\s+-\s+-\s+cannot move: `,
			`(?m)^dry run: would move 6, would fail 1$`,
		} {
			if !regexp.MustCompile(re).MatchString(out.String()) {
				t.Errorf("report does not match %s", re)
			}
		}
		// Nothing was removed, nothing published.
		b.waitCount(t, tp.dlq, 7)
		if n := b.count(t, tp.src); n != 0 {
			t.Errorf("source queue got %d messages", n)
		}
		var order []string
		for _, d := range b.get(t, tp.dlq, 7) {
			order = append(order, string(d.Body))
		}
		if want := []string{"r1", "r2", "r3", "m1", "m2", "t1", "plain"}; !reflect.DeepEqual(order, want) {
			t.Errorf("DLQ holds %v after the dry run, want %v in that order", order, want)
		}
	})
}

// TestRedriveWithoutHistory leaves a message without x-death in the DLQ and reports it as failed.
func TestRedriveWithoutHistory(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b *broker) {
		tp := b.setup(t, nil)
		b.publish(t, "", tp.dlq, msg("plain"))
		b.publish(t, tp.exchange, "k", msg("a"))
		b.reject(t, tp.src, 1)
		b.waitCount(t, tp.dlq, 2)
		res, err := redrive(t, b, Options{Queue: tp.dlq})
		if err == nil || !strings.Contains(err.Error(), "1 message(s) could not be moved") {
			t.Fatalf("Redrive error %v, want one message not moved", err)
		}
		if res.Moved != 1 || res.Failed != 1 {
			t.Fatalf("moved %d, failed %d; want 1, 1", res.Moved, res.Failed)
		}
		if got := bodies(b.get(t, tp.src, 1)); got[0] != "a" {
			t.Errorf("source got %v", got)
		}
		if got := bodies(b.get(t, tp.dlq, 1)); got[0] != "plain" {
			t.Errorf("DLQ kept %v", got)
		}
	})
}

// TestRedriveUnroutable: the source queue was unbound, so the republish is returned; the messages
// stay in the DLQ and the redrive stops with an error.
func TestRedriveUnroutable(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b *broker) {
		tp := b.setup(t, nil)
		b.publish(t, tp.exchange, "k", msg("a"), msg("b"), msg("c"))
		b.reject(t, tp.src, 3)
		b.waitCount(t, tp.dlq, 3)
		if err := b.ch(t).QueueUnbind(tp.src, "k", tp.exchange, nil); err != nil {
			t.Fatalf("unbind: %v", err)
		}
		res, err := redrive(t, b, Options{Queue: tp.dlq})
		if err == nil || !strings.Contains(err.Error(), "unroutable") || !strings.Contains(err.Error(), "NO_ROUTE") {
			t.Fatalf("Redrive error %v, want unroutable (312 NO_ROUTE)", err)
		}
		if res.Moved != 0 || res.Failed == 0 {
			t.Fatalf("moved %d, failed %d; want 0, >0", res.Moved, res.Failed)
		}
		b.waitCount(t, tp.dlq, 3)
		got := b.get(t, tp.dlq, 3)
		if !reflect.DeepEqual(bodies(got), []string{"a", "b", "c"}) {
			t.Fatalf("DLQ holds %v", bodies(got))
		}
		if _, ok := got[0].Headers["x-death"]; !ok {
			t.Errorf("message in the DLQ lost its x-death: %v", got[0].Headers)
		}
	})
}

// TestRedriveRefused: the target queue refuses the publish (x-overflow reject-publish), the broker
// nacks it and the message stays in the DLQ.
func TestRedriveRefused(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b *broker) {
		tp := b.setup(t, nil)
		full := b.name("full")
		b.declareQueue(t, full, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
		b.publish(t, "", full, msg("occupant"))
		b.publish(t, tp.exchange, "k", msg("a"), msg("b"))
		b.reject(t, tp.src, 2)
		b.waitCount(t, tp.dlq, 2)
		res, err := redrive(t, b, Options{Queue: tp.dlq, To: full})
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("Redrive error %v, want refused", err)
		}
		if res.Moved != 0 || res.Failed == 0 {
			t.Fatalf("moved %d, failed %d; want 0, >0", res.Moved, res.Failed)
		}
		b.waitCount(t, tp.dlq, 2)
		b.waitCount(t, full, 1)
	})
}

// TestRedriveManyPartlyUnroutable: 400 messages from two sources, interleaved in the DLQ; one
// source is unbound. With up to 100 publishes awaiting their confirm, every message ends up exactly
// once either in its source queue or in the DLQ, and every unroutable one in the DLQ.
func TestRedriveManyPartlyUnroutable(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b *broker) {
		tp := b.setup(t, nil)
		gone := b.name("gone")
		b.declareQueue(t, gone, amqp.Table{"x-dead-letter-exchange": tp.dlx})
		b.bind(t, gone, "g", tp.exchange)
		const n = 200
		for i := 0; i < n; i++ {
			b.publish(t, tp.exchange, "k", msg(fmt.Sprintf("k%03d", i)))
			b.publish(t, tp.exchange, "g", msg(fmt.Sprintf("g%03d", i)))
		}
		ch := b.ch(t)
		for i := 0; i < n; i++ {
			b.reject(t, tp.src, 1)
			b.reject(t, gone, 1)
		}
		b.waitCount(t, tp.dlq, 2*n)
		if err := ch.QueueUnbind(gone, "g", tp.exchange, nil); err != nil {
			t.Fatalf("unbind: %v", err)
		}
		res, err := redrive(t, b, Options{Queue: tp.dlq, Window: 100})
		if err == nil || !strings.Contains(err.Error(), "unroutable") {
			t.Fatalf("Redrive error %v, want unroutable", err)
		}
		t.Logf("moved %d, failed %d: %v", res.Moved, res.Failed, err)
		b.waitCount(t, tp.dlq, 2*n-res.Moved)
		seen := map[string]int{}
		for _, d := range b.get(t, tp.dlq, 2*n-res.Moved) {
			seen[string(d.Body)]++
		}
		inSrc := b.get(t, tp.src, res.Moved)
		for _, d := range inSrc {
			if d.Body[0] != 'k' {
				t.Errorf("source queue got %s", d.Body)
			}
			seen[string(d.Body)]++
		}
		if len(seen) != 2*n {
			t.Errorf("%d distinct messages left, want %d", len(seen), 2*n)
		}
		for body, c := range seen {
			if c != 1 {
				t.Errorf("message %s found %d times", body, c)
			}
		}
		if b.count(t, tp.src) != 0 || b.count(t, gone) != 0 {
			t.Error("extra messages in the source queues")
		}
	})
}

// TestRedriveMissingExchange: the exchange a message came from is gone; it stays in the DLQ.
func TestRedriveMissingExchange(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b *broker) {
		tp := b.setup(t, nil)
		b.publish(t, tp.exchange, "k", msg("a"))
		b.reject(t, tp.src, 1)
		b.waitCount(t, tp.dlq, 1)
		if err := b.ch(t).ExchangeDelete(tp.exchange, false, false); err != nil {
			t.Fatalf("delete exchange: %v", err)
		}
		res, err := redrive(t, b, Options{Queue: tp.dlq})
		if err == nil {
			t.Fatal("Redrive succeeded, want an error")
		}
		if res.Moved != 0 || res.Failed != 1 || !strings.Contains(res.Groups[0].Target, "does not exist") {
			t.Fatalf("moved %d, failed %d, groups %+v", res.Moved, res.Failed, res.Groups)
		}
		b.waitCount(t, tp.dlq, 1)
	})
}

// TestRedriveToSourceQueue: a message that died in one of two queues of a fanout exchange goes
// back to both when republished to its exchange, to its own queue only with --to-source-queue.
func TestRedriveToSourceQueue(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b *broker) {
		fan, a, other, dlx, dlq := b.name("fan"), b.name("a"), b.name("b"), b.name("dlx"), b.name("dlq")
		b.declareExchange(t, fan, "fanout")
		b.declareExchange(t, dlx, "fanout")
		b.declareQueue(t, dlq, nil)
		b.bind(t, dlq, "", dlx)
		b.declareQueue(t, a, amqp.Table{"x-dead-letter-exchange": dlx})
		b.declareQueue(t, other, nil)
		b.bind(t, a, "", fan)
		b.bind(t, other, "", fan)
		b.publish(t, fan, "", msg("m"))
		b.get(t, other, 1) // consumed fine there
		b.reject(t, a, 1)
		b.waitCount(t, dlq, 1)

		if _, err := redrive(t, b, Options{Queue: dlq, ToSourceQueue: true}); err != nil {
			t.Fatalf("Redrive --to-source-queue: %v", err)
		}
		b.get(t, a, 1)
		if n := b.count(t, other); n != 0 {
			t.Errorf("--to-source-queue also delivered to the other queue (%d)", n)
		}

		// The same through the exchange reaches both queues.
		b.publish(t, fan, "", msg("m2"))
		b.get(t, other, 1)
		b.reject(t, a, 1)
		b.waitCount(t, dlq, 1)
		if _, err := redrive(t, b, Options{Queue: dlq}); err != nil {
			t.Fatalf("Redrive: %v", err)
		}
		b.get(t, a, 1)
		b.get(t, other, 1)
	})
}

// TestCommand runs `warren dlq redrive` through the cli: a dry run, then the redrive.
func TestCommand(t *testing.T) {
	b := startWarren(t)
	tp := b.setup(t, nil)
	b.publish(t, tp.exchange, "k", msg("a"), msg("b"))
	b.reject(t, tp.src, 2)
	b.waitCount(t, tp.dlq, 2)

	run := func(queue string, args ...string) (string, error) {
		var out bytes.Buffer
		app := &cli.App{Name: "warren", Writer: &out, ErrWriter: &out, Commands: []*cli.Command{Command()}}
		err := app.Run(append([]string{"warren", "dlq", "redrive", "--uri", b.url, "--queue", queue}, args...))
		return out.String(), err
	}
	out, err := run(tp.dlq, "--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	t.Logf("dry run:\n%s", out)
	if !strings.Contains(out, "dry run: would move 2, would fail 0") || !regexp.MustCompile(`(?m)^\s+2\s+rejected\s+`).MatchString(out) {
		t.Errorf("dry-run output:\n%s", out)
	}
	b.waitCount(t, tp.dlq, 2)
	out, err = run(tp.dlq)
	if err != nil {
		t.Fatalf("redrive: %v\n%s", err, out)
	}
	t.Logf("redrive:\n%s", out)
	if !strings.Contains(out, "moved 2, failed 0\n") {
		t.Errorf("output:\n%s", out)
	}
	b.get(t, tp.src, 2)

	if _, err := run(tp.dlq, "--to", tp.dlq); err == nil || !strings.Contains(err.Error(), "dead-letter queue itself") {
		t.Errorf("--to the DLQ itself: %v", err)
	}
	out, err = run(b.name("missing"))
	if err == nil {
		t.Errorf("missing queue: no error\n%s", out)
	}
}
