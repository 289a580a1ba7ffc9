package queue

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// t0 is the test clock's origin, Unix ms.
const t0 int64 = 1_700_000_000_000

func cfgWith(f func(*Config)) Config {
	c := DefaultConfig()
	f(&c)
	return c
}

// publish publishes a message with a body of size bytes, failing the test if the id is not the
// next one or if the message is not accepted.
func publish(t *testing.T, m *driver, size int, prio uint8, expiresAt, now int64) uint64 {
	t.Helper()
	want := m.nextID
	id, ok, dead := m.Publish(&Message{Body: make([]byte, size), Priority: prio, ExpiresAt: expiresAt}, uint32(size), 0, now)
	if id != want || !ok || len(dead) != 0 {
		t.Fatalf("Publish = %d, %v, %+v; want %d, true, none", id, ok, dead, want)
	}
	return id
}

func deadIDs(ds []Dead) []uint64 {
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

func deadReasons(ds []Dead) []Reason {
	out := make([]Reason, len(ds))
	for i, d := range ds {
		out[i] = d.Reason
	}
	return out
}

// drain gets every ready message (no-ack) at now and returns the ids.
func drain(m *driver, now int64) []uint64 {
	var out []uint64
	for {
		d, ok, _ := m.GetAt(true, now)
		if !ok {
			return out
		}
		out = append(out, d.ID)
	}
}

func TestDefaultConfig(t *testing.T) {
	if got := newDriver(DefaultConfig()).Config(); got != DefaultConfig() {
		t.Fatalf("newDriver(DefaultConfig()).Config() = %+v", got)
	}
	want := Config{MessageTTL: -1, MaxLength: -1, MaxLengthBytes: -1, DeliveryLimit: -1}
	if DefaultConfig() != want {
		t.Fatalf("DefaultConfig() = %+v", DefaultConfig())
	}
	m := newDriver(DefaultConfig())
	for i := range 10 {
		publish(t, m, 1000, uint8(i), 0, t0) // priority ignored: FIFO
	}
	// A per-message expiration is honoured without a queue TTL: already due with no consumer, the
	// message is expired at once.
	if id, ok, dead := m.Publish(&Message{ExpiresAt: t0 - 5}, 0, 0, t0); !ok || !slices.Equal(deadIDs(dead), []uint64{id}) {
		t.Fatalf("due message: %d %v %+v", id, ok, dead)
	}
	if got := drain(m, t0); !slices.Equal(got, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
		t.Fatalf("order %v", got)
	}
}

func TestDeadline(t *testing.T) {
	tests := []struct {
		name      string
		ttl       int64
		expiresAt int64 // relative to t0; 0 = none
		want      int64 // relative to t0; 0 = none
	}{
		{"none", -1, 0, 0},
		{"queue ttl", 100, 0, t0 + 100},
		{"message expiration", -1, 50, t0 + 50},
		{"message earlier than queue", 100, 50, t0 + 50},
		{"queue earlier than message", 100, 200, t0 + 100},
		{"queue ttl 0", 0, 0, t0},
		{"message in the past", 100, -30, t0 - 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newDriver(cfgWith(func(c *Config) { c.MessageTTL = tt.ttl }))
			exp := int64(0)
			if tt.expiresAt != 0 {
				exp = t0 + tt.expiresAt
			}
			if got := m.DeadlineFor(exp, t0); got != tt.want {
				t.Fatalf("DeadlineFor = %d, want %d", got-t0, tt.want-t0)
			}
			if tt.want == 0 || tt.want > t0 {
				id := publish(t, m, 1, 0, exp, t0)
				m.AddConsumer(ConsumerSpec{ID: 1})
				ds, _ := m.CheckoutAt(nil, 0, nil, t0)
				if dl, ok := m.unackedDeadline(id); !ok || dl != tt.want || len(ds) != 1 {
					t.Fatalf("unacked deadline = %d, %v", dl, ok)
				}
			}
		})
	}
}

func TestExpireAnywhereInTheQueue(t *testing.T) {
	m := newDriver(DefaultConfig())
	long := publish(t, m, 1, 0, t0+10_000, t0)
	short := publish(t, m, 2, 0, t0+100, t0)
	none := publish(t, m, 3, 0, 0, t0)
	short2 := publish(t, m, 4, 0, t0+50, t0)
	if d, ok := m.NextExpiry(); !ok || d != t0+50 {
		t.Fatalf("NextExpiry = %d, %v", d-t0, ok)
	}
	if got := m.Expire(t0 + 49); len(got) != 0 {
		t.Fatalf("Expire before any deadline = %+v", got)
	}
	got := m.Expire(t0 + 100)
	if !slices.Equal(deadIDs(got), []uint64{short2, short}) || !slices.Equal(deadReasons(got), []Reason{ReasonExpired, ReasonExpired}) {
		t.Fatalf("Expire = %+v", got)
	}
	if got[0].size != 4 || got[1].size != 2 || got[0].Msg == nil || len(got[0].Msg.Body) != 4 {
		t.Fatalf("dead messages lost their data: %+v", got)
	}
	if m.Ready() != 2 || m.ReadyBytes() != 4 {
		t.Fatalf("ready %d bytes %d", m.Ready(), m.ReadyBytes())
	}
	if d, ok := m.NextExpiry(); !ok || d != t0+10_000 {
		t.Fatalf("NextExpiry = %d, %v", d-t0, ok)
	}
	if ids := drain(m, t0+100); !slices.Equal(ids, []uint64{long, none}) {
		t.Fatalf("remaining %v", ids)
	}
	if _, ok := m.NextExpiry(); ok {
		t.Fatal("NextExpiry with nothing timed")
	}
}

