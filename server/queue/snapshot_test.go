package queue

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// snapT0 is the snapshot tests' clock origin, Unix ms.
const snapT0 int64 = 1_700_000_000_000

// The snapshot property test drives an original machine with random operations, decodes copies of
// it from snapshots taken at random points, and then applies every later operation to the original
// and to each copy, requiring identical results.

// Operation kinds.
const (
	snapOpPublish = iota
	snapOpBurst
	snapOpEnqueue
	snapOpRestore
	snapOpAddConsumer
	snapOpRemoveConsumer
	snapOpCheckoutAt
	snapOpCheckout
	snapOpGetAt
	snapOpGet
	snapOpSettle
	snapOpSettleMany
	snapOpReturnAt
	snapOpReturn
	snapOpDiscardDead
	snapOpDiscard
	snapOpReturnConsumer
	snapOpExpire
	snapOpTrim
	snapOpPurge
	snapOpTimedOut
	snapOpNextExpiry
	snapOpSetFlags
	snapOpTick
	snapOpKinds
)

// snapOp is one operation with all its arguments drawn, so that it can be applied to several
// machines.
type snapOp struct {
	kind      int
	spec      ConsumerSpec
	msgs      []*Message // nil elements: bodies paged out
	sizes     []uint32
	flags     uint8
	prio      uint8
	expiresAt int64
	now       int64
	max       int
	refuse    uint8 // reserve refuses the consumers whose bit is set
	noAck     bool
	ids       []uint64
	count     uint32
}

// snapGen draws operations. It tracks the original machine's deliveries to pick ids worth settling.
type snapGen struct {
	rng      *rand.Rand
	now      int64
	maxID    uint64
	bodies   int
	seen     []uint64 // ids delivered with an ack pending (some may be settled since)
	weights  [snapOpKinds]int
	timeouts [7]int64
}

func newSnapGen(seed uint64) *snapGen {
	g := &snapGen{rng: rand.New(rand.NewPCG(seed, 0x5a4b)), now: snapT0}
	for k := range g.weights {
		g.weights[k] = 1 + g.rng.IntN(4)
	}
	g.weights[snapOpPublish] += 4
	g.weights[snapOpCheckoutAt] += 3
	g.weights[snapOpSettle] += 2
	g.weights[snapOpTick] += 2
	g.weights[snapOpEnqueue] = g.rng.IntN(2)
	g.weights[snapOpRestore] = g.rng.IntN(2)
	g.weights[snapOpPurge] = g.rng.IntN(2)
	for i := range g.timeouts {
		g.timeouts[i] = snapPick[int64](g.rng, 0, 0, 30, 100, 400)
	}
	return g
}

func snapPick[T any](rng *rand.Rand, xs ...T) T { return xs[rng.IntN(len(xs))] }

func snapConfig(rng *rand.Rand) Config {
	return Config{
		MaxPriority:          snapPick[uint8](rng, 0, 0, 1, 4, 9),
		MessageTTL:           snapPick[int64](rng, -1, -1, 0, 40, 150, 1000),
		MaxLength:            snapPick[int64](rng, -1, -1, -1, 0, 5, 30),
		MaxLengthBytes:       snapPick[int64](rng, -1, -1, -1, 500, 4000),
		Overflow:             snapPick(rng, DropHead, DropHead, RejectPublish, RejectPublishDLX),
		DeliveryLimit:        snapPick[int64](rng, -1, -1, 0, 2),
		SingleActiveConsumer: rng.IntN(3) == 0,
	}
}

func (g *snapGen) timeout(id ConsumerID) int64 { return g.timeouts[id%7] }

