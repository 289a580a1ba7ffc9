package tlsconf

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"warren/server/auth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// authority is a test CA.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial atomicSerial

type atomicSerial struct {
	mu sync.Mutex
	n  int64
}

func (s *atomicSerial) next() *big.Int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return big.NewInt(s.n)
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newAuthority(t *testing.T, name string) *authority {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial.next(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &authority{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a leaf certificate; server certificates are for 127.0.0.1 and localhost.
func (a *authority) issue(t *testing.T, subject pkix.Name, server bool) (certPEM, keyPEM []byte, cert *x509.Certificate) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial.next(), Subject: subject,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), cert
}

// clientCert is a tls.Certificate for a client.
func (a *authority) clientCert(t *testing.T, subject pkix.Name) tls.Certificate {
	t.Helper()
	c, k, _ := a.issue(t, subject, false)
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// files writes a server certificate and key signed by ca, and the PEM of the client CA.
type files struct{ cert, key, ca string }

func writeFiles(t *testing.T, dir string, ca, clientCA *authority) (files, *x509.Certificate) {
	t.Helper()
	c, k, leaf := ca.issue(t, pkix.Name{CommonName: "warren-test-server"}, true)
	f := files{cert: filepath.Join(dir, "cert.pem"), key: filepath.Join(dir, "key.pem"), ca: filepath.Join(dir, "ca.pem")}
	for name, data := range map[string][]byte{f.cert: c, f.key: k, f.ca: clientCA.pem} {
		writeFile(t, name, data)
	}
	return f, leaf
}

// writeFile replaces a file atomically, as a certificate renewal tool would.
func writeFile(t *testing.T, name string, data []byte) {
	t.Helper()
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
}

// server accepts TLS connections with cfg on loopback and reports each handshake's result.
type server struct {
	ln      net.Listener
	results chan result
	wg      sync.WaitGroup
}

type result struct {
	err   error
	state tls.ConnectionState
}

func startServer(t *testing.T, cfg *Config) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ln: ln, results: make(chan result, 16)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				tc := tls.Server(nc, cfg.TLSConfig())
				defer tc.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				err := Handshake(ctx, tc)
				s.results <- result{err: err, state: tc.ConnectionState()}
				if err == nil { // echo, so a test can use the connection
					tc.SetDeadline(time.Now().Add(10 * time.Second))
					io.Copy(tc, tc)
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *server) addr() string { return s.ln.Addr().String() }

// next waits (boundedly) for the next handshake result.
func (s *server) next(t *testing.T) result {
	t.Helper()
	select {
	case r := <-s.results:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no handshake finished on the server")
		return result{}
	}
}

// dial makes a TLS client connection and checks it works both ways.
func dial(t *testing.T, addr string, cfg *tls.Config) (*tls.Conn, error) {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	// TLS 1.3 reports a refused client certificate only on the first read.
	if _, err := c.Write([]byte("ping")); err != nil {
		c.Close()
		return nil, err
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		c.Close()
		return nil, errors.Join(errors.New("no echo"), err)
	}
	return c, nil
}

func clientConfig(ca *authority, certs ...tls.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Certificates: certs}
}

func TestServerTLS(t *testing.T) {
	ca := newAuthority(t, "test CA")
	f, leaf := writeFiles(t, t.TempDir(), ca, ca)
	cfg, err := Load(Options{CertFile: f.cert, KeyFile: f.key})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.VerifyPeer() || !cfg.Certificate().Equal(leaf) {
		t.Fatalf("VerifyPeer %v, certificate %v", cfg.VerifyPeer(), cfg.Certificate().Subject)
	}
	s := startServer(t, cfg)
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		cc := clientConfig(ca)
		cc.MinVersion, cc.MaxVersion = version, version
		c, err := dial(t, s.addr(), cc)
		if err != nil {
			t.Fatalf("TLS %x: %v", version, err)
		}
		if got := c.ConnectionState().Version; got != version {
			t.Errorf("negotiated %x, want %x", got, version)
		}
		c.Close()
		if r := s.next(t); r.err != nil || len(r.state.PeerCertificates) != 0 {
			t.Errorf("server: %v, %d peer certificates", r.err, len(r.state.PeerCertificates))
		}
	}
	// A client that does not trust the server's CA fails (and the server sees an alert).
	if c, err := dial(t, s.addr(), clientConfig(newAuthority(t, "other CA"))); err == nil {
		c.Close()
		t.Fatal("a client with another CA verified the server")
	}
	s.next(t)
}