func TestCheckoutAndGetNeverHandOutExpired(t *testing.T) {
	m := newDriver(cfgWith(func(c *Config) { c.MessageTTL = 100 }))
	a := publish(t, m, 1, 0, 0, t0)
	b := publish(t, m, 1, 0, 0, t0+50)
	c := publish(t, m, 1, 0, t0+120, t0+50)
	d, ok, dead := m.GetAt(false, t0+100)
	if !ok || d.ID != b || !slices.Equal(deadIDs(dead), []uint64{a}) {
		t.Fatalf("GetAt = %+v %v, dead %v", d, ok, deadIDs(dead))
	}
	m.AddConsumer(ConsumerSpec{ID: 1})
	ds, dead := m.CheckoutAt(nil, 0, nil, t0+200)
	if len(ds) != 0 || !slices.Equal(deadIDs(dead), []uint64{c}) {
		t.Fatalf("CheckoutAt = %v, dead %v", ids(ds), deadIDs(dead))
	}
	// Unacked messages do not expire; one returned after its deadline expires then.
	if got := m.Expire(t0 + 1000); len(got) != 0 || m.Unacked() != 1 {
		t.Fatalf("unacked message expired: %+v", got)
	}
	if _, ok := m.ReturnAt(b); !ok {
		t.Fatal("ReturnAt failed")
	}
	if dl, ok := m.NextExpiry(); !ok || dl != t0+150 {
		t.Fatalf("NextExpiry after return = %d, %v", dl-t0, ok)
	}
	ds, dead = m.CheckoutAt(nil, 0, nil, t0+1000)
	if len(ds) != 0 || len(dead) != 1 || dead[0].ID != b || dead[0].DeliveryCount != 1 {
		t.Fatalf("CheckoutAt after return = %v, dead %+v", ids(ds), dead)
	}
	if m.Len() != 0 {
		t.Fatalf("Len %d", m.Len())
	}
}

func TestTTLZero(t *testing.T) {
	tests := []struct {
		name      string
		consumer  *ConsumerSpec
		refuse    bool // reserve refuses
		max       int
		delivered []uint64
		dead      []uint64 // at publish, then at CheckoutAt
	}{
		{name: "no consumer: expired at publish", dead: []uint64{1, 2}},
		{name: "consumer without credit: expired at publish", consumer: &ConsumerSpec{ID: 1, Prefetch: 1}, dead: []uint64{2, 3}},
		{name: "consumer takes them", consumer: &ConsumerSpec{ID: 1}, delivered: []uint64{1, 2}},
		{name: "consumer refuses: expired at checkout", consumer: &ConsumerSpec{ID: 1}, refuse: true, dead: []uint64{1, 2}},
		{name: "max reached: the rest waits", consumer: &ConsumerSpec{ID: 1}, max: 1, delivered: []uint64{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newDriver(cfgWith(func(c *Config) { c.MessageTTL = 0 }))
			var dead []Dead
			if tt.consumer != nil {
				m.AddConsumer(*tt.consumer)
				if tt.consumer.Prefetch == 1 {
					publish(t, m, 1, 0, 0, t0) // delivered at once: takes the only credit
					if ds, dead := m.CheckoutAt(nil, 0, nil, t0); len(ds) != 1 || len(dead) != 0 {
						t.Fatalf("first message: %v %v", ids(ds), deadIDs(dead))
					}
				}
			}
			for range 2 {
				_, ok, d := m.Publish(&Message{}, 0, 0, t0)
				if !ok {
					t.Fatal("not accepted")
				}
				dead = append(dead, d...)
			}
			if got := m.Expire(t0 + 1000); len(got) != 0 {
				t.Fatalf("Expire took messages waiting for a consumer: %v", deadIDs(got))
			}
			if _, ok := m.NextExpiry(); ok {
				t.Fatal("NextExpiry reports messages waiting for a consumer")
			}
			ds, d := m.CheckoutAt(nil, tt.max, func(ConsumerID) bool { return !tt.refuse }, t0+5)
			dead = append(dead, d...)
			got := ids(ds)
			if !slices.Equal(got, tt.delivered) || !slices.Equal(deadIDs(dead), tt.dead) {
				t.Fatalf("delivered %v dead %v, want %v %v", got, deadIDs(dead), tt.delivered, tt.dead)
			}
			for _, x := range dead {
				if x.Reason != ReasonExpired {
					t.Fatalf("reason %q", x.Reason)
				}
			}
			if tt.max == 1 {
				if m.Ready() != 1 {
					t.Fatalf("ready %d", m.Ready())
				}
				ds, d = m.CheckoutAt(nil, 0, nil, t0+10)
				if len(ds) != 1 || ds[0].ID != 2 || len(d) != 0 {
					t.Fatalf("second CheckoutAt = %v, dead %v", ids(ds), deadIDs(d))
				}
			}
		})
	}
}

func TestTombstonesAreSwept(t *testing.T) {
	m := newDriver(DefaultConfig())
	head := publish(t, m, 1, 0, 0, t0) // a head that never expires keeps everything behind it
	now := t0
	for range 10_000 {
		publish(t, m, 100, 0, now+10, now)
		now += 5
		m.Expire(now)
	}
	if phys := m.levels[0].len(); phys > 2*m.Ready()+64 || m.tombs > 64 {
		t.Fatalf("%d entries (%d tombstones) kept for %d ready", phys, m.tombs, m.Ready())
	}
	for i := range m.levels[0].fifo.Len() {
		if e := m.levels[0].fifo.At(i); e.msg != nil && e.timed {
			if _, live := m.timed[e.id]; !live {
				t.Fatalf("tombstone %d still holds its body", e.id)
			}
		}
	}
	if len(m.expiry) > 2*m.queuedLive+64 {
		t.Fatalf("expiry heap %d for %d live", len(m.expiry), m.queuedLive)
	}
	m.AddConsumer(ConsumerSpec{ID: 1})
	ds, dead := m.CheckoutAt(nil, 0, nil, now+100)
	if len(ds) != 1 || ds[0].ID != head || len(dead) != 1 || m.Ready() != 0 {
		t.Fatalf("got %v dead %v ready %d", ids(ds), deadIDs(dead), m.Ready())
	}
}

