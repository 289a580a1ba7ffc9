package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

// gogc reads the GOGC setting in force.
func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// waitGOGC collects until want(GOGC) holds (the tuner runs after a collection, on the runtime's
// cleanup goroutine) or 5 s have passed, and returns the last setting seen.
func waitGOGC(want func(int) bool) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		if p := gogc(); want(p) || time.Now().After(deadline) {
			return p
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGCTunerGivesSmallHeapsRoom checks the GOGC the tuner sets: with a small live heap (16 MiB
// and the test process's own) GOGC leaves the floor as room, far above the base; with a live heap
// of four times the floor it is the base; after stop the base stays, whatever the heap. Without the
// tuner GOGC stays at the base and the first check fails.
func TestGCTunerGivesSmallHeapsRoom(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	const floor = 64 << 20
	tuner := startGCTuner(50, floor)
	defer tuner.stop()

	liveNow := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	// With 16 MiB live (pointer-free and never touched: no memory is used), and whatever else the
	// test process holds, the room GOGC leaves is the floor.
	small := make([]byte, floor/4)
	roomOK := func(p int) bool {
		room := liveNow() * uint64(p) / 100
		return p > 50 && room >= floor*95/100 && room <= floor*105/100
	}
	if p := waitGOGC(roomOK); !roomOK(p) {
		t.Fatalf("with %d KiB live, GOGC is %d: %d KiB of room; want the floor, %d KiB",
			liveNow()>>10, p, liveNow()*uint64(p)/100>>10, floor>>10)
	}
	runtime.KeepAlive(small)

	// With four times the floor live, half of it is more than the floor: the base.
	big := make([]byte, 4*floor)
	if p := waitGOGC(func(p int) bool { return p == 50 }); p != 50 {
		t.Fatalf("with %d MiB live, GOGC is %d; want the base, 50", len(big)>>20, p)
	}
	runtime.KeepAlive(big)

	tuner.stop()
	runtime.GC()
	runtime.GC()
	if p := gogc(); p != 50 {
		t.Fatalf("after stop, with a small heap again, GOGC is %d; want the base, 50", p)
	}
}

// TestGCTunerPercent checks the GOGC chosen for live heaps of every size: the cap for a nearly
// empty heap, the floor's room for a small one, the base once half the heap is more than the floor.
func TestGCTunerPercent(t *testing.T) {
	tuner := &gcTuner{basePercent: 50, floorBytes: 64 << 20}
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 50},         // unknown
		{1 << 20, 1000}, // the floor would be 6,400%: capped
		{16 << 20, 400}, // 64 MiB of room
		{100 << 20, 64}, // 64 MiB of room
		{128 << 20, 50}, // half the heap is the floor
		{1 << 30, 50},   // half the heap is more
	} {
		if got := tuner.percentFor(c.live); got != c.want {
			t.Errorf("live %d MiB: GOGC %d, want %d", c.live>>20, got, c.want)
		}
	}
}