// message draws a message, or nil (a paged-out body) with some probability.
func (g *snapGen) message() (*Message, uint32) {
	g.bodies++
	body := []byte(fmt.Sprintf("body-%d-", g.bodies))
	body = append(body, bytes.Repeat([]byte{'x'}, g.rng.IntN(120))...)
	if g.rng.IntN(8) == 0 {
		return nil, uint32(len(body))
	}
	msg := &Message{
		Exchange:   snapPick(g.rng, "", "amq.direct", "ex"),
		RoutingKey: fmt.Sprintf("rk%d", g.rng.IntN(5)),
		Props:      snapPick(g.rng, nil, []byte{}, []byte{0x10, 0, 2}),
		Body:       body,
		Persistent: g.rng.IntN(2) == 0,
		Priority:   uint8(g.rng.IntN(12)),
	}
	switch g.rng.IntN(6) {
	case 0:
		msg.Body = nil
	case 1:
		msg.BCC = []string{"b1", fmt.Sprint("b", g.bodies)}
	case 2:
		msg.BCC = []string{}
	}
	if g.rng.IntN(4) == 0 {
		msg.ExpiresAt = g.now + int64(g.rng.IntN(400)) - 20
	}
	return msg, uint32(len(msg.Body))
}

// id draws a message id: mostly one delivered and maybe still unacked, else any.
func (g *snapGen) id() uint64 {
	if len(g.seen) > 0 && g.rng.IntN(5) > 0 {
		i := g.rng.IntN(len(g.seen))
		id := g.seen[i]
		g.seen = slices.Delete(g.seen, i, i+1)
		return id
	}
	return uint64(g.rng.IntN(int(g.maxID) + 3))
}

func (g *snapGen) next() snapOp {
	total := 0
	for _, w := range g.weights {
		total += w
	}
	x := g.rng.IntN(total)
	kind := 0
	for x >= g.weights[kind] {
		x -= g.weights[kind]
		kind++
	}
	op := snapOp{kind: kind, now: g.now, flags: uint8(g.rng.IntN(4)), noAck: g.rng.IntN(4) == 0,
		max: snapPick(g.rng, 0, 0, 1, 3), refuse: uint8(g.rng.IntN(256)) & snapPick[uint8](g.rng, 0, 0, 0xff)}
	switch kind {
	case snapOpPublish, snapOpEnqueue, snapOpRestore:
		msg, size := g.message()
		op.msgs, op.sizes = []*Message{msg}, []uint32{size}
		op.prio = uint8(g.rng.IntN(12))
		if msg != nil {
			op.prio, op.expiresAt = msg.Priority, msg.ExpiresAt
		} else if g.rng.IntN(3) == 0 {
			op.expiresAt = g.now + int64(g.rng.IntN(300))
		}
		if kind == snapOpRestore {
			op.ids = []uint64{g.maxID + 1 + uint64(g.rng.IntN(3))}
			op.count = uint32(g.rng.IntN(3))
			if g.rng.IntN(2) == 0 {
				op.expiresAt = g.now + int64(g.rng.IntN(300)) - 20
			}
		}
	case snapOpBurst:
		for range 10 + g.rng.IntN(60) {
			msg, size := g.message()
			op.msgs, op.sizes = append(op.msgs, msg), append(op.sizes, size)
		}
	case snapOpAddConsumer, snapOpRemoveConsumer, snapOpReturnConsumer:
		op.spec = ConsumerSpec{
			ID:       ConsumerID(1 + g.rng.IntN(6)),
			Prefetch: snapPick[uint32](g.rng, 0, 0, 1, 2, 5, 50),
			Priority: snapPick[int32](g.rng, 0, 0, 0, 1, 2, -1),
			NoAck:    g.rng.IntN(6) == 0,
		}
	case snapOpSettle, snapOpReturnAt, snapOpReturn, snapOpDiscardDead, snapOpDiscard, snapOpSetFlags:
		op.ids = []uint64{g.id()}
	case snapOpSettleMany:
		for range (len(g.seen) + 1) / 2 {
			op.ids = append(op.ids, g.id())
		}
	case snapOpTick:
		op.now = g.now + int64(snapPick(g.rng, 0, 1, 10, 50, 200))
	}
	return op
}

// observe updates the generator from the original machine's result.
func (g *snapGen) observe(op snapOp, r snapResult) {
	g.now = op.now
	g.maxID = max(g.maxID, r.maxID)
	for _, d := range r.deliveries {
		if !d.Settled {
			g.seen = append(g.seen, d.ID)
		}
	}
	if len(g.seen) > 500 {
		g.seen = g.seen[len(g.seen)-500:]
	}
}