func TestStaleExpiryItemsAreSwept(t *testing.T) {
	m := newDriver(cfgWith(func(c *Config) { c.MessageTTL = 60_000 }))
	m.AddConsumer(ConsumerSpec{ID: 1})
	var ds []Delivery
	for i := range 10_000 {
		publish(t, m, 1, 0, 0, t0+int64(i))
		ds, _ = m.CheckoutAt(ds[:0], 0, nil, t0+int64(i))
		m.Settle(ds[0].ID)
	}
	if len(m.expiry) > 128 || len(m.timed) != 0 || len(m.consumers[1].sent.buf) > 64 {
		t.Fatalf("expiry heap %d, timed %d, sent buffer %d", len(m.expiry), len(m.timed), len(m.consumers[1].sent.buf))
	}
}

func TestOverflow(t *testing.T) {
	type pub struct {
		size     int
		accepted bool
		dead     []uint64 // ids dropped by this publish (0: the refused message itself)
	}
	tests := []struct {
		name   string
		cfg    func(*Config)
		pubs   []pub
		remain []uint64
	}{
		{"drop-head by count", func(c *Config) { c.MaxLength = 2 },
			[]pub{{1, true, nil}, {1, true, nil}, {1, true, []uint64{1}}, {1, true, []uint64{2}}}, []uint64{3, 4}},
		{"drop-head by bytes", func(c *Config) { c.MaxLengthBytes = 10 },
			[]pub{{4, true, nil}, {4, true, nil}, {4, true, []uint64{1}}, {10, true, []uint64{2, 3}}, {11, true, []uint64{4, 5}}}, nil},
		{"drop-head max-length 0", func(c *Config) { c.MaxLength = 0 },
			[]pub{{1, true, []uint64{1}}}, nil},
		{"reject-publish by count", func(c *Config) { c.MaxLength = 2; c.Overflow = RejectPublish },
			[]pub{{1, true, nil}, {1, true, nil}, {1, false, nil}}, []uint64{1, 2}},
		{"reject-publish by bytes", func(c *Config) { c.MaxLengthBytes = 10; c.Overflow = RejectPublish },
			[]pub{{4, true, nil}, {6, true, nil}, {1, false, nil}, {0, true, nil}}, []uint64{1, 2, 3}},
		{"reject-publish-dlx by count", func(c *Config) { c.MaxLength = 1; c.Overflow = RejectPublishDLX },
			[]pub{{1, true, nil}, {1, false, []uint64{0}}}, []uint64{1}},
		{"reject-publish-dlx by bytes", func(c *Config) { c.MaxLengthBytes = 5; c.Overflow = RejectPublishDLX },
			[]pub{{6, false, []uint64{0}}, {5, true, nil}, {1, false, []uint64{0}}}, []uint64{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newDriver(cfgWith(tt.cfg))
			for i, p := range tt.pubs {
				msg := &Message{Body: make([]byte, p.size)}
				want := m.nextID
				id, ok, dead := m.Publish(msg, uint32(p.size), 3, t0)
				if ok != p.accepted || (ok && id != want) || (!ok && id != 0) {
					t.Fatalf("publish %d = %d, %v", i, id, ok)
				}
				if !slices.Equal(deadIDs(dead), p.dead) {
					t.Fatalf("publish %d: dead %v, want %v", i, deadIDs(dead), p.dead)
				}
				for _, d := range dead {
					if d.Reason != ReasonMaxLen || d.flags != 3 || (d.ID == 0 && (d.Msg != msg || d.size != uint32(p.size))) {
						t.Fatalf("publish %d: dead %+v", i, d)
					}
				}
			}
			if got := drain(m, t0); !slices.Equal(got, tt.remain) {
				t.Fatalf("remaining %v, want %v", got, tt.remain)
			}
		})
	}
}

func TestLengthLimitCountsReadyOnly(t *testing.T) {
	m := newDriver(cfgWith(func(c *Config) { c.MaxLength = 1; c.Overflow = RejectPublish }))
	m.AddConsumer(ConsumerSpec{ID: 1})
	publish(t, m, 1, 0, 0, t0)
	m.CheckoutAt(nil, 0, nil, t0)
	publish(t, m, 1, 0, 0, t0) // the first one is unacked: it does not count
	if _, ok, _ := m.Publish(&Message{}, 0, 0, t0); ok {
		t.Fatal("third message accepted")
	}
	// A requeue may exceed the limit; drop-head queues trim it after the return, reject-publish
	// ones keep it.
	if dead, ok := m.ReturnAt(1); !ok || m.Ready() != 2 || len(dead) != 0 {
		t.Fatalf("ready %d", m.Ready())
	}
	d := newDriver(cfgWith(func(c *Config) { c.MaxLength = 1 }))
	d.AddConsumer(ConsumerSpec{ID: 1})
	publish(t, d, 1, 0, 0, t0)
	d.CheckoutAt(nil, 0, nil, t0)
	publish(t, d, 1, 0, 0, t0)
	if dead, _ := d.ReturnAt(1); !slices.Equal(deadIDs(dead), []uint64{1}) || dead[0].DeliveryCount != 1 || d.Ready() != 1 {
		t.Fatalf("trimmed on return: %+v, ready %d", dead, d.Ready())
	}
}