func TestOldTLSVersionsRefused(t *testing.T) {
	ca := newAuthority(t, "test CA")
	f, _ := writeFiles(t, t.TempDir(), ca, ca)
	cfg, err := Load(Options{CertFile: f.cert, KeyFile: f.key})
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, cfg)
	for _, version := range []uint16{tls.VersionTLS10, tls.VersionTLS11} {
		cc := clientConfig(ca)
		cc.MinVersion, cc.MaxVersion = version, version
		c, err := dial(t, s.addr(), cc)
		if err == nil {
			c.Close()
			t.Fatalf("TLS %x accepted", version)
		}
		r := s.next(t)
		if r.err == nil || !strings.Contains(r.err.Error(), "unsupported versions") {
			t.Errorf("TLS %x: server error %v, want unsupported versions", version, r.err)
		}
		if !strings.Contains(err.Error(), "protocol version not supported") {
			t.Errorf("TLS %x: client error %v, want the protocol_version alert", version, err)
		}
		t.Logf("TLS %x: client %v; server %v", version, err, r.err)
	}
}

func TestMutualTLS(t *testing.T) {
	serverCA, clientCA, otherCA := newAuthority(t, "server CA"), newAuthority(t, "client CA"), newAuthority(t, "other CA")
	f, _ := writeFiles(t, t.TempDir(), serverCA, clientCA)
	cfg, err := Load(Options{CertFile: f.cert, KeyFile: f.key, CAFile: f.ca, VerifyPeer: true})
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, cfg)
	subject := pkix.Name{CommonName: "app-1", Organization: []string{"Warren, Inc."}, Country: []string{"DE"}}

	c, err := dial(t, s.addr(), clientConfig(serverCA, clientCA.clientCert(t, subject)))
	if err != nil {
		t.Fatalf("client with a certificate from the client CA: %v", err)
	}
	c.Close()
	r := s.next(t)
	if r.err != nil || len(r.state.VerifiedChains) == 0 {
		t.Fatalf("server: %v, %d verified chains", r.err, len(r.state.VerifiedChains))
	}
	// EXTERNAL's login names from the verified peer certificate.
	for from, want := range map[auth.LoginFrom]string{
		auth.LoginFromDistinguishedName: `CN=app-1,O=Warren\, Inc.,C=DE`,
		auth.LoginFromCommonName:        "app-1",
	} {
		name, err := auth.External(&r.state, cfg.VerifyPeer(), from)
		if err != nil || name != want {
			t.Errorf("External(%s) = %q, %v; want %q", from, name, err, want)
		}
	}

	for name, cc := range map[string]*tls.Config{
		"no client certificate":             clientConfig(serverCA),
		"certificate from another CA":       clientConfig(serverCA, otherCA.clientCert(t, subject)),
		"server certificate used as client": clientConfig(serverCA, serverCA.clientCert(t, subject)),
	} {
		t.Run(name, func(t *testing.T) {
			if c, err := dial(t, s.addr(), cc); err == nil {
				c.Close()
				t.Fatal("handshake succeeded")
			}
			if r := s.next(t); r.err == nil {
				t.Error("server accepted the client")
			} else {
				t.Logf("server: %v", r.err)
			}
		})
	}
}