// snapResult is what an operation returned: a full description to compare, and what the
// generator tracks.
type snapResult struct {
	desc       string
	deliveries []Delivery
	maxID      uint64
}

func snapMsgString(m *Message) string {
	if m == nil {
		return "<paged>"
	}
	bs := func(b []byte) string {
		if b == nil {
			return "nil"
		}
		return fmt.Sprintf("%q", b)
	}
	bcc := "nil"
	if m.BCC != nil {
		bcc = fmt.Sprintf("%q", m.BCC)
	}
	return fmt.Sprintf("{%q %q props=%s body=%s pers=%v prio=%d bcc=%s exp=%d}", m.Exchange, m.RoutingKey,
		bs(m.Props), bs(m.Body), m.Persistent, m.Priority, bcc, m.ExpiresAt)
}

func snapDeliveryString(d Delivery) string {
	return fmt.Sprintf("{c=%d id=%d %s redel=%v n=%d f=%d settled=%v}", d.Consumer, d.ID, snapMsgString(d.Msg),
		d.Redelivered, d.DeliveryCount, d.Flags, d.Settled)
}

func snapDeadString(d Dead) string {
	return fmt.Sprintf("{id=%d %s f=%d %s n=%d size=%d}", d.ID, snapMsgString(d.Msg), d.Flags, d.Reason,
		d.DeliveryCount, d.Size)
}

func snapDeadsString(ds []Dead) string {
	var b strings.Builder
	for _, d := range ds {
		b.WriteString(snapDeadString(d))
	}
	return b.String()
}

// snapApply applies op to m and describes everything it returned, then the machine's counters.
func snapApply(m *Machine, op snapOp, timeout func(ConsumerID) int64) snapResult {
	var r snapResult
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	var calls []ConsumerID
	reserve := func(id ConsumerID) bool {
		calls = append(calls, id)
		return op.refuse&(1<<(id%8)) == 0
	}
	switch op.kind {
	case snapOpPublish, snapOpBurst:
		for i, msg := range op.msgs {
			prio, exp := op.prio, op.expiresAt
			if op.kind == snapOpBurst && msg != nil {
				prio, exp = msg.Priority, msg.ExpiresAt
			}
			id, ok, dead := m.PublishEntry(msg, op.sizes[i], op.flags, prio, exp, op.now)
			r.maxID = max(r.maxID, id)
			p("publish %d %v %s;", id, ok, snapDeadsString(dead))
		}
	case snapOpEnqueue:
		id := m.EnqueueEntry(op.msgs[0], op.sizes[0], op.flags)
		r.maxID = id
		p("enqueue %d", id)
	case snapOpRestore:
		m.RestoreAt(op.ids[0], op.msgs[0], op.sizes[0], op.flags, op.count, op.expiresAt, op.prio)
		r.maxID = op.ids[0]
	case snapOpAddConsumer:
		m.AddConsumer(op.spec)
	case snapOpRemoveConsumer:
		p("remove %v", m.RemoveConsumer(op.spec.ID))
	case snapOpCheckoutAt, snapOpCheckout:
		var dead []Dead
		if op.kind == snapOpCheckoutAt {
			r.deliveries, dead = m.CheckoutAt(nil, op.max, reserve, op.now)
		} else {
			r.deliveries = m.Checkout(nil, op.max, reserve)
		}
		p("dead %s reserve %v deliveries", snapDeadsString(dead), calls)
		for _, d := range r.deliveries {
			p(" %s", snapDeliveryString(d))
		}
	case snapOpGetAt, snapOpGet:
		var d Delivery
		var ok bool
		var dead []Dead
		if op.kind == snapOpGetAt {
			d, ok, dead = m.GetAt(op.noAck, op.now)
		} else {
			d, ok = m.Get(op.noAck)
		}
		if ok {
			r.deliveries = []Delivery{d}
		}
		p("get %v %s dead %s", ok, snapDeliveryString(d), snapDeadsString(dead))
	case snapOpSettle:
		p("settle %v", m.Settle(op.ids[0]))
	case snapOpSettleMany:
		for _, id := range op.ids {
			f, ok := m.SettleEntry(id)
			p("settle %d %v;", f, ok)
		}
	case snapOpReturnAt:
		d, ok := m.ReturnAt(op.ids[0])
		p("returnAt %v", ok)
		if d != nil {
			p(" %s", snapDeadString(*d))
		}
	case snapOpReturn:
		p("return %v trim %s", m.Return(op.ids[0]), snapDeadsString(m.Trim()))
	case snapOpDiscardDead:
		d, ok := m.DiscardDead(op.ids[0])
		p("discardDead %v %s", ok, snapDeadString(d))
	case snapOpDiscard:
		msg, f, ok := m.DiscardEntry(op.ids[0])
		p("discard %s %d %v", snapMsgString(msg), f, ok)
	case snapOpReturnConsumer:
		req, dead := m.ReturnConsumer(op.spec.ID)
		p("returnConsumer %v %s", req, snapDeadsString(dead))
	case snapOpExpire:
		p("expire %s", snapDeadsString(m.Expire(op.now)))
	case snapOpTrim:
		p("trim %s", snapDeadsString(m.Trim()))
	case snapOpPurge:
		var purged []string
		n := m.PurgeEntries(func(id uint64, f uint8) { purged = append(purged, fmt.Sprint(id, "/", f)) })
		p("purge %d %v", n, purged)
	case snapOpTimedOut:
		next, ok := m.NextTimeout(timeout)
		p("timedOut %v next %d %v", m.TimedOut(op.now, timeout), next, ok)
	case snapOpNextExpiry:
		d, ok := m.NextExpiry()
		p("nextExpiry %d %v", d, ok)
	case snapOpSetFlags:
		info, ok := m.UnackedInfo(op.ids[0])
		p("info %+v %v set %v", info, ok, m.SetUnackedFlags(op.ids[0], op.flags))
	case snapOpTick:
	}
	active, hasActive := m.ActiveConsumer()
	p(" | ready %d unacked %d bytes %d len %d consumers %d active %d %v cfg %+v", m.Ready(), m.Unacked(),
		m.ReadyBytes(), m.Len(), m.Consumers(), active, hasActive, m.Config())
	for id := ConsumerID(1); id <= 6; id++ {
		p(" c%d:%v/%d", id, m.HasConsumer(id), m.ConsumerUnacked(id))
	}
	r.desc = b.String()
	return r
}