func TestPriorities(t *testing.T) {
	tests := []struct {
		name  string
		max   uint8
		prios []uint8 // message i+1 has priority prios[i]
		want  []uint64
	}{
		{"no priority queue is FIFO", 0, []uint8{0, 9, 3, 9}, []uint64{1, 2, 3, 4}},
		{"higher first, FIFO within", 5, []uint8{1, 5, 1, 3, 5, 0}, []uint64{2, 5, 4, 1, 3, 6}},
		{"above max counts as max", 2, []uint8{2, 200, 1, 3}, []uint64{1, 2, 4, 3}},
		{"255 levels", 255, []uint8{0, 255, 128, 254}, []uint64{2, 4, 3, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newDriver(cfgWith(func(c *Config) { c.MaxPriority = tt.max }))
			for _, p := range tt.prios {
				publish(t, m, 1, p, 0, t0)
			}
			if got := drain(m, t0); !slices.Equal(got, tt.want) {
				t.Fatalf("order %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPriorityRequeuePosition(t *testing.T) {
	m := newDriver(cfgWith(func(c *Config) { c.MaxPriority = 3 }))
	for _, p := range []uint8{1, 1, 3, 1, 3} { // ids 1..5
		publish(t, m, 1, p, 0, t0)
	}
	m.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 4})
	first, _ := m.CheckoutAt(nil, 0, nil, t0)
	if !slices.Equal(ids(first), []uint64{3, 5, 1, 2}) {
		t.Fatalf("first %v", ids(first))
	}
	publish(t, m, 1, 1, 0, t0) // 6
	publish(t, m, 1, 2, 0, t0) // 7
	for _, id := range []uint64{2, 5} {
		if d, ok := m.ReturnAt(id); !ok || d != nil {
			t.Fatalf("ReturnAt(%d) = %v, %v", id, d, ok)
		}
	}
	m.AddConsumer(ConsumerSpec{ID: 1})
	second, _ := m.CheckoutAt(nil, 0, nil, t0)
	// 5 goes back before everything of priority 3; 2 before 4 and 6 within priority 1.
	if !slices.Equal(ids(second), []uint64{5, 7, 2, 4, 6}) {
		t.Fatalf("second %v", ids(second))
	}
	// A priority queue restored from storage keeps each message's priority.
	r := newDriver(cfgWith(func(c *Config) { c.MaxPriority = 3 }))
	r.RestoreAt(10, 0, 0, 0, 1)
	r.RestoreAt(11, 0, 0, 0, 9)
	r.RestoreAt(12, 0, 0, 0, 2)
	if got := drain(r, t0); !slices.Equal(got, []uint64{11, 12, 10}) {
		t.Fatalf("restored order %v", got)
	}
}

func TestRestoreAtKeepsDeadline(t *testing.T) {
	m := newDriver(cfgWith(func(c *Config) { c.MessageTTL = 10 }))
	m.RestoreAt(5, 1, 2, t0+100, 0)
	m.RestoreAt(6, 1, 0, 0, 0) // no deadline: the queue TTL is not applied again
	m.RestoreAt(7, 1, 0, t0-1, 0)
	if dead := m.Expire(t0); !slices.Equal(deadIDs(dead), []uint64{7}) {
		t.Fatalf("Expire(t0) = %v", deadIDs(dead))
	}
	dead := m.Expire(t0 + 100)
	if !slices.Equal(deadIDs(dead), []uint64{5}) || dead[0].DeliveryCount != 2 || dead[0].flags != 1 {
		t.Fatalf("Expire(t0+100) = %+v", dead)
	}
	d, ok, _ := m.GetAt(false, t0+1_000_000)
	if !ok || d.ID != 6 || !d.Redelivered {
		t.Fatalf("GetAt = %+v, %v", d, ok)
	}
}

func TestDeliveryLimit(t *testing.T) {
	// RabbitMQ quorum queues (rabbit_fifo return_one): the delivery count is incremented on
	// return and the message is dead-lettered once it is greater than the limit, so with limit N
	// a message is delivered N+1 times.
	for _, limit := range []int64{-1, 0, 1, 2, 5} {
		t.Run(fmt.Sprint("limit", limit), func(t *testing.T) {
			m := newDriver(cfgWith(func(c *Config) { c.DeliveryLimit = limit }))
			m.AddConsumer(ConsumerSpec{ID: 1})
			id := publish(t, m, 3, 0, 0, t0)
			deliveries := 0
			for deliveries < 20 {
				ds, _ := m.CheckoutAt(nil, 0, nil, t0)
				if len(ds) == 0 {
					break
				}
				if ds[0].DeliveryCount != uint32(deliveries) {
					t.Fatalf("delivery %d has count %d", deliveries, ds[0].DeliveryCount)
				}
				deliveries++
				dead, ok := m.ReturnAt(id)
				if !ok {
					t.Fatal("ReturnAt failed")
				}
				if dead != nil {
					if len(dead) != 1 || dead[0] != (Dead{ID: id, Msg: ds[0].Msg, Reason: ReasonDeliveryLimit, DeliveryCount: uint32(limit) + 1, size: 3}) {
						t.Fatalf("dead %+v", dead)
					}
					if m.Len() != 0 {
						t.Fatalf("dead message still in the queue: len %d", m.Len())
					}
				}
			}
			want := int(limit) + 1
			if limit < 0 {
				want = 20
			}
			if deliveries != want {
				t.Fatalf("%d deliveries, want %d", deliveries, want)
			}
		})
	}
}

func TestDiscardDeadAndReturnOverLimit(t *testing.T) {
	m := newDriver(cfgWith(func(c *Config) { c.DeliveryLimit = 0; c.MessageTTL = 100 }))
	m.AddConsumer(ConsumerSpec{ID: 1})
	a := publish(t, m, 2, 0, 0, t0)
	b := publish(t, m, 2, 0, 0, t0)
	c := publish(t, m, 2, 0, 0, t0)
	m.CheckoutAt(nil, 0, nil, t0)
	if dead, ok := m.ReturnAt(a); !ok || len(dead) != 1 || dead[0].ID != a || dead[0].Reason != ReasonDeliveryLimit {
		t.Fatalf("ReturnAt over the limit = %+v, %v", dead, ok)
	}
	d, ok := m.DiscardDead(b)
	if !ok || d.ID != b || d.Reason != ReasonRejected || d.size != 2 {
		t.Fatalf("DiscardDead = %+v, %v", d, ok)
	}
	if _, ok := m.DiscardDead(b); ok {
		t.Fatal("second DiscardDead succeeded")
	}
	if len(m.timed) != 1 || m.timed[c].e.id != c {
		t.Fatalf("timed records %d", len(m.timed))
	}
}

func TestSingleActiveConsumer(t *testing.T) {
	type step struct {
		op     string // add, remove, checkout, settle
		spec   ConsumerSpec
		id     uint64
		active ConsumerID // expected afterwards (0: none)
		got    []got      // expected deliveries of checkout
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first attached is active; next in attach order on removal", []step{
			{op: "add", spec: ConsumerSpec{ID: 1, Prefetch: 3}, active: 1},
			{op: "add", spec: ConsumerSpec{ID: 2}, active: 1},
			{op: "add", spec: ConsumerSpec{ID: 3}, active: 1},
			{op: "checkout", active: 1, got: []got{{1, 1}, {1, 2}, {1, 3}}},
			{op: "remove", spec: ConsumerSpec{ID: 1}, active: 2},
			{op: "checkout", active: 2, got: []got{{2, 4}, {2, 5}, {2, 6}}},
			{op: "remove", spec: ConsumerSpec{ID: 3}, active: 2},
			{op: "remove", spec: ConsumerSpec{ID: 2}, active: 0},
		}},
		{"highest priority takes over on removal", []step{
			{op: "add", spec: ConsumerSpec{ID: 1, Priority: 5}, active: 1},
			{op: "add", spec: ConsumerSpec{ID: 2}, active: 1},
			{op: "add", spec: ConsumerSpec{ID: 3, Priority: 1}, active: 1},
			{op: "add", spec: ConsumerSpec{ID: 4, Priority: 1}, active: 1},
			{op: "remove", spec: ConsumerSpec{ID: 1}, active: 3},
			{op: "remove", spec: ConsumerSpec{ID: 3}, active: 4},
		}},
		{"higher priority takes over once unacked drain", []step{
			{op: "add", spec: ConsumerSpec{ID: 1, Prefetch: 2}, active: 1},
			{op: "checkout", active: 1, got: []got{{1, 1}, {1, 2}}},
			{op: "add", spec: ConsumerSpec{ID: 2, Priority: 1}, active: 1},
			{op: "settle", id: 1, active: 1},
			{op: "checkout", active: 1}, // quiescing: nobody gets anything
			{op: "settle", id: 2, active: 2},
			{op: "checkout", active: 2, got: []got{{2, 3}, {2, 4}, {2, 5}, {2, 6}}},
		}},
		{"higher priority takes over at once when nothing is unacked", []step{
			{op: "add", spec: ConsumerSpec{ID: 1}, active: 1},
			{op: "add", spec: ConsumerSpec{ID: 2, Priority: 1}, active: 2},
			{op: "add", spec: ConsumerSpec{ID: 3, Priority: 1}, active: 2},
			{op: "checkout", active: 2, got: []got{{2, 1}, {2, 2}, {2, 3}, {2, 4}, {2, 5}, {2, 6}}},
		}},
		{"equal priority does not take over", []step{
			{op: "add", spec: ConsumerSpec{ID: 1, Priority: 2}, active: 1},
			{op: "add", spec: ConsumerSpec{ID: 2, Priority: 2}, active: 1},
			{op: "checkout", active: 1, got: []got{{1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5}, {1, 6}}},
		}},
		{"the waiting candidate leaves: the active one resumes", []step{
			{op: "add", spec: ConsumerSpec{ID: 1, Prefetch: 1}, active: 1},
			{op: "checkout", active: 1, got: []got{{1, 1}}},
			{op: "add", spec: ConsumerSpec{ID: 2, Priority: 1}, active: 1},
			{op: "remove", spec: ConsumerSpec{ID: 2}, active: 1},
			{op: "settle", id: 1, active: 1},
			{op: "checkout", active: 1, got: []got{{1, 2}}},
		}},
		{"the quiescing consumer leaves: the candidate takes over at once", []step{
			{op: "add", spec: ConsumerSpec{ID: 1, Prefetch: 1}, active: 1},
			{op: "checkout", active: 1, got: []got{{1, 1}}},
			{op: "add", spec: ConsumerSpec{ID: 2, Priority: 1, Prefetch: 1}, active: 1},
			{op: "remove", spec: ConsumerSpec{ID: 1}, active: 2},
			{op: "checkout", active: 2, got: []got{{2, 2}}},
		}},
		{"raising the active one's priority keeps it", []step{
			{op: "add", spec: ConsumerSpec{ID: 1, Prefetch: 1}, active: 1},
			{op: "checkout", active: 1, got: []got{{1, 1}}},
			{op: "add", spec: ConsumerSpec{ID: 2, Priority: 1}, active: 1},
			{op: "add", spec: ConsumerSpec{ID: 1, Priority: 3}, active: 1},
			{op: "settle", id: 1, active: 1},
			{op: "checkout", active: 1, got: []got{{1, 2}, {1, 3}, {1, 4}, {1, 5}, {1, 6}}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newDriver(cfgWith(func(c *Config) { c.SingleActiveConsumer = true }))
			for range 6 {
				publish(t, m, 1, 0, 0, t0)
			}
			for i, s := range tt.steps {
				switch s.op {
				case "add":
					m.AddConsumer(s.spec)
				case "remove":
					m.RemoveConsumer(s.spec.ID)
				case "settle":
					if !m.Settle(s.id) {
						t.Fatalf("step %d: Settle(%d) failed", i, s.id)
					}
				case "checkout":
					ds, _ := m.CheckoutAt(nil, 0, nil, t0)
					if !slices.Equal(gots(ds), s.got) {
						t.Fatalf("step %d: got %v, want %v", i, gots(ds), s.got)
					}
				}
				id, ok := m.ActiveConsumer()
				if ok != (s.active != 0) || id != s.active {
					t.Fatalf("step %d (%s): active %d %v, want %d", i, s.op, id, ok, s.active)
				}
				checkConsumers(t, m)
			}
		})
	}
	if _, ok := newDriver(DefaultConfig()).ActiveConsumer(); ok {
		t.Fatal("ActiveConsumer on a normal queue")
	}
}

func TestConsumerTimeout(t *testing.T) {
	m := newDriver(cfgWith(func(c *Config) { c.DeliveryLimit = 1 }))
	timeouts := map[ConsumerID]int64{1: 100, 2: 50, 3: 0}
	timeout := func(c ConsumerID) int64 { return timeouts[c] }
	for id := range ConsumerID(3) {
		m.AddConsumer(ConsumerSpec{ID: id + 1, Prefetch: 2})
	}
	for range 8 {
		publish(t, m, 1, 0, 0, t0)
	}
	m.CheckoutAt(nil, 3, nil, t0) // 1:{1} 2:{2} 3:{3}
	m.CheckoutAt(nil, 3, nil, t0+40)
	// 1:{1,4} 2:{2,5} 3:{3,6}
	if d, ok := m.NextTimeout(timeout); !ok || d != t0+50 {
		t.Fatalf("NextTimeout = %d, %v", d-t0, ok)
	}
	if got := m.TimedOut(t0+49, timeout); len(got) != 0 {
		t.Fatalf("TimedOut early = %v", got)
	}
	if got := m.TimedOut(t0+50, timeout); !slices.Equal(got, []ConsumerID{2}) {
		t.Fatalf("TimedOut = %v", got)
	}
	// Acking the oldest delivery moves the deadline to the next one.
	m.Settle(2)
	if d, ok := m.NextTimeout(timeout); !ok || d != t0+90 {
		t.Fatalf("NextTimeout after ack = %d, %v", d-t0, ok)
	}
	if got := m.TimedOut(t0+1000, timeout); !slices.Equal(got, []ConsumerID{1, 2}) {
		t.Fatalf("TimedOut = %v", got)
	}
	// The caller cancels consumer 1 and requeues its messages.
	m.RemoveConsumer(1)
	requeued, dead := m.ReturnConsumer(1)
	if !slices.Equal(requeued, []uint64{1, 4}) || len(dead) != 0 {
		t.Fatalf("ReturnConsumer = %v, %+v", requeued, dead)
	}
	if got := m.TimedOut(t0+1000, timeout); !slices.Equal(got, []ConsumerID{2}) {
		t.Fatalf("TimedOut after cancel = %v", got)
	}
	// Redelivered (count 1), then timed out again: over the limit of 1.
	m.Settle(5)
	ds, _ := m.CheckoutAt(nil, 0, nil, t0+2000)
	if !slices.Equal(gots(ds), []got{{2, 1}, {2, 4}}) {
		t.Fatalf("redelivery %v", gots(ds))
	}
	if d, ok := m.NextTimeout(timeout); !ok || d != t0+2050 {
		t.Fatalf("NextTimeout after redelivery = %d, %v", d-t0, ok)
	}
	// Returned a second time, message 1 is over the limit of 1: dead-lettered, not requeued.
	if dead, ok := m.ReturnAt(1); !ok || !slices.Equal(deadIDs(dead), []uint64{1}) || dead[0].DeliveryCount != 2 {
		t.Fatalf("second return of 1 = %+v, %v", dead, ok)
	}
	ds, _ = m.CheckoutAt(nil, 0, nil, t0+2010) // 7
	requeued, dead = m.ReturnConsumer(2)
	if !slices.Equal(requeued, []uint64{7}) || !slices.Equal(deadIDs(dead), []uint64{4}) || dead[0].DeliveryCount != 2 {
		t.Fatalf("ReturnConsumer(2) = %v, %+v (deliveries %v)", requeued, dead, gots(ds))
	}
	// Messages delivered without a time never time out.
	m.Checkout(nil, 0, nil)
	if _, ok := m.NextTimeout(func(ConsumerID) int64 { return 1 }); !ok {
		t.Fatal("consumer 3 has timed deliveries")
	}
	if got := m.TimedOut(t0+1_000_000, func(ConsumerID) int64 { return 1 }); !slices.Equal(got, []ConsumerID{3}) {
		t.Fatalf("TimedOut = %v", got)
	}
	n := newDriver(DefaultConfig())
	n.AddConsumer(ConsumerSpec{ID: 1})
	n.Enqueue(&Message{})
	n.Checkout(nil, 0, nil)
	if _, ok := n.NextTimeout(func(ConsumerID) int64 { return 1 }); ok {
		t.Fatal("untimed delivery has a timeout")
	}
}

func TestMachineMatchesLifecycleModel(t *testing.T) {
	seeds, steps := 400, 500
	if testing.Short() {
		seeds = 40
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runLifecycleModel(t, seed, steps) })
	}
}

