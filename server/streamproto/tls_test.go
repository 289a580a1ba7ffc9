package streamproto_test

// The stream protocol over TLS (--stream-tls-listen): open and metadata advertise the nodes' TLS
// ports to a TLS connection and their plain ports to a plain one, with the advertised host, on
// one node and across a 3-node cluster; rabbitmq-stream-go-client follows them over TLS.

import (
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"warren/server"
	"warren/server/streamproto/wire"
	"warren/server/tlsconf"
	"warren/server/tlsconf/tlstest"
)

// dialRawTLS connects to addr over TLS and returns the raw connection (not opened yet).
func dialRawTLS(t *testing.T, addr string, cfg *tls.Config) *rawConn {
	t.Helper()
	d := &net.Dialer{Timeout: waitFor}
	nc, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(waitFor))
	return &rawConn{t: t, nc: nc, r: wire.NewReader(nc, 0)}
}

// openAdvertised runs the handshake as guest and returns what open advertised.
func (c *rawConn) openAdvertised() string {
	c.t.Helper()
	r := c.handshake("guest", "guest", func(tune *wire.Tune) *wire.Tune {
		return &wire.Tune{FrameMax: tune.FrameMax, Heartbeat: tune.Heartbeat, Response: true}
	})
	var host, port string
	for _, p := range r.Properties {
		switch p.Key {
		case "advertised_host":
			host = p.Value
		case "advertised_port":
			port = p.Value
		}
	}
	return host + ":" + port
}