// snapDecode decodes a snapshot, failing the test on error, and checks that re-encoding the
// decoded machine gives the same bytes.
func snapDecode(t testing.TB, b []byte) *Machine {
	t.Helper()
	m, err := DecodeMachine(b)
	if err != nil {
		t.Fatalf("DecodeMachine: %v", err)
	}
	if b2 := m.AppendSnapshot(nil); !bytes.Equal(b, b2) {
		t.Fatalf("re-encoded snapshot differs: %d bytes, want %d", len(b2), len(b))
	}
	return m
}

// runSnapshotProperty runs one random scenario: copies are decoded from snapshots at random points
// (of the original or of an earlier copy) and must then behave exactly like the original.
func runSnapshotProperty(t *testing.T, seed uint64, steps int) {
	g := newSnapGen(seed)
	m := NewMachineConfig(snapConfig(g.rng))
	var copies []*Machine
	first := g.rng.IntN(steps)
	for step := range steps {
		if step == first || g.rng.IntN(150) == 0 {
			src := m
			if len(copies) > 0 && g.rng.IntN(2) == 0 {
				src = copies[g.rng.IntN(len(copies))]
			}
			copies = append(copies, snapDecode(t, src.AppendSnapshot(nil)))
		}
		op := g.next()
		want := snapApply(m, op, g.timeout)
		for i, c := range copies {
			if got := snapApply(c, op, g.timeout); got.desc != want.desc {
				t.Fatalf("seed %d step %d copy %d op %d:\n got  %s\n want %s", seed, step, i, op.kind, got.desc, want.desc)
			}
		}
		g.observe(op, want)
		if len(copies) > 0 && (step%8 == 0 || step == steps-1) {
			snap := m.AppendSnapshot(nil)
			for i, c := range copies {
				if !bytes.Equal(c.AppendSnapshot(nil), snap) {
					t.Fatalf("seed %d step %d: snapshot of copy %d differs from the original's", seed, step, i)
				}
			}
		}
	}
}

