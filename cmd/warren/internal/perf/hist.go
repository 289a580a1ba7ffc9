package perf

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// The latency histogram is log-linear: values below histSub nanoseconds have a bucket each;
// above, every power of two is split into histSub equal buckets, so a bucket is never wider
// than 1/histSub (1.6%) of the values it holds. Values are clamped at 2^histMaxBits ns
// (about 13 days). Counts are atomic so a progress reporter can read them while the owning
// consumer writes; the other fields belong to the writer alone.
const (
	histSubBits = 6
	histSub     = 1 << histSubBits
	histMaxBits = 50
	histBuckets = (histMaxBits-histSubBits)*histSub + histSub // last: 2^histMaxBits-1
)

type histogram struct {
	counts [histBuckets]atomic.Uint64
	n      uint64 // samples recorded (writer only)
	sum    uint64 // sum of samples in ns (writer only)
	max    uint64 // largest sample in ns (writer only)
}

// histBucket maps a value in nanoseconds to its bucket.
func histBucket(v uint64) int {
	if v >= 1<<histMaxBits {
		v = 1<<histMaxBits - 1
	}
	if v < 2*histSub {
		return int(v)
	}
	e := bits.Len64(v) - histSubBits - 1 // v>>e is in [histSub, 2*histSub)
	return e*histSub + int(v>>e)
}

// histBounds returns the smallest value of bucket b and the bucket's width.
func histBounds(b int) (low, width uint64) {
	if b < 2*histSub {
		return uint64(b), 1
	}
	e := b/histSub - 1
	m := uint64(b%histSub + histSub)
	return m << e, 1 << e
}

// record adds one sample.
func (h *histogram) record(d time.Duration) {
	v := uint64(0)
	if d > 0 {
		v = uint64(d)
	}
	h.counts[histBucket(v)].Add(1)
	h.n++
	h.sum += v
	if v > h.max {
		h.max = v
	}
}

// histSnapshot is a plain copy of bucket counts, used to merge histograms and to compute
// percentiles over an interval (the difference of two snapshots).
type histSnapshot struct {
	counts [histBuckets]uint64
	n      uint64
	sum    uint64
	max    uint64 // 0 when unknown (interval snapshots); percentiles then use bucket values only
}

// addCounts adds h's current bucket counts to s (safe while h is being written).
func (s *histSnapshot) addCounts(h *histogram) {
	for i := range h.counts {
		c := h.counts[i].Load()
		s.counts[i] += c
		s.n += c
	}
}

// addFinal adds h completely, including its writer-owned totals; call only once h's writer
// has stopped.
func (s *histSnapshot) addFinal(h *histogram) {
	s.addCounts(h)
	s.sum += h.sum
	if h.max > s.max {
		s.max = h.max
	}
}

// sub returns s minus prev, bucket by bucket (for per-interval percentiles).
func (s *histSnapshot) sub(prev *histSnapshot) *histSnapshot {
	d := &histSnapshot{}
	for i := range s.counts {
		d.counts[i] = s.counts[i] - prev.counts[i]
		d.n += d.counts[i]
	}
	return d
}

// quantile returns the value at quantile q (0 < q <= 1): the middle of the bucket holding the
// sample of rank ceil(q*n), never above the recorded maximum when that is known.
func (s *histSnapshot) quantile(q float64) time.Duration {
	if s.n == 0 {
		return 0
	}
	rank := uint64(q*float64(s.n) + 0.999999999)
	if rank < 1 {
		rank = 1
	}
	if rank > s.n {
		rank = s.n
	}
	var seen uint64
	for b, c := range s.counts {
		seen += c
		if seen >= rank {
			low, w := histBounds(b)
			v := low + w/2
			if s.max != 0 && v > s.max {
				v = s.max
			}
			return time.Duration(v)
		}
	}
	return time.Duration(s.max)
}

// mean returns the average sample (only meaningful for snapshots built with addFinal).
func (s *histSnapshot) mean() time.Duration {
	if s.n == 0 {
		return 0
	}
	return time.Duration(s.sum / s.n)
}

// stats summarises the snapshot in microseconds.
func (s *histSnapshot) stats() LatencyStats {
	return LatencyStats{
		Samples: s.n, Mean: us(s.mean()),
		P50: us(s.quantile(0.50)), P75: us(s.quantile(0.75)), P95: us(s.quantile(0.95)),
		P99: us(s.quantile(0.99)), Max: us(time.Duration(s.max)),
	}
}
