package streamproto_test

// Component tests of the stream-protocol front-end: a broker in process on 127.0.0.1:0 ports,
// driven by rabbitmq-stream-go-client (the Go module proxy's v1.8.3) over TCP, and by
// amqp091-go for the interop tests. With WARREN_STREAM_TEST_URI set (a rabbitmq-stream:// URI,
// e.g. the reference RabbitMQ's rabbitmq-stream://guest:guest@localhost:5562/%2f) and
// WARREN_TEST_URL (its AMQP URL) the same tests run against that broker instead.

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
	"go.uber.org/goleak"

	"warren/server"
)

const waitFor = 10 * time.Second

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The client library's own background goroutines outlive Environment.Close briefly.
		goleak.IgnoreAnyFunction("github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream.(*Client).heartBeat.func1"),
		goleak.IgnoreAnyFunction("github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream.(*Client).handleResponse"),
		goleak.IgnoreTopFunction("time.Sleep"),
	)
}

// broker is a broker under test: its stream URI and AMQP URL.
type broker struct {
	streamURI string
	amqpURL   string
	srv       *server.Server
}

func external() (broker, bool) {
	u := os.Getenv("WARREN_STREAM_TEST_URI")
	if u == "" {
		return broker{}, false
	}
	return broker{streamURI: u, amqpURL: os.Getenv("WARREN_TEST_URL")}, true
}

// startBroker starts an in-process broker (or returns the external one) stopped at the end of
// the test.
func startBroker(t *testing.T) broker {
	t.Helper()
	return startBrokerTB(t)
}

func startBrokerTB(t testing.TB) broker {
	t.Helper()
	if b, ok := external(); ok {
		return b
	}
	return brokerOf(startServer(t, brokerConfig(t)))
}

// brokerConfig is the configuration of startBroker's in-process broker: AMQP 0-9-1 and the stream
// protocol on 127.0.0.1:0 ports, data in a temporary directory.
func brokerConfig(t testing.TB) server.Config {
	cfg := server.DefaultConfig()
	cfg.AMQPListen = "127.0.0.1:0"
	cfg.StreamListen = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	return cfg
}

// brokerOf is the broker under test served by the in-process srv.
func brokerOf(srv *server.Server) broker {
	sa := srv.StreamAddr().(*net.TCPAddr)
	aa := srv.Addr().(*net.TCPAddr)
	return broker{streamURI: fmt.Sprintf("rabbitmq-stream://guest:guest@127.0.0.1:%d/%%2f", sa.Port),
		amqpURL: fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", aa.Port), srv: srv}
}

// env opens a stream-client environment closed at the end of the test.
func env(t *testing.T, b broker) *stream.Environment {
	t.Helper()
	e, err := stream.NewEnvironment(stream.NewEnvironmentOptions().SetUri(b.streamURI))
	if err != nil {
		t.Fatalf("connect %s: %v", b.streamURI, err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

var nameSeq struct {
	sync.Mutex
	n int
}

// streamName returns a name unique to the test (the reference broker keeps streams).
func streamName(t *testing.T) string {
	nameSeq.Lock()
	nameSeq.n++
	n := nameSeq.n
	nameSeq.Unlock()
	return fmt.Sprintf("%s-%d-%d", t.Name(), time.Now().UnixNano()%1e9, n)
}

// declare creates a stream deleted at the end of the test.
func declare(t *testing.T, e *stream.Environment, opts *stream.StreamOptions) string {
	t.Helper()
	name := streamName(t)
	if err := e.DeclareStream(name, opts); err != nil {
		t.Fatalf("declare stream %s: %v", name, err)
	}
	t.Cleanup(func() { _ = e.DeleteStream(name) })
	return name
}

// publish sends n messages "<prefix><i>" and waits for every confirm.
func publish(t *testing.T, e *stream.Environment, name, prefix string, n int) {
	t.Helper()
	p, err := e.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("new producer: %v", err)
	}
	defer p.Close()
	confirmed := make(chan int, n)
	notes := p.NotifyPublishConfirmation()
	go func() {
		for batch := range notes {
			for _, c := range batch {
				if c.IsConfirmed() {
					confirmed <- 1
				} else {
					confirmed <- 0
				}
			}
		}
	}()
	for i := range n {
		if err := p.Send(amqp.NewMessage([]byte(prefix + strconv.Itoa(i)))); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	deadline := time.After(waitFor)
	for i := 0; i < n; i++ {
		select {
		case ok := <-confirmed:
			if ok != 1 {
				t.Fatalf("message %d not confirmed", i)
			}
		case <-deadline:
			t.Fatalf("%d of %d confirms", i, n)
		}
	}
}

// consume reads until n messages arrived (or times out) and returns their bodies and offsets.
func consume(t *testing.T, e *stream.Environment, name string, opts *stream.ConsumerOptions, n int) ([]string, []int64) {
	t.Helper()
	var mu sync.Mutex
	var bodies []string
	var offsets []int64
	done := make(chan struct{})
	c, err := e.NewConsumer(name, func(ctx stream.ConsumerContext, m *amqp.Message) {
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, string(m.GetData()))
		offsets = append(offsets, ctx.Consumer.GetOffset())
		if len(bodies) == n {
			close(done)
		}
	}, opts)
	if err != nil {
		t.Fatalf("new consumer: %v", err)
	}
	defer c.Close()
	select {
	case <-done:
	case <-time.After(waitFor):
		mu.Lock()
		got := len(bodies)
		mu.Unlock()
		t.Fatalf("consumed %d of %d", got, n)
	}
	mu.Lock()
	defer mu.Unlock()
	return append([]string(nil), bodies...), append([]int64(nil), offsets...)
}

func TestPublishConsume(t *testing.T) {
	b := startBroker(t)
	e := env(t, b)
	name := declare(t, e, nil)
	publish(t, e, name, "m", 500)
	bodies, offsets := consume(t, e, name, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()), 500)
	for i := range bodies {
		if bodies[i] != "m"+strconv.Itoa(i) || offsets[i] != int64(i) {
			t.Fatalf("message %d: %q at offset %d", i, bodies[i], offsets[i])
		}
	}
}

// startServer starts an in-process broker with cfg (alarms off) and shuts it down at the end of
// the test.
func startServer(t testing.TB, cfg server.Config) *server.Server {
	t.Helper()
	srv, _ := startStoppableServer(t, cfg)
	return srv
}

// startStoppableServer is startServer that also returns stop, which shuts the broker down
// (bounded by 10 s) once and returns Shutdown's error (the end of the test calls it too).
func startStoppableServer(t testing.TB, cfg server.Config) (*server.Server, func() error) {
	t.Helper()
	cfg.DiskFreeLimit = 0
	cfg.MemoryHighWatermark = 0
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var stopErr error
	stop := func() error {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stopErr = srv.Shutdown(ctx)
		})
		return stopErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return srv, stop
}