func pick[T any](rng *rand.Rand, xs ...T) T { return xs[rng.IntN(len(xs))] }

func (md *model) full(size uint32) bool {
	return (md.cfg.MaxLength >= 0 && int64(len(md.ready)) >= md.cfg.MaxLength) ||
		(md.cfg.MaxLengthBytes >= 0 && int64(md.bytes())+int64(size) > md.cfg.MaxLengthBytes)
}

func (md *model) publish(msg *Message, size uint32) (uint64, bool, []Dead) {
	if md.cfg.Overflow != DropHead && md.full(size) {
		var dead []Dead
		if md.cfg.Overflow == RejectPublishDLX {
			dead = []Dead{{Msg: msg, Reason: ReasonMaxLen, size: size}}
		}
		return 0, false, dead
	}
	id := md.nextID
	md.nextID++
	mm := modelMsg{id: id, msg: msg, size: size, prio: min(msg.Priority, md.cfg.MaxPriority)}
	d := msg.ExpiresAt
	if ttl := md.cfg.MessageTTL; ttl >= 0 && (d == 0 || md.now+ttl < d) {
		d = md.now + ttl
	}
	if d != 0 {
		canTake := false
		for _, c := range md.consumers {
			canTake = canTake || md.receives(c)
		}
		if d <= md.now && !canTake {
			return id, true, []Dead{{ID: id, Msg: msg, Reason: ReasonExpired, size: size}}
		}
		mm.deadline, mm.atOnce = d, d <= md.now
	}
	md.insertReady(mm)
	return id, true, md.trim()
}

