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

// TestGCTunerGivesSmallHeapsRoom checks the GOGC the tuner sets: a small live heap (this test
// process's) gets GOGC well above the base, enough for the floor; a live heap bigger than the floor
// gets the base; after stop the base stays, whatever the heap.
func TestGCTunerGivesSmallHeapsRoom(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	const floor = 64 << 20
	tuner := startGCTuner(50, floor)
	defer tuner.stop()

	p := waitGOGC(func(p int) bool { return p > 50 })
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	live := s[0].Value.Uint64()
	if p <= 50 || p > 1000 {
		t.Fatalf("with %d KiB live, GOGC is %d; want above the base 50 and at most 1000", live>>10, p)
	}
	if room := live * uint64(p) / 100; room < floor*9/10 && p < 1000 {
		t.Errorf("with %d KiB live, GOGC %d leaves %d KiB of room; want about the floor, %d KiB", live>>10, p, room>>10, floor>>10)
	}
	t.Logf("%d KiB live: GOGC %d", live>>10, p)

	big := make([]byte, 4*floor) // live, pointer-free, never touched: no memory is used
	if p := waitGOGC(func(p int) bool { return p == 50 }); p != 50 {
		t.Fatalf("with %d MiB live, GOGC is %d; want the base, 50", len(big)>>20, p)
	}
	runtime.KeepAlive(big)

	tuner.stop()
	big = nil
	runtime.GC()
	runtime.GC()
	if p := gogc(); p != 50 {
		t.Fatalf("after stop, with a small heap again, GOGC is %d; want the base, 50", p)
	}
}
