package netserve

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreePorts returns n distinct loopback TCP ports that nothing listened on when it returned, for
// brokers that must be told their addresses before they start: a cluster's peers, and the
// processes that tests and `warren perf` start.
//
// A port from listening on port 0 comes from the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), the range outgoing connections take their local ports from, so
// any connection opened between the choice and the broker's bind can take it ("address already in
// use"), and two such choices made one after the other can be the same port. FreePorts picks at
// random below that range instead, where only an explicit bind can take a port, and holds all n
// open until it has them all.
func FreePorts(n int) ([]int, error) {
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	lo, hi := fixedPortRange()
	for tries := 0; len(lns) < n && tries < 100*n; tries++ {
		port := 0 // the kernel's choice, when there is no room below the ephemeral range
		if hi > lo {
			port = lo + rand.IntN(hi-lo)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		lns = append(lns, ln)
	}
	if len(lns) < n {
		return nil, fmt.Errorf("find %d free ports: found %d in %d..%d", n, len(lns), lo, hi-1)
	}
	ports := make([]int, n)
	for i, ln := range lns {
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// FreePort is FreePorts(1).
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// lowestFixedPort is where FreePorts starts: above the ports services are usually configured on
// (AMQP 5672, the stream protocol 5552, HTTP 15672 are below it).
const lowestFixedPort = 16000

// fixedPortRange is [lo, hi): from lowestFixedPort to the start of the ephemeral range (32768 when
// it cannot be read). An empty range (hi <= lo) means the kernel chooses.
func fixedPortRange() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				hi = v
			}
		}
	}
	return lowestFixedPort, hi
}