func TestSnapshotProperty(t *testing.T) {
	seeds, steps := 100, 400
	if testing.Short() {
		seeds = 30
	}
	for seed := range uint64(seeds) {
		runSnapshotProperty(t, seed+1, steps)
	}
}

// snapRich returns a machine in a state that uses every part of the snapshot: priorities, TTL
// (tombstones, queued and unqueued timed records, atOnce), paged entries, returned messages,
// consumers of several priorities with pending sent records, a removed owner whose ID was reused,
// basic.get unacked messages and single active consumer state.
func snapRich(t testing.TB) *Machine {
	t.Helper()
	cfg := DefaultConfig()
	cfg.MaxPriority = 3
	cfg.MessageTTL = 1000
	cfg.DeliveryLimit = 5
	cfg.SingleActiveConsumer = true
	m := NewMachineConfig(cfg)
	now := snapT0
	pub := func(prio uint8, exp int64) uint64 {
		msg := &Message{Exchange: "x", RoutingKey: "k", Props: []byte{1, 2}, Body: []byte(fmt.Sprint("b", prio, exp)),
			Priority: prio, ExpiresAt: exp, BCC: []string{"c"}, Persistent: prio%2 == 0}
		id, ok, dead := m.Publish(msg, uint32(len(msg.Body)), prio, now)
		if !ok || len(dead) > 0 {
			t.Fatalf("publish: %v %v", ok, dead)
		}
		return id
	}
	m.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 2})
	m.AddConsumer(ConsumerSpec{ID: 2, Priority: 1})
	for i := range 8 {
		pub(uint8(i%4), 0)
	}
	m.EnqueueEntry(nil, 77, 3)
	m.CheckoutAt(nil, 0, nil, now)
	m.RemoveConsumer(1) // its unacked messages stay, owned by a removed consumer
	m.AddConsumer(ConsumerSpec{ID: 1, Prefetch: 3, Priority: 1})
	m.AddConsumer(ConsumerSpec{ID: 3, Priority: -1})
	m.GetAt(false, now)
	for i := range 3 {
		pub(uint8(i), 0)
	}
	pub(0, now+10)
	m.CheckoutAt(nil, 1, nil, now)
	for id := uint64(1); id < 4; id++ {
		m.ReturnAt(id)
	}
	now += 50
	m.Expire(now)                                   // a tombstone
	pub(1, now)                                     // already due, a consumer can take it: atOnce
	m.AddConsumer(ConsumerSpec{ID: 4, Priority: 5}) // the active consumer has unacked messages: quiescing
	if len(m.atOnce) == 0 || m.tombs == 0 || len(m.unacked) < 3 || m.ready < 3 || !m.sacQuiescing {
		t.Fatalf("rich machine not rich: atOnce %d tombs %d unacked %d ready %d quiescing %v", len(m.atOnce),
			m.tombs, len(m.unacked), m.ready, m.sacQuiescing)
	}
	return m
}

func TestSnapshotRichRoundTrip(t *testing.T) {
	m := snapRich(t)
	b := m.AppendSnapshot(nil)
	c := snapDecode(t, b)
	if !bytes.Equal(m.AppendSnapshot(nil), b) {
		t.Fatal("AppendSnapshot modified the machine")
	}
	// Appending keeps dst.
	if b2 := m.AppendSnapshot([]byte("pre")); !bytes.Equal(b2[:3], []byte("pre")) || !bytes.Equal(b2[3:], b) {
		t.Fatal("AppendSnapshot does not append to dst")
	}
	g := newSnapGen(99)
	for step := range 300 {
		op := g.next()
		want := snapApply(m, op, g.timeout)
		if got := snapApply(c, op, g.timeout); got.desc != want.desc {
			t.Fatalf("step %d:\n got  %s\n want %s", step, got.desc, want.desc)
		}
		g.observe(op, want)
	}
}

