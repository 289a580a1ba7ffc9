package queue

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"warren/storage"
)

// openDB opens a storage engine in a temporary directory, closed at the end of the test.
func openDB(t testing.TB, dir string) *storage.DB {
	t.Helper()
	db, err := storage.Open(storage.Options{Dir: dir, NoSync: true, GCInterval: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// openClassic opens a classic queue through its Type, closed at the end of the test.
func openClassic(t testing.TB, cfg OpenConfig) *Classic {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "q"
	}
	if cfg.Lifecycle == (Config{}) {
		cfg.Lifecycle = DefaultConfig()
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	q, err := ClassicType{}.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Close)
	return q.(*Classic)
}

func consume(t testing.TB, q Queue, spec ConsumeSpec, c Consumer) {
	t.Helper()
	if err := q.Consume(spec, c); err != nil {
		t.Fatalf("consume %d: %v", spec.ID, err)
	}
}

func settle(t testing.TB, q Queue, op SettleOp, tags []Tag) {
	t.Helper()
	if err := q.Settle(1, op, tags); err != nil {
		t.Fatal(err)
	}
}

func TestClassicPublishDeliverAck(t *testing.T) {
	q := openClassic(t, OpenConfig{})
	if q.Kind() != "classic" || q.Name() != "q" {
		t.Fatalf("kind %q name %q", q.Kind(), q.Name())
	}
	for i := range 3 {
		q.Publish(body(fmt.Sprint("m", i)), nil)
	}
	c := &tconsumer{}
	added := false
	consume(t, q, ConsumeSpec{ID: 1, Prefetch: 2, OnAdded: func() { added = c.count() == 0 }}, c)
	if !added {
		t.Fatal("OnAdded did not run before the first delivery")
	}
	waitFor(t, "two deliveries (prefetch 2)", func() bool { return c.count() == 2 })
	if st := q.Stats(); st.Ready != 1 || st.Unacked != 2 || st.Consumers != 1 || st.ReadyBytes != 2 {
		t.Fatalf("stats %+v", st)
	}
	settle(t, q, SettleAck, c.take())
	waitFor(t, "the third delivery", func() bool { return c.count() == 1 })
	if got := c.bodies(); !slices.Equal(got, []string{"m2"}) {
		t.Fatalf("bodies %v", got)
	}
	settle(t, q, SettleAck, c.take())
	if st := q.Stats(); st.Ready != 0 || st.Unacked != 0 {
		t.Fatalf("stats after acks %+v", st)
	}
	if q.Cancel(1) {
		t.Fatal("a queue that is not auto-delete reported auto-delete")
	}
}

// Settlements name deliveries: applied twice (or late), they never touch a later delivery of the
// same message.
func TestClassicSettleByTag(t *testing.T) {
	q := openClassic(t, OpenConfig{})
	c := &tconsumer{}
	consume(t, q, ConsumeSpec{ID: 1}, c)
	q.Publish(body("a"), nil)
	waitFor(t, "delivery", func() bool { return c.count() == 1 })
	first := c.take()
	settle(t, q, SettleRequeue, first)
	waitFor(t, "redelivery", func() bool { return c.count() == 1 })
	second := c.deliveries()[0]
	if !second.Redelivered || second.DeliveryCount != 1 {
		t.Fatalf("redelivery %+v", second)
	}
	// The first delivery's tag again (a retry): neither requeues nor acks the redelivery.
	settle(t, q, SettleRequeue, first)
	settle(t, q, SettleAck, first)
	if st := q.Stats(); st.Unacked != 1 || st.Ready != 0 {
		t.Fatalf("stale tags changed the queue: %+v", st)
	}
	settle(t, q, SettleAck, []Tag{second.Tag()})
	settle(t, q, SettleAck, []Tag{second.Tag()}) // twice: nothing left to ack
	if st := q.Stats(); st.Unacked != 0 || st.Ready != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// done is called exactly once for every publish, whatever happens to it.
func TestClassicDoneOnce(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	tests := []struct {
		name    string
		cfg     OpenConfig
		prepare func(t *testing.T, q *Classic)
		msg     *Message
		status  PublishStatus
		err     error
		sync    bool // done runs before Publish returns
	}{
		{name: "transient", cfg: OpenConfig{DB: db, ID: 1}, msg: body("x"), status: Accepted, sync: true},
		{name: "stored", cfg: OpenConfig{DB: db, ID: 2, Durable: true},
			msg: &Message{Body: []byte("x"), Persistent: true}, status: Accepted},
		{name: "rejected", cfg: OpenConfig{DB: db, ID: 3, Lifecycle: cfgWith(func(c *Config) { c.MaxLength = 0; c.Overflow = RejectPublish })},
			msg: body("x"), status: Rejected, err: ErrRejected, sync: true},
		{name: "rejected stored", cfg: OpenConfig{DB: db, ID: 4, Durable: true, Lifecycle: cfgWith(func(c *Config) { c.MaxLength = 0; c.Overflow = RejectPublishDLX })},
			msg: &Message{Body: []byte("x"), Persistent: true}, status: Rejected, err: ErrRejected, sync: true},
		{name: "gone", cfg: OpenConfig{DB: db, ID: 5}, prepare: func(t *testing.T, q *Classic) { q.Delete() },
			msg: body("x"), status: Gone, err: ErrGone, sync: true},
		{name: "paged", cfg: OpenConfig{DB: db, ID: 6, Extra: &ClassicConfig{PageWindow: 2}},
			prepare: func(t *testing.T, q *Classic) { q.Publish(body("a"), nil); q.Publish(body("b"), nil) },
			msg:     body("x"), status: Accepted},
		{name: "inline", cfg: OpenConfig{DB: db, ID: 7},
			prepare: func(t *testing.T, q *Classic) { consume(t, q, ConsumeSpec{ID: 1}, &tconsumer{}) },
			msg:     body("x"), status: Accepted, sync: true},
		{name: "inline stored", cfg: OpenConfig{DB: db, ID: 8, Durable: true},
			prepare: func(t *testing.T, q *Classic) { consume(t, q, ConsumeSpec{ID: 1}, &tconsumer{}) },
			msg:     &Message{Body: []byte("x"), Persistent: true}, status: Accepted},
		{name: "expired at once", cfg: OpenConfig{DB: db, ID: 9, Durable: true, Lifecycle: cfgWith(func(c *Config) { c.MessageTTL = 0 })},
			msg: &Message{Body: []byte("x"), Persistent: true}, status: Accepted},
		{name: "duplicate", cfg: OpenConfig{DB: db, ID: 10},
			prepare: func(t *testing.T, q *Classic) { q.Publish(&Message{Dedupe: DedupeKey{Source: 4, Seq: 1}}, nil) },
			msg:     &Message{Dedupe: DedupeKey{Source: 4, Seq: 1}}, status: Accepted, sync: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Hooks = &thooks{}
			q := openClassic(t, tt.cfg)
			if tt.prepare != nil {
				tt.prepare(t, q)
			}
			d := newDone(t)
			if st := q.Publish(tt.msg, d); st != tt.status {
				t.Fatalf("status %d, want %d", st, tt.status)
			}
			if tt.sync && !d.called() {
				t.Fatal("done not called before Publish returned")
			}
			if err := d.wait(); !errors.Is(err, tt.err) {
				t.Fatalf("done(%v), want %v", err, tt.err)
			}
			q.Close()
			if d.calls.Load() != 1 {
				t.Fatalf("done called %d times", d.calls.Load())
			}
		})
	}
	// A nil Done is allowed on every path.
	q := openClassic(t, OpenConfig{DB: db, ID: 11, Durable: true})
	q.Publish(&Message{Persistent: true}, nil)
}

// A dead letter handed over twice (its source's at-least-once hand-over) is taken once.
func TestClassicDedupe(t *testing.T) {
	q := openClassic(t, OpenConfig{})
	k := DedupeKey{Source: 9, Seq: 1}
	for _, m := range []*Message{{Body: []byte("a"), Dedupe: k}, {Body: []byte("a again"), Dedupe: k},
		{Body: []byte("b"), Dedupe: DedupeKey{Source: 9, Seq: 2}}, {Body: []byte("c"), Dedupe: DedupeKey{Source: 8, Seq: 1}}, body("plain"), body("plain")} {
		if st := q.Publish(m, nil); st != Accepted {
			t.Fatalf("status %d", st)
		}
	}
	if st := q.Stats(); st.Ready != 5 {
		t.Fatalf("ready %d, want 5 (one duplicate dropped)", st.Ready)
	}
}

func TestClassicExclusiveConsumer(t *testing.T) {
	q := openClassic(t, OpenConfig{})
	consume(t, q, ConsumeSpec{ID: 1}, &tconsumer{})
	if err := q.Consume(ConsumeSpec{ID: 2, Exclusive: true}, &tconsumer{}); !errors.Is(err, ErrInExclusiveUse) {
		t.Fatalf("exclusive with another consumer: %v", err)
	}
	q.Cancel(1)
	consume(t, q, ConsumeSpec{ID: 2, Exclusive: true}, &tconsumer{})
	if err := q.Consume(ConsumeSpec{ID: 3}, &tconsumer{}); !errors.Is(err, ErrInExclusiveUse) {
		t.Fatalf("consumer beside an exclusive one: %v", err)
	}
	q.Cancel(2)
	consume(t, q, ConsumeSpec{ID: 3}, &tconsumer{})
}

func TestClassicAutoDelete(t *testing.T) {
	q := openClassic(t, OpenConfig{AutoDelete: true})
	consume(t, q, ConsumeSpec{ID: 1}, &tconsumer{})
	consume(t, q, ConsumeSpec{ID: 2}, &tconsumer{})
	if q.Cancel(1) || q.Cancel(7) {
		t.Fatal("auto-delete with a consumer left, or for an unknown consumer")
	}
	if !q.Cancel(2) {
		t.Fatal("last consumer gone: not auto-deleted")
	}
}

// A consumer that cannot take more (its connection is full) is skipped until it kicks the queue.
func TestClassicReserveBackPressure(t *testing.T) {
	q := openClassic(t, OpenConfig{})
	c := &tconsumer{noRoom: true}
	consume(t, q, ConsumeSpec{ID: 1}, c)
	for i := range 10 {
		q.Publish(body(fmt.Sprint(i)), nil)
	}
	waitFor(t, "reserve asked", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.reserves > 0 })
	if c.count() != 0 {
		t.Fatal("delivered to a consumer without room")
	}
	c.setRoom(true)
	waitFor(t, "all delivered after the kick", func() bool { return c.count() == 10 })
}

// A delivery to a consumer that went away (Deliver returns false) goes back to the queue.
func TestClassicDeliverRefusedTakesBack(t *testing.T) {
	q := openClassic(t, OpenConfig{})
	gone := &tconsumer{}
	gone.close()
	consume(t, q, ConsumeSpec{ID: 1}, gone)
	q.Publish(body("a"), nil)
	waitFor(t, "taken back", func() bool { st := q.Stats(); return st.Ready == 1 && st.Unacked == 0 })
	q.Cancel(1)
	c := &tconsumer{}
	consume(t, q, ConsumeSpec{ID: 2}, c)
	waitFor(t, "redelivered", func() bool { return c.count() == 1 })
	if d := c.deliveries()[0]; !d.Redelivered || string(d.Msg.Body) != "a" {
		t.Fatalf("delivery %+v", d)
	}
}

func TestClassicGetPurge(t *testing.T) {
	q := openClassic(t, OpenConfig{})
	if _, n, ok, err := q.Get(false); ok || n != 0 || err != nil {
		t.Fatalf("get on empty = %d %v %v", n, ok, err)
	}
	for i := range 4 {
		q.Publish(body(fmt.Sprint(i)), nil)
	}
	d, n, ok, err := q.Get(false)
	if !ok || err != nil || n != 3 || string(d.Msg.Body) != "0" || d.Settled {
		t.Fatalf("get = %+v %d %v %v", d, n, ok, err)
	}
	if d, n, ok, _ := q.Get(true); !ok || n != 2 || !d.Settled {
		t.Fatalf("get no-ack = %+v %d %v", d, n, ok)
	}
	if n, err := q.Purge(); n != 2 || err != nil {
		t.Fatalf("purge = %d %v", n, err)
	}
	settle(t, q, SettleRequeue, []Tag{d.Tag()})
	if st := q.Stats(); st.Ready != 1 || st.Unacked != 0 {
		t.Fatalf("stats %+v", st)
	}
	q.Delete()
	if _, _, _, err := q.Get(false); !errors.Is(err, ErrGone) {
		t.Fatalf("get on a deleted queue: %v", err)
	}
	if _, err := q.Purge(); !errors.Is(err, ErrGone) {
		t.Fatalf("purge on a deleted queue: %v", err)
	}
}

// Deleting a queue tells its consumers and deletes its stored records.
func TestClassicDelete(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	defer db.Close()
	q := openClassic(t, OpenConfig{DB: db, ID: 3, Durable: true})
	c := &tconsumer{}
	consume(t, q, ConsumeSpec{ID: 1, Prefetch: 1}, c)
	for range 3 {
		d := newDone(t)
		q.Publish(&Message{Body: []byte("p"), Persistent: true}, d)
		d.wait()
	}
	waitFor(t, "delivery", func() bool { return c.count() == 1 })
	if n := q.Delete(); n != 2 {
		t.Fatalf("Delete = %d ready, want 2", n)
	}
	if got := c.cancels(); !slices.Equal(got, []CancelReason{CancelDeleted}) {
		t.Fatalf("cancels %v", got)
	}
	if q.Delete() != 0 {
		t.Fatal("second Delete")
	}
	n := 0
	db.Scan(storage.MessagePrefix(3), true, func([]byte, []byte) error { n++; return nil })
	if n != 0 {
		t.Fatalf("%d records left", n)
	}
}

// Close wakes publishers that flow control holds back, and later publishes are Gone.
func TestClassicCloseReleasesFlow(t *testing.T) {
	q := openClassic(t, OpenConfig{})
	c := &tconsumer{noRoom: true}
	consume(t, q, ConsumeSpec{ID: 1}, c)
	for range flowHigh + 1 {
		q.Publish(body("x"), nil)
	}
	q.mu.Lock()
	throttled := q.flow.ch != nil
	q.mu.Unlock()
	if !throttled {
		t.Fatal("no flow control on a long queue with a consumer")
	}
	q.Close()
	q.mu.Lock()
	throttled = q.flow.ch != nil
	q.mu.Unlock()
	if throttled {
		t.Fatal("flow gate still closed after Close")
	}
	if st := q.Publish(body("y"), nil); st != Gone {
		t.Fatalf("publish after close: %d", st)
	}
}

// Stored messages come back at Open with their delivery counts, deadlines and priorities; paged
// transient messages do not.
func TestClassicRecovery(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	cfg := OpenConfig{Name: "q", ID: 7, DB: db, Durable: true, Logger: quiet,
		Lifecycle: cfgWith(func(c *Config) { c.MaxPriority = 5; c.DeliveryLimit = 3 }), Extra: &ClassicConfig{PageWindow: 3}}
	q := openClassic(t, cfg)
	pub := func(m *Message) {
		d := newDone(t)
		q.Publish(m, d)
		if err := d.wait(); err != nil {
			t.Fatal(err)
		}
	}
	pub(&Message{Body: []byte("a"), Persistent: true})
	pub(&Message{Body: []byte("b"), Persistent: true, Priority: 4})
	pub(&Message{Body: []byte("c"), Persistent: true, ExpiresAt: nowMs() + 60_000})
	pub(&Message{Body: []byte("transient paged")}) // beyond the window: paged to disk, gone at restart
	// "a" is delivered and returned twice: its delivery count is kept.
	for range 2 {
		d, _, ok, _ := q.Get(false)
		if !ok || string(d.Msg.Body) != "b" {
			t.Fatalf("get = %+v", d)
		}
		settle(t, q, SettleRequeue, []Tag{d.Tag()})
	}
	q.Close()
	db.Close()

	db = openDB(t, dir)
	defer db.Close()
	cfg.DB, cfg.Recovered = db, true
	r := openClassic(t, cfg)
	if st := r.Stats(); st.Ready != 3 {
		t.Fatalf("recovered %d messages, want 3", st.Ready)
	}
	var got []string
	for {
		d, _, ok, err := r.Get(false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got = append(got, fmt.Sprintf("%s/%d/%v", d.Msg.Body, d.DeliveryCount, d.Redelivered))
	}
	if !slices.Equal(got, []string{"b/2/true", "a/0/true", "c/0/true"}) {
		t.Fatalf("recovered %v", got)
	}
	n := 0
	db.Scan([]byte{PrefixTransient}, true, func([]byte, []byte) error { n++; return nil })
	if n != 0 {
		t.Fatalf("%d transient pages left after recovery", n)
	}
}

// The delivery limit holds across a restart: the count of a returned stored message is stored.
func TestClassicDeliveryLimitAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	h := &thooks{}
	cfg := OpenConfig{Name: "q", ID: 8, DB: db, Durable: true, Hooks: h, Logger: quiet,
		Lifecycle: cfgWith(func(c *Config) { c.DeliveryLimit = 1 })}
	q := openClassic(t, cfg)
	d := newDone(t)
	q.Publish(&Message{Body: []byte("m"), Persistent: true}, d)
	d.wait()
	g, _, _, _ := q.Get(false)
	settle(t, q, SettleRequeue, []Tag{g.Tag()})
	q.Close()
	db.Close()
	db = openDB(t, dir)
	defer db.Close()
	cfg.DB, cfg.Recovered = db, true
	r := openClassic(t, cfg)
	g, _, ok, _ := r.Get(false)
	if !ok || g.DeliveryCount != 1 {
		t.Fatalf("recovered delivery %+v %v", g, ok)
	}
	settle(t, r, SettleRequeue, []Tag{g.Tag()}) // the second return: over the limit
	if dl := h.deadLetters(); len(dl) != 1 || dl[0].Reason != ReasonDeliveryLimit || string(dl[0].Msg.Body) != "m" {
		t.Fatalf("dead letters %+v", dl)
	}
}

// Long queues keep only a window of bodies in memory; the rest is read back in order.
func TestClassicPaging(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	q := openClassic(t, OpenConfig{DB: db, ID: 4, Extra: &ClassicConfig{PageWindow: 10}})
	for i := range 100 {
		q.Publish(body(fmt.Sprint(i)), nil)
	}
	q.mu.Lock()
	inMemory := 0
	for i := range q.s.m.levels[0].fifo.Len() {
		if q.s.m.levels[0].fifo.At(i).msg != nil {
			inMemory++
		}
	}
	q.mu.Unlock()
	if inMemory != 10 {
		t.Fatalf("%d bodies in memory, want the window of 10", inMemory)
	}
	c := &tconsumer{}
	consume(t, q, ConsumeSpec{ID: 1, NoAck: true}, c)
	waitFor(t, "all delivered", func() bool { return c.count() == 100 })
	for i, b := range c.bodies() {
		if b != fmt.Sprint(i) {
			t.Fatalf("delivery %d is %q", i, b)
		}
	}
}

// A TTL-expired message, paged or not, is dead-lettered with its body.
func TestClassicTTLDeadLetter(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	h := &thooks{}
	q := openClassic(t, OpenConfig{DB: db, ID: 5, Durable: true, Hooks: h, Extra: &ClassicConfig{PageWindow: 1},
		Lifecycle: cfgWith(func(c *Config) { c.MessageTTL = 20 })})
	for i := range 3 {
		d := newDone(t)
		q.Publish(&Message{Body: []byte(fmt.Sprint("m", i)), Persistent: true}, d)
		d.wait()
	}
	waitFor(t, "dead-lettered", func() bool { return len(h.deadLetters()) == 3 })
	for i, d := range h.deadLetters() {
		if d.Reason != ReasonExpired || string(d.Msg.Body) != fmt.Sprint("m", i) || d.Key != (DedupeKey{}) {
			t.Fatalf("dead letter %d: %+v", i, d)
		}
	}
	waitFor(t, "records deleted", func() bool {
		n := 0
		db.Scan(storage.MessagePrefix(5), true, func([]byte, []byte) error { n++; return nil })
		return n == 0
	})
}

// A consumer that holds a delivery too long is cancelled (CancelTimeout) and gets nothing more;
// the session returns its deliveries.
func TestClassicConsumerTimeout(t *testing.T) {
	q := openClassic(t, OpenConfig{ConsumerTimeout: 30, AutoDelete: true})
	c := &tconsumer{}
	consume(t, q, ConsumeSpec{ID: 1, Prefetch: 1}, c)
	q.Publish(body("a"), nil)
	q.Publish(body("b"), nil)
	waitFor(t, "cancelled for the timeout", func() bool { return len(c.cancels()) == 1 })
	if got := c.cancels(); got[0] != CancelTimeout {
		t.Fatalf("cancel reason %v", got)
	}
	settle(t, q, SettleRequeue, c.take()) // what the session does
	if st := q.Stats(); st.Ready != 2 || st.Consumers != 1 {
		t.Fatalf("stats %+v", st) // still counted until the session cancels it
	}
	if !q.Cancel(1) {
		t.Fatal("the auto-delete queue's last consumer cancelled: not reported")
	}
	if n := len(c.cancels()); n != 1 {
		t.Fatalf("cancelled %d times", n)
	}
}

func TestClassicExpires(t *testing.T) {
	h := &thooks{}
	q := openClassic(t, OpenConfig{Expires: 30, Hooks: h})
	waitFor(t, "expired", func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.expired == 1 })
	q.Touch()
}
