package definitions

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"warren/amqp"
	"warren/server/policy"
)

// TestExportImportsIntoRabbitMQ checks that a document Warren encodes imports into a real
// RabbitMQ with the same objects and working passwords. It needs the reference broker's
// management API in WARREN_REF_MGMT (http://127.0.0.1:15682, user guest) and, for the logins,
// its AMQP URL in WARREN_TEST_URL (amqp://guest:guest@127.0.0.1:5682/). Everything is created
// in a vhost and under user names of its own, deleted at the end.
func TestExportImportsIntoRabbitMQ(t *testing.T) {
	mgmt := os.Getenv("WARREN_REF_MGMT")
	if mgmt == "" {
		t.Skip("WARREN_REF_MGMT is not set (the reference RabbitMQ's management API, e.g. http://127.0.0.1:15682)")
	}
	src, err := Decode(readFile(t, "rabbitmq-3.10.8-export.json"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	vhost := "wdefs-reimport-" + suffix
	user := func(name string) string { return strings.Replace(name, "wdefs-", "wdefs-ri-"+suffix+"-", 1) }

	// (apply-to classic_queues and the other 3.12+ values would be refused by 3.10.8.)
	// The fixture's vhost "wdefs" and its users, renamed, plus objects built the way Warren's
	// exporter will build them.
	d := &Definitions{RabbitVersion: "warren", RabbitMQVersion: "3.10.8", ProductName: "Warren", ProductVersion: "0"}
	d.VHosts = []VHost{{Name: vhost, Description: "reimport test", Tags: []string{"warren", "test"}, DefaultQueueType: "classic"}}
	for _, u := range src.Users {
		if strings.HasPrefix(u.Name, "wdefs-") {
			u.Name = user(u.Name)
			d.Users = append(d.Users, u)
		}
	}
	for _, p := range src.Permissions {
		if p.VHost == "wdefs" && strings.HasPrefix(p.User, "wdefs-") {
			p.VHost, p.User = vhost, user(p.User)
			d.Permissions = append(d.Permissions, p)
		}
	}
	d.Permissions = append(d.Permissions, Permission{User: user("wdefs-sha512"), VHost: vhost, Configure: "", Write: "", Read: ".*"})
	for _, p := range src.TopicPermissions {
		p.VHost, p.User = vhost, user(p.User)
		d.TopicPermissions = append(d.TopicPermissions, p)
	}
	for _, p := range src.Policies {
		p.VHost = vhost
		d.Policies = append(d.Policies, p)
	}
	built, err := policy.Compile(policy.ComponentPolicy, policy.Policy{VHost: vhost, Name: "built", Pattern: "^built\\.",
		ApplyTo: policy.ApplyToQueues, Priority: 7, Definition: policy.Definition{"max-length": int64(42), "overflow": "reject-publish"}})
	if err != nil {
		t.Fatal(err)
	}
	d.Policies = append(d.Policies, built.Policy)
	for _, p := range src.OperatorPolicies {
		p.VHost = vhost
		d.OperatorPolicies = append(d.OperatorPolicies, p)
	}
	for _, l := range src.VHostLimits {
		l.VHost = vhost
		d.VHostLimits = append(d.VHostLimits, l)
	}
	for _, q := range src.Queues {
		if q.VHost == "wdefs" {
			q.VHost = vhost
			d.Queues = append(d.Queues, q)
		}
	}
	d.Queues = append(d.Queues,
		Queue{Name: "built.q", VHost: vhost, Type: "classic", Durable: true,
			Arguments: Arguments(amqp.Table{"x-message-ttl": int32(5000), "x-dead-letter-exchange": []byte("app.dlx")})},
		Queue{Name: "built.qq", VHost: vhost, Type: "quorum", Durable: true, Arguments: Arguments(amqp.Table{"x-delivery-limit": int64(7)})})
	for _, x := range src.Exchanges {
		if x.VHost == "wdefs" {
			x.VHost = vhost
			d.Exchanges = append(d.Exchanges, x)
		}
	}
	for _, b := range src.Bindings {
		if b.VHost == "wdefs" {
			b.VHost = vhost
			d.Bindings = append(d.Bindings, b)
		}
	}
	if err := d.Validate(nil, nil); err != nil {
		t.Fatal(err)
	}
	body, err := Encode(d)
	if err != nil {
		t.Fatal(err)
	}

	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections) // runs last, after the deletions below
	api := func(method, path string, in []byte) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, mgmt+"/api/"+path, bytes.NewReader(in))
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth("guest", "guest")
		req.Header.Set("content-type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	esc := url.PathEscape
	t.Cleanup(func() {
		api("DELETE", "vhosts/"+esc(vhost), nil)
		for _, u := range d.Users {
			api("DELETE", "users/"+esc(u.Name), nil)
		}
	})
	if code, out := api("POST", "definitions", body); code/100 != 2 {
		t.Fatalf("POST /api/definitions: %d %s\n%s", code, out, body)
	}

	// What RabbitMQ now holds for the vhost is what we sent.
	code, out := api("GET", "definitions/"+esc(vhost), nil)
	if code != 200 {
		t.Fatalf("GET /api/definitions/%s: %d %s", vhost, code, out)
	}
	back, err := Decode(out, Options{VHost: vhost})
	if err != nil {
		t.Fatalf("decoding RabbitMQ's export of the imported vhost: %v", err)
	}
	counts := map[string][2]int{
		"queues": {len(back.Queues), len(d.Queues)}, "exchanges": {len(back.Exchanges), len(d.Exchanges)},
		"bindings": {len(back.Bindings), len(d.Bindings)}, "policies": {len(back.Policies), len(d.Policies)},
		"operator policies": {len(back.OperatorPolicies), len(d.OperatorPolicies)}, "vhost limits": {len(back.VHostLimits), 1},
	}
	for what, c := range counts {
		if c[0] != c[1] {
			t.Errorf("%s: RabbitMQ has %d, we sent %d", what, c[0], c[1])
		}
	}
	for _, q := range d.Queues {
		code, out := api("GET", "queues/"+esc(vhost)+"/"+esc(q.Name), nil)
		var info struct {
			Type      string         `json:"type"`
			Arguments map[string]any `json:"arguments"`
		}
		if code != 200 || json.Unmarshal(out, &info) != nil {
			t.Errorf("queue %s: %d %s", q.Name, code, out)
			continue
		}
		if info.Type != q.Type {
			t.Errorf("queue %s: type %q, want %q", q.Name, info.Type, q.Type)
		}
	}
	for _, u := range d.Users {
		code, out := api("GET", "users/"+esc(u.Name), nil)
		var info struct {
			Tags             any    `json:"tags"`
			HashingAlgorithm string `json:"hashing_algorithm"`
		}
		if code != 200 || json.Unmarshal(out, &info) != nil {
			t.Errorf("user %s: %d %s", u.Name, code, out)
			continue
		}
		if info.HashingAlgorithm != u.Algorithm(d.RabbitVersion) {
			t.Errorf("user %s: algorithm %s, want %s", u.Name, info.HashingAlgorithm, u.Algorithm(d.RabbitVersion))
		}
	}

	// The imported hashes log in with the passwords the fixture's users were made with.
	amqpURL := os.Getenv("WARREN_TEST_URL")
	if amqpURL == "" {
		t.Log("WARREN_TEST_URL is not set: logins not checked")
		return
	}
	base, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ user, pass string }{{"wdefs-app", "app-pass"}, {"wdefs-sha512", "sha512-pass"}, {"wdefs-admin", "admin-pass"}} {
		u := *base
		u.User = url.UserPassword(user(c.user), c.pass)
		u.Path = "/" + vhost
		conn, err := amqp091.Dial(u.String())
		if err != nil {
			t.Errorf("login as %s: %v", user(c.user), err)
			continue
		}
		conn.Close()
	}
	u := *base
	u.User = url.UserPassword(user("wdefs-app"), "wrong")
	u.Path = "/" + vhost
	if conn, err := amqp091.Dial(u.String()); err == nil {
		conn.Close()
		t.Error("a wrong password logged in")
	}
}
