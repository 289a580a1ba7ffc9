package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"warren/server"
	"warren/server/httpapi"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// broker is a Warren in this process with its AMQP listener and HTTP API on loopback ports the
// kernel picks.
type broker struct {
	srv     *server.Server
	amqpURL string
	api     string // http://127.0.0.1:PORT
}

func startBroker(t *testing.T) *broker {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	l, err := httpapi.Listen("127.0.0.1:0", srv, httpapi.Options{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return &broker{srv: srv, amqpURL: "amqp://guest:guest@" + srv.Addr().String() + "/", api: "http://" + l.Addr().String()}
}

// call sends an HTTP request with guest's credentials (or the given ones) and decodes a JSON
// answer into out when out is not nil.
func (b *broker) call(t *testing.T, method, path string, hdr http.Header, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, b.api+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("guest", "guest")
	for k, v := range hdr {
		req.Header[k] = v
	}
	client := http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil && len(body) > 0 {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s %s: %d %q is not JSON: %v", method, path, resp.StatusCode, body, err)
		}
	}
	return resp.StatusCode
}

type connJSON struct {
	Name             string         `json:"name"`
	User             string         `json:"user"`
	VHost            string         `json:"vhost"`
	Channels         int            `json:"channels"`
	PeerPort         int            `json:"peer_port"`
	ClientProperties map[string]any `json:"client_properties"`
}

// findConn polls the connection list until one named (by its client) name shows up.
func (b *broker) findConn(t *testing.T, name string) connJSON {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var conns []connJSON
		if code := b.call(t, "GET", "/api/connections/", nil, &conns); code != http.StatusOK {
			t.Fatalf("GET /api/connections/: %d", code)
		}
		for _, c := range conns {
			if c.ClientProperties["connection_name"] == name {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection named %q in %+v", name, conns)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func dial(t *testing.T, url, name string) *amqp.Connection {
	t.Helper()
	return dialProps(t, url, name, nil)
}

func dialProps(t *testing.T, url, name string, extra amqp.Table) *amqp.Connection {
	t.Helper()
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	for k, v := range extra {
		props[k] = v
	}
	c, err := amqp.DialConfig(url, amqp.Config{Properties: props})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// The way amqp091-go's recovery tests use the API: find a connection by its client-given name,
// delete it by RabbitMQ's name for it, and see the client get 320 CONNECTION_FORCED.
func TestCloseConnectionByName(t *testing.T) {
	b := startBroker(t)
	conn := dial(t, b.amqpURL, "api-test")
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	if _, err := conn.Channel(); err != nil {
		t.Fatal(err)
	}
	other := dial(t, b.amqpURL, "bystander")

	c := b.findConn(t, "api-test")
	if c.User != "guest" || c.VHost != "/" || c.Channels != 1 {
		t.Errorf("connection = %+v; want user guest, vhost /, 1 channel", c)
	}
	if want := fmt.Sprintf("127.0.0.1:%d -> %s", c.PeerPort, b.srv.Addr()); c.Name != want {
		t.Errorf("name = %q, want %q", c.Name, want)
	}
	var one connJSON
	path := "/api/connections/" + url.PathEscape(c.Name)
	if code := b.call(t, "GET", path, nil, &one); code != http.StatusOK || one.Name != c.Name {
		t.Errorf("GET %s: %d %+v", path, code, one)
	}

	hdr := http.Header{"X-Reason": {"maintenance"}}
	if code := b.call(t, "DELETE", path, hdr, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE %s: %d, want 204", path, code)
	}
	select {
	case e := <-closed:
		if e == nil || e.Code != amqp.ConnectionForced || e.Reason != "CONNECTION_FORCED - maintenance" {
			t.Errorf("client saw close %v; want 320 CONNECTION_FORCED - maintenance", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client was not closed within 5s")
	}
	if code := b.call(t, "DELETE", path, nil, nil); code != http.StatusNotFound {
		t.Errorf("second DELETE: %d, want 404", code)
	}
	if other.IsClosed() {
		t.Error("closing one connection closed another")
	}
	b.findConn(t, "bystander")
}

// Client properties of every AMQP type come out as RabbitMQ's API renders them.
func TestClientPropertiesAsJSON(t *testing.T) {
	b := startBroker(t)
	dialProps(t, b.amqpURL, "typed", amqp.Table{
		"bytes":   []byte("ab"),
		"when":    time.Unix(1700000000, 0),
		"decimal": amqp.Decimal{Scale: 2, Value: 12345},
		"nan":     math.NaN(),
		"nested":  amqp.Table{"list": []any{int32(1), "two"}},
	})
	got := b.findConn(t, "typed").ClientProperties
	want := map[string]any{
		"bytes":   "ab",
		"when":    float64(1700000000),
		"decimal": 123.45,
		"nan":     "NaN",
		"nested":  map[string]any{"list": []any{float64(1), "two"}},
	}
	for k, v := range want {
		if !reflect.DeepEqual(got[k], v) {
			t.Errorf("client_properties[%q] = %#v, want %#v", k, got[k], v)
		}
	}
}

// Without the X-Reason header the reason is RabbitMQ's.
func TestCloseConnectionDefaultReason(t *testing.T) {
	b := startBroker(t)
	conn := dial(t, b.amqpURL, "plain")
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	c := b.findConn(t, "plain")
	if code := b.call(t, "DELETE", "/api/connections/"+url.PathEscape(c.Name), nil, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d", code)
	}
	select {
	case e := <-closed:
		if e == nil || e.Reason != "CONNECTION_FORCED - Closed via management plugin" {
			t.Errorf("client saw close %v", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client was not closed within 5s")
	}
}

func TestQueueCounts(t *testing.T) {
	b := startBroker(t)
	conn := dial(t, b.amqpURL, "queues")
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("api-q", true, false, false, false, amqp.Table{"x-max-length": int32(100)}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := ch.Publish("", "api-q", false, false, amqp.Publishing{Body: []byte("m")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume("api-q", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-msgs: // held unacknowledged
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery")
	}

	type queueJSON struct {
		Name       string         `json:"name"`
		VHost      string         `json:"vhost"`
		Type       string         `json:"type"`
		Durable    bool           `json:"durable"`
		Arguments  map[string]any `json:"arguments"`
		Messages   int            `json:"messages"`
		Ready      int            `json:"messages_ready"`
		Unacked    int            `json:"messages_unacknowledged"`
		Consumers  int            `json:"consumers"`
		AutoDelete bool           `json:"auto_delete"`
	}
	want := queueJSON{Name: "api-q", VHost: "/", Type: "classic", Durable: true, Messages: 3, Ready: 2, Unacked: 1, Consumers: 1}
	var q queueJSON
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if code := b.call(t, "GET", "/api/queues/%2F/api-q", nil, &q); code != http.StatusOK {
			t.Fatalf("GET /api/queues/%%2F/api-q: %d", code)
		}
		got := q
		got.Arguments = nil
		if reflect.DeepEqual(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue = %+v, want %+v", got, want)
		}
	}
	if q.Arguments["x-max-length"] != float64(100) {
		t.Errorf("arguments = %v, want x-max-length 100", q.Arguments)
	}

	var list []queueJSON
	if code := b.call(t, "GET", "/api/queues/%2F/", nil, &list); code != http.StatusOK || len(list) != 1 || list[0].Name != "api-q" {
		t.Errorf("GET /api/queues/%%2F/: %d %+v", code, list)
	}
	if code := b.call(t, "GET", "/api/queues/%2F/missing", nil, nil); code != http.StatusNotFound {
		t.Errorf("missing queue: %d, want 404", code)
	}
	if code := b.call(t, "GET", "/api/queues/nope", nil, nil); code != http.StatusNotFound {
		t.Errorf("missing vhost: %d, want 404", code)
	}
	var ov struct {
		Totals map[string]int `json:"object_totals"`
		Queue  struct {
			Messages int `json:"messages"`
		} `json:"queue_totals"`
	}
	if code := b.call(t, "GET", "/api/overview", nil, &ov); code != http.StatusOK ||
		ov.Totals["queues"] != 1 || ov.Totals["connections"] != 1 || ov.Totals["consumers"] != 1 || ov.Queue.Messages != 3 {
		t.Errorf("GET /api/overview: %d %+v", code, ov)
	}
}

func TestExchangesAndDefaultExchange(t *testing.T) {
	b := startBroker(t)
	var ex struct {
		Name, Type string
		Durable    bool
	}
	if code := b.call(t, "GET", "/api/exchanges/%2F/amq.default", nil, &ex); code != http.StatusOK || ex.Name != "" || ex.Type != "direct" || !ex.Durable {
		t.Errorf("amq.default: %d %+v", code, ex)
	}
	if code := b.call(t, "GET", "/api/exchanges/%2F/amq.topic/", nil, &ex); code != http.StatusOK || ex.Type != "topic" {
		t.Errorf("amq.topic: %d %+v", code, ex)
	}
	var all []struct{ Name, Type, VHost string }
	if code := b.call(t, "GET", "/api/exchanges/%2F", nil, &all); code != http.StatusOK {
		t.Fatalf("GET /api/exchanges/%%2F: %d", code)
	}
	got := map[string]string{}
	for _, e := range all {
		got[e.Name] = e.Type
	}
	want := map[string]string{"": "direct", "amq.direct": "direct", "amq.fanout": "fanout",
		"amq.headers": "headers", "amq.match": "headers", "amq.topic": "topic"}
	for name, typ := range want {
		if got[name] != typ {
			t.Errorf("exchange %q: type %q, want %q (all: %v)", name, got[name], typ, got)
		}
	}
}

func TestAuthenticationAndMethods(t *testing.T) {
	b := startBroker(t)
	client := http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	for name, set := range map[string]func(*http.Request){
		"no credentials": func(*http.Request) {},
		"wrong password": func(r *http.Request) { r.SetBasicAuth("guest", "nope") },
		"unknown user":   func(r *http.Request) { r.SetBasicAuth("admin", "guest") },
	} {
		req, _ := http.NewRequest("GET", b.api+"/api/overview", nil)
		set(req)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: %d %v, want 401 with WWW-Authenticate", name, resp.StatusCode, resp.Header)
		}
	}
	if code := b.call(t, "POST", "/api/overview", nil, nil); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /api/overview: %d, want 405", code)
	}
	if code := b.call(t, "GET", "/api/no-such-thing", nil, nil); code != http.StatusNotFound {
		t.Errorf("GET /api/no-such-thing: %d, want 404", code)
	}
}

func TestAlarmHealthCheck(t *testing.T) {
	b := startBroker(t)
	var res struct {
		Status string              `json:"status"`
		Alarms []map[string]string `json:"alarms"`
	}
	if code := b.call(t, "GET", "/api/health/checks/alarms", nil, &res); code != http.StatusOK || res.Status != "ok" {
		t.Fatalf("no alarm: %d %+v", code, res)
	}
	b.srv.SetResourceLimits(1, 0) // any process uses more than a byte: the memory alarm goes off
	if code := b.call(t, "GET", "/api/health/checks/alarms", nil, &res); code != http.StatusServiceUnavailable ||
		res.Status != "failed" || len(res.Alarms) != 1 || res.Alarms[0]["resource"] != "memory" {
		t.Errorf("memory alarm: %d %+v", code, res)
	}
	b.srv.SetResourceLimits(0, 0)
	res.Alarms = nil
	if code := b.call(t, "GET", "/api/health/checks/alarms", nil, &res); code != http.StatusOK || res.Status != "ok" {
		t.Errorf("alarm cleared: %d %+v", code, res)
	}
}
