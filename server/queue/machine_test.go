package queue

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// got is a delivery reduced to what most tests compare: who got which message.
type got struct {
	c  ConsumerID
	id uint64
}

func gots(ds []Delivery) []got {
	out := make([]got, len(ds))
	for i, d := range ds {
		out[i] = got{d.Consumer, d.ID}
	}
	return out
}

func ids(ds []Delivery) []uint64 {
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

// enqueueN adds n messages whose bodies are "m<id>".
func enqueueN(t *testing.T, m *driver, n int) {
	t.Helper()
	for range n {
		want := m.nextID
		if id := m.Enqueue(&Message{Body: fmt.Appendf(nil, "m%d", want)}); id != want {
			t.Fatalf("Enqueue returned id %d, want %d", id, want)
		}
	}
}

func TestEnqueueIDsAndFIFOOrder(t *testing.T) {
	m := newDriver(DefaultConfig())
	msgs := make([]*Message, 5)
	for i := range msgs {
		msgs[i] = &Message{Body: []byte{byte(i)}}
		if id := m.Enqueue(msgs[i]); id != uint64(i+1) {
			t.Fatalf("Enqueue #%d returned id %d, want %d", i+1, id, i+1)
		}
	}
	if m.Ready() != 5 || m.Unacked() != 0 || m.Len() != 5 || m.ReadyBytes() != 5 {
		t.Fatalf("counts: ready %d unacked %d len %d bytes %d", m.Ready(), m.Unacked(), m.Len(), m.ReadyBytes())
	}
	for i, msg := range msgs {
		d, ok := m.Get(true)
		if !ok || d.ID != uint64(i+1) || d.Msg != msg || d.Consumer != 0 || d.Redelivered || d.DeliveryCount != 0 {
			t.Fatalf("Get #%d = %+v, %v", i+1, d, ok)
		}
	}
	if _, ok := m.Get(true); ok {
		t.Fatal("Get on empty queue returned a message")
	}
}

func TestCheckout(t *testing.T) {
	tests := []struct {
		name      string
		consumers []ConsumerSpec
		enqueue   int
		max       int
		refuse    []ConsumerID // reserve returns false for these
		want      []got
		unacked   int
	}{
		{
			name:      "fifo to one consumer",
			consumers: []ConsumerSpec{{ID: 1}},
			enqueue:   3,
			want:      []got{{1, 1}, {1, 2}, {1, 3}},
			unacked:   3,
		},
		{
			name:      "prefetch limits",
			consumers: []ConsumerSpec{{ID: 1, Prefetch: 2}},
			enqueue:   5,
			want:      []got{{1, 1}, {1, 2}},
			unacked:   2,
		},
		{
			name:      "round robin",
			consumers: []ConsumerSpec{{ID: 1}, {ID: 2}},
			enqueue:   5,
			want:      []got{{1, 1}, {2, 2}, {1, 3}, {2, 4}, {1, 5}},
			unacked:   5,
		},
		{
			name:      "round robin with unequal prefetch",
			consumers: []ConsumerSpec{{ID: 1, Prefetch: 1}, {ID: 2, Prefetch: 3}, {ID: 3, Prefetch: 2}},
			enqueue:   7,
			want:      []got{{1, 1}, {2, 2}, {3, 3}, {2, 4}, {3, 5}, {2, 6}},
			unacked:   6,
		},
		{
			name:      "higher priority first, lower when it is full",
			consumers: []ConsumerSpec{{ID: 1, Priority: 0}, {ID: 2, Priority: 5, Prefetch: 2}},
			enqueue:   4,
			want:      []got{{2, 1}, {2, 2}, {1, 3}, {1, 4}},
			unacked:   4,
		},
		{
			name:      "negative priority last",
			consumers: []ConsumerSpec{{ID: 1, Priority: -1}, {ID: 2, Prefetch: 1}, {ID: 3, Priority: 3, Prefetch: 1}},
			enqueue:   4,
			want:      []got{{3, 1}, {2, 2}, {1, 3}, {1, 4}},
			unacked:   4,
		},
		{
			name:      "round robin within the top group",
			consumers: []ConsumerSpec{{ID: 1}, {ID: 2, Priority: 1, Prefetch: 2}, {ID: 3, Priority: 1, Prefetch: 2}},
			enqueue:   6,
			want:      []got{{2, 1}, {3, 2}, {2, 3}, {3, 4}, {1, 5}, {1, 6}},
			unacked:   6,
		},
		{
			name:      "max",
			consumers: []ConsumerSpec{{ID: 1}},
			enqueue:   5,
			max:       3,
			want:      []got{{1, 1}, {1, 2}, {1, 3}},
			unacked:   3,
		},
		{
			name:      "reserve false skips the consumer",
			consumers: []ConsumerSpec{{ID: 1}, {ID: 2}},
			enqueue:   3,
			refuse:    []ConsumerID{1},
			want:      []got{{2, 1}, {2, 2}, {2, 3}},
			unacked:   3,
		},
		{
			name:      "reserve false on the high group falls through",
			consumers: []ConsumerSpec{{ID: 1}, {ID: 2, Priority: 9}},
			enqueue:   2,
			refuse:    []ConsumerID{2},
			want:      []got{{1, 1}, {1, 2}},
			unacked:   2,
		},
		{
			name:      "reserve false for everyone",
			consumers: []ConsumerSpec{{ID: 1}, {ID: 2}},
			enqueue:   2,
			refuse:    []ConsumerID{1, 2},
			unacked:   0,
		},
		{
			name:      "noack ignores prefetch and leaves nothing unacked",
			consumers: []ConsumerSpec{{ID: 1, Prefetch: 1, NoAck: true}},
			enqueue:   3,
			want:      []got{{1, 1}, {1, 2}, {1, 3}},
			unacked:   0,
		},
		{
			name:    "no consumers",
			enqueue: 2,
		},
		{
			name:      "no messages",
			consumers: []ConsumerSpec{{ID: 1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newDriver(DefaultConfig())
			for _, c := range tt.consumers {
				m.AddConsumer(c)
			}
			enqueueN(t, m, tt.enqueue)
			calls := map[ConsumerID]int{}
			reserve := func(id ConsumerID) bool {
				calls[id]++
				return !slices.Contains(tt.refuse, id)
			}
			ds := m.Checkout(nil, tt.max, reserve)
			if g := gots(ds); !slices.Equal(g, tt.want) {
				t.Fatalf("deliveries %v, want %v", g, tt.want)
			}
			for _, id := range tt.refuse {
				if calls[id] > 1 {
					t.Errorf("reserve(%d) called %d times after refusing", id, calls[id])
				}
			}
			if m.Unacked() != tt.unacked {
				t.Errorf("Unacked() = %d, want %d", m.Unacked(), tt.unacked)
			}
			noack := 0
			if len(tt.consumers) == 1 && tt.consumers[0].NoAck {
				noack = len(ds)
			}
			if want := tt.enqueue - tt.unacked - noack; m.Ready() != want {
				t.Errorf("Ready() = %d, want %d", m.Ready(), want)
			}
		})
	}
}

func TestCheckoutAppendsToDst(t *testing.T) {
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 7})
	enqueueN(t, m, 2)
	dst := []Delivery{{ID: 99}}
	dst = m.Checkout(dst, 0, nil)
	if want := []uint64{99, 1, 2}; !slices.Equal(ids(dst), want) {
		t.Fatalf("ids %v, want %v", ids(dst), want)
	}
}

