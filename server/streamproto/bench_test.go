package streamproto_test

// Throughput of the stream protocol through rabbitmq-stream-go-client: publish with confirms and
// consume from the first offset, 12-byte and 1 KB messages, against Warren and (with
// WARREN_BENCH_RABBITMQ_STREAM_URI, e.g. rabbitmq-stream://guest:guest@localhost:5562/%2f) the
// reference RabbitMQ in the same run. Each iteration is one message; besides ns/op the benchmark
// reports msgs/s and, when the broker's process id is known, its CPU time per message
// (broker-cpu-ns/msg, from /proc/PID/stat): Warren runs as a separate process when WARREN_BIN
// names its binary, RabbitMQ's pid is WARREN_BENCH_RABBITMQ_PID (the reference script's pid
// file). `make bench-stream` runs `warren perf stream` instead (the tool's own lean client: this
// client's consumer stalls on long replays of 1 KB chunks, against RabbitMQ too); run this one by
// hand with -benchtime Nx -count 3.

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/message"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"warren/server/netserve"
)

// cpuTicks returns a process's user+system CPU time in clock ticks (0 if unknown).
func cpuTicks(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	sy, _ := strconv.ParseInt(f[12], 10, 64)
	return u + sy
}

const ticksPerSecond = 100 // USER_HZ on Linux

type benchTarget struct {
	name string
	uri  string
	pid  int
}

// benchTargets starts Warren (as a process when WARREN_BIN is set) and adds RabbitMQ when asked.
func benchTargets(b *testing.B) []benchTarget {
	var out []benchTarget
	if bin := os.Getenv("WARREN_BIN"); bin != "" {
		out = append(out, startWarrenProcess(b, bin))
	} else {
		out = append(out, benchTarget{name: "warren", uri: startBrokerTB(b).streamURI})
	}
	if u := os.Getenv("WARREN_BENCH_RABBITMQ_STREAM_URI"); u != "" {
		pid, _ := strconv.Atoi(strings.TrimSpace(os.Getenv("WARREN_BENCH_RABBITMQ_PID")))
		out = append(out, benchTarget{name: "rabbitmq", uri: u, pid: pid})
	}
	return out
}

func startWarrenProcess(b *testing.B, bin string) benchTarget {
	ports, err := netserve.FreePorts(2)
	if err != nil {
		b.Fatal(err)
	}
	sp, ap := ports[0], ports[1]
	dir := b.TempDir()
	cmd := exec.Command(bin, "serve", "--amqp-listen", fmt.Sprintf("127.0.0.1:%d", ap), "--http-listen", "",
		"--stream-listen", fmt.Sprintf("127.0.0.1:%d", sp), "--data-dir", filepath.Join(dir, "data"), "--log-level", "warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(waitFor)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", sp))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("warren did not listen: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return benchTarget{name: "warren", uri: fmt.Sprintf("rabbitmq-stream://guest:guest@127.0.0.1:%d/%%2f", sp), pid: cmd.Process.Pid}
}

func BenchmarkStreamProtocol(b *testing.B) {
	for _, tg := range benchTargets(b) {
		e, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(tg.uri))
		if err != nil {
			b.Fatalf("%s: %v", tg.name, err)
		}
		for _, size := range []int{12, 1024} {
			body := make([]byte, size)
			b.Run(fmt.Sprintf("publish-confirm/%s/%dB", tg.name, size), func(b *testing.B) {
				name := fmt.Sprintf("bench-%d-%d", size, time.Now().UnixNano())
				if err := e.DeclareStream(name, nil); err != nil {
					b.Fatal(err)
				}
				defer e.DeleteStream(name)
				start, startCPU := time.Now(), cpuTicks(tg.pid)
				b.ResetTimer()
				benchPublish(b, e, name, body, b.N)
				b.StopTimer()
				report(b, tg, b.N, time.Since(start), startCPU)
			})
			b.Run(fmt.Sprintf("consume/%s/%dB", tg.name, size), func(b *testing.B) {
				name := fmt.Sprintf("bench-c-%d-%d", size, time.Now().UnixNano())
				if err := e.DeclareStream(name, nil); err != nil {
					b.Fatal(err)
				}
				defer e.DeleteStream(name)
				benchPublish(b, e, name, body, b.N)
				start, startCPU := time.Now(), cpuTicks(tg.pid)
				b.ResetTimer()
				var got atomic.Int64
				done := make(chan struct{})
				n := int64(b.N)
				c, err := e.NewConsumer(name, func(_ stream.ConsumerContext, _ *amqp.Message) {
					if got.Add(1) == n {
						close(done)
					}
				}, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()))
				if err != nil {
					b.Fatal(err)
				}
				select {
				case <-done:
				case <-time.After(5 * time.Minute):
					b.Fatalf("consumed %d of %d", got.Load(), n)
				}
				b.StopTimer()
				report(b, tg, b.N, time.Since(start), startCPU)
				c.Close()
			})
		}
		e.Close()
	}
}

func report(b *testing.B, tg benchTarget, n int, d time.Duration, startCPU int64) {
	b.ReportMetric(float64(n)/d.Seconds(), "msgs/s")
	if tg.pid > 0 {
		ticks := cpuTicks(tg.pid) - startCPU
		b.ReportMetric(float64(ticks)*1e9/ticksPerSecond/float64(n), "broker-cpu-ns/msg")
	}
}

// benchPublish sends n messages through one producer and waits for all confirms.
func benchPublish(b *testing.B, e *stream.Environment, name string, body []byte, n int) {
	p, err := e.NewProducer(name, stream.NewProducerOptions().SetBatchSize(500))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	var confirmed atomic.Int64
	done := make(chan struct{})
	notes := p.NotifyPublishConfirmation()
	go func() {
		for cs := range notes {
			if confirmed.Add(int64(len(cs))) >= int64(n) {
				close(done)
				for range notes {
				}
				return
			}
		}
	}()
	batch := make([]message.StreamMessage, 0, 100)
	for i := 0; i < n; i++ {
		batch = append(batch, amqp.NewMessage(body))
		if len(batch) == cap(batch) || i == n-1 {
			if err := p.BatchSend(batch); err != nil {
				b.Fatal(err)
			}
			batch = make([]message.StreamMessage, 0, 100)
		}
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d confirmed", confirmed.Load(), n)
	}
}
