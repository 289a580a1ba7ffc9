package httpapi_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// browsedPayloads is the JavaScript that lists the payloads the queue page's browse shows.
const browsedPayloads = `[...document.querySelectorAll("#browse-results tr[data-msg-id] pre.payload")].map(e => e.textContent).join(",")`

// browsedRedelivered lists the redelivered cells of the browse.
const browsedRedelivered = `[...document.querySelectorAll("#browse-results tr[data-msg-id] td.redelivered")].map(e => e.textContent).join(",")`

// TestConsoleBrowseRedriveAndStreams drives the console's queue tools in a real headless Chromium:
// browse a queue and check over AMQP that nothing was delivered, dead-letter two messages, see
// their x-death in the dead-letter queue's browse, redrive one of them and see it back in its
// source queue (and the other still in the dead-letter queue), then the stream and super stream
// pages with a consumer group's owners and lag, and the overview's node health. Each page's
// screenshot goes to bin/console-screenshots.
func TestConsoleBrowseRedriveAndStreams(t *testing.T) {
	c := newConsoleBrowser(t)
	b := startBroker(t)
	conn, ch := amqpSetup(t, b.amqpURL)
	if _, err := ch.QueueDeclare("work-dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("work", true, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work-dlq"}); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"job-1", "job-2", "job-3"} {
		confirmPublish(t, ch, "", "work", amqp.Publishing{Body: []byte(body), DeliveryMode: 2})
	}
	c.login(b.api)

	c.run("browse a queue twice",
		chromedp.Navigate(b.api+"/#/queue/%2F/work"),
		c.waitText("#q-messages b", "3"),
		chromedp.Click(chromedp.CSS("#browse-submit")),
		c.waitEval(browsedPayloads, "job-1,job-2,job-3"),
		c.waitEval(browsedRedelivered, "false,false,false"),
		chromedp.Click(chromedp.CSS("#browse-submit")),
		c.waitEval(browsedRedelivered, "false,false,false"),
		c.waitText("#q-messages b", "3"),
		c.shot("queue-browse"),
	)
	// The browse delivered nothing: the first two come out of basic.get never delivered before.
	// Rejected without requeue, they die into work-dlq.
	for _, want := range []string{"job-1", "job-2"} {
		d := mustGet(t, ch, "work")
		if string(d.Body) != want || d.Redelivered {
			t.Fatalf("basic.get after the browse: %q redelivered=%v, want %q not redelivered", d.Body, d.Redelivered, want)
		}
		if err := d.Reject(false); err != nil {
			t.Fatal(err)
		}
	}
	b.waitDepth(t, "work-dlq", 2)

	secondSelect := `#browse-results tbody tr:nth-child(2) .browse-select`
	c.run("browse the dead-letter queue and redrive the second message",
		chromedp.Navigate(b.api+"/#/queue/%2F/work-dlq"),
		c.waitText("#q-messages b", "2"),
		chromedp.Click(chromedp.CSS("#browse-submit")),
		c.waitEval(browsedPayloads, "job-1,job-2"),
		c.waitUntil("#browse-results tbody tr:nth-child(1) td.x-death", func(s string) bool {
			return strings.HasPrefix(s, "work · rejected ×1 · from (default) [work]")
		}, "work's x-death entry"),
		c.shot("dlq-browse"),
		chromedp.Click(chromedp.CSS(secondSelect)),
		chromedp.Click(chromedp.CSS("#redrive-submit")),
		c.waitText("#status", "Redrove 1 message"),
		c.waitEval(browsedPayloads, "job-1"),
		c.waitText("#q-messages b", "1"),
		c.shot("dlq-redriven"),
	)
	c.run("see the redriven message back in its source queue",
		chromedp.Navigate(b.api+"/#/queue/%2F/work"),
		c.waitText("#q-messages b", "2"),
		chromedp.Click(chromedp.CSS("#browse-submit")),
		c.waitEval(browsedPayloads, "job-3,job-2"),
		c.waitEval(browsedRedelivered, "false,false"),
	)
	for _, want := range []struct{ queue, body string }{{"work", "job-3"}, {"work", "job-2"}, {"work-dlq", "job-1"}} {
		d := mustGet(t, ch, want.queue)
		if string(d.Body) != want.body || d.Redelivered {
			t.Fatalf("basic.get %s after the redrive: %q redelivered=%v, want %q not redelivered", want.queue, d.Body, d.Redelivered, want.body)
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}

	// A super stream of two partitions; a consumer group member acknowledges 4 of 10 messages.
	if err := ch.ExchangeDeclare("orders", "x-super-stream", true, false, false, false, amqp.Table{"x-partitions": int32(2)}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		confirmPublish(t, ch, "orders", fmt.Sprintf("order-%d", i), amqp.Publishing{Body: []byte(fmt.Sprintf("order %d", i))})
	}
	mch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := mch.Qos(100, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := mch.Consume("orders", "member-1", false, false, false, false, amqp.Table{"x-stream-consumer-group": "billing", "x-stream-offset": "first"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		select {
		case d := <-ds:
			if i < 4 {
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the group member got %d of 10 messages", i)
		}
	}
	lagSum := `String([...document.querySelectorAll('#ss-groups tr[data-group="billing"] td.lag')].reduce((s, e) => s + Number(e.textContent), 0))`
	owners := `[...document.querySelectorAll('#ss-groups tr[data-group="billing"] td:nth-child(2)')].map(e => e.textContent.split(" @ ")[0]).join(",")`
	c.run("see the super stream's partitions and the group's owners and lag",
		chromedp.Navigate(b.api+"/#/superstreams"),
		c.waitText(`#ss-list tr[data-super="orders"] a`, "orders"),
		c.shot("superstreams"),
		chromedp.Click(chromedp.CSS(`#ss-list tr[data-super="orders"] a`)),
		c.waitEval(`String(document.querySelectorAll("#ss-parts tr[data-partition]").length)`, "2"),
		c.waitEval(`String([...document.querySelectorAll("#ss-parts td.messages")].reduce((s, e) => s + Number(e.textContent), 0))`, "10"),
		c.waitEval(owners, "member-1,member-1"),
		// 4 of 10 acknowledged: the partitions' lag sums to 6 (more while the commits are on their way).
		c.waitEval(lagSum+` >= 6 && `+lagSum+` < 10 ? "lagging" : `+lagSum, "lagging"),
		c.shot("superstream"),
	)
	// The lag the page shows is the API's.
	var groups []map[string]any
	b.call(t, "GET", "/api/stream/consumer-groups/%2F/orders", nil, &groups)
	if len(groups) != 1 || groups[0]["group"] != "billing" {
		t.Fatalf("consumer groups: %v", groups)
	}

	partition := `#ss-parts tr[data-partition] a`
	c.run("open a partition's stream page and browse it",
		chromedp.Click(chromedp.CSS(partition)),
		c.waitUntil("#q-type b", func(s string) bool { return s == "stream" }, "stream"),
		chromedp.WaitVisible(chromedp.CSS("#q-firstoffset")),
		chromedp.WaitVisible(chromedp.CSS("#q-segments")),
		chromedp.Click(chromedp.CSS("#browse-submit")),
		c.waitUntil("#browse-results tbody tr:nth-child(1) td:nth-child(1)", func(s string) bool { return s == "0" }, "offset 0 first"),
		// The partition's page shows the super stream's group on it.
		c.waitEval(`String(document.querySelectorAll('#s-groups tr[data-group="billing"] td.lag').length)`, "1"),
		c.waitText(`#s-consumers tbody tr td:nth-child(1)`, "member-1"),
		c.shot("stream"),
	)
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(c.ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	first, last, segs := text("#q-firstoffset b"), text("#q-lastoffset b"), text("#q-segments b")
	if n, err := strconv.Atoi(segs); err != nil || n < 1 || first != "0" || last == "" {
		t.Fatalf("stream cards: first %q last %q segments %q", first, last, segs)
	}

	c.run("see the node's health on the overview",
		chromedp.Navigate(b.api+"/#/overview"),
		c.waitText(`#ov-cards [data-total="cluster members"] b`, "1 of 1 running"),
		c.waitText(`#ov-cards [data-total="alarms"] b`, "none"),
		chromedp.WaitVisible(chromedp.CSS("#ov-nodes table")),
		// The rate chart takes a sample at every refresh (5 s).
		c.waitEval(`String(Number(document.querySelector("canvas#rates").dataset.points) >= 2)`, "true"),
		c.shot("overview-health"),
	)
}
