package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"warren/server/netserve"
)

// runCtl runs `warren ctl args...` against the HTTP API at url and returns stdout, stderr and
// the exit status.
func runCtl(t *testing.T, url string, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testEnv.bin, append(append([]string{"ctl"}, args...), "--url", url)...)
	var out, errOut syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		status = ee.ExitCode()
	default:
		t.Fatalf("warren ctl %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), status
}

// mustCtl is runCtl that fails the test unless the command exits 0.
func mustCtl(t *testing.T, url string, args ...string) string {
	t.Helper()
	out, errOut, status := runCtl(t, url, args...)
	if status != 0 {
		t.Fatalf("warren ctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), status, out, errOut)
	}
	return out
}

// lagRow is one row of `warren ctl streams lag --format json`.
type lagRow struct {
	Stream, Kind, Name, Partition string
	Offset, LastOffset, Lag       *int64
}

func (r *lagRow) UnmarshalJSON(b []byte) error {
	var m struct {
		Stream     string `json:"stream"`
		Kind       string `json:"kind"`
		Name       string `json:"name"`
		Partition  string `json:"partition"`
		Offset     *int64 `json:"offset"`
		LastOffset *int64 `json:"last_offset"`
		Lag        *int64 `json:"lag"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*r = lagRow{m.Stream, m.Kind, m.Name, m.Partition, m.Offset, m.LastOffset, m.Lag}
	return nil
}

func (r lagRow) String() string {
	v := func(p *int64) string {
		if p == nil {
			return "null"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("%s/%s/%s/%s offset=%s last=%s lag=%s", r.Stream, r.Kind, r.Name, r.Partition, v(r.Offset), v(r.LastOffset), v(r.Lag))
}

// TestCtlStreamsLag drives `warren ctl streams lag` against the built broker: a stream with a
// stored offset (the stream protocol's store_offset) and a live AMQP consumer that has acked
// nothing, and a super stream whose consumer group committed some of its partitions. The table
// and --format json show each with its offset, the last offset and the lag.
func TestCtlStreamsLag(t *testing.T) {
	if testEnv.bin == "" {
		t.Skipf("needs its own warren process; %s is set", envAddr)
	}
	ports, err := netserve.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	httpAddr, streamAddr := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	b, err := launchBroker(testEnv.bin, t.TempDir(), "--http-listen", httpAddr, "--stream-listen", streamAddr,
		"--stream-advertised-host", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.stop(); err != nil {
			t.Errorf("stop broker: %v", err)
		}
		if t.Failed() {
			t.Logf("broker log:\n%s", tail(b.logs(), 8192))
		}
	})
	api := "http://" + httpAddr

	conn := dial(t, b.URL)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("lag.s", true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("lag.ss", "x-super-stream", true, false, false, false, amqp.Table{"x-partitions": int64(2)}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publish := func(exchange, key string, n int) {
		for i := range n {
			dc, err := ch.PublishWithDeferredConfirm(exchange, key, false, false, amqp.Publishing{Body: []byte(fmt.Sprint(i))})
			if err != nil || !dc.Wait() {
				t.Fatalf("publish to %s/%s: %v", exchange, key, err)
			}
		}
	}
	publish("", "lag.s", 10) // offsets 0..9
	// Five messages straight into each partition (the default exchange, the partition's name as
	// the routing key, which the group's deliveries then carry).
	publish("", "lag.ss-0", 5)
	publish("", "lag.ss-1", 5)

	// A stored offset on lag.s: reference "ref1" at 3 (lag 9 - 3 = 6).
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri("rabbitmq-stream://guest:guest@" + streamAddr + "/%2f"))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.StoreOffset("ref1", "lag.s", 3); err != nil {
		t.Fatal(err)
	}
	env.Close()

	// A consumer group on the super stream: acks 2 messages of each partition, then leaves.
	gch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := gch.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := gch.Consume("lag.ss", "gc", false, false, false, false, amqp.Table{"x-stream-consumer-group": "g1", "x-stream-offset": "first"})
	if err != nil {
		t.Fatal(err)
	}
	acked := map[string]int{}
	deadline := time.After(30 * time.Second)
	for acked["lag.ss-0"] < 2 || acked["lag.ss-1"] < 2 {
		select {
		case d := <-ds:
			part := d.RoutingKey
			if acked[part] < 2 {
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
				acked[part]++
			}
		case <-deadline:
			t.Fatalf("consumer group deliveries: acked %v", acked)
		}
	}
	// A live consumer on lag.s that acks nothing: offset 0 or beyond, lag > 0.
	cch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := cch.Qos(2, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := cch.Consume("lag.s", "live", false, false, false, false, amqp.Table{"x-stream-offset": "first"}); err != nil {
		t.Fatal(err)
	}

	var rows []lagRow
	find := func(kind, stream, name, partition string) *lagRow {
		for i := range rows {
			r := &rows[i]
			if r.Kind == kind && r.Stream == stream && r.Name == name && r.Partition == partition {
				return r
			}
		}
		return nil
	}
	// Committed offsets reach the API once the partitions' groups applied them: poll.
	var lastOut string
	ok := pollUntil(30*time.Second, func() bool {
		lastOut = mustCtl(t, api, "streams", "lag", "--format", "json")
		rows = nil
		if err := json.Unmarshal([]byte(lastOut), &rows); err != nil {
			t.Fatalf("streams lag --format json is not a JSON array of rows: %v\n%s", err, lastOut)
		}
		g0, g1 := find("group", "lag.ss", "g1", "lag.ss-0"), find("group", "lag.ss", "g1", "lag.ss-1")
		return g0 != nil && g1 != nil && g0.Offset != nil && g1.Offset != nil && find("consumer", "lag.s", "live", "") != nil
	})
	if !ok {
		t.Fatalf("streams lag never showed the group's committed offsets and the live consumer:\n%s", lastOut)
	}
	ref := find("offset", "lag.s", "ref1", "")
	if ref == nil || ref.Offset == nil || *ref.Offset != 3 || ref.LastOffset == nil || *ref.LastOffset != 9 || ref.Lag == nil || *ref.Lag != 6 {
		t.Errorf("stored offset row: %v, want offset 3, last 9, lag 6\n%s", ref, lastOut)
	}
	for _, p := range []string{"lag.ss-0", "lag.ss-1"} {
		g := find("group", "lag.ss", "g1", p)
		if g.LastOffset == nil || *g.LastOffset != 4 {
			t.Errorf("group row %v: last offset want 4 (5 messages)", g)
		}
		if g.Lag == nil || g.Offset == nil || *g.Lag != *g.LastOffset-*g.Offset || *g.Lag <= 0 || *g.Lag > 4 {
			t.Errorf("group row %v: lag want last - committed, in 1..4", g)
		}
	}
	if find("offset", "lag.ss-0", "g1", "") != nil {
		t.Errorf("the group's committed offset also shows as a stored offset of its partition:\n%s", lastOut)
	}
	live := find("consumer", "lag.s", "live", "")
	if live.LastOffset == nil || *live.LastOffset != 9 || live.Lag == nil || *live.Lag <= 0 {
		t.Errorf("live consumer row %v: want last offset 9 and a positive lag", live)
	}

	// The table: a header and tab-separated rows; one stream asked for by name.
	t.Logf("streams lag --format json:\n%s", lastOut)
	table := mustCtl(t, api, "streams", "lag", "lag.s")
	t.Logf("streams lag lag.s:\n%s", table)
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if lines[0] != "stream\tkind\tname\tpartition\toffset\tlast_offset\tlag" {
		t.Errorf("table header %q", lines[0])
	}
	if !slices.Contains(lines, "lag.s\toffset\tref1\t\t3\t9\t6") {
		t.Errorf("table lacks the stored offset row:\n%s", table)
	}
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "lag.s\t") {
			t.Errorf("streams lag lag.s shows another stream: %q", l)
		}
	}
	// A stream that is not there: non-zero, with the reason.
	if out, errOut, status := runCtl(t, api, "streams", "lag", "nope"); status == 0 || !strings.Contains(errOut, `"nope"`) {
		t.Errorf("streams lag nope: exit %d, stdout %q, stderr %q; want non-zero naming the stream", status, out, errOut)
	}
}

// TestCtlQuorumMembership drives rabbitmq-queues' membership commands through `warren ctl` on a
// 3-node cluster: delete_member and add_member of one queue, shrink and grow of a node, and
// rebalance; then the refusals, each a non-zero exit with the server's reason.
func TestCtlQuorumMembership(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three broker processes")
	}
	c := newTestCluster(t, 3)
	ports, err := netserve.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	n1 := c.Nodes[0]
	n1.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	c.startAll(30 * time.Second)
	api := "http://" + n1.HTTPAddr
	const q = "ctl.members"
	declareQuorumQueue(t, n1.URL, q, 30*time.Second)

	type qrow struct {
		VHost   string   `json:"vhost"`
		Name    string   `json:"name"`
		Leader  *string  `json:"leader"`
		Members []string `json:"members"`
	}
	// members reads the queue's members through list_queues --format json.
	members := func() []string {
		t.Helper()
		var rows []qrow
		out := mustCtl(t, api, "list_queues", "name", "members", "--format", "json")
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("list_queues --format json: %v\n%s", err, out)
		}
		for _, r := range rows {
			if r.Name == q {
				slices.Sort(r.Members)
				return r.Members
			}
		}
		t.Fatalf("list_queues has no %s:\n%s", q, out)
		return nil
	}
	waitMembers := func(what string, want ...string) {
		t.Helper()
		var got []string
		if !pollUntil(30*time.Second, func() bool { got = members(); return slices.Equal(got, want) }) {
			t.Fatalf("%s: members %v, want %v", what, got, want)
		}
	}
	waitMembers("after declare", "n1", "n2", "n3")

	out := mustCtl(t, api, "delete_member", q, "n3")
	if !strings.Contains(out, `Removing the replica of queue "ctl.members" on node "n3"`) {
		t.Errorf("delete_member printed %q", out)
	}
	waitMembers("after delete_member n3", "n1", "n2")
	mustCtl(t, api, "add_member", "-p", "/", q, "n3")
	waitMembers("after add_member n3", "n1", "n2", "n3")

	// shrink prints every quorum queue's members after the change, as JSON here.
	out = mustCtl(t, api, "shrink", "n2", "--format", "json")
	var rows []qrow
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 1 || rows[0].Name != q || rows[0].VHost != "/" {
		t.Fatalf("shrink --format json: %v\n%s", err, out)
	}
	waitMembers("after shrink n2", "n1", "n3")
	// grow, as a table: a header, then the queue's row.
	out = mustCtl(t, api, "grow", "n2", "all", "--queue-pattern", "^ctl\\.")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || lines[0] != "vhost\tname\tleader\tmembers" || !strings.HasPrefix(lines[1], "/\tctl.members\t") {
		t.Errorf("grow printed:\n%s", out)
	}
	waitMembers("after grow n2", "n1", "n2", "n3")
	out = mustCtl(t, api, "rebalance", "quorum")
	if !strings.Contains(out, "ctl.members") {
		t.Errorf("rebalance printed:\n%s", out)
	}

	// Refusals: the exit status and the server's reason.
	for _, tc := range []struct {
		args   []string
		status int
		reason string
	}{
		{[]string{"add_member", q, "n3"}, 65, "node 'n3' is already a member of queue 'ctl.members'"},
		{[]string{"add_member", q, "n9"}, 65, "node 'n9' is not a member of the cluster"},
		{[]string{"delete_member", "nosuch", "n2"}, 70, "404"},
		{[]string{"grow", "n2", "sideways"}, 64, "all or even"},
		{[]string{"shrink"}, 64, "usage"},
	} {
		out, errOut, status := runCtl(t, api, tc.args...)
		if status != tc.status || !strings.Contains(errOut, tc.reason) {
			t.Errorf("warren ctl %s: exit %d, stderr %q (stdout %q); want exit %d with %q",
				strings.Join(tc.args, " "), status, errOut, out, tc.status, tc.reason)
		}
	}
}
