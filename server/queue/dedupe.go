package queue

// dedupeWindow is how many recent sequence numbers per producer or source a State remembers.
const dedupeWindow = 1 << 14

// seqWindow remembers which of a producer's (or a dead-letter source's) recent sequence numbers
// were applied: a bit per sequence number in (max-dedupeWindow, max].
type seqWindow struct {
	max  uint64
	bits []uint64 // allocated on first use
	// last is the State's command counter when the window was last used, to evict the least
	// recently used window deterministically when there are too many.
	last uint64
}

// seen records seq and reports whether it had been recorded before. A seq too far below the
// newest to tell is reported as seen when oldSeen is set (a producer's retry is never that late,
// so it must be a duplicate) and as new otherwise (a dead letter handed over late must not be lost).
func (w *seqWindow) seen(seq uint64, oldSeen bool) bool {
	if w.bits == nil {
		w.bits = make([]uint64, dedupeWindow/64)
	}
	if seq+dedupeWindow <= w.max {
		return oldSeen
	}
	if seq > w.max && seq-w.max >= dedupeWindow {
		clear(w.bits)
		w.max = seq - 1
	}
	for w.max < seq {
		w.max++
		i := w.max % dedupeWindow
		w.bits[i/64] &^= 1 << (i % 64)
	}
	i := seq % dedupeWindow
	if w.bits[i/64]&(1<<(i%64)) != 0 {
		return true
	}
	w.bits[i/64] |= 1 << (i % 64)
	return false
}
