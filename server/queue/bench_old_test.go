package queue

import (
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"warren/storage"
)

// Benchmarks of the classic publish -> deliver -> ack path, written against the pre-rewrite API
// (queue.New, AddConsumer, Settle by id) to record the baseline.

type benchConsumer struct {
	mu  sync.Mutex
	ids []uint64
	n   atomic.Int64
}

func (c *benchConsumer) Reserve(*Classic) bool { return true }
func (c *benchConsumer) Deliver(_ *Classic, d Delivery) {
	c.mu.Lock()
	c.ids = append(c.ids, d.ID)
	c.mu.Unlock()
	c.n.Add(1)
}

// BenchmarkClassicPublishDeliverAck: one goroutine publishes a message into an empty queue (it is
// delivered inline to the idle consumer) and acks it.
func BenchmarkClassicPublishDeliverAck(b *testing.B) {
	q := New(Options{Name: "bench"})
	defer q.Close()
	c := &benchConsumer{}
	if err := q.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 0}, false, c, nil); err != nil {
		b.Fatal(err)
	}
	msg := &Message{Exchange: "", RoutingKey: "bench", Body: make([]byte, 64)}
	ids := make([]uint64, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		q.Publish(msg, nil)
		for c.n.Load() <= int64(i) {
		}
		c.mu.Lock()
		ids[0] = c.ids[len(c.ids)-1]
		c.ids = c.ids[:0]
		c.mu.Unlock()
		q.Settle(ids)
	}
}

// BenchmarkClassicPipelined: a publisher streams messages while another goroutine acks what was
// delivered in batches, through the dispatcher.
func BenchmarkClassicPipelined(b *testing.B) {
	q := New(Options{Name: "bench"})
	defer q.Close()
	c := &benchConsumer{}
	if err := q.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 1000}, false, c, nil); err != nil {
		b.Fatal(err)
	}
	msg := &Message{Exchange: "", RoutingKey: "bench", Body: make([]byte, 64)}
	b.ReportAllocs()
	b.ResetTimer()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var batch []uint64
		acked := 0
		for acked < b.N {
			c.mu.Lock()
			batch = append(batch[:0], c.ids...)
			c.ids = c.ids[:0]
			c.mu.Unlock()
			if len(batch) > 0 {
				q.Settle(batch)
				acked += len(batch)
			} else {
				runtime.Gosched()
			}
		}
	}()
	for i := 0; i < b.N; i++ {
		q.Publish(msg, nil)
	}
	<-done
}

// BenchmarkClassicDurablePipelined is the pipelined path for persistent messages in a durable
// queue: every publish is written through the group committer (badger without fsync) and every ack
// deletes the record.
func BenchmarkClassicDurablePipelined(b *testing.B) {
	db, err := storage.Open(storage.Options{Dir: b.TempDir(), NoSync: true, GCInterval: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	q := New(Options{Name: "bench", Durable: true, ID: 1, DB: db})
	defer q.Close()
	c := &benchConsumer{}
	if err := q.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 1000}, false, c, nil); err != nil {
		b.Fatal(err)
	}
	msg := &Message{Exchange: "", RoutingKey: "bench", Body: make([]byte, 64), Persistent: true}
	var confirmed atomic.Int64
	confirm := func(error) { confirmed.Add(1) }
	b.ReportAllocs()
	b.ResetTimer()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var batch []uint64
		acked := 0
		for acked < b.N {
			c.mu.Lock()
			batch = append(batch[:0], c.ids...)
			c.ids = c.ids[:0]
			c.mu.Unlock()
			if len(batch) > 0 {
				q.Settle(batch)
				acked += len(batch)
			} else {
				runtime.Gosched()
			}
		}
	}()
	for i := 0; i < b.N; i++ {
		q.Publish(msg, confirm)
	}
	<-done
	for confirmed.Load() < int64(b.N) {
		runtime.Gosched()
	}
}
