package queue

import (
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// quiet is a logger for tests that provoke errors on purpose.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// tconsumer is the tests' Consumer: it records deliveries and cancellations. Its connection's
// room can be turned off (Reserve and HasRoom then refuse and the consumer kicks the queue when
// room comes back), and it can be closed (Deliver then refuses, as a closed channel's consumer).
type tconsumer struct {
	mu        sync.Mutex
	ds        []Delivery
	cancelled []CancelReason
	noRoom    bool
	closed    bool
	kickers   []Kicker
	reserves  int
	// onDeliver, if set, runs for each delivery (no lock held).
	onDeliver func(d Delivery)
}

func (c *tconsumer) Reserve(k Kicker) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reserves++
	if c.noRoom {
		c.kickers = append(c.kickers, k)
		return false
	}
	return true
}

func (c *tconsumer) HasRoom(k Kicker) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.noRoom {
		c.kickers = append(c.kickers, k)
		return false
	}
	return true
}

func (c *tconsumer) Deliver(_ Queue, d Delivery) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.ds = append(c.ds, d)
	f := c.onDeliver
	c.mu.Unlock()
	if f != nil {
		f(d)
	}
	return true
}

func (c *tconsumer) Cancelled(_ Queue, why CancelReason) {
	c.mu.Lock()
	c.cancelled = append(c.cancelled, why)
	c.mu.Unlock()
}

// setRoom turns the consumer's room on or off; turning it on kicks the queues that waited.
func (c *tconsumer) setRoom(room bool) {
	c.mu.Lock()
	c.noRoom = !room
	ks := c.kickers
	if room {
		c.kickers = nil
	}
	c.mu.Unlock()
	if room {
		for _, k := range ks {
			k.Kick()
		}
	}
}

func (c *tconsumer) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

func (c *tconsumer) deliveries() []Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Delivery(nil), c.ds...)
}

func (c *tconsumer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ds)
}

func (c *tconsumer) cancels() []CancelReason {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]CancelReason(nil), c.cancelled...)
}

func (c *tconsumer) bodies() []string {
	var out []string
	for _, d := range c.deliveries() {
		out = append(out, string(d.Msg.Body))
	}
	return out
}

// tags returns the tags of the recorded deliveries and forgets them.
func (c *tconsumer) take() []Tag {
	c.mu.Lock()
	defer c.mu.Unlock()
	var tags []Tag
	for _, d := range c.ds {
		if !d.Settled {
			tags = append(tags, d.Tag())
		}
	}
	c.ds = nil
	return tags
}

// thooks records what a queue hands to the core.
type thooks struct {
	mu      sync.Mutex
	dead    []Dead
	expired int
	// deadLetter, if set, replaces the recording (for tests that republish).
	deadLetter func(q Queue, dead []Dead, done func(error))
}

func (h *thooks) DeadLetter(q Queue, dead []Dead, done func(error)) {
	if h.deadLetter != nil {
		h.deadLetter(q, dead, done)
		return
	}
	h.mu.Lock()
	h.dead = append(h.dead, dead...)
	h.mu.Unlock()
	if done != nil {
		done(nil)
	}
}

func (h *thooks) Expired(Queue) {
	h.mu.Lock()
	h.expired++
	h.mu.Unlock()
}

func (h *thooks) deadLetters() []Dead {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Dead(nil), h.dead...)
}

// tdone is a Done that fails the test when it is called more than once.
type tdone struct {
	t     testing.TB
	calls atomic.Int32
	err   atomic.Pointer[error]
	ch    chan struct{}
}

func newDone(t testing.TB) *tdone { return &tdone{t: t, ch: make(chan struct{})} }

func (d *tdone) Done(err error) {
	if n := d.calls.Add(1); n > 1 {
		d.t.Errorf("Done called %d times (err %v)", n, err)
		return
	}
	d.err.Store(&err)
	close(d.ch)
}

// wait waits for the call and returns its error.
func (d *tdone) wait() error {
	d.t.Helper()
	select {
	case <-d.ch:
	case <-time.After(5 * time.Second):
		d.t.Fatal("Done not called within 5s")
	}
	return *d.err.Load()
}

// called reports whether Done has been called.
func (d *tdone) called() bool { return d.calls.Load() > 0 }

// waitFor polls cond until it holds, failing the test after 5 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true within 5s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func body(s string) *Message { return &Message{Body: []byte(s)} }
