package queue

// minCap is the smallest backing array a deque or heap keeps; below it they never shrink.
const minCap = 16

// deque is a double-ended queue on a ring buffer whose capacity is a power of two.
// Push and pop at either end are amortised O(1) and do not allocate once the buffer has grown;
// the buffer shrinks again when it is less than a quarter full, so a drained backlog frees its memory.
type deque[T any] struct {
	buf  []T
	head int // index of the first element in buf
	n    int // number of elements
}

// Len returns the number of elements.
func (d *deque[T]) Len() int { return d.n }

// At returns the i-th element from the front (0 <= i < Len).
func (d *deque[T]) At(i int) T { return d.buf[(d.head+i)&(len(d.buf)-1)] }

// PushBack appends v at the back.
func (d *deque[T]) PushBack(v T) {
	if d.n == len(d.buf) {
		d.resize(max(minCap, 2*len(d.buf)))
	}
	d.buf[(d.head+d.n)&(len(d.buf)-1)] = v
	d.n++
}

// PushFront inserts v at the front.
func (d *deque[T]) PushFront(v T) {
	if d.n == len(d.buf) {
		d.resize(max(minCap, 2*len(d.buf)))
	}
	d.head = (d.head - 1) & (len(d.buf) - 1)
	d.buf[d.head] = v
	d.n++
}

// insert puts v at position i (0 <= i <= Len), shifting the elements behind it back. O(Len).
func (d *deque[T]) insert(i int, v T) {
	d.PushBack(v)
	mask := len(d.buf) - 1
	for j := d.n - 1; j > i; j-- {
		d.buf[(d.head+j)&mask] = d.buf[(d.head+j-1)&mask]
	}
	d.buf[(d.head+i)&mask] = v
}

// PopFront removes and returns the front element. The deque must not be empty.
func (d *deque[T]) PopFront() T {
	var zero T
	v := d.buf[d.head]
	d.buf[d.head] = zero // drop the reference for the garbage collector
	d.head = (d.head + 1) & (len(d.buf) - 1)
	d.n--
	d.shrink()
	return v
}

// Remove deletes the i-th element from the front, shifting the ones behind it forward. O(Len).
func (d *deque[T]) Remove(i int) {
	var zero T
	mask := len(d.buf) - 1
	for ; i < d.n-1; i++ {
		d.buf[(d.head+i)&mask] = d.buf[(d.head+i+1)&mask]
	}
	d.buf[(d.head+d.n-1)&mask] = zero
	d.n--
	d.shrink()
}

// shrink halves the buffer when it is at most a quarter full.
func (d *deque[T]) shrink() {
	if len(d.buf) > minCap && d.n <= len(d.buf)/4 {
		d.resize(len(d.buf) / 2)
	}
}

// Clear removes every element and releases the buffer.
func (d *deque[T]) Clear() { *d = deque[T]{} }

// resize moves the elements to a new buffer of capacity c (a power of two >= d.n).
func (d *deque[T]) resize(c int) {
	buf := make([]T, c)
	if d.n > 0 {
		k := copy(buf, d.buf[d.head:min(d.head+d.n, len(d.buf))])
		copy(buf[k:], d.buf[:d.n-k])
	}
	d.buf, d.head = buf, 0
}

// idHeap is a binary min-heap of entries ordered by id. It holds returned messages, whose ids are
// all below the head of the FIFO (see Machine). Written by hand: container/heap boxes every element.
type idHeap []entry

// push adds e. O(log n).
func (h *idHeap) push(e entry) {
	s := append(*h, e)
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if s[p].id <= s[i].id {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
	*h = s
}

// pop removes and returns the entry with the smallest id. The heap must not be empty. O(log n).
func (h *idHeap) pop() entry {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s[last] = entry{}
	s = s[:last]
	for i := 0; ; {
		l := 2*i + 1
		if l >= last {
			break
		}
		c := l
		if r := l + 1; r < last && s[r].id < s[l].id {
			c = r
		}
		if s[i].id <= s[c].id {
			break
		}
		s[i], s[c] = s[c], s[i]
		i = c
	}
	if cap(s) > minCap && len(s) <= cap(s)/4 {
		s = append(make(idHeap, 0, cap(s)/2), s...)
	}
	*h = s
	return top
}

// set replaces the i-th element from the front (0 <= i < Len).
func (d *deque[T]) set(i int, v T) { d.buf[(d.head+i)&(len(d.buf)-1)] = v }

// search returns the smallest i in [0, Len) for which less(At(i)) is false, or Len if there is
// none. less must be true for a prefix of the deque and false after it. O(log Len).
func (d *deque[T]) search(less func(T) bool) int {
	lo, hi := 0, d.n
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if less(d.At(mid)) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// heapify restores the heap property of h after arbitrary changes to its elements. O(n).
func (h idHeap) heapify() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		for j := i; ; {
			l := 2*j + 1
			if l >= len(h) {
				break
			}
			c := l
			if r := l + 1; r < len(h) && h[r].id < h[l].id {
				c = r
			}
			if h[j].id <= h[c].id {
				break
			}
			h[j], h[c] = h[c], h[j]
			j = c
		}
	}
}

// deadlineItem is an entry of the expiry heap: a message id and its deadline.
type deadlineItem struct {
	deadline int64
	id       uint64
}

func (a deadlineItem) less(b deadlineItem) bool {
	return a.deadline < b.deadline || (a.deadline == b.deadline && a.id < b.id)
}

// deadlineHeap is a binary min-heap of deadlines, earliest first, ties by id.
type deadlineHeap []deadlineItem

// push adds it. O(log n).
func (h *deadlineHeap) push(it deadlineItem) {
	s := append(*h, it)
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
	*h = s
}

// pop removes and returns the earliest item. The heap must not be empty. O(log n).
func (h *deadlineHeap) pop() deadlineItem {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	s.down(0)
	if cap(s) > minCap && len(s) <= cap(s)/4 {
		s = append(make(deadlineHeap, 0, cap(s)/2), s...)
	}
	*h = s
	return top
}

// down moves the item at i down to its place.
func (h deadlineHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		c := l
		if r := l + 1; r < len(h) && h[r].less(h[l]) {
			c = r
		}
		if !h[c].less(h[i]) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// heapify restores the heap property after arbitrary changes. O(n).
func (h deadlineHeap) heapify() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

// truncate keeps the first n elements (0 <= n <= Len).
func (d *deque[T]) truncate(n int) {
	var zero T
	for i := n; i < d.n; i++ {
		d.buf[(d.head+i)&(len(d.buf)-1)] = zero
	}
	d.n = n
	for len(d.buf) > minCap && d.n <= len(d.buf)/4 {
		d.resize(len(d.buf) / 2)
	}
}