func (md *model) nextExpiry() (int64, bool) {
	var best int64
	ok := false
	for _, r := range md.ready {
		if r.deadline != 0 && !r.atOnce && (!ok || r.deadline < best) {
			best, ok = r.deadline, true
		}
	}
	return best, ok
}

// oldest returns the earliest time a consumer's unacked messages were delivered at.
func (md *model) oldest(c *modelConsumer) (int64, bool) {
	var best int64
	ok := false
	for _, u := range md.unacked {
		if u.owner == c && u.at != 0 && (!ok || u.at < best) {
			best, ok = u.at, true
		}
	}
	return best, ok
}

func runLifecycleModel(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 0x11fe))
	cfg := Config{
		MaxPriority:          pick[uint8](rng, 0, 0, 1, 3),
		MessageTTL:           pick[int64](rng, -1, -1, 0, 20, 100),
		MaxLength:            pick[int64](rng, -1, -1, 0, 3, 8),
		MaxLengthBytes:       pick[int64](rng, -1, -1, 20),
		Overflow:             pick(rng, DropHead, RejectPublish, RejectPublishDLX),
		DeliveryLimit:        pick[int64](rng, -1, 0, 2),
		SingleActiveConsumer: rng.IntN(3) == 0,
	}
	m := newDriver(cfg)
	md := newModel(cfg)
	md.now = t0
	randID := func() uint64 { return uint64(rng.IntN(int(md.nextID) + 2)) }
	timeout := func(id ConsumerID) int64 { return int64(id%3) * 25 }

	for step := range steps {
		switch op := rng.IntN(100); {
		case op < 26:
			size := rng.IntN(8)
			msg := &Message{Body: make([]byte, size), Priority: uint8(rng.IntN(5))}
			if rng.IntN(3) == 0 {
				msg.ExpiresAt = md.now + int64(rng.IntN(80)) - 10
			}
			id, ok, dead := m.Publish(msg, uint32(size), 0, md.now)
			wid, wok, wdead := md.publish(msg, uint32(size))
			if id != wid || ok != wok {
				t.Fatalf("step %d: Publish = %d %v, want %d %v", step, id, ok, wid, wok)
			}
			checkDead(t, fmt.Sprint("step ", step, " Publish"), dead, wdead)
		case op < 33:
			md.now += int64(rng.IntN(40))
		case op < 39:
			addConsumer(rng, m, md)
		case op < 42:
			removeConsumer(t, step, rng, m, md)
		case op < 58:
			checkout(t, rng, m, md, true)
		case op < 63:
			noAck := rng.IntN(2) == 0
			d, ok, dead := m.GetAt(noAck, md.now)
			checkDead(t, fmt.Sprint("step ", step, " GetAt"), dead, md.expire())
			if ok != (len(md.ready) > 0) {
				t.Fatalf("step %d: GetAt ok = %v with %d ready", step, ok, len(md.ready))
			}
			if ok {
				md.deliver(t, d, nil, noAck, md.now)
			}
		case op < 73:
			id := randID()
			_, want := md.take(id)
			if got := m.Settle(id); got != want {
				t.Fatalf("step %d: Settle(%d) = %v, want %v", step, id, got, want)
			}
		case op < 83:
			id := randID()
			// A return dead-letters the message over the delivery limit, then trims the head
			// of a drop-head queue over its length limit.
			dead, ok := m.ReturnAt(id)
			wd, wok := md.returnAt(id)
			if ok != wok {
				t.Fatalf("step %d: ReturnAt(%d) = %v, want %v", step, id, ok, wok)
			}
			var want []Dead
			if wd != nil {
				want = append(want, *wd)
			}
			if wok {
				want = append(want, md.trim()...)
			}
			checkDead(t, fmt.Sprint("step ", step, " ReturnAt"), dead, want)
		case op < 87:
			id := randID()
			d, ok := m.DiscardDead(id)
			mm, wok := md.take(id)
			if ok != wok || (ok && d != mdDead(mm, ReasonRejected, mm.count)) {
				t.Fatalf("step %d: DiscardDead(%d) = %+v %v", step, id, d, ok)
			}
		case op < 91:
			checkDead(t, fmt.Sprint("step ", step, " Expire"), m.Expire(md.now), md.expire())
		case op < 94:
			d, ok := m.NextExpiry()
			wd, wok := md.nextExpiry()
			if d != wd || ok != wok {
				t.Fatalf("step %d: NextExpiry = %d %v, want %d %v", step, d, ok, wd, wok)
			}
		case op < 97:
			var want []ConsumerID
			var wnext int64
			wok := false
			for id, c := range md.consumers {
				if to := timeout(id); to > 0 {
					if at, ok := md.oldest(c); ok {
						if md.now-at >= to {
							want = append(want, id)
						}
						if !wok || at+to < wnext {
							wnext, wok = at+to, true
						}
					}
				}
			}
			slices.Sort(want)
			if got := m.TimedOut(md.now, timeout); !slices.Equal(got, want) {
				t.Fatalf("step %d: TimedOut = %v, want %v", step, got, want)
			}
			if next, ok := m.NextTimeout(timeout); next != wnext || ok != wok {
				t.Fatalf("step %d: NextTimeout = %d %v, want %d %v", step, next, ok, wnext, wok)
			}
		case op < 99:
			cid := ConsumerID(1 + rng.IntN(6))
			var uids []uint64
			for id, u := range md.unacked {
				if u.owner != nil && u.owner.spec.ID == cid {
					uids = append(uids, id)
				}
			}
			slices.Sort(uids)
			var wreq []uint64
			var wdead []Dead
			for _, id := range uids {
				if d, _ := md.returnAt(id); d != nil {
					wdead = append(wdead, *d)
				} else {
					wreq = append(wreq, id)
				}
			}
			wdead = append(wdead, md.trim()...)
			req, dead := m.ReturnConsumer(cid)
			if !slices.Equal(req, wreq) {
				t.Fatalf("step %d: ReturnConsumer(%d) requeued %v, want %v", step, cid, req, wreq)
			}
			checkDead(t, fmt.Sprint("step ", step, " ReturnConsumer"), dead, wdead)
		default:
			if got := m.Purge(); got != len(md.ready) {
				t.Fatalf("step %d: Purge = %d, want %d", step, got, len(md.ready))
			}
			md.ready = nil
		}
		md.sac()
		compare(t, step, m, md)
	}
}