func TestReload(t *testing.T) {
	dir := t.TempDir()
	ca := newAuthority(t, "test CA")
	f, first := writeFiles(t, dir, ca, ca)
	cfg, err := Load(Options{CertFile: f.cert, KeyFile: f.key, CAFile: f.ca, VerifyPeer: true})
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, cfg)
	client := clientConfig(ca, ca.clientCert(t, pkix.Name{CommonName: "c"}))
	served := func() *x509.Certificate {
		t.Helper()
		c, err := dial(t, s.addr(), client)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if r := s.next(t); r.err != nil {
			t.Fatal(r.err)
		}
		return c.ConnectionState().PeerCertificates[0]
	}
	if !served().Equal(first) {
		t.Fatal("not serving the loaded certificate")
	}
	// A connection made before the reload keeps working after it.
	old, err := dial(t, s.addr(), client)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	s.next(t)

	_, second := writeFiles(t, dir, ca, ca)
	if err := cfg.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := served(); !got.Equal(second) || got.Equal(first) {
		t.Fatalf("after reload the server presents serial %v, want %v", got.SerialNumber, second.SerialNumber)
	}
	if !cfg.Certificate().Equal(second) {
		t.Error("Certificate() is not the reloaded one")
	}
	old.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := old.Write([]byte("pong")); err != nil {
		t.Fatalf("old connection after reload: %v", err)
	}
	if buf := make([]byte, 4); func() bool { _, err := io.ReadFull(old, buf); return err != nil || string(buf) != "pong" }() {
		t.Fatal("old connection stopped echoing after the reload")
	}

	// Broken reloads: each keeps the second certificate.
	goodCert, _ := os.ReadFile(f.cert)
	goodKey, _ := os.ReadFile(f.key)
	goodCA, _ := os.ReadFile(f.ca)
	otherCert, otherKey, _ := ca.issue(t, pkix.Name{CommonName: "other"}, true)
	for _, tc := range []struct {
		name           string
		cert, key, cas []byte
		remove         string
	}{
		{name: "garbage certificate", cert: []byte("not a certificate"), key: goodKey, cas: goodCA},
		{name: "key of another certificate", cert: goodCert, key: otherKey, cas: goodCA},
		{name: "certificate of another key", cert: otherCert, key: goodKey, cas: goodCA},
		{name: "CA file without certificates", cert: goodCert, key: goodKey, cas: []byte("nothing")},
		{name: "certificate file gone", cert: goodCert, key: goodKey, cas: goodCA, remove: f.cert},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeFile(t, f.cert, tc.cert)
			writeFile(t, f.key, tc.key)
			writeFile(t, f.ca, tc.cas)
			if tc.remove != "" {
				os.Remove(tc.remove)
			}
			err := cfg.Reload()
			if err == nil || !strings.Contains(err.Error(), "still serving the certificate loaded before") {
				t.Fatalf("Reload = %v, want an error", err)
			}
			t.Logf("Reload: %v", err)
			if got := served(); !got.Equal(second) {
				t.Fatalf("after a failed reload the server presents serial %v, want %v", got.SerialNumber, second.SerialNumber)
			}
		})
	}

	// A reloaded CA file decides which clients get in.
	newCA := newAuthority(t, "new client CA")
	writeFile(t, f.cert, goodCert)
	writeFile(t, f.key, goodKey)
	writeFile(t, f.ca, newCA.pem)
	if err := cfg.Reload(); err != nil {
		t.Fatal(err)
	}
	if c, err := dial(t, s.addr(), client); err == nil {
		c.Close()
		t.Fatal("a client of the old CA got in after the CA changed")
	}
	s.next(t)
	c, err := dial(t, s.addr(), clientConfig(ca, newCA.clientCert(t, pkix.Name{CommonName: "n"})))
	if err != nil {
		t.Fatalf("client of the new CA: %v", err)
	}
	c.Close()
	s.next(t)
}

func TestReloadConcurrentWithHandshakes(t *testing.T) {
	dir := t.TempDir()
	ca := newAuthority(t, "test CA")
	f, _ := writeFiles(t, dir, ca, ca)
	cfg, err := Load(Options{CertFile: f.cert, KeyFile: f.key})
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, cfg)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 5; i++ {
			writeFiles(t, dir, ca, ca)
			if err := cfg.Reload(); err != nil {
				t.Error(err)
			}
		}
	}()
	for i := 0; i < 10; i++ {
		c, err := dial(t, s.addr(), clientConfig(ca))
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		if r := s.next(t); r.err != nil {
			t.Fatal(r.err)
		}
	}
	wg.Wait()
}

