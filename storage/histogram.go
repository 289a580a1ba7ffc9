package storage

import (
	"sync/atomic"
	"time"
)

// Histogram counts observations in fixed buckets with atomics, for the metrics exporter: an
// observation is two uncontended atomic adds, and a reading never stops the writer.
type Histogram struct {
	bounds []float64 // upper bounds, increasing; the last bucket is +Inf
	counts []atomic.Uint64
	sum    atomic.Uint64 // of observations, in units of 1e-9 (nanoseconds for durations)
}

func newHistogram(bounds ...float64) *Histogram {
	return &Histogram{bounds: bounds, counts: make([]atomic.Uint64, len(bounds)+1)}
}

func (h *Histogram) observe(v float64) {
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(uint64(v * 1e9))
}

// HistogramSnapshot is a reading of a Histogram: cumulative counts per upper bound, as
// Prometheus's histograms are written.
type HistogramSnapshot struct {
	Count   uint64
	Sum     float64
	Buckets map[float64]uint64 // upper bound -> observations <= it (+Inf is Count)
}

func (h *Histogram) snapshot() HistogramSnapshot {
	s := HistogramSnapshot{Buckets: make(map[float64]uint64, len(h.bounds))}
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i].Load()
		s.Buckets[b] = cum
	}
	s.Count = cum + h.counts[len(h.bounds)].Load()
	s.Sum = float64(h.sum.Load()) / 1e9
	return s
}

// commitStats are the group committer's histograms.
type commitStats struct {
	roundSeconds *Histogram // time to write and fsync one round
	roundBatches *Histogram // Commit calls merged into one round (the group-commit batch size)
}

func newCommitStats() commitStats {
	return commitStats{
		roundSeconds: newHistogram(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
		roundBatches: newHistogram(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
	}
}

func (c commitStats) observeRound(d time.Duration, batches int) {
	if c.roundSeconds == nil {
		return
	}
	c.roundSeconds.observe(d.Seconds())
	c.roundBatches.observe(float64(batches))
}