// BenchmarkPublishCheckoutAtTTL measures the lifecycle path: publish with a queue TTL, checkout at
// a time (recording it for consumer timeouts), ack.
func BenchmarkPublishCheckoutAtTTL(b *testing.B) {
	s := newBenchState(cfgWith(func(c *Config) { c.MessageTTL = 60_000; c.MaxLength = 1000 }),
		Command{Type: CmdConsume, Consumer: 1, Prefetch: 100})
	msg := &Message{Body: make([]byte, 64)}
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now++
		s.enqueue(msg, now)
		d := s.checkout(0, now)[0]
		s.settle(&s.ack, d.Tag())
	}
}

// BenchmarkExpireBehindLongLived measures expiring short-TTL messages stuck behind a long-lived
// head, which RabbitMQ only expires at the head.
func BenchmarkExpireBehindLongLived(b *testing.B) {
	s := newBenchState(cfgWith(func(c *Config) { c.MessageTTL = 1000 }))
	s.enqueue(&Message{ExpiresAt: 1 << 62}, t0)
	msg := &Message{Body: make([]byte, 64)}
	tick := Command{Type: CmdTick}
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now++
		s.enqueue(msg, now)
		s.fx.Reset()
		s.s.Apply(&tick, now, &s.fx)
	}
}

