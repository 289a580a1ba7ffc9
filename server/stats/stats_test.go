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

// TestSampleVisitsOnlyWhatCounted: the sampler visits the objects that counted since the last
// sample and no other; an object it skips reads zero rates, and a count made after a visit is
// seen by the next sample.
func TestSampleVisitsOnlyWhatCounted(t *testing.T) {
	r := NewRegistry()
	busy := r.NewObject(ScopeQueue, Labels{Name: "busy"})
	idle := r.NewObject(ScopeQueue, Labels{Name: "idle"})
	t0 := time.Unix(1000, 0)
	r.Sample(t0)
	busy.Add(Published, 20)
	r.Sample(t0.Add(2 * time.Second))
	if busy.tick != 2 || idle.tick != 0 {
		t.Fatalf("after a sample: busy visited at %d, idle at %d; want 2 and never", busy.tick, idle.tick)
	}
	if got := busy.Snapshot().Rates[Published]; got != 10 {
		t.Fatalf("busy rate = %v, want 10", got)
	}
	if r.dirty.Load() != nil {
		t.Fatal("dirty stack not empty after a sample")
	}
	r.Sample(t0.Add(4 * time.Second))
	if busy.tick != 2 {
		t.Fatalf("busy visited again at %d without counting", busy.tick)
	}
	if s := busy.Snapshot(); s.Rates[Published] != 0 || s.Totals[Published] != 20 {
		t.Fatalf("busy after an idle interval = %+v, want rate 0 and total 20", s)
	}
	busy.Inc(Published)
	busy.Inc(Acknowledged) // one push per interval, whatever the counts
	r.Sample(t0.Add(6 * time.Second))
	if got := busy.Snapshot().Rates; got[Published] != 0.5 || got[Acknowledged] != 0.5 {
		t.Fatalf("busy rates = %v, want 0.5 published and acked", got)
	}
}

// TestCountsRaceSamples: objects counted from several goroutines while the sampler runs: the
// node totals are exact and, after the counting stops, one more sample has seen every count
// of every object (none was counted while its object was off the dirty stack and missed).
func TestCountsRaceSamples(t *testing.T) {
	r := NewRegistry()
	objs := make([]*Object, 16)
	for i := range objs {
		objs[i] = r.NewObject(ScopeChannel, Labels{Channel: uint16(i)})
	}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		now := time.Unix(1000, 0)
		for {
			select {
			case <-stop:
				return
			default:
				now = now.Add(time.Second)
				r.Sample(now)
			}
		}
	}()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 20000; j++ {
				objs[(j*7+g)%len(objs)].Inc(Published)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	r.Sample(time.Unix(1e9, 0))
	if got := r.Totals()[Published]; got != 80000 {
		t.Fatalf("total = %d, want 80000", got)
	}
	for i, o := range objs {
		if o.last != o.Values() {
			t.Fatalf("object %d: last sampled %d, counted %d", i, o.last[Published], o.Load(Published))
		}
	}
}

// TestObjectOutsideARegistry: an Object made without a registry counts for itself.
func TestObjectOutsideARegistry(t *testing.T) {
	var o Object
	o.Add(Published, 2)
	if s := o.Snapshot(); s.Totals[Published] != 2 || s.Rates[Published] != 0 {
		t.Fatalf("snapshot = %+v", s)
	}
}

// BenchmarkInc is the hot path's cost of one count: the object's counter and a node-wide shard.
func BenchmarkInc(b *testing.B) {
	r := NewRegistry()
	o := r.NewObject(ScopeChannel, Labels{})
	for i := 0; i < b.N; i++ {
		o.Inc(Published)
	}
}

// BenchmarkIncParallel counts on one object per goroutine, as channels do.
func BenchmarkIncParallel(b *testing.B) {
	r := NewRegistry()
	b.RunParallel(func(pb *testing.PB) {
		o := r.NewObject(ScopeChannel, Labels{})
		for pb.Next() {
			o.Inc(Published)
		}
	})
}

// BenchmarkIdle10k is the sampler's and the totals' cost with 10,000 objects of which none
// (idle) or 100 (busy) counted in the interval.
func BenchmarkIdle10k(b *testing.B) {
	r := NewRegistry()
	objs := make([]*Object, 10000)
	for i := range objs {
		objs[i] = r.NewObject(ScopeQueue, Labels{})
	}
	now := time.Now()
	b.Run("sample-idle", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			now = now.Add(time.Second)
			r.Sample(now)
		}
	})
	b.Run("sample-100-busy", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			for _, o := range objs[:100] {
				o.Inc(Published)
			}
			now = now.Add(time.Second)
			r.Sample(now)
		}
	})
	b.Run("totals", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			_ = r.Totals()
		}
	})
}