func TestPlainClientOnTLSPort(t *testing.T) {
	ca := newAuthority(t, "test CA")
	f, _ := writeFiles(t, t.TempDir(), ca, ca)
	cfg, err := Load(Options{CertFile: f.cert, KeyFile: f.key})
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, cfg)

	for _, tc := range []struct {
		name  string
		hello string
		want  error
	}{
		{"AMQP 0-9-1 header", "AMQP\x00\x00\x09\x01", ErrPlainAMQP},
		{"AMQP 1.0 header", "AMQP\x00\x01\x00\x00", ErrPlainAMQP},
		{"HTTP", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", ErrNotTLS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := net.DialTimeout("tcp", s.addr(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := nc.Write([]byte(tc.hello)); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(nc) // until the server closes
			if err != nil {
				t.Fatalf("read: %v (got %x)", err, got)
			}
			nc.Close() // as a client does on the alert; the server stops waiting for it
			if !bytes.Equal(got, alertUnexpectedMessage) {
				t.Errorf("client read %x, want the alert %x", got, alertUnexpectedMessage)
			}
			r := s.next(t)
			if !errors.Is(r.err, tc.want) || !errors.Is(r.err, ErrNotTLS) {
				t.Errorf("server: %v, want %v", r.err, tc.want)
			}
			if tc.want != ErrPlainAMQP && errors.Is(r.err, ErrPlainAMQP) {
				t.Errorf("server: %v is not plain AMQP", r.err)
			}
			t.Logf("server: %v", r.err)
		})
	}

	t.Run("amqp091-go fails at once", func(t *testing.T) {
		start := time.Now()
		conn, err := amqp091.DialConfig("amqp://guest:guest@"+s.addr()+"/", amqp091.Config{Dial: amqp091.DefaultDial(5 * time.Second)})
		if err == nil {
			conn.Close()
			t.Fatal("plain AMQP client connected to the TLS port")
		}
		if elapsed := time.Since(start); elapsed > 3*time.Second {
			t.Errorf("the client took %v to fail", elapsed)
		}
		if r := s.next(t); !errors.Is(r.err, ErrPlainAMQP) {
			t.Errorf("server: %v", r.err)
		}
		t.Logf("amqp091-go: %v", err)
	})

	// And a TLS client is still served afterwards.
	c, err := dial(t, s.addr(), clientConfig(ca))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.next(t)
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	ca := newAuthority(t, "test CA")
	f, _ := writeFiles(t, dir, ca, ca)
	empty := filepath.Join(dir, "empty.pem")
	writeFile(t, empty, nil)
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"no certificate", Options{KeyFile: f.key}, "--tls-cert and --tls-key"},
		{"no key", Options{CertFile: f.cert}, "--tls-cert and --tls-key"},
		{"verify peer without CA", Options{CertFile: f.cert, KeyFile: f.key, VerifyPeer: true}, "--tls-verify-peer needs --tls-ca"},
		{"missing certificate file", Options{CertFile: filepath.Join(dir, "nope.pem"), KeyFile: f.key}, "nope.pem"},
		{"key swapped for certificate", Options{CertFile: f.key, KeyFile: f.cert}, "load TLS certificate"},
		{"missing CA file", Options{CertFile: f.cert, KeyFile: f.key, CAFile: filepath.Join(dir, "noca.pem")}, "noca.pem"},
		{"empty CA file", Options{CertFile: f.cert, KeyFile: f.key, CAFile: empty, VerifyPeer: true}, "holds no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Load(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v, %v; want an error with %q", cfg, err, tc.want)
			}
		})
	}
	// A CA without --tls-verify-peer is accepted but asks clients for nothing.
	cfg, err := Load(Options{CertFile: f.cert, KeyFile: f.key, CAFile: f.ca})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := cfg.TLSConfig().GetConfigForClient(nil); got.ClientAuth != tls.NoClientCert || got.MinVersion != tls.VersionTLS12 {
		t.Errorf("ClientAuth %v, MinVersion %x", got.ClientAuth, got.MinVersion)
	}
}