func TestSweepReturnedTombstones(t *testing.T) {
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 1})
	var keep []uint64
	for i := range 100 {
		exp := int64(0)
		if i%5 != 0 {
			exp = t0 + 100
		}
		if id := publish(t, m, 1, 0, exp, t0); exp == 0 {
			keep = append(keep, id)
		}
	}
	ds, _ := m.CheckoutAt(nil, 0, nil, t0)
	for i := len(ds) - 1; i >= 0; i-- {
		m.ReturnAt(ds[i].ID)
	}
	if dead := m.Expire(t0 + 100); len(dead) != 80 || m.tombs != 0 || len(m.levels[0].returned) != 20 {
		t.Fatalf("dead %d, tombstones %d, returned %d", len(dead), m.tombs, len(m.levels[0].returned))
	}
	ds, _ = m.CheckoutAt(nil, 0, nil, t0+100)
	if !slices.Equal(ids(ds), keep) {
		t.Fatalf("after sweep %v, want %v", ids(ds), keep)
	}
	for _, d := range ds {
		if !d.Redelivered || d.DeliveryCount != 1 {
			t.Fatalf("delivery %+v", d)
		}
	}
}

func TestTimeoutRecordsCompacted(t *testing.T) {
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 1})
	publish(t, m, 1, 0, 0, t0)
	m.CheckoutAt(nil, 0, nil, t0) // held: its record stays at the front
	for i := range int64(1000) {
		publish(t, m, 1, 0, 0, t0+i)
		ds, _ := m.CheckoutAt(nil, 0, nil, t0+i)
		if fl, ok := m.SettleEntry(ds[0].ID); !ok || fl != 0 {
			t.Fatal("SettleEntry failed")
		}
	}
	if n := m.consumers[1].sent.Len(); n > 64 {
		t.Fatalf("%d timeout records for 1 unacked message", n)
	}
	if d, ok := m.NextTimeout(func(ConsumerID) int64 { return 10 }); !ok || d != t0+10 {
		t.Fatalf("NextTimeout = %d, %v", d-t0, ok)
	}
	if msg, fl, ok := m.DiscardEntry(1); !ok || msg == nil || fl != 0 {
		t.Fatal("DiscardEntry failed")
	}
	if _, ok := m.NextTimeout(func(ConsumerID) int64 { return 10 }); ok || m.consumers[1].sent.Len() != 0 {
		t.Fatal("timeout left after the last ack")
	}
}