func TestRoundRobinAcrossCalls(t *testing.T) {
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 1})
	m.AddConsumer(ConsumerSpec{ID: 2})
	m.AddConsumer(ConsumerSpec{ID: 3})
	var order []ConsumerID
	for range 7 {
		enqueueN(t, m, 1)
		ds := m.Checkout(nil, 0, nil)
		if len(ds) != 1 {
			t.Fatalf("got %d deliveries, want 1", len(ds))
		}
		order = append(order, ds[0].Consumer)
	}
	if want := []ConsumerID{1, 2, 3, 1, 2, 3, 1}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
}

func TestRefusedConsumerKeepsItsTurn(t *testing.T) {
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 1})
	m.AddConsumer(ConsumerSpec{ID: 2})
	m.AddConsumer(ConsumerSpec{ID: 3})
	enqueueN(t, m, 4)
	ds := m.Checkout(nil, 1, func(id ConsumerID) bool { return id != 1 })
	if want := []got{{2, 1}}; !slices.Equal(gots(ds), want) {
		t.Fatalf("first call %v, want %v", gots(ds), want)
	}
	ds = m.Checkout(nil, 0, nil)
	if want := []got{{1, 2}, {3, 3}, {2, 4}}; !slices.Equal(gots(ds), want) {
		t.Fatalf("second call %v, want %v", gots(ds), want)
	}
}

func TestCreditReturns(t *testing.T) {
	for _, tt := range []struct {
		name    string
		release func(m *driver, id uint64) bool
		next    []uint64 // ids delivered after releasing message 1
	}{
		{"settle", (*driver).Settle, []uint64{3}},
		{"return", (*driver).Return, []uint64{1}},
		{"discard", func(m *driver, id uint64) bool { _, ok := m.Discard(id); return ok }, []uint64{3}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := newDriver(DefaultConfig())
			m.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 2})
			enqueueN(t, m, 4)
			if ds := m.Checkout(nil, 0, nil); !slices.Equal(ids(ds), []uint64{1, 2}) {
				t.Fatalf("first checkout %v", ids(ds))
			}
			if ds := m.Checkout(nil, 0, nil); len(ds) != 0 {
				t.Fatalf("full consumer got %v", ids(ds))
			}
			if got := m.ConsumerUnacked(1); got != 2 {
				t.Fatalf("ConsumerUnacked = %d, want 2", got)
			}
			if !tt.release(m, 1) {
				t.Fatal("release returned false")
			}
			if got := m.ConsumerUnacked(1); got != 1 {
				t.Fatalf("ConsumerUnacked after release = %d, want 1", got)
			}
			if ds := m.Checkout(nil, 0, nil); !slices.Equal(ids(ds), tt.next) {
				t.Fatalf("after release got %v, want %v", ids(ds), tt.next)
			}
		})
	}
}

func TestGet(t *testing.T) {
	m := newDriver(DefaultConfig())
	enqueueN(t, m, 2)
	d, ok := m.Get(false)
	if !ok || d.ID != 1 || d.Consumer != 0 {
		t.Fatalf("Get(false) = %+v, %v", d, ok)
	}
	if m.Ready() != 1 || m.Unacked() != 1 {
		t.Fatalf("after Get(false): ready %d unacked %d", m.Ready(), m.Unacked())
	}
	d, ok = m.Get(true)
	if !ok || d.ID != 2 {
		t.Fatalf("Get(true) = %+v, %v", d, ok)
	}
	if m.Ready() != 0 || m.Unacked() != 1 {
		t.Fatalf("after Get(true): ready %d unacked %d", m.Ready(), m.Unacked())
	}
	if m.Settle(2) {
		t.Fatal("Settle of a no-ack message succeeded")
	}
	if !m.Return(1) {
		t.Fatal("Return of a got message failed")
	}
	d, ok = m.Get(false)
	if !ok || d.ID != 1 || !d.Redelivered || d.DeliveryCount != 1 {
		t.Fatalf("Get after return = %+v, %v", d, ok)
	}
	if !m.Settle(1) || m.Len() != 0 {
		t.Fatalf("Settle failed or Len() = %d", m.Len())
	}
}

