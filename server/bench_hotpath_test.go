package server_test

import (
	"context"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server"
)

// BenchmarkPublishDeliverAck is the hot path the counters layer sits on: a publisher connection
// sends b.N transient messages to a classic queue through the default exchange, and a consumer
// on another connection (prefetch 200) acknowledges each. It compares the cost per message with
// and without per-channel and per-queue counters (run it on the commit before them).
func BenchmarkPublishDeliverAck(b *testing.B) {
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
	pc, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()
	cc, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	pch, err := pc.Channel()
	if err != nil {
		b.Fatal(err)
	}
	cch, err := cc.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q, err := cch.QueueDeclare("bench-hotpath", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := cch.Qos(200, 0, false); err != nil {
		b.Fatal(err)
	}
	deliveries, err := cch.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 64)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	done := make(chan error, 1)
	go func() {
		for i := 0; i < b.N; i++ {
			d, ok := <-deliveries
			if !ok {
				done <- io.ErrUnexpectedEOF
				return
			}
			if err := d.Ack(false); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := 0; i < b.N; i++ {
		if err := pch.Publish("", q.Name, false, false, amqp.Publishing{Body: body}); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	// The machine is shared: CPU time of the process (client and broker) per message is steadier
	// than wall-clock time.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}

// processCPU is the process's user plus system CPU time in nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
