package idlemem

import (
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// heapObjects is the bytes of live and dead objects on the heap now.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: mObjs}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// sink keeps the burst's allocations reachable until the burst ends.
func sink(b [][]byte) int { return len(b) }

// A burst of work leaves garbage that the collector, with a large live heap, would keep for a
// long time; once the process is quiet the Releaser collects it.
func TestQuietProcessReturnsGarbage(t *testing.T) {
	old := debug.SetGCPercent(400) // the collector alone would wait for +400%
	defer debug.SetGCPercent(old)
	live := make([]byte, 64<<20) // a large live heap, as badger's arenas are
	runtime.GC()
	before := heapObjects()
	burst := make([][]byte, 0, 4096)
	for range 4096 {
		burst = append(burst, make([]byte, 8<<10)) // 32 MB, then dropped
	}
	sink(burst)
	burst = nil
	if got := heapObjects(); got < before+16<<20 {
		t.Skipf("the runtime collected the burst on its own (%d -> %d bytes): nothing to observe", before, got)
	}
	r := Start(slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer r.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for heapObjects() > before+8<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("garbage not collected within 10 s of going quiet: heap objects %d bytes, %d before the burst",
				heapObjects(), before)
		}
		time.Sleep(50 * time.Millisecond)
	}
	runtime.KeepAlive(live)
}

// Under a high allocation rate the collector runs soon anyway and a forced collection is not due;
// too little garbage is not worth one either.
func TestWorthCollecting(t *testing.T) {
	const mb = 1 << 20
	for _, c := range []struct {
		live, objs, goal uint64
		rate             float64
		want             bool
	}{
		{live: 30 * mb, objs: 40 * mb, goal: 45 * mb, rate: 10 * 1024, want: true}, // quiet, 10 MB garbage
		{live: 30 * mb, objs: 40 * mb, goal: 45 * mb, rate: 1 * mb, want: false},   // busy: GC in 5 s
		{live: 30 * mb, objs: 32 * mb, goal: 45 * mb, rate: 0, want: false},        // 2 MB garbage
		{live: 30 * mb, objs: 46 * mb, goal: 45 * mb, rate: 0, want: false},        // collector due now
		{live: 30 * mb, objs: 30 * mb, goal: 45 * mb, rate: 0, want: false},        // no garbage
	} {
		if got := worthCollecting(c.live, c.objs, c.goal, c.rate); got != c.want {
			t.Errorf("worthCollecting(live %d, objs %d, goal %d, rate %.0f) = %v, want %v",
				c.live/mb, c.objs/mb, c.goal/mb, c.rate, got, c.want)
		}
	}
}