func TestReturnKeepsOriginalPosition(t *testing.T) {
	tests := []struct {
		name      string
		enqueue   int
		prefetch  uint32
		returns   []uint64 // returned in this order after the first checkout
		settle    bool     // settle everything else that is unacked
		enqueueAf int      // enqueued after the returns
		want      []uint64 // second checkout
	}{
		{"requeue 2 of 1..5 comes before 6", 5, 0, []uint64{2}, true, 1, []uint64{2, 6}},
		{"requeue in reverse order", 5, 0, []uint64{4, 2, 5}, true, 1, []uint64{2, 4, 5, 6}},
		{"returned before the undelivered tail", 6, 3, []uint64{2}, true, 0, []uint64{2, 4, 5, 6}},
		{"all returned", 3, 0, []uint64{3, 1, 2}, false, 2, []uint64{1, 2, 3, 4, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newDriver(DefaultConfig())
			m.AddConsumer(ConsumerSpec{ID: 1, Prefetch: tt.prefetch})
			enqueueN(t, m, tt.enqueue)
			first := m.Checkout(nil, 0, nil)
			for _, id := range tt.returns {
				if !m.Return(id) {
					t.Fatalf("Return(%d) = false", id)
				}
			}
			if tt.settle {
				for _, d := range first {
					if !slices.Contains(tt.returns, d.ID) && !m.Settle(d.ID) {
						t.Fatalf("Settle(%d) = false", d.ID)
					}
				}
			}
			enqueueN(t, m, tt.enqueueAf)
			m.AddConsumer(ConsumerSpec{ID: 1}) // lift the prefetch
			second := m.Checkout(nil, 0, nil)
			if !slices.Equal(ids(second), tt.want) {
				t.Fatalf("order %v, want %v", ids(second), tt.want)
			}
			for _, d := range second {
				returned := slices.Contains(tt.returns, d.ID)
				if d.Redelivered != returned || d.DeliveryCount != map[bool]uint32{false: 0, true: 1}[returned] {
					t.Errorf("message %d: redelivered %v count %d", d.ID, d.Redelivered, d.DeliveryCount)
				}
			}
		})
	}
}

func TestDeliveryCountGrows(t *testing.T) {
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 1})
	enqueueN(t, m, 1)
	for want := range uint32(4) {
		ds := m.Checkout(nil, 0, nil)
		if len(ds) != 1 || ds[0].DeliveryCount != want || ds[0].Redelivered != (want > 0) {
			t.Fatalf("delivery %d: %+v", want, ds)
		}
		if !m.Return(ds[0].ID) {
			t.Fatal("Return failed")
		}
	}
}

func TestDiscard(t *testing.T) {
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 1})
	msg := &Message{Body: []byte("x")}
	id := m.Enqueue(msg)
	m.Checkout(nil, 0, nil)
	got, ok := m.Discard(id)
	if !ok || got != msg {
		t.Fatalf("Discard = %v, %v", got, ok)
	}
	if m.Len() != 0 || m.ConsumerUnacked(1) != 0 {
		t.Fatalf("Len %d, ConsumerUnacked %d", m.Len(), m.ConsumerUnacked(1))
	}
	if got, ok := m.Discard(id); ok || got != nil {
		t.Fatalf("second Discard = %v, %v", got, ok)
	}
}

func TestPurgeLeavesUnacked(t *testing.T) {
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 2})
	enqueueN(t, m, 5) // bodies "m1".."m5"
	m.Checkout(nil, 0, nil)
	m.Return(1) // a returned message is ready too
	if n := m.Purge(); n != 4 {
		t.Fatalf("Purge() = %d, want 4", n)
	}
	if m.Ready() != 0 || m.ReadyBytes() != 0 || m.Unacked() != 1 {
		t.Fatalf("ready %d bytes %d unacked %d", m.Ready(), m.ReadyBytes(), m.Unacked())
	}
	if !m.Settle(2) {
		t.Fatal("unacked message lost by Purge")
	}
	if n := m.Purge(); n != 0 {
		t.Fatalf("second Purge() = %d", n)
	}
	enqueueN(t, m, 1)
	if ds := m.Checkout(nil, 0, nil); !slices.Equal(ids(ds), []uint64{6}) {
		t.Fatalf("after purge got %v", ids(ds))
	}
}

func TestRemoveConsumerKeepsUnacked(t *testing.T) {
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 2})
	m.AddConsumer(ConsumerSpec{ID: 2, Prefetch: 1})
	enqueueN(t, m, 5)
	m.Checkout(nil, 0, nil) // 1:{1,3} 2:{2}
	if !m.RemoveConsumer(1) {
		t.Fatal("RemoveConsumer(1) = false")
	}
	if m.HasConsumer(1) || m.Consumers() != 1 || m.ConsumerUnacked(1) != 0 {
		t.Fatalf("consumer 1 still visible: has %v n %d", m.HasConsumer(1), m.Consumers())
	}
	if m.Unacked() != 3 || m.Ready() != 2 {
		t.Fatalf("unacked %d ready %d", m.Unacked(), m.Ready())
	}
	if ds := m.Checkout(nil, 0, nil); len(ds) != 0 {
		t.Fatalf("removed consumer or full consumer got %v", gots(ds))
	}
	// A new consumer reusing ID 1 is not credited by the old consumer's settlements.
	m.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 1})
	if ds := m.Checkout(nil, 0, nil); !slices.Equal(gots(ds), []got{{1, 4}}) {
		t.Fatalf("new consumer got %v", gots(ds))
	}
	if !m.Settle(1) || !m.Return(3) {
		t.Fatal("old consumer's messages not settleable")
	}
	if got := m.ConsumerUnacked(1); got != 1 {
		t.Fatalf("ConsumerUnacked(1) = %d, want 1", got)
	}
	if ds := m.Checkout(nil, 0, nil); len(ds) != 0 {
		t.Fatalf("full consumers got %v", gots(ds))
	}
	m.Settle(2)
	if ds := m.Checkout(nil, 0, nil); !slices.Equal(gots(ds), []got{{2, 3}}) {
		t.Fatalf("after settle got %v", gots(ds))
	}
}