// A removed consumer's unacked messages stay apart from those of a new consumer with the same ID.
func TestSnapshotRemovedOwner(t *testing.T) {
	m := NewMachine()
	m.AddConsumer(ConsumerSpec{ID: 7, Prefetch: 1})
	m.Enqueue(&Message{Body: []byte("a")})
	m.Enqueue(&Message{Body: []byte("b")})
	m.Checkout(nil, 0, nil)
	m.RemoveConsumer(7)
	m.AddConsumer(ConsumerSpec{ID: 7, Prefetch: 1})
	m.Checkout(nil, 0, nil)
	c := snapDecode(t, m.AppendSnapshot(nil))
	for _, x := range []*Machine{m, c} {
		if x.ConsumerUnacked(7) != 1 || x.Unacked() != 2 {
			t.Fatalf("unacked %d/%d, want 1/2", x.ConsumerUnacked(7), x.Unacked())
		}
		x.Settle(1) // the removed consumer's: no credit for the new one
		x.Enqueue(&Message{Body: []byte("c")})
		if ds := x.Checkout(nil, 0, nil); len(ds) != 0 {
			t.Fatalf("new consumer credited by the removed one's ack: %v", ds)
		}
		if req, _ := x.ReturnConsumer(7); !slices.Equal(req, []uint64{2}) {
			t.Fatalf("ReturnConsumer = %v, want [2]", req)
		}
	}
}

func TestSnapshotDeterministic(t *testing.T) {
	a, b := snapRich(t), snapRich(t)
	sa := a.AppendSnapshot(nil)
	for range 20 {
		if !bytes.Equal(sa, a.AppendSnapshot(nil)) || !bytes.Equal(sa, b.AppendSnapshot(nil)) {
			t.Fatal("equal machines give different snapshots")
		}
	}
	if sa[0] != SnapshotVersion {
		t.Fatalf("first byte %d, want the version %d", sa[0], SnapshotVersion)
	}
}

func TestSnapshotVersion(t *testing.T) {
	b := NewMachine().AppendSnapshot(nil)
	b[0] = SnapshotVersion + 1
	if _, err := DecodeMachine(b); err == nil || !strings.Contains(err.Error(), "version") {
		t.Fatalf("DecodeMachine of another version: %v", err)
	}
	if _, err := DecodeMachine(nil); err == nil {
		t.Fatal("DecodeMachine(nil) succeeded")
	}
}

// snapExercise drives a decoded machine with random operations: it must not panic, and its
// snapshot must stay decodable.
func snapExercise(t testing.TB, m *Machine, seed uint64, steps int) {
	t.Helper()
	g := newSnapGen(seed)
	g.maxID = m.nextID
	for range steps {
		op := g.next()
		g.observe(op, snapApply(m, op, g.timeout))
	}
	if _, err := DecodeMachine(m.AppendSnapshot(nil)); err != nil {
		t.Fatalf("snapshot of an exercised machine: %v", err)
	}
}

// snapCheckCorrupt decodes possibly corrupt input: an error is fine; a machine must re-encode to a
// snapshot that decodes to itself, and survive being driven.
func snapCheckCorrupt(t testing.TB, b []byte, seed uint64) {
	t.Helper()
	m, err := DecodeMachine(b)
	if err != nil {
		if !errors.Is(err, errSnapshot) {
			t.Fatalf("error does not wrap errSnapshot: %v", err)
		}
		return
	}
	b2 := m.AppendSnapshot(nil)
	m2, err := DecodeMachine(b2)
	if err != nil {
		t.Fatalf("snapshot of an accepted machine does not decode: %v", err)
	}
	if !bytes.Equal(m2.AppendSnapshot(nil), b2) {
		t.Fatal("snapshot of an accepted machine is not a fixed point")
	}
	snapExercise(t, m, seed, 40)
}

