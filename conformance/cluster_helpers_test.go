package conformance

// Helpers of the cluster tests: a set of warren processes started as one Raft cluster (fixed AMQP
// and cluster ports per node, so that a killed node can be restarted with exactly the same flags),
// `warren cluster status --json`, and quorum-queue declaration while the cluster is still electing.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server/netserve"
)

// clusterContractHint is appended to start failures: until clustering lands, the binary refuses
// the cluster flags, and the failure should say what the test expects.
const clusterContractHint = "(the test expects `warren serve --node-id ID --cluster-listen ADDR --cluster-peers id=addr,...`" +
	" and `warren cluster status --server ADDR --json`, see /work/contracts/cluster-conformance.md)"

// clusterNode is one member of a test cluster: its identity, ports and data directory, and the
// warren process currently running on them (nil while stopped).
type clusterNode struct {
	t           testing.TB
	ID          string // node id, e.g. "n1"
	AMQPAddr    string // host:port of the AMQP listener (the same for every process of the node)
	ClusterAddr string // host:port of the cluster listener (idem)
	URL         string // amqp://guest:guest@AMQPAddr/
	dir         string
	peers       string // the --cluster-peers value
	join        bool   // start with --cluster-join
	HTTPAddr    string // host:port of the HTTP API, if the test set one before launch
	StreamAddr  string // host:port of the stream-protocol listener, if the test set one before launch
	b           *broker
	lives       int
	history     []string // tails of the logs of earlier processes, for failure reports

	netns string   // if set, the node runs in this network namespace (ip netns exec)
	extra []string // more `warren serve` flags, after the others (a repeated flag's last value wins)
}

// testCluster is a set of warren processes that form one cluster.
type testCluster struct {
	t     testing.TB
	Nodes []*clusterNode
}

// newTestCluster prepares n nodes n1..nN (free ports, own data directories) whose --cluster-peers
// name all of them. It starts nothing. Every running process is stopped with SIGTERM when the
// test ends; on failure the logs of every node are printed.
func newTestCluster(t testing.TB, n int) *testCluster {
	t.Helper()
	if testEnv.bin == "" {
		t.Skipf("needs its own warren processes; %s is set", envAddr)
	}
	ports, err := netserve.FreePorts(2 * n)
	if err != nil {
		t.Fatal(err)
	}
	c := &testCluster{t: t}
	var peers []string
	for i := range n {
		nd := &clusterNode{
			t:           t,
			ID:          fmt.Sprintf("n%d", i+1),
			AMQPAddr:    fmt.Sprintf("127.0.0.1:%d", ports[2*i]),
			ClusterAddr: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]),
			dir:         t.TempDir(),
		}
		nd.URL = "amqp://guest:guest@" + nd.AMQPAddr + "/"
		peers = append(peers, nd.ID+"="+nd.ClusterAddr)
		c.Nodes = append(c.Nodes, nd)
	}
	for _, nd := range c.Nodes {
		nd.peers = strings.Join(peers, ",")
	}
	t.Cleanup(c.shutdown)
	return c
}

// shutdown stops every running process (concurrently, SIGTERM with the broker's 15 s grace) and,
// if the test failed, prints the nodes' logs.
func (c *testCluster) shutdown() {
	var wg sync.WaitGroup
	errs := make([]error, len(c.Nodes))
	for i, nd := range c.Nodes {
		if nd.b == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = nd.b.stop()
		}()
	}
	wg.Wait()
	for i, nd := range c.Nodes {
		if errs[i] != nil {
			c.t.Errorf("stop node %s: %v", nd.ID, errs[i])
		}
		if nd.b != nil {
			if logs := nd.b.logs(); strings.Contains(logs, "WARNING: DATA RACE") {
				c.t.Errorf("node %s reported a data race:\n%s", nd.ID, tail(logs, 8<<10))
			}
		}
	}
	if c.t.Failed() {
		for _, nd := range c.Nodes {
			c.t.Logf("%s", nd.logReport())
		}
	}
}

// logReport returns the tails of the node's process logs, for failure messages.
func (nd *clusterNode) logReport() string {
	var sb strings.Builder
	for i, h := range nd.history {
		fmt.Fprintf(&sb, "node %s, process %d of %d (earlier), log tail:\n%s\n", nd.ID, i+1, nd.lives, h)
	}
	if nd.b != nil {
		fmt.Fprintf(&sb, "node %s, process %d (last), log tail:\n%s\n", nd.ID, nd.lives, tail(nd.b.logs(), 6<<10))
	}
	return sb.String()
}

