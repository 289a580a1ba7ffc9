package stats

import (
	"math"
	"sync"
	"testing"
	"time"
)

func TestSourceAndNames(t *testing.T) {
	for _, tc := range []struct {
		k     Kind
		scope Scope
		name  string
	}{
		{Published, ScopeChannel, "published"},
		{Acknowledged, ScopeChannel, "acknowledged"},
		{DeadLetteredExpired, ScopeQueue, "dead_lettered_expired"},
		{DeadLetteredDeliveryLimit, ScopeQueue, "dead_lettered_delivery_limit"},
		{ConnectionsOpened, ScopeNode, "connections_opened"},
		{QueuesDeleted, ScopeNode, "queues_deleted"},
		{NumKinds, ScopeNode, "unknown"},
	} {
		if tc.k < NumKinds && Source(tc.k) != tc.scope {
			t.Errorf("Source(%v) = %v, want %v", tc.k, Source(tc.k), tc.scope)
		}
		if tc.k.String() != tc.name {
			t.Errorf("String(%d) = %q, want %q", tc.k, tc.k.String(), tc.name)
		}
	}
	for k := Kind(0); k < NumKinds; k++ {
		if kindNames[k] == "" {
			t.Errorf("kind %d has no name", k)
		}
	}
}

// TestTotals checks that node-wide totals sum each kind from its source scope only and survive
// releases.
func TestTotals(t *testing.T) {
	r := NewRegistry()
	ch1 := r.NewObject(ScopeChannel, Labels{Name: "c1"})
	ch2 := r.NewObject(ScopeChannel, Labels{Name: "c2"})
	q := r.NewObject(ScopeQueue, Labels{VHost: "/", Name: "q"})
	ch1.Add(Published, 3)
	ch2.Inc(Published)
	q.Add(Published, 4)          // a queue's own view: not in the node total of Published
	q.Inc(DeadLetteredRejected)  // queues are the source of dead-letter totals
	ch1.Inc(DeadLetteredExpired) // ignored in the node total: not its source
	r.Inc(ConnectionsOpened)
	if got := r.Totals(); got[Published] != 4 || got[DeadLetteredRejected] != 1 || got[DeadLetteredExpired] != 0 || got[ConnectionsOpened] != 1 {
		t.Fatalf("totals = %v", got)
	}
	r.Release(ch1)
	r.Release(ch1) // twice: no double count
	r.Release(q)
	r.Release(nil)
	if got := r.Totals(); got[Published] != 4 || got[DeadLetteredRejected] != 1 {
		t.Fatalf("totals after release = %v", got)
	}
	if n := len(r.Objects(ScopeChannel)); n != 1 {
		t.Fatalf("%d live channels, want 1", n)
	}
	if n := len(r.Objects(ScopeQueue)); n != 0 {
		t.Fatalf("%d live queues, want 0", n)
	}
}

func TestRates(t *testing.T) {
	r := NewRegistry()
	ch := r.NewObject(ScopeChannel, Labels{})
	t0 := time.Unix(1000, 0)
	r.Sample(t0)
	ch.Add(Published, 50)
	ch.Add(Acknowledged, 10)
	r.Sample(t0.Add(5 * time.Second))
	s := ch.Snapshot()
	if s.Totals[Published] != 50 || math.Abs(s.Rates[Published]-10) > 1e-9 || math.Abs(s.Rates[Acknowledged]-2) > 1e-9 {
		t.Fatalf("object snapshot = %+v", s)
	}
	g := r.Global()
	if g.Totals[Published] != 50 || math.Abs(g.Rates[Published]-10) > 1e-9 {
		t.Fatalf("global = %+v", g)
	}
	r.Sample(t0.Add(10 * time.Second)) // nothing happened: rates fall to zero
	if s := ch.Snapshot(); s.Rates[Published] != 0 {
		t.Fatalf("idle rate = %v", s.Rates[Published])
	}
}

// TestFirstSampleHasARate: an object created between samples gets a rate at the first sample
// it sees (its baseline is zero at creation).
func TestFirstSampleHasARate(t *testing.T) {
	r := NewRegistry()
	o := r.NewObject(ScopeQueue, Labels{})
	o.Add(Published, 10)
	r.Sample(time.Now().Add(time.Second))
	if got := o.Snapshot().Rates[Published]; got <= 0 {
		t.Fatalf("rate after the first sample = %v, want > 0", got)
	}
}

func TestConcurrentCounting(t *testing.T) {
	r := NewRegistry()
	ch := r.NewObject(ScopeChannel, Labels{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				ch.Inc(DeliveredAck)
			}
		}()
	}
	s := StartSampler(r, time.Millisecond)
	wg.Wait()
	s.Stop()
	s.Stop()
	if got := r.Totals()[DeliveredAck]; got != 4000 {
		t.Fatalf("total = %d, want 4000", got)
	}
}

func BenchmarkInc(b *testing.B) {
	var c Counters
	for i := 0; i < b.N; i++ {
		c.Inc(Published)
	}
}
