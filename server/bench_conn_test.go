package server_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server"
)

// BenchmarkConnectionSetup measures a client's connection setup with authentication: dial,
// handshake (a PLAIN login checked against the stored password hash), connection.open with its
// vhost checks, one channel, close.
func BenchmarkConnectionSetup(b *testing.B) {
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.DataDir = b.TempDir()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := server.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	}()
	url := "amqp://guest:guest@" + s.Addr().String() + "/"
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, err := amqp.Dial(url)
		if err != nil {
			b.Fatal(err)
		}
		ch, err := c.Channel()
		if err != nil {
			b.Fatal(err)
		}
		ch.Close()
		c.Close()
	}
}
