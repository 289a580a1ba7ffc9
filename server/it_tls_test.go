package server_test

import (
	"crypto/tls"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server"
	"warren/server/auth"
	"warren/server/tlsconf"
	"warren/server/tlsconf/tlstest"
)

// TestITAMQPSWithCertificateVerification: an AMQPS listener with --tls-verify-peer accepts a
// client whose certificate the CA signed, with a password or with EXTERNAL (the certificate's
// CN as the user), and refuses a client without a certificate, one signed by another CA, and
// plain AMQP on the TLS port.
func TestITAMQPSWithCertificateVerification(t *testing.T) {
	if againstRabbitMQ() {
		t.Skip("the reference RabbitMQ has no TLS listener configured")
	}
	pki := tlstest.New(t)
	a := startAdminConfig(t, func(cfg *server.Config) {
		cfg.AMQPSListen = "127.0.0.1:0"
		cfg.TLS = tlsconf.Options{CertFile: pki.CertFile, KeyFile: pki.KeyFile, CAFile: pki.CAFile, VerifyPeer: true}
		cfg.TLSLoginFrom = auth.LoginFromCommonName
	})
	a.must("PUT", "/api/users/tls-user", map[string]any{"password": "tls-pass", "tags": ""})
	a.users = append(a.users, "tls-user")
	a.permit("tls-user", "/", ".*", ".*", ".*")
	addr := a.srv.TLSAddr().String()
	tlsCfg := func(cert *tls.Certificate) *tls.Config {
		c := pki.ClientConfig("127.0.0.1")
		if cert != nil {
			c.Certificates = []tls.Certificate{*cert}
		}
		return c
	}

	// A password login over TLS.
	c, err := amqp.DialTLS("amqps://tls-user:tls-pass@"+addr+"/", tlsCfg(&pki.Client))
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
	c, err = amqp.DialConfig("amqps://"+addr+"/", amqp.Config{TLSClientConfig: tlsCfg(&pki.Client),
		SASL: []amqp.Authentication{&amqp.ExternalAuth{}}, Heartbeat: 10 * time.Second})
	if err != nil {
		t.Fatalf("AMQPS with EXTERNAL: %v", err)
	}
	c.Close()

	// No certificate, or one from another CA: the handshake fails.
	for name, cert := range map[string]*tls.Certificate{"no certificate": nil, "another CA": &pki.OtherClient} {
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
