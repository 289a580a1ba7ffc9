package conformance

// Network namespaces for the partition test: each node of a test cluster runs in a namespace of
// its own with two links. Its cluster link (10.77.0.N/24) is a veth whose other end is a port of
// a bridge in a hub namespace, so the nodes reach each other only through the hub, and the test
// cuts a node off by setting its hub port down or with tc on both ends (netem delay and loss; tbf
// where the kernel has no netem).
// Its client link (10.78.N.2/30, peer 10.78.N.1 in the test's namespace) carries the test's AMQP,
// HTTP and Prometheus traffic, so a client of a node that is cut off from its peers still reaches
// that node, as a client on the minority side of a real partition does. There is no route between
// the two networks: the test's namespace forwards nothing between the client links and the hub
// has no address. The hub is a namespace of its own so that the host's firewall rules (bridged
// traffic can pass through iptables) do not apply to it.
//
// The names are fixed (namespaces wpart0..wpartN, links wpart-aN in the test's namespace), so a
// run deletes what an earlier, killed run left behind before it creates its own.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

const (
	netnsPrefix  = "wpart"      // namespaces wpart0 (the hub) and wpart1..N (the nodes)
	hubBridge    = "br0"        // the bridge, in the hub namespace
	nodeCluster  = "cl0"        // a node's cluster link, in its namespace
	nodeClient   = "cli0"       // a node's client link, in its namespace
	maxNetNodes  = 9            // names and addresses below assume one digit
	clusterIPFmt = "10.77.0.%d" // a node's cluster address
)

// partitionNet is the set of namespaces and links of one test.
type partitionNet struct {
	t testing.TB
	n int
}

// requireNetns skips the test unless it can make network namespaces (root, `ip` and `tc` from
// iproute2); under CI (CI=true), where .ci/run installs iproute2 and runs as root, it fails instead.
func requireNetns(t testing.TB) {
	t.Helper()
	skip := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s (CI=true: the partition test must run; .ci/run runs as root and installs iproute2)", msg)
		}
		t.Skipf("%s: the partition test needs root and iproute2 (ip, tc) to make network namespaces", msg)
	}
	if os.Geteuid() != 0 {
		skip("not root (uid %d)", os.Geteuid())
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			skip("no %s on PATH (Debian: apt-get install iproute2)", tool)
		}
	}
	// A namespace that cannot be made (no CAP_SYS_ADMIN in a container, say) says so here.
	probe := netnsPrefix + "probe"
	_ = exec.Command("ip", "netns", "del", probe).Run()
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		skip("ip netns add failed: %v: %s", err, bytes.TrimSpace(out))
	}
	_ = exec.Command("ip", "netns", "del", probe).Run()
}

// newPartitionNet makes the hub and n node namespaces with their links, and removes them when
// the test ends (register it before the cluster, so that the processes stop first).
func newPartitionNet(t testing.TB, n int) *partitionNet {
	t.Helper()
	if n < 1 || n > maxNetNodes {
		t.Fatalf("newPartitionNet: %d nodes (1 to %d)", n, maxNetNodes)
	}
	p := &partitionNet{t: t, n: n}
	p.remove() // leftovers of an earlier run
	t.Cleanup(p.remove)
	hub := p.ns(0)
	p.ip("netns", "add", hub)
	p.ip("-n", hub, "link", "set", "lo", "up")
	p.ip("-n", hub, "link", "add", hubBridge, "type", "bridge")
	p.ip("-n", hub, "link", "set", hubBridge, "up")
	for i := 1; i <= n; i++ {
		ns := p.ns(i)
		p.ip("netns", "add", ns)
		p.ip("-n", ns, "link", "set", "lo", "up")
		// Cluster link: cl0 in the node, port cN of the hub's bridge.
		p.ip("-n", ns, "link", "add", nodeCluster, "type", "veth", "peer", "name", p.port(i), "netns", hub)
		p.ip("-n", hub, "link", "set", p.port(i), "master", hubBridge, "up")
		p.ip("-n", ns, "addr", "add", p.ClusterIP(i)+"/24", "dev", nodeCluster)
		p.ip("-n", ns, "link", "set", nodeCluster, "up")
		// Client link: cli0 in the node, wpart-aN here.
		p.ip("link", "add", p.clientLink(i), "type", "veth", "peer", "name", nodeClient, "netns", ns)
		p.ip("addr", "add", fmt.Sprintf("10.78.%d.1/30", i), "dev", p.clientLink(i))
		p.ip("link", "set", p.clientLink(i), "up")
		p.ip("-n", ns, "addr", "add", p.ClientIP(i)+"/30", "dev", nodeClient)
		p.ip("-n", ns, "link", "set", nodeClient, "up")
	}
	return p
}

