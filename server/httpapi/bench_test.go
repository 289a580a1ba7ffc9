package httpapi_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"syscall"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// BenchmarkAPIQueues measures GET /api/queues over real HTTP (keep-alive, as a dashboard polls)
// against a broker in this process holding 1,000 and 10,000 classic queues with a message
// each: wall time and CPU time (broker and client) per request, allocations and the body's
// size. The target is under
// 1 s at 10,000 queues.
func BenchmarkAPIQueues(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			br := startBroker(b)
			declareBenchQueues(b, br.amqpURL, n)
			client := &http.Client{}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU(b)
			var size int64
			for i := 0; i < b.N; i++ {
				req, err := http.NewRequest("GET", br.api+"/api/queues", nil)
				if err != nil {
					b.Fatal(err)
				}
				req.SetBasicAuth("guest", "guest")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				size, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("GET /api/queues: %d %v", resp.StatusCode, err)
				}
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(size), "bytes/op")
		})
	}
}

// processCPU is the CPU time this process (broker and client) has used, in nanoseconds: on a
// shared machine a steadier measure than the wall time.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// declareBenchQueues declares n classic queues called bench.q.NNNNN and publishes one message
// to each.
func declareBenchQueues(b *testing.B, url string, n int) {
	b.Helper()
	conn, err := amqp.Dial(url)
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
}
