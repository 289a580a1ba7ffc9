package policy

import (
	"fmt"
	"slices"
	"testing"
)

// benchSet has n policies in vhost "v" with distinct literal-prefix patterns and priorities,
// plus a catch-all at the lowest priority, and one operator policy.
func benchSet(b *testing.B, n int) *Set {
	s := NewSet()
	for i := range n {
		s = s.With(mustParse(b, ComponentPolicy, "v", fmt.Sprintf("p%04d", i),
			fmt.Sprintf(`{"pattern":"^svc%d\\.","apply-to":"queues","priority":%d,"definition":{"max-length":%d}}`, i, i+1, i+1)))
	}
	s = s.With(mustParse(b, ComponentPolicy, "v", "all", `{"pattern":"^(?!amq\\.).*","priority":0,"definition":{"message-ttl":60000}}`))
	s = s.With(mustParse(b, ComponentOperatorPolicy, "v", "cap", `{"pattern":".*","definition":{"max-length":100000}}`))
	return s
}

// BenchmarkMatchDeclare is the cost of finding a new queue's policy and operator policy among
// n policies: one walk of the vhost's list in priority order.
func BenchmarkMatchDeclare(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		s := benchSet(b, n)
		names := []string{fmt.Sprintf("svc%d.orders", n/2), "unmatched.queue"}
		for _, name := range names {
			b.Run(fmt.Sprintf("policies=%d/%s", n, name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if m := s.Match("v", name, ClassicQueue); m.OperatorPolicy == nil {
						b.Fatal("no operator policy")
					}
				}
			})
		}
	}
}

// BenchmarkReapply10k is the cost of applying one policy change to a vhost of 10,000 queues
// (100 policies): one pass, one compiled-pattern test per queue, a full match only for the
// queues the changed policy matches (1,000 of them here) or held.
func BenchmarkReapply10k(b *testing.B) {
	s := benchSet(b, 100)
	objs := make([]Object, 10000)
	for i := range objs {
		name := fmt.Sprintf("svc%d.q%d", i%100, i)
		if i%10 == 0 {
			name = fmt.Sprintf("hot.q%d", i)
		}
		objs[i] = Object{Name: name, Type: ClassicQueue, Current: s.Match("v", name, ClassicQueue)}
	}
	hot := mustParse(b, ComponentPolicy, "v", "hot", `{"pattern":"^hot\\.","priority":500,"definition":{"max-length":7}}`)
	s = s.With(hot)
	b.ReportAllocs()
	for b.Loop() {
		updates := 0
		s.Reapply("v", ComponentPolicy, "hot", slices.Values(objs), func(Object, Match) { updates++ })
		if updates != 1000 {
			b.Fatalf("%d updates, want 1000", updates)
		}
	}
}

// BenchmarkCompile is the cost of validating and compiling one policy.
func BenchmarkCompile(b *testing.B) {
	p, err := ParseBody("v", "p", []byte(`{"pattern":"^orders\\.","apply-to":"queues","priority":3,"definition":{"max-length":1000,"message-ttl":60000,"dead-letter-exchange":"dlx","overflow":"reject-publish"}}`))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(ComponentPolicy, p); err != nil {
			b.Fatal(err)
		}
	}
}
