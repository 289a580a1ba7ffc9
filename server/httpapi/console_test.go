package httpapi_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// chromeBinary finds a Chrome or Chromium to drive ("" if none is installed).
func chromeBinary() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// screenshotDir is bin/console-screenshots at the repository's top, where the test leaves a
// picture of every page it visits.
func screenshotDir(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "bin", "console-screenshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// consoleBrowser is a headless Chromium driving the web console, with the helpers the browser
// tests share: actions that wait (bounded) for what a page shows, and screenshots.
type consoleBrowser struct {
	t     *testing.T
	ctx   context.Context
	shots string
}

// newConsoleBrowser starts Chromium (skipping the test when none is installed); it is stopped at
// the end of the test.
func newConsoleBrowser(t *testing.T) *consoleBrowser {
	chrome := chromeBinary()
	if chrome == "" {
		t.Skip("no Chrome or Chromium binary found (apt-get install chromium); the browser test needs one")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1280, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	ctx, cancel := context.WithTimeout(bctx, 3*time.Minute)
	t.Cleanup(func() { cancel(); cancelBrowser(); cancelAlloc() })
	return &consoleBrowser{t: t, ctx: ctx, shots: screenshotDir(t)}
}

// shot saves a full-page screenshot as bin/console-screenshots/NAME.png.
func (c *consoleBrowser) shot(name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		png, err := chromedp.FullScreenshot(100)(ctx, tg) // 100: PNG (below it, JPEG)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(c.shots, name+".png"), png, 0o644)
	})
}

// waitText polls the text of sel until it is want: the console refreshes every 5 s.
func (c *consoleBrowser) waitText(sel, want string) chromedp.Action[chromedp.Void] {
	return c.waitUntil(sel, func(got string) bool { return got == want }, fmt.Sprintf("%q", want))
}

// waitUntil polls the (trimmed) text of sel until ok accepts it, for up to 30 s.
func (c *consoleBrowser) waitUntil(sel string, ok func(string) bool, want string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		deadline := time.Now().Add(30 * time.Second)
		var got string
		for time.Now().Before(deadline) {
			tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
			text, err := chromedp.Text(chromedp.CSS(sel))(tctx, tg)
			tcancel()
			got = strings.TrimSpace(text)
			if err == nil && ok(got) {
				return nil
			}
			time.Sleep(200 * time.Millisecond)
		}
		return fmt.Errorf("%s: text %q, want %s", sel, got, want)
	})
}

// waitEval polls a JavaScript expression (a string) until it is want, for up to 30 s.
func (c *consoleBrowser) waitEval(expr, want string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		deadline := time.Now().Add(30 * time.Second)
		var got string
		for time.Now().Before(deadline) {
			v, err := chromedp.Evaluate[string](expr)(ctx, tg)
			got = v
			if err == nil && v == want {
				return nil
			}
			time.Sleep(200 * time.Millisecond)
		}
		return fmt.Errorf("%s = %q, want %q", expr, got, want)
	})
}

// run does actions in order and fails the test with what if one fails.
func (c *consoleBrowser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	c.t.Helper()
	if err := chromedp.Do(c.ctx, actions...); err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
}

// login opens the console at base and logs in as guest.
func (c *consoleBrowser) login(base string) {
	c.t.Helper()
	c.run("log in",
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS("#login-user")),
		chromedp.SendKeys(chromedp.CSS("#login-user"), "guest"),
		chromedp.SendKeys(chromedp.CSS("#login-pass"), "guest"),
		chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS("#nav")),
		c.waitText("#who", "guest (administrator)"),
	)
}

// TestConsoleInBrowser drives the web console in a real headless Chromium as an operator
// would: log in, find a queue declared over AMQP, watch its depth change after publishes over
// AMQP, publish and get a message through the queue page, and visit every page, keeping a
// screenshot of each under bin/console-screenshots.
func TestConsoleInBrowser(t *testing.T) {
	c := newConsoleBrowser(t)
	b := startBroker(t)
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	const qname = "console-q"
	if _, err := ch.QueueDeclare(qname, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	shot, waitText, run := c.shot, c.waitText, c.run

	run("log in with a wrong password",
		chromedp.Navigate(b.api+"/"),
		chromedp.WaitVisible(chromedp.CSS("#login-user")),
		chromedp.SendKeys(chromedp.CSS("#login-user"), "guest"),
		chromedp.SendKeys(chromedp.CSS("#login-pass"), "wrong"),
		chromedp.Click(chromedp.CSS("#login-submit")),
		waitText("#login-error", "Login failed"),
		shot("login-failed"),
	)
	run("log in",
		chromedp.SetValue(chromedp.CSS("#login-pass"), "guest"),
		chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS("#nav")),
		waitText("#who", "guest (administrator)"),
		chromedp.WaitVisible(chromedp.CSS("#ov-cards .card")),
		waitText(`#ov-cards [data-total="queues"] b`, "1"),
		shot("overview"),
	)
	rowMessages := fmt.Sprintf(`tr[data-queue=%q] td.messages`, qname)
	run("see the queue declared over AMQP",
		chromedp.Navigate(b.api+"/#/queues"),
		waitText(rowMessages, "0"),
	)
	for _, body := range []string{"amqp-1", "amqp-2"} {
		if err := ch.Publish("", qname, false, false, amqp.Publishing{Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	run("see its depth change after two publishes over AMQP",
		waitText(rowMessages, "2"),
		shot("queues"),
	)
	run("publish through the queue page",
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-queue=%q] a`, qname))),
		chromedp.WaitVisible(chromedp.CSS("#publish-payload")),
		waitText("#q-messages b", "2"),
		chromedp.SendKeys(chromedp.CSS("#publish-payload"), "from-the-browser"),
		chromedp.Click(chromedp.CSS("#publish-submit")),
		waitText("#status", "Message published"),
		waitText("#q-messages b", "3"),
	)
	run("get (and acknowledge) the first message through the queue page",
		chromedp.SetValue(chromedp.CSS("#get-ackmode"), "ack_requeue_false"),
		chromedp.Click(chromedp.CSS("#get-submit")),
		waitText("#get-results .payload", "amqp-1"),
		waitText("#q-messages b", "2"),
		shot("queue"),
	)
	// What the browser did is what an AMQP client sees.
	for _, want := range []string{"amqp-2", "from-the-browser"} {
		d, ok, err := ch.Get(qname, true)
		if err != nil || !ok || string(d.Body) != want {
			t.Fatalf("basic.get after the console: %q %v %v, want %q", d.Body, ok, err, want)
		}
	}
	for _, page := range []struct{ hash, ready string }{
		{"exchanges", "#x-list table"}, {"connections", "#c-list table"}, {"admin", "#u-list table"},
		{"policies", "#pol-list table"}, {"definitions", "#d-export"},
	} {
		run("visit "+page.hash,
			chromedp.Navigate(b.api+"/#/"+page.hash),
			chromedp.WaitVisible(chromedp.CSS(page.ready)),
			shot(page.hash),
		)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	run("see the AMQP connection and close it",
		chromedp.Navigate(b.api+"/#/connections"),
		waitText("#c-list tbody tr td:nth-child(2)", "guest"),
		chromedp.Click(chromedp.CSS("#c-list [data-close]")),
	)
	select {
	case e := <-closed:
		if e == nil || e.Code != amqp.ConnectionForced || !strings.Contains(e.Reason, "Closed from the Warren console") {
			t.Fatalf("connection closed with %v, want 320 and the console's reason", e)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the connection closed from the console is still open")
	}
}