func TestSnapshotCorrupt(t *testing.T) {
	small := snapRich(t).AppendSnapshot(nil)
	big := func() []byte {
		g := newSnapGen(7)
		m := NewMachineConfig(snapConfig(g.rng))
		for range 300 {
			op := g.next()
			g.observe(op, snapApply(m, op, g.timeout))
		}
		return m.AppendSnapshot(nil)
	}()
	for _, b := range [][]byte{small, big} {
		step := 1
		if len(b) > 2000 {
			step = len(b)/2000 + 1
		}
		for n := 0; n < len(b); n += step {
			if _, err := DecodeMachine(b[:n]); err == nil {
				t.Fatalf("truncation to %d of %d bytes decoded", n, len(b))
			}
		}
		if _, err := DecodeMachine(append(slices.Clip(b), 0)); err == nil {
			t.Fatal("trailing byte accepted")
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	accepted := 0
	for i := range 1500 {
		src := snapPick(rng, small, big)
		b := slices.Clone(src)
		for range 1 + rng.IntN(3) {
			j := rng.IntN(len(b))
			if rng.IntN(2) == 0 {
				b[j] ^= 1 << rng.IntN(8)
			} else {
				b[j] = byte(rng.IntN(256))
			}
		}
		if _, err := DecodeMachine(b); err == nil {
			accepted++
		}
		snapCheckCorrupt(t, b, uint64(i))
	}
	t.Logf("%d of 1500 corrupted snapshots decoded to a valid machine", accepted)
}

func FuzzDecodeMachine(f *testing.F) {
	f.Add(NewMachine().AppendSnapshot(nil))
	f.Add(snapRich(f).AppendSnapshot(nil))
	for seed := range uint64(3) {
		g := newSnapGen(seed + 11)
		m := NewMachineConfig(snapConfig(g.rng))
		for range 60 {
			op := g.next()
			g.observe(op, snapApply(m, op, g.timeout))
		}
		f.Add(m.AppendSnapshot(nil))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		snapCheckCorrupt(t, b, 1)
	})
}

// Bodies are written once each: 10,000 messages of 1 KB, half of them unacked, take 10-11 MB.
func TestSnapshotSize(t *testing.T) {
	m := NewMachine()
	body := bytes.Repeat([]byte{'z'}, 1024)
	for range 10_000 {
		m.Enqueue(&Message{Exchange: "amq.direct", RoutingKey: "orders", Props: []byte{0x90, 0, 2}, Body: body, Persistent: true})
	}
	m.AddConsumer(ConsumerSpec{ID: 1})
	m.Checkout(nil, 5000, nil)
	b := m.AppendSnapshot(nil)
	if len(b) < 10_240_000 || len(b) > 11_000_000 {
		t.Fatalf("snapshot of 10,000 1 KB messages is %d bytes, want 10-11 MB", len(b))
	}
	c := snapDecode(t, b)
	if c.Ready() != 5000 || c.Unacked() != 5000 || c.ReadyBytes() != 5000*1024 {
		t.Fatalf("decoded: ready %d unacked %d bytes %d", c.Ready(), c.Unacked(), c.ReadyBytes())
	}
	t.Logf("snapshot size %d bytes", len(b))
}

// TestSnapshotCoversAllFields fails when a field is added to the machine's state: the snapshot
// (AppendSnapshot and DecodeMachine in snapshot.go) must then be extended, or the field listed here
// with the reason it need not be written.
func TestSnapshotCoversAllFields(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{Machine{}, "cfg nextID levels top ready readyBytes tombs unacked timed expiry queuedLive atOnce " +
			"consumers groups skipped seq sacActive sacQuiescing"},
		{Config{}, "MaxPriority MessageTTL MaxLength MaxLengthBytes Overflow DeliveryLimit SingleActiveConsumer"},
		{Message{}, "Exchange RoutingKey Props Body Persistent Priority BCC ExpiresAt FilterValue PublisherID PublishingID"}, // FilterValue: streams only, never in a queue snapshot,
		{ConsumerSpec{}, "ID Prefetch Priority NoAck"},
		{entry{}, "id msg count size flags prio redelivered timed"},
		{unackedEntry{}, "entry owner deadline"},
		{consumer{}, "spec group unacked active standby seq sent"},
		{group{}, "priority members ring"},
		{level{}, "fifo returned"},
		{timedMsg{}, "e deadline unacked queued"},
		{outstanding{}, "at id count"},
		{deadlineItem{}, "deadline id"},
	} {
		typ := reflect.TypeOf(c.v)
		var names []string
		for i := range typ.NumField() {
			names = append(names, typ.Field(i).Name)
		}
		if got := strings.Join(names, " "); got != c.want {
			t.Errorf("%s fields changed: update snapshot.go, then this test\n got  %s\n want %s", typ, got, c.want)
		}
	}
}
