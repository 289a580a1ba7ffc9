package perf

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// A seqSet is a growable bitmap of sequence numbers that many goroutines may add to at once
// without a lock on the hot path: the chunk directory is copied on growth and published through
// an atomic pointer, and bits are set with atomic OR, whose old value says whether the number
// was already present.
type seqSet struct {
	mu  sync.Mutex // serialises growth of the directory
	dir atomic.Pointer[[]*seqChunk]
}

const (
	chunkShift = 16                    // sequence numbers per chunk: 65,536
	chunkWords = 1 << (chunkShift - 6) // uint64 words per chunk
	chunkMask  = uint64(1)<<chunkShift - 1
)

type seqChunk [chunkWords]uint64

// chunk returns the chunk holding sequence numbers [i<<chunkShift, (i+1)<<chunkShift),
// allocating it (and growing the directory) if needed.
func (s *seqSet) chunk(i uint64) *seqChunk {
	if d := s.dir.Load(); d != nil && i < uint64(len(*d)) && (*d)[i] != nil {
		return (*d)[i]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var old []*seqChunk
	if d := s.dir.Load(); d != nil {
		old = *d
	}
	if i < uint64(len(old)) && old[i] != nil {
		return old[i]
	}
	n := len(old)
	if i >= uint64(n) {
		n = int(i) + 1
		if n < 2*len(old) {
			n = 2 * len(old)
		}
	}
	grown := make([]*seqChunk, n)
	copy(grown, old)
	grown[i] = new(seqChunk)
	s.dir.Store(&grown)
	return grown[i]
}

// add puts seq in the set and reports whether it was absent before.
func (s *seqSet) add(seq uint64) bool {
	c := s.chunk(seq >> chunkShift)
	bit := uint64(1) << (seq & 63)
	old := atomic.OrUint64(&c[(seq&chunkMask)>>6], bit)
	return old&bit == 0
}

// has reports whether seq is in the set.
func (s *seqSet) has(seq uint64) bool {
	d := s.dir.Load()
	i := seq >> chunkShift
	if d == nil || i >= uint64(len(*d)) || (*d)[i] == nil {
		return false
	}
	return atomic.LoadUint64(&(*d)[i][(seq&chunkMask)>>6])&(uint64(1)<<(seq&63)) != 0
}

// count returns the number of sequence numbers in the set.
func (s *seqSet) count() uint64 {
	var n uint64
	s.each(func(_ int, w uint64, _ uint64) { n += uint64(bits.OnesCount64(w)) })
	return n
}

// missingFrom returns how many members of want are not in s.
func (s *seqSet) missingFrom(want *seqSet) uint64 {
	var n uint64
	want.each(func(ci int, w uint64, wi uint64) {
		var have uint64
		if d := s.dir.Load(); d != nil && ci < len(*d) && (*d)[ci] != nil {
			have = atomic.LoadUint64(&(*d)[ci][wi])
		}
		n += uint64(bits.OnesCount64(w &^ have))
	})
	return n
}

// each calls f with every non-zero word of the set, its chunk index and word index.
func (s *seqSet) each(f func(chunk int, word uint64, wordIndex uint64)) {
	d := s.dir.Load()
	if d == nil {
		return
	}
	for ci, c := range *d {
		if c == nil {
			continue
		}
		for wi := range c {
			if w := atomic.LoadUint64(&c[wi]); w != 0 {
				f(ci, w, uint64(wi))
			}
		}
	}
}