func TestAddConsumerReplacesSpec(t *testing.T) {
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 1})
	m.AddConsumer(ConsumerSpec{ID: 2, Prefetch: 5})
	enqueueN(t, m, 6)
	m.Checkout(nil, 2, nil) // 1:{1} 2:{2}
	m.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 3, Priority: 1})
	if m.Consumers() != 2 || m.ConsumerUnacked(1) != 1 {
		t.Fatalf("consumers %d, unacked(1) %d", m.Consumers(), m.ConsumerUnacked(1))
	}
	if ds := m.Checkout(nil, 0, nil); !slices.Equal(gots(ds), []got{{1, 3}, {1, 4}, {2, 5}, {2, 6}}) {
		t.Fatalf("after replace got %v", gots(ds))
	}
	// Lowering the prefetch below the unacked count stops deliveries until enough are settled.
	m.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 1})
	enqueueN(t, m, 1)
	m.RemoveConsumer(2)
	if ds := m.Checkout(nil, 0, nil); len(ds) != 0 {
		t.Fatalf("over-prefetch consumer got %v", gots(ds))
	}
	m.Settle(1)
	m.Settle(3)
	if ds := m.Checkout(nil, 0, nil); len(ds) != 0 {
		t.Fatalf("consumer at its lowered prefetch got %v", gots(ds))
	}
	m.Settle(4)
	if ds := m.Checkout(nil, 0, nil); !slices.Equal(gots(ds), []got{{1, 7}}) {
		t.Fatalf("after settling got %v", gots(ds))
	}
}

func TestUnknownIDs(t *testing.T) {
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 1})
	enqueueN(t, m, 2)
	m.Checkout(nil, 1, nil) // 1 unacked, 2 ready
	for _, id := range []uint64{0, 2, 3, 1 << 40} {
		if m.Settle(id) || m.Return(id) {
			t.Errorf("Settle/Return(%d) succeeded", id)
		}
		if msg, ok := m.Discard(id); ok || msg != nil {
			t.Errorf("Discard(%d) succeeded", id)
		}
	}
	if !m.Settle(1) || m.Settle(1) || m.Return(1) {
		t.Error("double settle")
	}
	if m.RemoveConsumer(9) || m.HasConsumer(9) || m.ConsumerUnacked(9) != 0 {
		t.Error("unknown consumer visible")
	}
	if m.Ready() != 1 || m.Unacked() != 0 {
		t.Errorf("state changed: ready %d unacked %d", m.Ready(), m.Unacked())
	}
}

func TestReadyBytes(t *testing.T) {
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 1})
	m.Enqueue(&Message{Body: make([]byte, 10)})
	m.Enqueue(&Message{Body: make([]byte, 5)})
	m.Enqueue(&Message{})
	steps := []struct {
		op   func()
		want int
	}{
		{func() {}, 15},
		{func() { m.Checkout(nil, 0, nil) }, 5},
		{func() { m.Return(1) }, 15},
		{func() { m.Get(true) }, 5},
		{func() { m.Purge() }, 0},
	}
	for i, s := range steps {
		s.op()
		if m.ReadyBytes() != s.want {
			t.Fatalf("step %d: ReadyBytes() = %d, want %d", i, m.ReadyBytes(), s.want)
		}
	}
}

func TestDeque(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	var d deque[int]
	var ref []int
	next := 0
	for step := range 20000 {
		switch r := rng.IntN(10); {
		case r < 4 || (step%5000 < 2500 && r < 6):
			d.PushBack(next)
			ref = append(ref, next)
			next++
		case r < 5:
			d.PushFront(next)
			ref = slices.Insert(ref, 0, next)
			next++
		case r < 9 && len(ref) > 0:
			if v := d.PopFront(); v != ref[0] {
				t.Fatalf("step %d: PopFront = %d, want %d", step, v, ref[0])
			}
			ref = ref[1:]
		case len(ref) > 0:
			i := rng.IntN(len(ref))
			d.Remove(i)
			ref = slices.Delete(ref, i, i+1)
		}
		if d.Len() != len(ref) {
			t.Fatalf("step %d: Len = %d, want %d", step, d.Len(), len(ref))
		}
		if len(d.buf) > minCap && d.Len() < len(d.buf)/8 {
			t.Fatalf("step %d: buffer %d not shrunk for %d elements", step, len(d.buf), d.Len())
		}
	}
	for i, v := range ref {
		if d.At(i) != v {
			t.Fatalf("At(%d) = %d, want %d", i, d.At(i), v)
		}
	}
}

// The model-based tests drive the machine and a simple reference model with the same random
// operations and check after every step that they agree and that the invariants hold.

type modelMsg struct {
	id          uint64
	msg         *Message
	count       uint32
	redelivered bool
	size        uint32
	prio        uint8 // level, already clamped
	deadline    int64 // 0 = none
	atOnce      bool  // published already due, waiting for the next CheckoutAt
}

type modelConsumer struct {
	spec    ConsumerSpec
	unacked int
	seq     uint64
}

func (c *modelConsumer) credit() bool {
	return c.spec.NoAck || c.spec.Prefetch == 0 || c.unacked < int(c.spec.Prefetch)
}

type modelUnacked struct {
	modelMsg
	owner *modelConsumer // nil for basic.get
	at    int64
}

type model struct {
	cfg       Config
	now       int64
	nextID    uint64
	ready     []modelMsg // in delivery order: priority desc, id asc
	unacked   map[uint64]modelUnacked
	consumers map[ConsumerID]*modelConsumer
	seq       uint64
	active    *modelConsumer // single active consumer
	quiescing bool
}

