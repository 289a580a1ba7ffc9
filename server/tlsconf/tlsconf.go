// Package tlsconf builds the TLS side of Warren's listeners (AMQPS, HTTPS) from the command
// line's --tls-cert, --tls-key, --tls-ca and --tls-verify-peer, and swaps certificates on
// Reload (SIGHUP) without dropping connections: a handshake uses whatever was loaded last.
//
// It offers TLS 1.2 and 1.3 only, as RabbitMQ does by default. A client that speaks plain AMQP
// to a TLS port is answered as RabbitMQ's TLS stack answers it (Handshake).
package tlsconf

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Options are the TLS flags of `warren serve`.
type Options struct {
	CertFile string // --tls-cert: PEM certificate, then any intermediates
	KeyFile  string // --tls-key: PEM private key of the certificate
	// CAFile (--tls-ca) holds the PEM certificates of the authorities whose client
	// certificates are accepted; it is required with VerifyPeer and otherwise unused.
	CAFile string
	// VerifyPeer (--tls-verify-peer) is mutual TLS: every client must present a certificate
	// that verifies against CAFile, or the handshake fails. That is RabbitMQ's verify_peer with
	// fail_if_no_peer_cert = true; it is also what the EXTERNAL mechanism requires.
	VerifyPeer bool
}

// Config is a listener's TLS configuration, reloadable. Its methods are safe for concurrent use.
type Config struct {
	opts    Options
	base    *tls.Config
	current atomic.Pointer[loaded]
	mu      sync.Mutex // serialises Reload
}

// loaded is one generation of files.
type loaded struct {
	config *tls.Config
	leaf   *x509.Certificate
}

// Load reads the files named in opts; the error names the file at fault.
func Load(opts Options) (*Config, error) {
	if opts.CertFile == "" || opts.KeyFile == "" {
		return nil, errors.New("TLS needs both --tls-cert and --tls-key")
	}
	if opts.VerifyPeer && opts.CAFile == "" {
		return nil, errors.New("--tls-verify-peer needs --tls-ca, the authority that signs client certificates")
	}
	c := &Config{opts: opts}
	l, err := c.load()
	if err != nil {
		return nil, err
	}
	c.current.Store(l)
	// The listener holds base; every handshake asks it for the generation loaded last.
	c.base = &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return c.current.Load().config, nil
		},
	}
	return c, nil
}

// load reads and checks the files.
func (c *Config) load() (*loaded, error) {
	pair, err := tls.LoadX509KeyPair(c.opts.CertFile, c.opts.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s with key %s: %w", c.opts.CertFile, c.opts.KeyFile, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parse TLS certificate %s: %w", c.opts.CertFile, err)
		}
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.NoClientCert,
	}
	if c.opts.CAFile != "" {
		pem, err := os.ReadFile(c.opts.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS CA file %s holds no PEM certificate", c.opts.CAFile)
		}
		cfg.ClientCAs = pool
	}
	if c.opts.VerifyPeer {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return &loaded{config: cfg, leaf: leaf}, nil
}

// TLSConfig is the configuration to serve with (tls.NewListener, tls.Server,
// http.Server.TLSConfig). It stays valid across reloads: each handshake takes the files
// loaded last.
func (c *Config) TLSConfig() *tls.Config { return c.base }

// Reload reads the files again (the command line calls it on SIGHUP). Connections accepted
// afterwards use the new certificate, key and CA; established ones keep theirs. If anything fails
// to load, the old files stay in use and the error says why.
func (c *Config) Reload() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, err := c.load()
	if err != nil {
		return fmt.Errorf("TLS reload failed, still serving the certificate loaded before: %w", err)
	}
	c.current.Store(l)
	return nil
}

// Certificate is the server certificate in use, for logs and certificate-expiry checks.
func (c *Config) Certificate() *x509.Certificate { return c.current.Load().leaf }

// VerifyPeer reports whether clients must present a verified certificate, which is what the
// EXTERNAL mechanism needs.
func (c *Config) VerifyPeer() bool { return c.opts.VerifyPeer }

// ErrNotTLS is returned by Handshake when the client's first bytes were not a TLS record at all;
// ErrPlainAMQP when they were an AMQP protocol header, a plain AMQP client dialling the TLS port.
var (
	ErrNotTLS    = errors.New("client does not speak TLS")
	ErrPlainAMQP = fmt.Errorf("%w: it sent a plain AMQP protocol header to the TLS port", ErrNotTLS)
)

// alertUnexpectedMessage is the record RabbitMQ's TLS stack (Erlang/OTP ssl) answers a
// plain-text client with: a fatal (2) unexpected_message (10) alert in a TLS 1.2 record
// (observed: 15 03 03 00 02 02 0a).
var alertUnexpectedMessage = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x0a}

// lingerTimeout bounds how long Handshake waits for a plain-text client to read the alert and
// hang up before the connection is closed.
const lingerTimeout = time.Second

// Handshake runs the server side of the TLS handshake on c, bounded by ctx (the listener's
// handshake timeout). A client that did not begin with a TLS record gets the fatal alert
// RabbitMQ sends such clients, then the connection is half-closed and closed, so that its
// client library reports a protocol error at once instead of waiting for connection.start; the
// error wraps ErrPlainAMQP or ErrNotTLS so the listener can log what happened. Any other
// handshake error is returned as it is; the caller closes c.
func Handshake(ctx context.Context, c *tls.Conn) error {
	err := c.HandshakeContext(ctx)
	if err == nil {
		return nil
	}
	var rhe tls.RecordHeaderError
	if !errors.As(err, &rhe) || rhe.Conn == nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	refuse(rhe.Conn)
	if bytes.HasPrefix(rhe.RecordHeader[:], []byte("AMQP")) {
		return fmt.Errorf("TLS handshake from %s: %w", rhe.Conn.RemoteAddr(), ErrPlainAMQP)
	}
	return fmt.Errorf("TLS handshake from %s: %w (first bytes %q)", rhe.Conn.RemoteAddr(), ErrNotTLS, rhe.RecordHeader[:])
}

// refuse sends the alert, half-closes, and drains what the client still sends until it hangs
// up (or lingerTimeout passes): closing a socket with unread input would reset it and could
// destroy the alert before the client reads it.
func refuse(nc net.Conn) {
	deadline := time.Now().Add(lingerTimeout)
	nc.SetDeadline(deadline)
	if _, err := nc.Write(alertUnexpectedMessage); err != nil {
		nc.Close()
		return
	}
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(nc, 64<<10))
	nc.Close()
}