// ns is the name of namespace i (0: the hub).
func (p *partitionNet) ns(i int) string { return fmt.Sprintf("%s%d", netnsPrefix, i) }

// port is node i's port on the hub's bridge.
func (p *partitionNet) port(i int) string { return fmt.Sprintf("c%d", i) }

// clientLink is the test's end of node i's client link.
func (p *partitionNet) clientLink(i int) string { return fmt.Sprintf("%s-a%d", netnsPrefix, i) }

// ClusterIP is node i's address on the cluster network.
func (p *partitionNet) ClusterIP(i int) string { return fmt.Sprintf(clusterIPFmt, i) }

// ClientIP is node i's address on its client link, where the test reaches it.
func (p *partitionNet) ClientIP(i int) string { return fmt.Sprintf("10.78.%d.2", i) }

// NS is node i's namespace, for clusterNode.netns.
func (p *partitionNet) NS(i int) string { return p.ns(i) }

// Cut sets node i's hub port down: the node's cluster link has no carrier, its peers and it
// lose each other, its client link stays up.
func (p *partitionNet) Cut(i int) { p.ip("-n", p.ns(0), "link", "set", p.port(i), "down") }

// Heal sets node i's hub port up again.
func (p *partitionNet) Heal(i int) { p.ip("-n", p.ns(0), "link", "set", p.port(i), "up") }

// Shaping names what degrades a node's cluster link with tc, and how: netem where the kernel
// has it (sch_netem), else tbf, which only rate-limits (queueing delay, then drops) and, with a
// bucket smaller than any TCP segment, drops everything.
type Shaping struct {
	Kind             string   // "netem" or "tbf"
	Degrade, DropAll []string // qdisc arguments after the kind
}

// Describe says what a qdisc does, for the test's report.
func (s Shaping) Describe(args []string) string {
	return "tc " + s.Kind + " " + strings.Join(args, " ")
}

// Shaping probes whether tc netem works here (on node 1's hub port) and returns the shaping the
// test uses: netem delay 100ms ±50ms with 10% loss, then 100% loss; or, without sch_netem (some
// VM kernels are built without it), tbf at 256 kbit/s with 200 ms of queue, then tbf with a 40-byte
// bucket.
func (p *partitionNet) Shaping() Shaping {
	p.t.Helper()
	probe := exec.Command("ip", "netns", "exec", p.ns(0), "tc", "qdisc", "add", "dev", p.port(1), "root", "netem", "delay", "1ms")
	if err := probe.Run(); err == nil {
		p.ip("netns", "exec", p.ns(0), "tc", "qdisc", "del", "dev", p.port(1), "root")
		return Shaping{Kind: "netem", Degrade: []string{"delay", "100ms", "50ms", "loss", "10%"}, DropAll: []string{"loss", "100%"}}
	}
	return Shaping{Kind: "tbf", Degrade: []string{"rate", "256kbit", "burst", "8kb", "latency", "200ms"},
		DropAll: []string{"rate", "8bit", "burst", "40", "limit", "40"}}
}

// Shape puts qdisc kind with args on node i's cluster link, in both directions: on the hub's
// port (towards the node) and on the node's own end (from it). It replaces what an earlier
// call set.
func (p *partitionNet) Shape(i int, kind string, args ...string) {
	p.ip(append([]string{"netns", "exec", p.ns(0), "tc", "qdisc", "replace", "dev", p.port(i), "root", kind}, args...)...)
	p.ip(append([]string{"netns", "exec", p.ns(i), "tc", "qdisc", "replace", "dev", nodeCluster, "root", kind}, args...)...)
}

// ClearShape removes what Shape set on node i's cluster link.
func (p *partitionNet) ClearShape(i int) {
	p.ip("netns", "exec", p.ns(0), "tc", "qdisc", "del", "dev", p.port(i), "root")
	p.ip("netns", "exec", p.ns(i), "tc", "qdisc", "del", "dev", nodeCluster, "root")
}

// ip runs `ip args...` and fails the test if it fails.
func (p *partitionNet) ip(args ...string) {
	p.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		p.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
}

// remove deletes the namespaces (their links go with them) and the client links, whatever of
// them exists; it is quiet about what does not.
func (p *partitionNet) remove() {
	for i := 0; i <= maxNetNodes; i++ {
		_ = exec.Command("ip", "netns", "del", p.ns(i)).Run()
		_ = exec.Command("ip", "link", "del", p.clientLink(i)).Run()
	}
	for i := 0; i <= maxNetNodes; i++ {
		if _, err := os.Stat("/run/netns/" + p.ns(i)); err == nil {
			p.t.Errorf("network namespace %s is still there after ip netns del", p.ns(i))
		}
	}
}
