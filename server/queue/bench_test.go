package queue

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// Benchmarks of the classic publish -> deliver -> ack path through the Queue interface. They have
// the shapes of the benchmarks written against the previous API before the rewrite (same names),
// so the two can be compared.

type benchConsumer struct {
	mu   sync.Mutex
	tags []Tag
	n    atomic.Int64
}

func (c *benchConsumer) Reserve(Kicker) bool           { return true }
func (c *benchConsumer) HasRoom(Kicker) bool           { return true }
func (c *benchConsumer) Cancelled(Queue, CancelReason) {}
func (c *benchConsumer) Deliver(_ Queue, d Delivery) bool {
	c.mu.Lock()
	c.tags = append(c.tags, d.Tag())
	c.mu.Unlock()
	c.n.Add(1)
	return true
}

// countDone counts publish outcomes.
type countDone struct{ n atomic.Int64 }

func (d *countDone) Done(error) { d.n.Add(1) }

func benchQueue(b *testing.B, cfg OpenConfig, prefetch uint32) (Queue, *benchConsumer) {
	b.Helper()
	cfg.Name, cfg.Lifecycle, cfg.Logger = "bench", DefaultConfig(), quiet
	q, err := ClassicType{}.Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(q.Close)
	c := &benchConsumer{}
	if err := q.Consume(ConsumeSpec{ID: 1, Prefetch: prefetch}, c); err != nil {
		b.Fatal(err)
	}
	return q, c
}

// BenchmarkClassicPublishDeliverAck: one goroutine publishes a message into an empty queue (it is
// delivered inline to the idle consumer) and acks it.
func BenchmarkClassicPublishDeliverAck(b *testing.B) {
	q, c := benchQueue(b, OpenConfig{}, 0)
	msg := &Message{Exchange: "", RoutingKey: "bench", Body: make([]byte, 64)}
	tags := make([]Tag, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		q.Publish(msg, nil)
		for c.n.Load() <= int64(i) {
		}
		c.mu.Lock()
		tags[0] = c.tags[len(c.tags)-1]
		c.tags = c.tags[:0]
		c.mu.Unlock()
		q.Settle(1, SettleAck, tags)
	}
}

// pipelined streams b.N messages through q while another goroutine acks what was delivered.
func pipelined(b *testing.B, q Queue, c *benchConsumer, msg *Message, done Done) {
	b.ReportAllocs()
	b.ResetTimer()
	acked := make(chan struct{})
	go func() {
		defer close(acked)
		var batch []Tag
		n := 0
		for n < b.N {
			c.mu.Lock()
			batch = append(batch[:0], c.tags...)
			c.tags = c.tags[:0]
			c.mu.Unlock()
			if len(batch) > 0 {
				q.Settle(1, SettleAck, batch)
				n += len(batch)
			} else {
				runtime.Gosched()
			}
		}
	}()
	for i := 0; i < b.N; i++ {
		q.Publish(msg, done)
	}
	<-acked
}

// BenchmarkClassicPipelined: a publisher streams messages while another goroutine acks what was
// delivered in batches, through the dispatcher.
func BenchmarkClassicPipelined(b *testing.B) {
	q, c := benchQueue(b, OpenConfig{}, 1000)
	pipelined(b, q, c, &Message{Exchange: "", RoutingKey: "bench", Body: make([]byte, 64)}, nil)
}

// BenchmarkClassicDurablePipelined is the pipelined path for persistent messages in a durable
// queue: every publish is written through the group committer (badger without fsync) and every ack
// deletes the record.
func BenchmarkClassicDurablePipelined(b *testing.B) {
	db := openDB(b, b.TempDir())
	defer db.Close()
	q, c := benchQueue(b, OpenConfig{Durable: true, ID: 1, DB: db}, 1000)
	d := &countDone{}
	pipelined(b, q, c, &Message{Exchange: "", RoutingKey: "bench", Body: make([]byte, 64), Persistent: true}, d)
	for d.n.Load() < int64(b.N) {
		runtime.Gosched()
	}
	q.Close()
}
