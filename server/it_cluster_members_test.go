package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server/httpapi"
)

// clusterAPI serves node i's HTTP API on a loopback port for the rest of the test.
func (tc *testCluster) clusterAPI(i int) string {
	tc.t.Helper()
	ts := httptest.NewServer(httpapi.Handler(tc.srvs[i], httpapi.Options{}))
	tc.t.Cleanup(ts.Close)
	return ts.URL
}

// apiCall makes an HTTP API request as guest and returns the status and body.
func apiCall(t *testing.T, method, u, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("guest", "guest")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// queueMembersJSON is the part of a quorum queue's API object that names its members.
type queueMembersJSON struct {
	Node    string   `json:"node"`
	Leader  *string  `json:"leader"`
	Members []string `json:"members"`
	Online  []string `json:"online"`
}

// apiMembers reads queue q's members through the HTTP API at base.
func apiMembers(t *testing.T, base, q string) (queueMembersJSON, int) {
	t.Helper()
	code, body := apiCall(t, "GET", base+"/api/queues/%2F/"+url.PathEscape(q), "")
	var m queueMembersJSON
	if code == http.StatusOK {
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("queue object %s: %v", body, err)
		}
	}
	return m, code
}

// A quorum queue's x-expires holds on every member: the queue goes from all three nodes once it
// has been unused for the period; a consumer on a node that does not lead it keeps it. A durable
// classic queue, replicated in a cluster, expires too, and a passive declaration through another
// node renews its lease, as for a classic queue.
func TestClusterQueuesExpireOnEveryMember(t *testing.T) {
	tc := newTestCluster(t, 3)
	c1, c2, c3 := mustDial(t, tc.urls[0]), mustDial(t, tc.urls[1]), mustDial(t, tc.urls[2])
	const ttl = 1500 * time.Millisecond
	exp := amqp.Table{"x-expires": int32(ttl / time.Millisecond)}
	// exp.kept's consumer on n3 must attach before it could expire, on a loaded machine too.
	const keptTTL = 5 * time.Second
	var declared time.Time
	declareRetry(t, c1, "declare the queues on n1", func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare("exp.kept", true, false, false, false, quorumArgs(amqp.Table{"x-expires": int32(keptTTL / time.Millisecond)})); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare("exp.unused", true, false, false, false, quorumArgs(exp)); err != nil {
			return err
		}
		declared = time.Now()
		_, err := ch.QueueDeclare("exp.classic", true, false, false, false, exp)
		return err
	})
	onAll := func(q string, want bool) func() bool {
		return func() bool {
			for _, s := range tc.srvs {
				if _, ok := s.Queue("/", q); ok != want {
					return false
				}
			}
			return true
		}
	}
	// The classic queue's record reached n2; from now on it is redeclared (passively) through n2
	// every 200 ms, until the unused quorum queue has expired and exp.kept has outlived its TTL.
	pollUntil(t, "exp.classic on n2", clusterWait, func() bool { _, ok := tc.srvs[1].Queue("/", "exp.classic"); return ok })
	pch := mustChannel(t, c2)
	stopRenew, renewErr := make(chan struct{}), make(chan error, 1)
	go func() {
		defer close(renewErr)
		for {
			if _, err := pch.QueueDeclarePassive("exp.classic", true, false, false, false, nil); err != nil {
				renewErr <- err
				return
			}
			select {
			case <-stopRenew:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	renewing := true
	stopRenewing := func() {
		if renewing {
			renewing = false
			close(stopRenew)
			if err := <-renewErr; err != nil {
				t.Errorf("the classic queue expired although redeclared through n2: %v", err)
			}
		}
	}
	defer stopRenewing()
	// A consumer on n3 (n1, the declaring node, leads the queue).
	pollUntil(t, "exp.kept on n3", clusterWait, func() bool { _, ok := tc.srvs[2].Queue("/", "exp.kept"); return ok })
	cch := mustChannel(t, c3)
	srvCancels := cch.NotifyCancel(make(chan string, 4))
	mustConsume(t, cch, "exp.kept", "keeper", true, nil)
	pollUntil(t, "the queues on every node", clusterWait, func() bool {
		return onAll("exp.kept", true)() && onAll("exp.classic", true)()
	})
	var goneAt time.Time
	for until := time.Now().Add(2 * keptTTL); time.Now().Before(until) || goneAt.IsZero(); {
		select {
		case tag := <-srvCancels:
			t.Fatalf("the broker cancelled consumer %s of exp.kept on n3 (basic.cancel from the server) although its queue exists", tag)
		case err := <-renewErr:
			t.Fatalf("the classic queue expired although redeclared through n2: %v", err)
		default:
		}
		if goneAt.IsZero() && onAll("exp.unused", false)() {
			goneAt = time.Now()
		}
		if time.Since(declared) > expiresWait {
			t.Fatal("exp.unused was not deleted from every node")
		}
		time.Sleep(200 * time.Millisecond)
	}
	stopRenewing()
	if el := goneAt.Sub(declared); el < ttl-100*time.Millisecond {
		t.Errorf("exp.unused deleted %v after its declaration, before its x-expires of %v", el, ttl)
	}
	if !onAll("exp.kept", true)() {
		t.Fatal("exp.kept expired while it had a consumer on n3")
	}
	pollUntil(t, "the classic queue deleted once no longer redeclared", expiresWait, onAll("exp.classic", false))
	select {
	case tag := <-srvCancels:
		t.Fatalf("the broker cancelled consumer %s of exp.kept on n3 (basic.cancel from the server) although its queue exists", tag)
	default:
	}
	if err := cch.Cancel("keeper", false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}
	cancelled := time.Now()
	pollUntil(t, "exp.kept deleted from every node once its consumer left", expiresWait, onAll("exp.kept", false))
	if el := time.Since(cancelled); el < keptTTL-100*time.Millisecond {
		t.Errorf("exp.kept deleted %v after its consumer left, before its x-expires of %v", el, keptTTL)
	}
}

// Members of a quorum queue change through the HTTP API as with rabbitmq-queues add_member,
// delete_member, shrink and grow, and the queue object's members, online and leader show it;
// rebalance spreads the leaders over the nodes. The queue keeps its messages throughout.
func TestClusterQuorumMembershipThroughHTTPAPI(t *testing.T) {
	tc := newTestCluster(t, 3)
	apis := []string{tc.clusterAPI(0), tc.clusterAPI(1), tc.clusterAPI(2)}
	c1 := mustDial(t, tc.urls[0])
	declareRetry(t, c1, "declare a 2-member quorum queue on n1", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare("m.q", true, false, false, false, quorumArgs(amqp.Table{"x-quorum-initial-group-size": int32(2)}))
		return err
	})
	want := func(what string, base string, members []string) queueMembersJSON {
		t.Helper()
		var m queueMembersJSON
		pollUntil(t, what, clusterWait, func() bool {
			var code int
			m, code = apiMembers(t, base, "m.q")
			return code == http.StatusOK && slices.Equal(m.Members, members) && slices.Equal(m.Online, members) &&
				m.Leader != nil && slices.Contains(members, *m.Leader) && m.Node == *m.Leader
		})
		return m
	}
	if m := want("n3's API shows members n1, n2", apis[2], []string{"n1", "n2"}); *m.Leader != "n1" {
		t.Errorf("leader %s, want the declaring node n1", *m.Leader)
	}
	pub := mustConfirmChannel(t, c1)
	for i := range 10 {
		publishConfirmed(t, pub, "", "m.q", true, persistentMsg(fmt.Sprint(i)))
	}

	post := func(base, path, body string, wantCode int) {
		t.Helper()
		if code, b := apiCall(t, "POST", base+path, body); code != wantCode {
			t.Fatalf("POST %s %s: %d %s, want %d", path, body, code, b, wantCode)
		}
	}
	del := func(base, path, body string, wantCode int) {
		t.Helper()
		if code, b := apiCall(t, "DELETE", base+path, body); code != wantCode {
			t.Fatalf("DELETE %s %s: %d %s, want %d", path, body, code, b, wantCode)
		}
	}
	const replicas = "/api/queues/quorum/%2F/m.q/replicas/"
	post(apis[1], replicas+"add", `{"node":"n3"}`, http.StatusNoContent)
	want("members n1, n2, n3 after add_member n3", apis[1], []string{"n1", "n2", "n3"})
	// Refusals: RabbitMQ's 400 and 404.
	post(apis[1], replicas+"add", `{"node":"n3"}`, http.StatusBadRequest)
	post(apis[1], replicas+"add", `{"node":"n9"}`, http.StatusBadRequest)
	post(apis[1], replicas+"add", `{}`, http.StatusBadRequest)
	post(apis[1], "/api/queues/quorum/%2F/nosuch/replicas/add", `{"node":"n3"}`, http.StatusNotFound)
	if _, err := mustChannel(t, c1).QueueDeclare("m.classic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	post(apis[0], "/api/queues/quorum/%2F/m.classic/replicas/add", `{"node":"n3"}`, http.StatusBadRequest)

	// The leader goes: the leadership moves first, and the queue keeps its messages.
	del(apis[2], replicas+"delete", `{"node":"n1"}`, http.StatusNoContent)
	m := want("members n2, n3 after delete_member n1", apis[0], []string{"n2", "n3"})
	t.Logf("leader after delete_member n1: %s", *m.Leader)
	for i := range 10 {
		publishConfirmed(t, pub, "", "m.q", true, persistentMsg(fmt.Sprint(10+i)))
	}
	// shrink n2 leaves n3; the last member cannot go.
	del(apis[0], "/api/queues/quorum/replicas/on/n2/shrink", "", http.StatusNoContent)
	want("members n3 after shrink n2", apis[1], []string{"n3"})
	// n1 holds a replica without a vote: it answers from its own view of the membership, which it
	// learns from the leader a moment later.
	want("members n3 after shrink n2, as n1 sees them", apis[0], []string{"n3"})
	del(apis[0], replicas+"delete", `{"node":"n3"}`, http.StatusBadRequest)
	// grow n1 and n2 back (every quorum queue; "even" skips this one while it has one member).
	post(apis[0], "/api/queues/quorum/replicas/on/n1/grow", `{"strategy":"even","queue_pattern":"^m\\."}`, http.StatusNoContent)
	want("still n3 after grow n1 even", apis[1], []string{"n3"})
	post(apis[0], "/api/queues/quorum/replicas/on/n1/grow", `{"strategy":"all","queue_pattern":"^m\\."}`, http.StatusNoContent)
	post(apis[0], "/api/queues/quorum/replicas/on/n2/grow", `{"strategy":"all","vhost_pattern":"^/$"}`, http.StatusNoContent)
	want("members n1, n2, n3 after grow", apis[2], []string{"n1", "n2", "n3"})

	// Every message is still there, consumed through n2.
	cch := mustChannel(t, mustDial(t, tc.urls[1]))
	ds := mustConsume(t, cch, "m.q", "", false, nil)
	for i := range 20 {
		d := recvWithin(t, ds, clusterWait)
		if string(d.Body) != fmt.Sprint(i) {
			t.Fatalf("delivery %d: %q, want %d in order", i, d.Body, i)
		}
		d.Ack(false)
	}

	// Rebalance: six queues declared through n1 are all led by n1; afterwards no node leads more
	// than two of the seven quorum queues' ceil(7/3) = 3.
	for i := range 6 {
		declareRetry(t, c1, "declare a quorum queue on n1", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(fmt.Sprintf("r.q%d", i), true, false, false, false, quorumArgs(nil))
			return err
		})
	}
	leaders := func() map[string]int {
		out := map[string]int{}
		for _, g := range tc.srvs[0].ClusterStatus().Groups {
			if strings.HasPrefix(g.Name, "queue 'r.q") || strings.HasPrefix(g.Name, "queue 'm.q'") {
				out[g.Leader]++
			}
		}
		return out
	}
	pollUntil(t, "the new queues have leaders", clusterWait, func() bool { return leaders()[""] == 0 })
	t.Logf("leaders before rebalance: %v", leaders())
	post(apis[1], "/api/rebalance/queues", "", http.StatusNoContent)
	pollUntil(t, "leaders spread over the nodes", clusterWait, func() bool {
		l := leaders()
		return l["n1"] <= 3 && l["n2"] <= 3 && l["n3"] <= 3 && l[""] == 0
	})
	t.Logf("leaders after rebalance: %v", leaders())
}