func newModel(cfg Config) *model {
	return &model{cfg: cfg, now: 1000, nextID: 1, unacked: map[uint64]modelUnacked{},
		consumers: map[ConsumerID]*modelConsumer{}}
}

const (
	stateGone = iota
	stateReady
	stateUnacked
)

func (md *model) state(id uint64) int {
	if _, ok := md.unacked[id]; ok {
		return stateUnacked
	}
	for _, r := range md.ready {
		if r.id == id {
			return stateReady
		}
	}
	return stateGone
}

// receives reports whether c may be given a message now.
func (md *model) receives(c *modelConsumer) bool {
	return c.credit() && (!md.cfg.SingleActiveConsumer || (c == md.active && !md.quiescing))
}

// sac recomputes the single active consumer (the rules of ActiveConsumer, written plainly).
func (md *model) sac() {
	if !md.cfg.SingleActiveConsumer {
		return
	}
	var cand *modelConsumer
	for _, c := range md.consumers {
		if cand == nil || c.spec.Priority > cand.spec.Priority || (c.spec.Priority == cand.spec.Priority && c.seq < cand.seq) {
			cand = c
		}
	}
	if md.active == nil || (cand.spec.Priority > md.active.spec.Priority && md.active.unacked == 0) {
		md.active = cand
	}
	md.quiescing = md.active != nil && cand.spec.Priority > md.active.spec.Priority
}

func (md *model) insertReady(mm modelMsg) {
	i, _ := slices.BinarySearchFunc(md.ready, mm, func(a, b modelMsg) int {
		if a.prio != b.prio {
			return -cmpU64(uint64(a.prio), uint64(b.prio))
		}
		return cmpU64(a.id, b.id)
	})
	md.ready = slices.Insert(md.ready, i, mm)
}

// take removes id from the model's unacked set, returning its credit.
func (md *model) take(id uint64) (modelMsg, bool) {
	u, ok := md.unacked[id]
	if !ok {
		return modelMsg{}, false
	}
	delete(md.unacked, id)
	if u.owner != nil {
		u.owner.unacked--
	}
	return u.modelMsg, true
}

func (md *model) requeue(mm modelMsg) {
	mm.count++
	mm.redelivered = true
	md.insertReady(mm)
}

func mdDead(mm modelMsg, r Reason, count uint32) Dead {
	return Dead{ID: mm.id, Msg: mm.msg, Reason: r, DeliveryCount: count, size: mm.size}
}

// deliver pops the model's first ready message for consumer c (nil: basic.get) and checks d matches.
func (md *model) deliver(t *testing.T, d Delivery, c *modelConsumer, noAck bool, at int64) {
	t.Helper()
	if len(md.ready) == 0 {
		t.Fatalf("delivery %+v with nothing ready", d)
	}
	want := md.ready[0]
	if d.ID != want.id || d.Msg != want.msg || d.Redelivered != want.redelivered || d.DeliveryCount != want.count {
		t.Fatalf("delivery %+v, want id %d redelivered %v count %d", d, want.id, want.redelivered, want.count)
	}
	if _, dup := md.unacked[d.ID]; dup {
		t.Fatalf("message %d delivered again while unacked", d.ID)
	}
	md.ready = md.ready[1:]
	want.atOnce = false
	if !noAck {
		md.unacked[d.ID] = modelUnacked{want, c, at}
		if c != nil {
			c.unacked++
		}
	}
}

// eligibleTop returns the highest priority among consumers that may receive and were not refused.
func (md *model) eligibleTop(refused map[ConsumerID]bool) (int32, bool) {
	var top int32
	found := false
	for id, c := range md.consumers {
		if md.receives(c) && !refused[id] && (!found || c.spec.Priority > top) {
			top, found = c.spec.Priority, true
		}
	}
	return top, found
}

func (md *model) bytes() int {
	n := 0
	for _, r := range md.ready {
		n += int(r.size)
	}
	return n
}

func (md *model) over() bool {
	return (md.cfg.MaxLength >= 0 && int64(len(md.ready)) > md.cfg.MaxLength) ||
		(md.cfg.MaxLengthBytes >= 0 && int64(md.bytes()) > md.cfg.MaxLengthBytes)
}

func (md *model) trim() []Dead {
	var dead []Dead
	for md.cfg.Overflow == DropHead && len(md.ready) > 0 && md.over() {
		dead = append(dead, mdDead(md.ready[0], ReasonMaxLen, md.ready[0].count))
		md.ready = md.ready[1:]
	}
	return dead
}

// expire removes the due messages (not those waiting to be delivered at once), by deadline then id.
func (md *model) expire() []Dead {
	var due []modelMsg
	keep := md.ready[:0:0]
	for _, r := range md.ready {
		if r.deadline != 0 && r.deadline <= md.now && !r.atOnce {
			due = append(due, r)
		} else {
			keep = append(keep, r)
		}
	}
	md.ready = keep
	slices.SortFunc(due, func(a, b modelMsg) int {
		if a.deadline != b.deadline {
			return int(a.deadline - b.deadline)
		}
		return cmpU64(a.id, b.id)
	})
	var dead []Dead
	for _, r := range due {
		dead = append(dead, mdDead(r, ReasonExpired, r.count))
	}
	return dead
}

func (md *model) sweepAtOnce() []Dead {
	var dead []Dead
	keep := md.ready[:0:0]
	var gone []modelMsg
	for _, r := range md.ready {
		if r.atOnce {
			gone = append(gone, r)
		} else {
			keep = append(keep, r)
		}
	}
	md.ready = keep
	slices.SortFunc(gone, func(a, b modelMsg) int { return cmpU64(a.id, b.id) })
	for _, r := range gone {
		dead = append(dead, mdDead(r, ReasonExpired, r.count))
	}
	return dead
}

