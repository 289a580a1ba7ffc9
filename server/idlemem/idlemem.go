// Package idlemem returns a quiet process's garbage to the operating system.
//
// Go collects garbage when the heap has grown by GOGC percent over what was live after the last
// collection. A broker's live heap is dominated by storage buffers that never shrink (badger's
// memtable arena alone is about 21 MB), so after a burst of work (declaring a few hundred queues,
// a backlog drained) up to that much garbage stays resident, and an idle broker allocates so
// little that the next collection comes minutes later. RabbitMQ hibernates idle queue processes
// for the same reason: an idle broker should hold what it uses, not what it once used.
//
// A Releaser samples the runtime's heap statistics every Interval. When at least minGarbage is
// garbage and the allocation rate is so low that the
// collector would not run within idleHorizon, it collects and returns free memory at once
// (debug.FreeOSMemory). The collection also shrinks goroutine stacks that grew during the burst.
// Under load the collector runs on its own far more often than that, so the Releaser never
// acts: its cost there is one read of runtime/metrics per Interval.
package idlemem

import (
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

const (
	// Interval is how often the heap is sampled.
	Interval = time.Second
	// minGarbage is the least garbage worth a forced collection.
	minGarbage = 4 << 20
	// idleHorizon: a collection the allocation rate would trigger later than this is brought
	// forward.
	idleHorizon = 30 * time.Second
)

const (
	mAllocs = "/gc/heap/allocs:bytes"              // cumulative bytes allocated
	mLive   = "/gc/heap/live:bytes"                // live heap after the last collection
	mObjs   = "/memory/classes/heap/objects:bytes" // live and dead objects now
	mGoal   = "/gc/heap/goal:bytes"                // heap size that triggers the next collection
	mGCs    = "/gc/cycles/total:gc-cycles"         // collections so far
)

// Releaser is one process's idle-memory watcher; Start runs it, Stop ends it.
type Releaser struct {
	log     *slog.Logger
	samples []metrics.Sample
	last    uint64 // allocs at the previous sample
	quit    chan struct{}
	done    chan struct{}
}

// Start runs a Releaser until Stop. One per process: the heap is the process's.
func Start(log *slog.Logger) *Releaser {
	if log == nil {
		log = slog.Default()
	}
	r := &Releaser{log: log, quit: make(chan struct{}), done: make(chan struct{})}
	for _, name := range []string{mAllocs, mLive, mObjs, mGoal, mGCs} {
		r.samples = append(r.samples, metrics.Sample{Name: name})
	}
	r.read()
	r.last = r.samples[0].Value.Uint64()
	go r.run()
	return r
}

// Stop ends the Releaser and waits for its goroutine.
func (r *Releaser) Stop() {
	close(r.quit)
	<-r.done
}

func (r *Releaser) run() {
	defer close(r.done)
	t := time.NewTicker(Interval)
	defer t.Stop()
	for {
		select {
		case <-r.quit:
			return
		case <-t.C:
			r.step()
		}
	}
}

func (r *Releaser) read() { metrics.Read(r.samples) }

// value returns sample i, 0 if this runtime does not report it.
func (r *Releaser) value(i int) uint64 {
	if r.samples[i].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return r.samples[i].Value.Uint64()
}

// step samples the heap and collects if the process has gone quiet with garbage left behind.
func (r *Releaser) step() {
	r.read()
	allocs, live, objs, goal := r.value(0), r.value(1), r.value(2), r.value(3)
	rate := float64(allocs-r.last) / Interval.Seconds() // bytes per second over the last interval
	r.last = allocs
	if !worthCollecting(live, objs, goal, rate) {
		return
	}
	gcs := r.value(4)
	start := time.Now()
	debug.FreeOSMemory()
	r.read()
	r.last = r.value(0)
	r.log.Debug("idle: garbage collected and returned to the OS", "garbage", objs-live,
		"live", r.value(1), "took", time.Since(start), "gc_before", gcs)
}

// worthCollecting decides from the heap statistics whether a forced collection is due: enough
// garbage (objs-live), and at the current allocation rate (bytes/s) the collector's own trigger
// (goal) would not be reached within idleHorizon.
func worthCollecting(live, objs, goal uint64, rate float64) bool {
	if objs <= live {
		return false
	}
	garbage := objs - live
	if garbage < minGarbage {
		return false
	}
	if goal <= objs {
		return false // the collector is about to run anyway
	}
	return float64(goal-objs) > rate*idleHorizon.Seconds()
}
