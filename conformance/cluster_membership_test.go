package conformance

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// runCLI runs `warren args...` and returns its combined output.
func runCLI(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, testEnv.bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("warren %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestClusterAddAndRemoveNode grows a 3-node cluster with the documented commands: a fourth node
// started with --cluster-join is added with `warren cluster add`, receives the metadata declared
// before it joined and takes part in queues declared after; `warren cluster remove` takes it out.
func TestClusterAddAndRemoveNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four broker processes")
	}
	c := newTestCluster(t, 4)
	first3 := strings.Join(strings.Split(c.Nodes[0].peers, ",")[:3], ",")
	for _, nd := range c.Nodes[:3] {
		nd.peers = first3
		nd.launch()
	}
	for _, nd := range c.Nodes[:3] {
		nd.waitAccepting(30 * time.Second)
	}
	n1, n4 := c.Nodes[0], c.Nodes[3]
	declareQuorumQueue(t, n1.URL, "before-join", 30*time.Second)
	conn := dial(t, n1.URL)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("before-join-x", "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	n4.join = true
	n4.launch()
	n4.waitAccepting(30 * time.Second)
	out := runCLI(t, "cluster", "add", "--server", n1.ClusterAddr, n4.ID+"="+n4.ClusterAddr)
	t.Logf("cluster add: %s", strings.TrimSpace(out))
	pollStatus(t, 30*time.Second, "n4 is a voting member", []*clusterNode{n1}, func(s clusterStatus) bool {
		m, ok := s.member(n4.ID)
		return ok && m.Voter
	})
	// n4 received what was declared before it joined.
	c4 := dial(t, n4.URL)
	if !pollUntil(30*time.Second, func() bool {
		ch, err := c4.Channel()
		if err != nil {
			return false
		}
		defer ch.Close()
		return ch.ExchangeDeclarePassive("before-join-x", "topic", true, false, false, false, nil) == nil
	}) {
		t.Fatal("exchange declared before the join never became visible on n4")
	}
	// A quorum queue declared now has a replica on n4, and n4's clients use it.
	declareQuorumQueue(t, n1.URL, "after-join", 30*time.Second)
	st := pollStatus(t, 30*time.Second, "after-join has a leader", []*clusterNode{n1}, func(s clusterStatus) bool {
		g, ok := s.group(quorumGroupName("after-join"))
		return ok && g.Leader != ""
	})
	g, _ := st.group(quorumGroupName("after-join"))
	if !slices.Contains(g.Voters, n4.ID) && !slices.Contains(g.Nonvoters, n4.ID) {
		t.Fatalf("after-join members %v / %v do not include n4", g.Voters, g.Nonvoters)
	}
	pch, err := c4.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := pch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := pch.PublishWithDeferredConfirm("", "after-join", false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("via n4")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("publish through n4: confirmed=%v err=%v", ok, err)
	}

	runCLI(t, "cluster", "remove", "--server", n1.ClusterAddr, n4.ID)
	pollStatus(t, 30*time.Second, "n4 removed", []*clusterNode{n1}, func(s clusterStatus) bool {
		_, ok := s.member(n4.ID)
		return !ok
	})
}
