package metrics_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server"
	"warren/server/metrics"
)

// BenchmarkScrape measures one scrape of each endpoint (uncompressed) with 1,000 and 10,000
// queues holding a message each: time and allocations per scrape, and the exposition's size.
func BenchmarkScrape(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			br := startBenchBroker(b, n)
			h := metrics.Handler(br, metrics.Options{Version: "bench"})
			for _, path := range []string{"/metrics", "/metrics/per-object"} {
				b.Run(path, func(b *testing.B) {
					b.ReportAllocs()
					var size int
					for i := 0; i < b.N; i++ {
						rec := httptest.NewRecorder()
						req := httptest.NewRequest("GET", path, nil)
						h.ServeHTTP(rec, req)
						if rec.Code != http.StatusOK {
							b.Fatalf("%s: %d", path, rec.Code)
						}
						size = rec.Body.Len()
						io.Copy(io.Discard, rec.Body)
					}
					b.ReportMetric(float64(size), "bytes/scrape")
				})
			}
		})
	}
}

func startBenchBroker(b *testing.B, n int) *benchServer {
	b.Helper()
	srv := newBenchServer(b)
	conn, err := amqp.Dial("amqp://guest:guest@" + srv.Addr().String() + "/")
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("bench.q.%05d", i)
		if _, err := ch.QueueDeclare(name, false, false, false, false, nil); err != nil {
			b.Fatal(err)
		}
		if err := ch.Publish("", name, false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
			b.Fatal(err)
		}
	}
	return srv
}

type benchServer = server.Server

func newBenchServer(b *testing.B) *server.Server {
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.DataDir = b.TempDir()
	srv, err := server.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return srv
}
