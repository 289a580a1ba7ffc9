package streamproto_test

// The stream protocol over TLS (--stream-tls-listen): open and metadata advertise the nodes' TLS
// ports to a TLS connection and their plain ports to a plain one, with the advertised host, on
// one node and across a 3-node cluster; rabbitmq-stream-go-client follows them over TLS.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"warren/server"
	"warren/server/streamproto/wire"
	"warren/server/tlsconf"
)

// streamPKI is a CA and a server certificate for localhost and 127.0.0.1 in PEM files.
type streamPKI struct {
	certFile, keyFile string
	pool              *x509.CertPool
}

func newStreamPKI(t *testing.T) *streamPKI {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Warren stream test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := &streamPKI{certFile: filepath.Join(dir, "server.pem"), keyFile: filepath.Join(dir, "server.key"),
		pool: x509.NewCertPool()}
	p.pool.AddCert(caCert)
	write := func(path, kind string, b []byte) {
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(p.certFile, "CERTIFICATE", der)
	write(p.keyFile, "EC PRIVATE KEY", keyDER)
	return p
}

func (p *streamPKI) clientConfig() *tls.Config {
	return &tls.Config{RootCAs: p.pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
}

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
	c.send(&wire.PeerProperties{CorrelationID: 1})
	c.read()
	c.send(&wire.SASLHandshake{CorrelationID: 2})
	c.read()
	c.send(&wire.SASLAuthenticate{CorrelationID: 3, Mechanism: "PLAIN", Data: []byte("\x00guest\x00guest")})
	if r, ok := c.read().(*wire.SASLAuthenticateResponse); !ok || r.Code != wire.ResponseCodeOK {
		c.t.Fatalf("sasl authenticate: %+v", r)
	}
	tune, ok := c.read().(*wire.Tune)
	if !ok {
		c.t.Fatal("no tune")
	}
	c.send(&wire.Tune{FrameMax: tune.FrameMax, Heartbeat: tune.Heartbeat, Response: true})
	c.send(&wire.Open{CorrelationID: 4, VirtualHost: "/"})
	r, ok := c.read().(*wire.OpenResponse)
	if !ok || r.Code != wire.ResponseCodeOK {
		c.t.Fatalf("open: %+v", r)
	}
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
	pki := newStreamPKI(t)
	plainPort, tlsPort := freeTCPPort(t), freeTCPPort(t)
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.StreamListen = fmt.Sprintf("127.0.0.1:%d", plainPort)
	cfg.StreamTLSListen = fmt.Sprintf("127.0.0.1:%d", tlsPort)
	cfg.StreamAdvertisedHost = "localhost"
	cfg.TLS = tlsconf.Options{CertFile: pki.certFile, KeyFile: pki.keyFile}
	cfg.DataDir = t.TempDir()
	startServer(t, cfg)
	tlsAddr := fmt.Sprintf("localhost:%d", tlsPort)
	wantTLS, wantPlain := tlsAddr, fmt.Sprintf("localhost:%d", plainPort)

	// rabbitmq-stream-go-client over TLS: declare, publish (through the leader's endpoint that
	// metadata names: the client checks that open advertises the same) and consume.
	e, err := stream.NewEnvironment(stream.NewEnvironmentOptions().
		SetUri("rabbitmq-stream+tls://guest:guest@" + tlsAddr + "/%2f").SetTLSConfig(pki.clientConfig()))
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

	rc := dialRawTLS(t, tlsAddr, pki.clientConfig())
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
	pki := newStreamPKI(t)
	tlsPorts := []int{freeTCPPort(t), freeTCPPort(t), freeTCPPort(t)}
	tc := startClusterWith(t, 3, func(i int, cfg *server.Config) {
		cfg.StreamTLSListen = fmt.Sprintf("127.0.0.1:%d", tlsPorts[i])
		cfg.TLS = tlsconf.Options{CertFile: pki.certFile, KeyFile: pki.keyFile}
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
		rc := dialRawTLS(t, fmt.Sprintf("127.0.0.1:%d", tlsPorts[via]), pki.clientConfig())
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
