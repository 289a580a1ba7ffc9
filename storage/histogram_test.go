package storage

import "testing"

func TestHistogramBuckets(t *testing.T) {
	h := newHistogram(1, 2, 4)
	for _, v := range []float64{0.5, 1, 1.5, 3, 100} {
		h.observe(v)
	}
	s := h.snapshot()
	want := map[float64]uint64{1: 2, 2: 3, 4: 4}
	for b, n := range want {
		if s.Buckets[b] != n {
			t.Errorf("bucket <= %v: %d, want %d", b, s.Buckets[b], n)
		}
	}
	if s.Count != 5 || s.Sum != 106 {
		t.Errorf("count %d sum %v, want 5 and 106", s.Count, s.Sum)
	}
}
