// Package tlstest makes a throw-away PKI for tests that run TLS listeners: a CA, a server
// certificate for localhost and 127.0.0.1, and client certificates, the CA and the server's in
// PEM files under the test's temporary directory. It is for tests only; it exists so the
// packages that test TLS (the AMQP and stream-protocol listeners) share one certificate factory.
package tlstest

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
)

// PKI is a CA with a server certificate (for localhost and 127.0.0.1) and client certificates.
type PKI struct {
	CAFile, CertFile, KeyFile string          // PEM files: the CA, the server certificate, its key
	Pool                      *x509.CertPool  // the CA, for a client's RootCAs
	Client                    tls.Certificate // CN "tls-user", O "Warren", signed by the CA
	OtherClient               tls.Certificate // the same subject, signed by another CA
}

// New makes a PKI valid from an hour ago to an hour from now; it fails t on any error.
func New(t testing.TB) *PKI {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	valid := func(c *x509.Certificate) *x509.Certificate {
		c.NotBefore, c.NotAfter = now.Add(-time.Hour), now.Add(time.Hour)
		return c
	}
	p := &PKI{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "server.pem"),
		KeyFile: filepath.Join(dir, "server.key"), Pool: x509.NewCertPool()}

	caCert, caKey, caDER := issue(t, valid(&x509.Certificate{SerialNumber: big.NewInt(1),
		Subject: pkix.Name{CommonName: "Warren test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}), nil, nil)
	writePEM(t, p.CAFile, "CERTIFICATE", caDER)
	p.Pool.AddCert(caCert)

	_, srvKey, srvDER := issue(t, valid(&x509.Certificate{SerialNumber: big.NewInt(2),
		Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}), caCert, caKey)
	writePEM(t, p.CertFile, "CERTIFICATE", srvDER)
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, p.KeyFile, "EC PRIVATE KEY", keyDER)

	client := valid(&x509.Certificate{SerialNumber: big.NewInt(3),
		Subject:     pkix.Name{CommonName: "tls-user", Organization: []string{"Warren"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature})
	_, clKey, clDER := issue(t, client, caCert, caKey)
	p.Client = tls.Certificate{Certificate: [][]byte{clDER}, PrivateKey: clKey}

	otherCA, otherKey, _ := issue(t, valid(&x509.Certificate{SerialNumber: big.NewInt(4),
		Subject: pkix.Name{CommonName: "other CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}), nil, nil)
	_, oKey, oDER := issue(t, client, otherCA, otherKey)
	p.OtherClient = tls.Certificate{Certificate: [][]byte{oDER}, PrivateKey: oKey}
	return p
}

// ClientConfig is a client configuration that trusts the CA and expects serverName.
func (p *PKI) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{RootCAs: p.Pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
}

// issue signs tmpl with a new P-256 key by parent (self-signed when parent is nil).
func issue(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
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

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
