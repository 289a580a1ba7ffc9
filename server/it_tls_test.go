package server_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server"
	"warren/server/auth"
	"warren/server/tlsconf"
)

// testPKI is a CA with a server certificate for 127.0.0.1 and a client certificate, written to
// PEM files.
type testPKI struct {
	dir                       string
	caFile, certFile, keyFile string
	pool                      *x509.CertPool
	client                    tls.Certificate
	otherClient               tls.Certificate // signed by another CA
}

func newCert(t *testing.T, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key, der
}

func pemFile(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func keyDER(t *testing.T, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	b, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Warren test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caCert, caKey, caDER := newCert(t, ca, nil, nil)
	p.caFile = filepath.Join(p.dir, "ca.pem")
	pemFile(t, p.caFile, "CERTIFICATE", caDER)
	p.pool = x509.NewCertPool()
	p.pool.AddCert(caCert)

	srv := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	_, srvKey, srvDER := newCert(t, srv, caCert, caKey)
	p.certFile, p.keyFile = filepath.Join(p.dir, "server.pem"), filepath.Join(p.dir, "server.key")
	pemFile(t, p.certFile, "CERTIFICATE", srvDER)
	pemFile(t, p.keyFile, "EC PRIVATE KEY", keyDER(t, srvKey))

	cl := &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "tls-user", Organization: []string{"Warren"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	_, clKey, clDER := newCert(t, cl, caCert, caKey)
	p.client = tls.Certificate{Certificate: [][]byte{clDER}, PrivateKey: clKey}

	other := &x509.Certificate{SerialNumber: big.NewInt(4), Subject: pkix.Name{CommonName: "other CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	oCert, oKey, _ := newCert(t, other, nil, nil)
	_, oclKey, oclDER := newCert(t, cl, oCert, oKey)
	p.otherClient = tls.Certificate{Certificate: [][]byte{oclDER}, PrivateKey: oclKey}
	return p
}

// TestITAMQPSWithCertificateVerification: an AMQPS listener with --tls-verify-peer accepts a
// client whose certificate the CA signed, with a password or with EXTERNAL (the certificate's
// CN as the user), and refuses a client without a certificate, one signed by another CA, and
// plain AMQP on the TLS port.
func TestITAMQPSWithCertificateVerification(t *testing.T) {
	if againstRabbitMQ() {
		t.Skip("the reference RabbitMQ has no TLS listener configured")
	}
	pki := newTestPKI(t)
	a := startAdminConfig(t, func(cfg *server.Config) {
		cfg.AMQPSListen = "127.0.0.1:0"
		cfg.TLS = tlsconf.Options{CertFile: pki.certFile, KeyFile: pki.keyFile, CAFile: pki.caFile, VerifyPeer: true}
		cfg.TLSLoginFrom = auth.LoginFromCommonName
	})
	a.must("PUT", "/api/users/tls-user", map[string]any{"password": "tls-pass", "tags": ""})
	a.users = append(a.users, "tls-user")
	a.permit("tls-user", "/", ".*", ".*", ".*")
	addr := a.srv.TLSAddr().String()
	tlsCfg := func(cert *tls.Certificate) *tls.Config {
		c := &tls.Config{RootCAs: pki.pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
		if cert != nil {
			c.Certificates = []tls.Certificate{*cert}
		}
		return c
	}

	// A password login over TLS.
	c, err := amqp.DialTLS("amqps://tls-user:tls-pass@"+addr+"/", tlsCfg(&pki.client))
	if err != nil {
		t.Fatalf("AMQPS with a password: %v", err)
	}
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("", false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	c.Close()

	// EXTERNAL: the certificate's CN is the user, no password.
	c, err = amqp.DialConfig("amqps://"+addr+"/", amqp.Config{TLSClientConfig: tlsCfg(&pki.client),
		SASL: []amqp.Authentication{&amqp.ExternalAuth{}}, Heartbeat: 10 * time.Second})
	if err != nil {
		t.Fatalf("AMQPS with EXTERNAL: %v", err)
	}
	c.Close()

	// No certificate, or one from another CA: the handshake fails.
	for name, cert := range map[string]*tls.Certificate{"no certificate": nil, "another CA": &pki.otherClient} {
		if c, err := amqp.DialTLS("amqps://tls-user:tls-pass@"+addr+"/", tlsCfg(cert)); err == nil {
			c.Close()
			t.Fatalf("%s: AMQPS connection accepted", name)
		}
	}

	// Plain AMQP on the TLS port fails at once, not after a timeout.
	start := time.Now()
	if c, err := amqp.Dial("amqp://tls-user:tls-pass@" + addr + "/"); err == nil {
		c.Close()
		t.Fatal("plain AMQP on the TLS port connected")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("plain AMQP on the TLS port took %v to fail", d)
	}
}