// TestTLSMetadataSingleNode: a node with a plain and a TLS stream listener and
// --stream-advertised-host localhost tells a TLS connection its TLS port (open and metadata) and a
// plain connection its plain port; rabbitmq-stream-go-client over TLS publishes and consumes
// through the endpoint metadata names.
func TestTLSMetadataSingleNode(t *testing.T) {
	if _, ok := external(); ok {
		t.Skip("starts its own broker with a TLS listener")
	}
	pki := tlstest.New(t)
	ports := freeTCPPorts(t, 2)
	plainPort, tlsPort := ports[0], ports[1]
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.StreamListen = fmt.Sprintf("127.0.0.1:%d", plainPort)
	cfg.StreamTLSListen = fmt.Sprintf("127.0.0.1:%d", tlsPort)
	cfg.StreamAdvertisedHost = "localhost"
	cfg.TLS = tlsconf.Options{CertFile: pki.CertFile, KeyFile: pki.KeyFile}
	cfg.DataDir = t.TempDir()
	startServer(t, cfg)
	tlsAddr := fmt.Sprintf("localhost:%d", tlsPort)
	wantTLS, wantPlain := tlsAddr, fmt.Sprintf("localhost:%d", plainPort)

	// rabbitmq-stream-go-client over TLS: declare, publish (through the leader's endpoint that
	// metadata names: the client checks that open advertises the same) and consume.
	e, err := stream.NewEnvironment(stream.NewEnvironmentOptions().
		SetUri("rabbitmq-stream+tls://guest:guest@" + tlsAddr + "/%2f").SetTLSConfig(pki.ClientConfig("localhost")))
	if err != nil {
		t.Fatalf("connect over TLS: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	name := declare(t, e, nil)
	publish(t, e, name, "tls", 50)
	bodies, _ := consume(t, e, name, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()), 50)
	if bodies[49] != "tls49" {
		t.Fatalf("consumed %v", bodies)
	}
	md, err := e.StreamMetaData(name)
	if err != nil {
		t.Fatal(err)
	}
	if got := md.Leader.Host + ":" + md.Leader.Port; got != wantTLS {
		t.Fatalf("the Go client's metadata over TLS: leader %s, want %s", got, wantTLS)
	}

	rc := dialRawTLS(t, tlsAddr, pki.ClientConfig("localhost"))
	if got := rc.openAdvertised(); got != wantTLS {
		t.Fatalf("open over TLS advertises %s, want %s", got, wantTLS)
	}
	r := readMetadata(t, rc, 10, name)
	if got := endpointOf(r, r.Streams[0].Leader); r.Streams[0].Code != wire.ResponseCodeOK || got != wantTLS {
		t.Fatalf("metadata over TLS: %+v, leader %s, want %s", r, got, wantTLS)
	}
	if len(r.Brokers) != 1 {
		t.Fatalf("brokers %+v, want one", r.Brokers)
	}

	plain := dialRaw(t, broker{streamURI: fmt.Sprintf("rabbitmq-stream://guest:guest@127.0.0.1:%d/%%2f", plainPort)})
	if got := plain.openAdvertised(); got != wantPlain {
		t.Fatalf("open over plain TCP advertises %s, want %s", got, wantPlain)
	}
	r = readMetadata(t, plain, 11, name)
	if got := endpointOf(r, r.Streams[0].Leader); got != wantPlain {
		t.Fatalf("metadata over plain TCP: leader %s, want %s", got, wantPlain)
	}
}

// TestTLSMetadataCluster: in a 3-node cluster with TLS stream listeners, metadata asked over TLS
// of any node names every node (leader and replicas) by its own TLS port and the advertised host;
// asked over plain TCP, by the plain ports.
func TestTLSMetadataCluster(t *testing.T) {
	pki := tlstest.New(t)
	tlsPorts := freeTCPPorts(t, 3)
	tc := startClusterWith(t, 3, func(i int, cfg *server.Config) {
		cfg.StreamTLSListen = fmt.Sprintf("127.0.0.1:%d", tlsPorts[i])
		cfg.TLS = tlsconf.Options{CertFile: pki.CertFile, KeyFile: pki.KeyFile}
	})
	e := clusterEnv(t, tc, 0)
	name := declareOn(t, e)
	li := tc.leader(0, name)
	tlsOf := func(i int) string { return "localhost:" + strconv.Itoa(tlsPorts[i]) }
	plainOf := func(i int) string { return "localhost:" + strconv.Itoa(tc.nodes[i].streamPort) }
	check := func(rc *rawConn, via int, endpoint func(int) string) {
		t.Helper()
		var want []string
		for i := range tc.nodes {
			if i != li {
				want = append(want, endpoint(i))
			}
		}
		slices.Sort(want)
		var r *wire.MetadataResponse
		pollUntil(t, "metadata through "+tc.nodes[via].id+" lists two replicas", clusterWait, func() bool {
			r = readMetadata(t, rc, 20, name)
			return len(r.Streams) == 1 && len(r.Streams[0].Replicas) == 2
		})
		sm := r.Streams[0]
		if got := endpointOf(r, sm.Leader); sm.Code != wire.ResponseCodeOK || got != endpoint(li) {
			t.Fatalf("via %s: leader %s (code %s), want %s", tc.nodes[via].id, got, sm.Code, endpoint(li))
		}
		var got []string
		for _, ref := range sm.Replicas {
			got = append(got, endpointOf(r, ref))
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("via %s: replicas %v, want %v", tc.nodes[via].id, got, want)
		}
	}
	for via := range tc.nodes {
		rc := dialRawTLS(t, fmt.Sprintf("127.0.0.1:%d", tlsPorts[via]), pki.ClientConfig("localhost"))
		_ = rc.nc.SetDeadline(time.Now().Add(2 * clusterWait))
		if got := rc.openAdvertised(); got != tlsOf(via) {
			t.Fatalf("open over TLS on %s advertises %s, want %s", tc.nodes[via].id, got, tlsOf(via))
		}
		check(rc, via, tlsOf)
	}
	rc := dialRaw(t, tc.broker(1))
	_ = rc.nc.SetDeadline(time.Now().Add(2 * clusterWait))
	if got := rc.openAdvertised(); got != plainOf(1) {
		t.Fatalf("open over plain TCP advertises %s, want %s", got, plainOf(1))
	}
	check(rc, 1, plainOf)
}
