package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server/netserve"
)

// TestClusterJoinedNodeGrowsReplicas: a node that joins a running cluster gets a replica of a
// quorum queue declared before it joined when asked (the HTTP API's grow, as rabbitmq-queues
// grow), shows as a member and online in the queue object, and its clients consume the messages
// published before it joined.
func TestClusterJoinedNodeGrowsReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four broker processes")
	}
	c := newTestCluster(t, 4)
	ports, err := netserve.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	first3 := strings.Join(strings.Split(c.Nodes[0].peers, ",")[:3], ",")
	n1, n4 := c.Nodes[0], c.Nodes[3]
	n1.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	for _, nd := range c.Nodes[:3] {
		nd.peers = first3
		nd.launch()
	}
	for _, nd := range c.Nodes[:3] {
		nd.waitAccepting(30 * time.Second)
	}
	const q = "grown"
	declareQuorumQueue(t, n1.URL, q, 30*time.Second)
	conn := dial(t, n1.URL)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirm("", q, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		ok, err := dc.WaitContext(ctx)
		cancel()
		if err != nil || !ok {
			t.Fatalf("publish %d: confirmed=%v err=%v", i, ok, err)
		}
	}

	n4.join = true
	n4.launch()
	n4.waitAccepting(30 * time.Second)
	runCLI(t, "cluster", "add", "--server", n1.ClusterAddr, n4.ID+"="+n4.ClusterAddr)
	pollStatus(t, 30*time.Second, "n4 is a voting member", []*clusterNode{n1}, func(s clusterStatus) bool {
		m, ok := s.member(n4.ID)
		return ok && m.Voter && m.Up
	})

	api := "http://" + n1.HTTPAddr + "/api"
	call := func(method, path, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, api+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth("guest", "guest")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	type members struct {
		Members []string `json:"members"`
		Online  []string `json:"online"`
	}
	read := func() members {
		t.Helper()
		code, b := call("GET", "/queues/%2F/"+q, "")
		if code != http.StatusOK {
			t.Fatalf("GET queue: %d %s", code, b)
		}
		var m members
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("queue object %s: %v", b, err)
		}
		return m
	}
	if m := read(); slices.Contains(m.Members, n4.ID) {
		t.Fatalf("members %v include n4 before the grow", m.Members)
	}
	if code, b := call("POST", "/queues/quorum/replicas/on/"+n4.ID+"/grow", `{"strategy":"all"}`); code != http.StatusNoContent {
		t.Fatalf("grow n4: %d %s", code, b)
	}
	if !pollUntil(30*time.Second, func() bool {
		m := read()
		return slices.Contains(m.Members, n4.ID) && slices.Contains(m.Online, n4.ID) && len(m.Members) == 4
	}) {
		t.Fatalf("after grow n4: %+v", read())
	}

	// n4's clients consume what was published before it joined, in order, once its replica has
	// caught up (its queue.declare-ok counts them).
	c4 := dial(t, n4.URL)
	if !pollUntil(30*time.Second, func() bool {
		pch, err := c4.Channel()
		if err != nil {
			return false
		}
		defer pch.Close()
		st, err := pch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err == nil && st.Messages == n
	}) {
		t.Fatalf("n4's replica of %s never counted the %d messages", q, n)
	}
	ch4, err := c4.Channel()
	if err != nil {
		t.Fatal(err)
	}
	closed := ch4.NotifyClose(make(chan *amqp.Error, 1))
	cancels := ch4.NotifyCancel(make(chan string, 1))
	ds, err := ch4.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		select {
		case d, ok := <-ds:
			if !ok {
				select {
				case err := <-closed:
					t.Fatalf("delivery %d on n4: channel closed: %v", i, err)
				case tag := <-cancels:
					t.Fatalf("delivery %d on n4: consumer %s cancelled by the broker", i, tag)
				default:
					t.Fatalf("delivery %d on n4: deliveries ended", i)
				}
			}
			if string(d.Body) != fmt.Sprint(i) {
				t.Fatalf("delivery %d on n4: %q, want %d in order", i, d.Body, i)
			}
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("delivery %d of %d not received through n4", i, n)
		}
	}
}