// args returns the `warren serve` command line of the node.
func (nd *clusterNode) args() []string {
	args := []string{"serve",
		"--amqp-listen", nd.AMQPAddr,
		"--http-listen", nd.HTTPAddr,
		"--prometheus-listen", "",
		"--stream-listen", nd.StreamAddr,
		"--data-dir", nd.dir,
		"--node-id", nd.ID,
		"--cluster-listen", nd.ClusterAddr,
		"--cluster-peers", nd.peers,
	}
	if nd.join {
		args = append(args, "--cluster-join")
	}
	return append(args, nd.extra...)
}

// command returns the command that runs `warren args...` for the node: in its network
// namespace if it has one (ip netns exec execs the binary: the process is warren itself).
func (nd *clusterNode) command(ctx context.Context, args ...string) *exec.Cmd {
	if nd.netns == "" {
		return exec.CommandContext(ctx, testEnv.bin, args...)
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", nd.netns, testEnv.bin}, args...)...)
}

// launch starts the node's process without waiting for it to accept connections.
func (nd *clusterNode) launch() {
	nd.t.Helper()
	if nd.b != nil {
		nd.t.Fatalf("node %s: launch while a process is running", nd.ID)
	}
	b := &broker{
		Addr: nd.AMQPAddr,
		URL:  nd.URL,
		out:  &syncBuffer{},
		done: make(chan struct{}),
	}
	b.cmd = nd.command(context.Background(), nd.args()...)
	b.cmd.Stdout = b.out
	b.cmd.Stderr = b.out
	if err := startChild(b.cmd); err != nil {
		nd.t.Fatalf("node %s: start %s: %v", nd.ID, testEnv.bin, err)
	}
	go func() {
		b.waitErr = b.cmd.Wait()
		close(b.done)
	}()
	nd.b = b
	nd.lives++
}

// waitAccepting waits until the node's process accepts AMQP connections; it fails the test if the
// process exits or d passes first.
func (nd *clusterNode) waitAccepting(d time.Duration) {
	nd.t.Helper()
	if err := nd.b.waitAccepting(d); err != nil {
		nd.t.Fatalf("node %s (process %d, `warren %s`): %v\n%s", nd.ID, nd.lives, strings.Join(nd.args(), " "), err, clusterContractHint)
	}
}

// kill9 ends the node's process with SIGKILL and keeps the tail of its log.
func (nd *clusterNode) kill9() {
	nd.t.Helper()
	if err := nd.b.exitedEarly(); err != nil {
		nd.t.Fatalf("node %s died before it was killed: %v\nits log:\n%s", nd.ID, err, tail(nd.b.logs(), 4096))
	}
	_ = nd.b.kill()
	nd.history = append(nd.history, tail(nd.b.logs(), 4<<10))
	nd.b = nil
}

// running reports whether the node has a live process.
func (nd *clusterNode) running() bool {
	return nd.b != nil && nd.b.exitedEarly() == nil
}

// startAll launches every node at once (a node may wait for a majority before it serves AMQP)
// and waits until all accept AMQP connections, within d overall.
func (c *testCluster) startAll(d time.Duration) {
	c.t.Helper()
	for _, nd := range c.Nodes {
		nd.launch()
	}
	deadline := time.Now().Add(d)
	for _, nd := range c.Nodes {
		nd.waitAccepting(max(time.Until(deadline), time.Second))
	}
}

// node returns the node with id, or fails the test.
func (c *testCluster) node(id string) *clusterNode {
	c.t.Helper()
	for _, nd := range c.Nodes {
		if nd.ID == id {
			return nd
		}
	}
	c.t.Fatalf("no node %q in the test cluster (status named a node the test did not start)", id)
	return nil
}

// clusterStatus is the JSON printed by `warren cluster status --json`.
type clusterStatus struct {
	Node    string               `json:"node"`
	Addr    string               `json:"addr"`
	Members []clusterMember      `json:"members"`
	Groups  []clusterGroupStatus `json:"groups"`
}

// clusterMember is one entry of clusterStatus.Members.
type clusterMember struct {
	ID    string `json:"id"`
	Addr  string `json:"addr"`
	Voter bool   `json:"voter"`
	Up    bool   `json:"up"`
}

// clusterGroupStatus is one entry of clusterStatus.Groups.
type clusterGroupStatus struct {
	ID        uint64   `json:"id"`
	Name      string   `json:"name"`
	Leader    string   `json:"leader"`
	Voters    []string `json:"voters"`
	Nonvoters []string `json:"nonvoters"`
	Applied   uint64   `json:"applied"`
}

// group returns the group called name, if the status lists it.
func (s clusterStatus) group(name string) (clusterGroupStatus, bool) {
	for _, g := range s.Groups {
		if g.Name == name {
			return g, true
		}
	}
	return clusterGroupStatus{}, false
}

// member returns the member with id, if the status lists it.
func (s clusterStatus) member(id string) (clusterMember, bool) {
	for _, m := range s.Members {
		if m.ID == id {
			return m, true
		}
	}
	return clusterMember{}, false
}

// groupNames lists the groups of s, for failure messages.
func (s clusterStatus) groupNames() string {
	var parts []string
	for _, g := range s.Groups {
		parts = append(parts, fmt.Sprintf("%d %q leader=%q applied=%d", g.ID, g.Name, g.Leader, g.Applied))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

// quorumGroupName is the status name of the Raft group of quorum queue q in vhost "/".
func quorumGroupName(q string) string {
	return fmt.Sprintf("queue '%s' in vhost '/'", q)
}

// status runs `warren cluster status --server ADDR --json` against the node's cluster port.
func (nd *clusterNode) status() (clusterStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := nd.command(ctx, "cluster", "status", "--server", nd.ClusterAddr, "--json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return clusterStatus{}, fmt.Errorf("warren cluster status --server %s --json (node %s): %w\nstdout: %s\nstderr: %s",
			nd.ClusterAddr, nd.ID, err, abbrevText(stdout.String()), abbrevText(stderr.String()))
	}
	var s clusterStatus
	if err := json.Unmarshal(stdout.Bytes(), &s); err != nil {
		return clusterStatus{}, fmt.Errorf("warren cluster status --server %s --json (node %s) printed no valid JSON: %w\nstdout: %s",
			nd.ClusterAddr, nd.ID, err, abbrevText(stdout.String()))
	}
	return s, nil
}

// abbrevText shortens command output for failure messages.
func abbrevText(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 2000 {
		return s[:2000] + "..."
	}
	return s
}

// pollStatus asks each node in from for its status every 200 ms until cond accepts one, or d
// passes; then it fails the test with what, the last status seen and the last error.
func pollStatus(t testing.TB, d time.Duration, what string, from []*clusterNode, cond func(clusterStatus) bool) clusterStatus {
	t.Helper()
	deadline := time.Now().Add(d)
	var last clusterStatus
	var lastErr error
	seen := false
	for {
		for _, nd := range from {
			if !nd.running() {
				continue
			}
			s, err := nd.status()
			if err != nil {
				lastErr = err
				continue
			}
			last, seen = s, true
			if cond(s) {
				return s
			}
		}
		if time.Now().After(deadline) {
			switch {
			case seen:
				t.Fatalf("%s: not within %v; last status from node %s: members %+v, groups %s (last error: %v)",
					what, d, last.Node, last.Members, last.groupNames(), lastErr)
			case lastErr != nil:
				t.Fatalf("%s: not within %v; `warren cluster status` never succeeded: %v\n%s", what, d, lastErr, clusterContractHint)
			default:
				t.Fatalf("%s: not within %v; no node to ask was running", what, d)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// quorumArgs are the queue.declare arguments of a quorum queue.
func quorumArgs() amqp.Table {
	return amqp.Table{"x-queue-type": "quorum"}
}

// declareQuorumQueue declares durable quorum queue q through url. Right after start the cluster
// may still be electing its metadata leader and refuse with a channel error, so the declaration
// is retried (on a new channel, and a new connection if needed) for up to d.
func declareQuorumQueue(t testing.TB, url, q string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	var conn *amqp.Connection
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	attempts := 0
	var lastErr error
	for time.Now().Before(deadline) {
		attempts++
		if conn == nil || conn.IsClosed() {
			var err error
			conn, err = amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
			if err != nil {
				conn, lastErr = nil, fmt.Errorf("dial: %w", err)
				time.Sleep(200 * time.Millisecond)
				continue
			}
		}
		ch, err := conn.Channel()
		if err != nil {
			lastErr = fmt.Errorf("open channel: %w", err)
			_ = conn.Close()
			conn = nil
			time.Sleep(200 * time.Millisecond)
			continue
		}
		_, err = ch.QueueDeclare(q, true, false, false, false, quorumArgs())
		if err == nil {
			_ = ch.Close()
			if attempts > 1 {
				t.Logf("quorum queue %q declared through %s after %d attempts (last refusal: %v)", q, url, attempts, lastErr)
			}
			return
		}
		// A channel error closed only the channel; after a connection error the loop dials again.
		lastErr = err
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("declare quorum queue %q (durable, x-queue-type=quorum) through %s: still failing after %v and %d attempts: %v",
		q, url, d, attempts, lastErr)
}

// pollUntil calls cond every 50 ms until it returns true or d passes, and reports which.
func pollUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}