func (md *model) returnAt(id uint64) (*Dead, bool) {
	mm, ok := md.take(id)
	if !ok {
		return nil, false
	}
	if md.cfg.DeliveryLimit >= 0 && int64(mm.count)+1 > md.cfg.DeliveryLimit {
		d := mdDead(mm, ReasonDeliveryLimit, mm.count+1)
		return &d, true
	}
	md.requeue(mm)
	return nil, true
}

// readyIDs lists the machine's live ready ids in delivery order, checking its internal invariants.
func readyIDs(t *testing.T, m *driver) []uint64 {
	t.Helper()
	var out []uint64
	tombs := 0
	live := func(e entry) bool {
		if !e.timed {
			return true
		}
		if _, ok := m.timed[e.id]; ok {
			return true
		}
		tombs++
		return false
	}
	for p := len(m.levels) - 1; p >= 0; p-- {
		l := &m.levels[p]
		if p > m.top && l.len() > 0 {
			t.Fatalf("level %d above top %d holds %d entries", p, m.top, l.len())
		}
		for i := 1; i < len(l.returned); i++ {
			if l.returned[(i-1)/2].id > l.returned[i].id {
				t.Fatalf("level %d: heap property broken at %d", p, i)
			}
		}
		var lv []uint64
		for _, e := range l.returned {
			if int(e.prio) != p {
				t.Fatalf("entry %d of priority %d in level %d", e.id, e.prio, p)
			}
			if live(e) {
				lv = append(lv, e.id)
			}
		}
		slices.Sort(lv)
		for i := range l.fifo.Len() {
			e := l.fifo.At(i)
			if int(e.prio) != p || (i > 0 && l.fifo.At(i-1).id >= e.id) {
				t.Fatalf("level %d: fifo entry %d out of place", p, e.id)
			}
			if i == 0 {
				for _, r := range l.returned {
					if r.id >= e.id {
						t.Fatalf("level %d: returned %d not below the fifo head %d", p, r.id, e.id)
					}
				}
			}
			if live(e) {
				lv = append(lv, e.id)
			}
		}
		out = append(out, lv...)
	}
	if tombs != m.tombs {
		t.Fatalf("%d tombstones, counted %d", m.tombs, tombs)
	}
	if len(out) != m.ready {
		t.Fatalf("ready counter %d, %d live entries", m.ready, len(out))
	}
	return out
}

// checkTimed verifies the timed records and the expiry heap.
func checkTimed(t *testing.T, m *driver, ready []uint64) {
	t.Helper()
	isReady := map[uint64]bool{}
	for _, id := range ready {
		isReady[id] = true
	}
	queued := 0
	for id, tm := range m.timed {
		u, unacked := m.unacked[id]
		if tm.unacked != unacked || (!unacked && !isReady[id]) || tm.e.id != id || !tm.e.timed || tm.deadline <= 0 {
			t.Fatalf("timed %d: record %+v, unacked %v, ready %v", id, tm, unacked, isReady[id])
		}
		if unacked && !u.timed {
			t.Fatalf("timed %d: unacked entry not timed", id)
		}
		if tm.queued {
			queued++
		}
	}
	if queued != m.queuedLive {
		t.Fatalf("queuedLive %d, counted %d", m.queuedLive, queued)
	}
	items := map[uint64]int{}
	for i, it := range m.expiry {
		if i > 0 && m.expiry[(i-1)/2].deadline > it.deadline {
			t.Fatal("expiry heap property broken")
		}
		if tm, ok := m.timed[it.id]; ok {
			if !tm.queued || tm.deadline != it.deadline {
				t.Fatalf("expiry item %+v for record %+v", it, tm)
			}
			items[it.id]++
		}
	}
	for id, tm := range m.timed {
		if tm.queued && items[id] != 1 {
			t.Fatalf("queued message %d has %d expiry items", id, items[id])
		}
	}
}

// checkConsumers verifies the groups and rings against the consumers map.
func checkConsumers(t *testing.T, m *driver) {
	t.Helper()
	members := map[*group]int{}
	for id, c := range m.consumers {
		if c.spec.ID != id || c.group == nil || c.group.priority != c.spec.Priority {
			t.Fatalf("consumer %d: bad group or spec", id)
		}
		members[c.group]++
		n := 0
		for i := range c.group.ring.Len() {
			if c.group.ring.At(i) == c {
				n++
			}
		}
		if c.active != c.eligible() || (n == 1) != c.active || n > 1 {
			t.Fatalf("consumer %d: active %v eligible %v in ring %d times", id, c.active, c.eligible(), n)
		}
		if sac := m.cfg.SingleActiveConsumer; c.standby != (sac && (c != m.sacActive || m.sacQuiescing)) {
			t.Fatalf("consumer %d: standby %v", id, c.standby)
		}
	}
	for i, g := range m.groups {
		if i > 0 && m.groups[i-1].priority <= g.priority {
			t.Fatal("groups not in strictly decreasing priority")
		}
		if g.members == 0 || members[g] != g.members {
			t.Fatalf("group %d: members %d, counted %d", g.priority, g.members, members[g])
		}
	}
	if len(members) != len(m.groups) {
		t.Fatal("consumer points to a group not in the list")
	}
}

func TestMachineMatchesModel(t *testing.T) {
	seeds, steps := 300, 400
	if testing.Short() {
		seeds = 30
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runModel(t, seed, steps) })
	}
}

