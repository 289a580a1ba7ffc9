package netserve

import (
	"net"
	"strconv"
	"testing"
)

// The ports FreePorts returns are distinct, below the ephemeral range (where :0 would have
// chosen), and free: each can be bound right after.
func TestFreePortsAreDistinctAndBindable(t *testing.T) {
	ports, err := FreePorts(50)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := fixedPortRange()
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d returned twice in %v", p, ports)
		}
		seen[p] = true
		if hi > lo && (p < lo || p >= hi) {
			t.Errorf("port %d outside %d..%d", p, lo, hi-1)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("bind %d: %v", p, err)
		}
		defer ln.Close()
	}
}
