package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// gcTuner keeps the garbage collector from running many times a second while the live heap is
// small. With GOGC p the next collection starts once the heap has grown by p% of what the last one
// found live. A broker streaming 1 KB messages allocates about 200 MB/s (chunk and frame buffers
// that live for milliseconds) over a live heap of 10-40 MB: at p = 50 that was 25-40 collections a
// second, and the collector took a quarter of the broker's CPU. The tuner lets the heap grow by at
// least floorBytes between collections: after every collection it sets p to
// max(basePercent, floorBytes*100/live), so a small heap gets room and a large one (many
// connections or queues, where 50% is already more than the floor) keeps basePercent and costs no
// extra memory. GOGC never goes above gcMaxPercent (1000), so a nearly empty heap does not get the
// whole floor. Measured on the 2-core bench machine (warren perf stream, 1 KB, one run each): broker
// CPU per published message 5.9-7.0 µs without the tuner; 4.8-5.5 µs with a 48 MiB floor (peak
// RSS 20 MB higher), 4.2-4.5 µs with 96 MiB (75 MB higher); serve uses 64 MiB (4.3-4.8 µs, 40-50 MB).
//
// It needs no goroutine of its own and costs nothing while the broker is idle: a cleanup attached
// to a throwaway object runs once after each collection (on the runtime's cleanup goroutine) and
// attaches the next one.
type gcTuner struct {
	basePercent int
	floorBytes  uint64

	mu      sync.Mutex // held by retune and stop
	stopped bool
	percent int              // the GOGC last set
	sample  []metrics.Sample // /gc/heap/live:bytes
}

// gcMaxPercent bounds the GOGC the tuner sets: a nearly empty heap gets ten times its size.
const gcMaxPercent = 1000

// gcSentinel is the throwaway object whose collection marks the end of a cycle. It is larger than
// the runtime's tiny-object size (16 bytes), so it is not batched with other objects into one
// block that a reachable neighbour keeps alive.
type gcSentinel struct{ _ [32]byte }

// startGCTuner sets GOGC to basePercent and starts tuning.
func startGCTuner(basePercent int, floorBytes uint64) *gcTuner {
	t := &gcTuner{basePercent: basePercent, floorBytes: floorBytes, percent: basePercent, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	debug.SetGCPercent(basePercent)
	t.arm()
	return t
}

func (t *gcTuner) arm() {
	runtime.AddCleanup(new(gcSentinel), func(t *gcTuner) { t.retune() }, t)
}

// retune runs after a collection: it sets GOGC from the live heap that collection found.
func (t *gcTuner) retune() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	metrics.Read(t.sample)
	var live uint64
	if t.sample[0].Value.Kind() == metrics.KindUint64 {
		live = t.sample[0].Value.Uint64()
	}
	if p := t.percentFor(live); p != t.percent {
		debug.SetGCPercent(p)
		t.percent = p
	}
	t.arm()
}

// percentFor is the GOGC for a live heap of live bytes (0: unknown): the base, or the floor's room
// when that is more, at most gcMaxPercent.
func (t *gcTuner) percentFor(live uint64) int {
	if live == 0 {
		return t.basePercent
	}
	return max(t.basePercent, int(min(t.floorBytes*100/live, gcMaxPercent)))
}

// stop ends the tuning and leaves GOGC at basePercent.
func (t *gcTuner) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	debug.SetGCPercent(t.basePercent)
}
