package exchange

import (
	"fmt"
	"testing"

	"warren/amqp"
)

// topicBenchRegistry builds a topic exchange with 1,000 bindings of
// assorted shapes to 100 queues, plus the routing keys to publish with.
func topicBenchRegistry(b *testing.B) (*Registry, []string) {
	r := NewRegistry("/")
	mustDeclare(b, r, "t", "topic")
	n := 0
	bind := func(key string) {
		mustBind(b, r, qb("t", fmt.Sprintf("q%02d", n%100), key))
		n++
	}
	for i := 0; n < 1000; i++ {
		switch i % 5 {
		case 0:
			bind(fmt.Sprintf("stock.sym%d.nyse", i))
		case 1:
			bind(fmt.Sprintf("stock.*.venue%d", i))
		case 2:
			bind(fmt.Sprintf("stock.sym%d.#", i))
		case 3:
			bind(fmt.Sprintf("#.venue%d", i))
		case 4:
			bind(fmt.Sprintf("log.%d.*.error", i))
		}
	}
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("stock.sym%d.venue%d", i*5, i*5+1)
	}
	return r, keys
}

func BenchmarkRouteTopic(b *testing.B) {
	r, keys := topicBenchRegistry(b)
	if got, _ := r.Route(nil, "t", keys[1], nil, nil, nil); len(got) == 0 {
		b.Fatalf("benchmark key %q routes nowhere", keys[1])
	}
	dst := make([]string, 0, 64)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst, _ = r.Route(dst[:0], "t", keys[i%len(keys)], nil, nil, nil)
	}
}

func BenchmarkRouteTopicParallel(b *testing.B) {
	r, keys := topicBenchRegistry(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]string, 0, 64)
		i := 0
		for pb.Next() {
			dst, _ = r.Route(dst[:0], "t", keys[i%len(keys)], nil, nil, nil)
			i++
		}
	})
}

func BenchmarkRouteDirect(b *testing.B) {
	r := NewRegistry("/")
	mustDeclare(b, r, "d", "direct")
	for i := range 1000 {
		mustBind(b, r, qb("d", fmt.Sprintf("q%d", i), fmt.Sprintf("key%d", i)))
	}
	dst := make([]string, 0, 8)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst, _ = r.Route(dst[:0], "d", "key500", nil, nil, nil)
	}
	if len(dst) != 1 {
		b.Fatalf("routed to %v", dst)
	}
}

func BenchmarkRouteDefault(b *testing.B) {
	r := NewRegistry("/")
	exists := func(string) bool { return true }
	dst := make([]string, 0, 8)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst, _ = r.Route(dst[:0], "", "q", nil, nil, exists)
	}
}

func BenchmarkRouteFanout100(b *testing.B) {
	r := NewRegistry("/")
	mustDeclare(b, r, "f", "fanout")
	for i := range 100 {
		mustBind(b, r, qb("f", fmt.Sprintf("q%d", i), ""))
	}
	dst := make([]string, 0, 128)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst, _ = r.Route(dst[:0], "f", "", nil, nil, nil)
	}
}

func BenchmarkRouteHeaders(b *testing.B) {
	r := NewRegistry("/")
	mustDeclare(b, r, "h", "headers")
	for i := range 100 {
		mustBind(b, r, Binding{Source: "h", Dest: fmt.Sprintf("q%d", i), DestKind: ToQueue,
			Args: amqp.Table{"x-match": "all", "type": fmt.Sprintf("t%d", i%10), "region": "eu"}})
	}
	h := amqp.Table{"type": "t3", "region": "eu", "other": int32(1)}
	dst := make([]string, 0, 16)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst, _ = r.Route(dst[:0], "h", "", nil, h, nil)
	}
}

func BenchmarkRouteExchangeChain(b *testing.B) {
	r := NewRegistry("/")
	prev := "x0"
	mustDeclare(b, r, prev, "direct")
	for i := 1; i < 5; i++ {
		name := fmt.Sprintf("x%d", i)
		mustDeclare(b, r, name, "topic")
		mustBind(b, r, xb(prev, name, "a.b"))
		mustBind(b, r, qb(name, "q"+name, "a.*"))
		prev = name
	}
	dst := make([]string, 0, 16)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst, _ = r.Route(dst[:0], "x0", "a.b", nil, nil, nil)
	}
	if len(dst) != 4 {
		b.Fatalf("routed to %v", dst)
	}
}