func runModel(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	m := newDriver(DefaultConfig())
	md := newModel(DefaultConfig())
	randID := func() uint64 { return uint64(rng.IntN(int(md.nextID) + 2)) }

	for step := range steps {
		switch op := rng.IntN(100); {
		case op < 30:
			msg := &Message{Body: make([]byte, rng.IntN(8))}
			id := m.Enqueue(msg)
			if id != md.nextID {
				t.Fatalf("step %d: Enqueue = %d, want %d", step, id, md.nextID)
			}
			md.ready = append(md.ready, modelMsg{id: id, msg: msg, size: uint32(len(msg.Body))})
			md.nextID++
		case op < 38:
			addConsumer(rng, m, md)
		case op < 42:
			removeConsumer(t, step, rng, m, md)
		case op < 60:
			checkout(t, rng, m, md, false)
		case op < 66:
			noAck := rng.IntN(2) == 0
			d, ok := m.Get(noAck)
			if ok != (len(md.ready) > 0) {
				t.Fatalf("step %d: Get ok = %v with %d ready", step, ok, len(md.ready))
			}
			if ok {
				if d.Consumer != 0 {
					t.Fatalf("step %d: Get delivery has consumer %d", step, d.Consumer)
				}
				md.deliver(t, d, nil, noAck, 0)
			}
		case op < 80:
			id := randID()
			_, want := md.take(id)
			if got := m.Settle(id); got != want {
				t.Fatalf("step %d: Settle(%d) = %v, want %v", step, id, got, want)
			}
		case op < 92:
			id := randID()
			mm, want := md.take(id)
			if got := m.Return(id); got != want {
				t.Fatalf("step %d: Return(%d) = %v, want %v", step, id, got, want)
			}
			if want {
				md.requeue(mm)
			}
		case op < 98:
			id := randID()
			mm, want := md.take(id)
			msg, got := m.Discard(id)
			if got != want || msg != mm.msg {
				t.Fatalf("step %d: Discard(%d) = %v, want %v", step, id, got, want)
			}
		default:
			if got := m.Purge(); got != len(md.ready) {
				t.Fatalf("step %d: Purge = %d, want %d", step, got, len(md.ready))
			}
			md.ready = nil
		}
		compare(t, step, m, md)
	}
}

func addConsumer(rng *rand.Rand, m *driver, md *model) {
	spec := ConsumerSpec{
		ID:       ConsumerID(1 + rng.IntN(5)),
		Prefetch: uint32(rng.IntN(4)),
		Priority: int32(rng.IntN(3)),
		NoAck:    rng.IntN(8) == 0,
	}
	m.AddConsumer(spec)
	if c, ok := md.consumers[spec.ID]; ok {
		c.spec = spec
	} else {
		md.seq++
		md.consumers[spec.ID] = &modelConsumer{spec: spec, seq: md.seq}
	}
	md.sac()
}

func removeConsumer(t *testing.T, step int, rng *rand.Rand, m *driver, md *model) {
	id := ConsumerID(1 + rng.IntN(6))
	c, want := md.consumers[id]
	if got := m.RemoveConsumer(id); got != want {
		t.Fatalf("step %d: RemoveConsumer(%d) = %v, want %v", step, id, got, want)
	}
	delete(md.consumers, id)
	if c != nil && c == md.active {
		md.active = nil
	}
	md.sac()
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// checkout runs one Checkout (CheckoutAt at the model's time if timed) with a random max and a
// random reserve, then replays the reserve calls against the model: each call must go to a
// consumer that may receive, not refused earlier in this call, of the highest eligible priority;
// each accepted call must be the next delivery. It returns what CheckoutAt reported expired.
func checkout(t *testing.T, rng *rand.Rand, m *driver, md *model, timed bool) []Dead {
	t.Helper()
	max := rng.IntN(5) - 1
	type call struct {
		id ConsumerID
		ok bool
	}
	var calls []call
	var reserve func(ConsumerID) bool
	if rng.IntN(3) > 0 {
		refuseOneIn := 2 + rng.IntN(5)
		reserve = func(id ConsumerID) bool {
			ok := rng.IntN(refuseOneIn) != 0
			calls = append(calls, call{id, ok})
			return ok
		}
	}
	var ds []Delivery
	var dead, wantDead []Dead
	var at int64
	if timed {
		ds, dead = m.CheckoutAt(nil, max, reserve, md.now)
		wantDead = md.expire()
		at = md.now
	} else {
		ds = m.Checkout(nil, max, reserve)
	}
	if reserve == nil {
		for _, d := range ds {
			calls = append(calls, call{d.Consumer, true})
		}
	}
	refused := map[ConsumerID]bool{}
	di := 0
	for _, cl := range calls {
		c, ok := md.consumers[cl.id]
		if !ok || !md.receives(c) || refused[cl.id] {
			t.Fatalf("reserve(%d): known %v, receives %v, refused %v", cl.id, ok, ok && md.receives(c), refused[cl.id])
		}
		if top, _ := md.eligibleTop(refused); c.spec.Priority != top {
			t.Fatalf("reserve(%d) with priority %d while %d is eligible", cl.id, c.spec.Priority, top)
		}
		if len(md.ready) == 0 {
			t.Fatalf("reserve(%d) with nothing ready", cl.id)
		}
		if !cl.ok {
			refused[cl.id] = true
			continue
		}
		if di >= len(ds) || ds[di].Consumer != cl.id {
			t.Fatalf("accepted reserve(%d) is not delivery %d of %v", cl.id, di, gots(ds))
		}
		md.deliver(t, ds[di], c, c.spec.NoAck, at)
		di++
	}
	if di != len(ds) {
		t.Fatalf("%d deliveries without reserve", len(ds)-di)
	}
	if max > 0 && len(ds) > max {
		t.Fatalf("%d deliveries, max %d", len(ds), max)
	}
	if _, eligible := md.eligibleTop(refused); (max <= 0 || len(ds) < max) && len(md.ready) > 0 && eligible {
		t.Fatalf("Checkout stopped with %d ready and an eligible consumer", len(md.ready))
	}
	if timed {
		if atMax := max > 0 && len(ds) >= max; !atMax || len(md.ready) == 0 {
			wantDead = append(wantDead, md.sweepAtOnce()...)
		}
		checkDead(t, "CheckoutAt", dead, wantDead)
	}
	return dead
}

func checkDead(t *testing.T, what string, got, want []Dead) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: dead %+v, want %+v", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: dead[%d] = %+v, want %+v", what, i, got[i], want[i])
		}
	}
}

