package conformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server/netserve"
)

// TestClientSuitesAsProvisionedUsers provisions what test setups and deployment tools do,
// through the HTTP API (a vhost, an application user with full permissions there and a
// read-only user), then runs the client suites (conformance/clients/run.sh) as the application
// user in that vhost. WARREN_ACCESS_SUITES picks the suites (default: pika kombu amqplib bunny
// php-amqplib); a suite whose client is not installed is skipped by run.sh.
func TestClientSuitesAsProvisionedUsers(t *testing.T) {
	if testEnv.bin == "" {
		t.Skipf("needs its own warren process; %s is set", envAddr)
	}
	port, err := netserve.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	api := fmt.Sprintf("127.0.0.1:%d", port)
	b, err := launchBroker(testEnv.bin, t.TempDir(), "--http-listen", api)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.stop(); err != nil {
			t.Errorf("stop broker: %v", err)
		}
		if t.Failed() {
			t.Logf("broker log (last 8 KB):\n%s", tail(b.logs(), 8192))
		}
	})
	call := func(method, path string, body any) {
		t.Helper()
		js, _ := json.Marshal(body)
		req, err := http.NewRequest(method, "http://"+api+path, bytes.NewReader(js))
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth("guest", "guest")
		req.Header.Set("Content-Type", "application/json")
		client := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("%s %s: %s", method, path, resp.Status)
		}
	}
	const vhost = "suites"
	call("PUT", "/api/vhosts/"+vhost, map[string]any{"description": "client suites"})
	// As in RabbitMQ, the vhost's creator (guest) got full permissions in it; take them back.
	call("DELETE", "/api/permissions/"+vhost+"/guest", nil)
	call("PUT", "/api/users/suite-app", map[string]any{"password": "app-pass", "tags": "management"})
	call("PUT", "/api/users/suite-reader", map[string]any{"password": "reader-pass", "tags": ""})
	call("PUT", "/api/permissions/"+vhost+"/suite-app", map[string]string{"configure": ".*", "write": ".*", "read": ".*"})
	call("PUT", "/api/permissions/"+vhost+"/suite-reader", map[string]string{"configure": "^$", "write": "^$", "read": ".*"})

	// The read-only user may connect but not declare.
	rc := dial(t, fmt.Sprintf("amqp://suite-reader:reader-pass@%s/%s", b.Addr, vhost))
	ch, err := rc.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("reader.q", false, true, false, false, nil); err == nil {
		t.Fatal("the read-only user declared a queue")
	} else if ae, ok := err.(*amqp.Error); !ok || ae.Code != amqp.AccessRefused {
		t.Fatalf("declare as the read-only user: %v, want 403", err)
	}
	// guest no longer has a permission in the new vhost.
	if c, err := amqp.Dial(fmt.Sprintf("amqp://guest:guest@%s/%s", b.Addr, vhost)); err == nil {
		c.Close()
		t.Fatal("guest connected to a vhost it has no permission in")
	}

	suites := strings.Fields(os.Getenv("WARREN_ACCESS_SUITES"))
	if len(suites) == 0 {
		suites = []string{"pika", "kombu", "amqplib", "bunny", "php-amqplib"}
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "conformance/clients/run.sh"), suites...)
	cmd.Env = append(os.Environ(), "WARREN_URL=amqp://suite-app:app-pass@"+b.Addr+"/"+url.PathEscape(vhost),
		"RESULTS_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	summary := regexp.MustCompile(`(?m)^\S+: \d+ passed, \d+ failed.*$`).FindAllString(string(out), -1)
	t.Logf("client suites as suite-app in vhost %s:\n%s", vhost, strings.Join(summary, "\n"))
	if err != nil {
		t.Fatalf("client suites failed: %v\n%s", err, tail(string(out), 16384))
	}
}