// compare checks every observable count and the state of every id against the model.
func compare(t *testing.T, step int, m *driver, md *model) {
	t.Helper()
	bytes := md.bytes()
	if m.Ready() != len(md.ready) || m.Unacked() != len(md.unacked) || m.Len() != len(md.ready)+len(md.unacked) ||
		m.ReadyBytes() != bytes || m.Consumers() != len(md.consumers) {
		t.Fatalf("step %d: ready %d/%d unacked %d/%d len %d bytes %d/%d consumers %d/%d", step,
			m.Ready(), len(md.ready), m.Unacked(), len(md.unacked), m.Len(),
			m.ReadyBytes(), bytes, m.Consumers(), len(md.consumers))
	}
	for id := range ConsumerID(7) {
		want := 0
		c, ok := md.consumers[id]
		if ok {
			want = c.unacked
		}
		if m.HasConsumer(id) != ok || m.ConsumerUnacked(id) != want {
			t.Fatalf("step %d: consumer %d: has %v unacked %d, want %v %d", step, id, m.HasConsumer(id), m.ConsumerUnacked(id), ok, want)
		}
	}
	if md.cfg.SingleActiveConsumer {
		id, ok := m.ActiveConsumer()
		if ok != (md.active != nil) || (ok && id != md.active.spec.ID) || m.sacQuiescing != md.quiescing {
			t.Fatalf("step %d: active %d %v quiescing %v, model %+v %v", step, id, ok, m.sacQuiescing, md.active, md.quiescing)
		}
	}
	ready := readyIDs(t, m)
	want := make([]uint64, len(md.ready))
	for i, r := range md.ready {
		want[i] = r.id
	}
	if !slices.Equal(ready, want) {
		t.Fatalf("step %d: ready order %v, want %v", step, ready, want)
	}
	for id := uint64(1); id < md.nextID; id++ {
		got := stateGone
		if _, ok := m.unacked[id]; ok {
			got = stateUnacked
		}
		if slices.Contains(ready, id) {
			if got != stateGone {
				t.Fatalf("step %d: message %d both ready and unacked", step, id)
			}
			got = stateReady
		}
		if want := md.state(id); got != want {
			t.Fatalf("step %d: message %d in state %d, want %d", step, id, got, want)
		}
	}
	checkTimed(t, m, ready)
	checkConsumers(t, m)
}

// benchState is a State driven the way the classic queue drives it: one reused Command per
// kind and one reused Effects.
type benchState struct {
	s                  *State
	enq, co, ack, back Command
	fx                 Effects
	tag                [1]Tag
}

func newBenchState(cfg Config, consumers ...Command) *benchState {
	b := &benchState{s: NewState(StateConfig{Config: cfg})}
	for i := range consumers {
		b.s.Apply(&consumers[i], 0, &b.fx)
	}
	b.co = Command{Type: CmdCheckout}
	b.ack = Command{Type: CmdSettle, Tags: b.tag[:]}
	b.back = Command{Type: CmdReturn, Tags: b.tag[:]}
	return b
}

func (b *benchState) enqueue(msg *Message, now int64) {
	b.enq = Command{Type: CmdEnqueue, Msg: msg}
	b.fx.Reset()
	b.s.Apply(&b.enq, now, &b.fx)
}

func (b *benchState) checkout(max int, now int64) []Delivery {
	b.co.Max = max
	b.fx.Reset()
	b.s.Apply(&b.co, now, &b.fx)
	return b.fx.Deliveries
}

func (b *benchState) settle(cmd *Command, t Tag) {
	b.tag[0] = t
	var fx Effects
	b.s.Apply(cmd, 0, &fx)
}

func BenchmarkEnqueueCheckoutSettle(b *testing.B) {
	s := newBenchState(DefaultConfig(), Command{Type: CmdConsume, Consumer: 1, Prefetch: 100})
	msg := &Message{Body: make([]byte, 64)}
	b.ReportAllocs()
	for b.Loop() {
		s.enqueue(msg, 0)
		d := s.checkout(0, 0)[0]
		s.settle(&s.ack, d.Tag())
	}
}

// BenchmarkBacklog measures one message through a queue holding a 100k-message backlog, delivered in
// batches of 64 to four round-robin consumers with prefetch 64 and a reserve callback.
func BenchmarkBacklog(b *testing.B) {
	var cs []Command
	for id := range ConsumerID(4) {
		cs = append(cs, Command{Type: CmdConsume, Consumer: id + 1, Prefetch: 64})
	}
	s := newBenchState(DefaultConfig(), cs...)
	msg := &Message{Body: make([]byte, 64)}
	for range 100_000 {
		s.enqueue(msg, 0)
	}
	s.s.reserve = func(ConsumerID) bool { return true }
	var tags []Tag
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.enqueue(msg, 0)
		if i%64 == 63 {
			tags = tags[:0]
			for _, d := range s.checkout(64, 0) {
				tags = append(tags, d.Tag())
			}
			for _, t := range tags {
				s.settle(&s.ack, t)
			}
		}
	}
}

// BenchmarkReturnRedeliver measures requeueing: 1000 unacked messages are returned and redelivered.
func BenchmarkReturnRedeliver(b *testing.B) {
	s := newBenchState(DefaultConfig(), Command{Type: CmdConsume, Consumer: 1})
	msg := &Message{}
	for range 1000 {
		s.enqueue(msg, 0)
	}
	tags := make([]Tag, 0, 1000)
	for _, d := range s.checkout(0, 0) {
		tags = append(tags, d.Tag())
	}
	b.ReportAllocs()
	for b.Loop() {
		for i := len(tags) - 1; i >= 0; i-- {
			s.settle(&s.back, tags[i])
		}
		tags = tags[:0]
		for _, d := range s.checkout(0, 0) {
			tags = append(tags, d.Tag())
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(tags)), "ns/msg")
}
