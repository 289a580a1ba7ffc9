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
	snapOpCancelGiveBack
	snapOpPurge
	snapOpTimedOut
	snapOpNextExpiry
	snapOpStaleTag
	snapOpTick
	// Commands of replicated queues (applied in both modes).
	snapOpCredit
	snapOpEnqueueID // with a command id, sometimes a repeat
	snapOpGetID
	snapOpPurgeID
	snapOpDedupe // a dead letter with a dedupe key, sometimes a repeat
	snapOpDeadLettered
	snapOpNodeReset
	snapOpKinds
)

// snapCIDs are the consumer ids the scenarios use: node tag | epoch | counter, on two nodes and
// two epochs, so that node resets have something to tell apart.
var snapCIDs = [...]ConsumerID{1<<48 | 1<<32 | 1, 1<<48 | 1<<32 | 2, 1<<48 | 2<<32 | 3, 2<<48 | 1<<32 | 4,
	2<<48 | 1<<32 | 5, 2<<48 | 2<<32 | 6}

// snapCIndex returns the index of a consumer id in snapCIDs (for per-consumer test settings).
func snapCIndex(id ConsumerID) int { return int(uint32(id)) % len(snapCIDs) }

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
	producer  uint64
	seq       uint64
	key       DedupeKey
	node      uint16
	epochs    []uint16
	except    bool
	credit    uint64
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
	seqs     map[uint64]uint64 // last command id per producer
	dlSeq    uint64            // highest dead-letter sequence number recorded
	keySeq   uint64            // last dedupe key sequence used
}

func newSnapGen(seed uint64) *snapGen {
	g := &snapGen{rng: rand.New(rand.NewPCG(seed, 0x5a4b)), now: snapT0, seqs: map[uint64]uint64{}}
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

func (g *snapGen) timeout(id ConsumerID) int64 { return g.timeouts[snapCIndex(id)%7] }

// nextSeq draws a command id for one of three producers: mostly the next, sometimes a repeat.
func (g *snapGen) nextSeq() (uint64, uint64) {
	p := uint64(1+g.rng.IntN(2))<<48 | uint64(1+g.rng.IntN(2))<<32 | 7
	seq := g.seqs[p]
	if seq == 0 || g.rng.IntN(4) > 0 {
		seq++
		g.seqs[p] = seq
	} else {
		seq -= uint64(g.rng.IntN(int(min(seq, 40))))
	}
	return p, seq
}

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
	case snapOpAddConsumer, snapOpRemoveConsumer, snapOpReturnConsumer, snapOpCancelGiveBack, snapOpCredit:
		op.spec = ConsumerSpec{
			ID:        snapCIDs[g.rng.IntN(len(snapCIDs))],
			Prefetch:  snapPick[uint32](g.rng, 0, 0, 1, 2, 5, 50),
			Priority:  snapPick[int32](g.rng, 0, 0, 0, 1, 2, -1),
			NoAck:     g.rng.IntN(6) == 0,
			Exclusive: g.rng.IntN(10) == 0,
			Credited:  g.rng.IntN(2) == 0,
			Credit:    uint64(g.rng.IntN(12)),
		}
		op.credit = uint64(g.rng.IntN(40))
	case snapOpSettle, snapOpReturnAt, snapOpReturn, snapOpDiscardDead, snapOpDiscard, snapOpStaleTag:
		op.ids = []uint64{g.id()}
	case snapOpEnqueueID, snapOpDedupe:
		msg, _ := g.message()
		if msg == nil {
			msg = &Message{Body: []byte("paged-not-here")}
		}
		op.msgs = []*Message{msg}
		op.producer, op.seq = g.nextSeq()
		if kind == snapOpDedupe {
			if g.keySeq == 0 || g.rng.IntN(3) > 0 {
				g.keySeq++
			}
			op.key = DedupeKey{Source: uint64(1 + g.rng.IntN(2)), Seq: g.keySeq - uint64(g.rng.IntN(int(min(g.keySeq, 3))))}
		}
	case snapOpGetID, snapOpPurgeID:
		op.producer, op.seq = g.nextSeq()
	case snapOpDeadLettered:
		for range 1 + g.rng.IntN(4) {
			op.ids = append(op.ids, uint64(g.rng.IntN(int(g.dlSeq)+2)))
		}
	case snapOpNodeReset:
		op.node = uint16(1 + g.rng.IntN(2))
		op.except = g.rng.IntN(2) == 0
		for range g.rng.IntN(3) {
			op.epochs = append(op.epochs, uint16(1+g.rng.IntN(2)))
		}
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
	g.dlSeq = max(g.dlSeq, r.dlSeq)
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
	dlSeq      uint64
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
	return fmt.Sprintf("{%q %q props=%s body=%s pers=%v prio=%d bcc=%s exp=%d key=%v}", m.Exchange, m.RoutingKey,
		bs(m.Props), bs(m.Body), m.Persistent, m.Priority, bcc, m.ExpiresAt, m.Dedupe)
}

func snapDeliveryString(d Delivery) string {
	return fmt.Sprintf("{c=%d id=%d %s redel=%v n=%d f=%d settled=%v}", d.Consumer, d.ID, snapMsgString(d.Msg),
		d.Redelivered, d.DeliveryCount, d.flags, d.Settled)
}

func snapDeadString(d Dead) string {
	return fmt.Sprintf("{id=%d %s f=%d %s n=%d size=%d key=%v}", d.ID, snapMsgString(d.Msg), d.flags, d.Reason,
		d.DeliveryCount, d.size, d.Key)
}

// snapEffectsString describes everything a command left in its Effects.
func snapEffectsString(cmd *Command, fx *Effects) string {
	var b strings.Builder
	r := &fx.Reply
	fmt.Fprintf(&b, "[%d: %d %v %v %d %d %d %v", cmd.Type, r.Status, r.Duplicate, r.Stale, r.ID, r.Remaining, r.Count, r.Refused)
	if r.OK {
		b.WriteString(" get" + snapDeliveryString(r.Delivery))
	}
	for _, d := range fx.Deliveries {
		b.WriteString(" d" + snapDeliveryString(d))
	}
	if len(fx.Dead) > 0 {
		b.WriteString(" dead" + snapDeadsString(fx.Dead))
	}
	fmt.Fprintf(&b, " %d %d/%v", fx.DeadRecorded, fx.NextExpiry, fx.HasExpiry)
	for _, f := range fx.forget {
		fmt.Fprintf(&b, " f%d/%d", f.id, f.flags)
	}
	for _, w := range fx.rewrite {
		fmt.Fprintf(&b, " w%d/%d/%d/%d", w.id, w.deadline, w.priority, w.count)
	}
	b.WriteByte(']')
	return b.String()
}

func snapDeadsString(ds []Dead) string {
	var b strings.Builder
	for _, d := range ds {
		b.WriteString(snapDeadString(d))
	}
	return b.String()
}

// snapApply applies op to m and describes everything it returned, then the machine's counters.
func snapApply(m *driver, op snapOp, timeout func(ConsumerID) int64) snapResult {
	var r snapResult
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	m.trace = func(cmd *Command, fx *Effects) {
		b.WriteString(snapEffectsString(cmd, fx))
		for _, d := range fx.Deliveries {
			r.deliveries = append(r.deliveries, d)
		}
		if d := fx.Reply.Delivery; fx.Reply.OK {
			r.deliveries = append(r.deliveries, d)
		}
		r.maxID = max(r.maxID, fx.Reply.ID)
	}
	defer func() { m.trace = nil }()
	var calls []ConsumerID
	reserve := func(id ConsumerID) bool {
		calls = append(calls, id)
		return op.refuse&(1<<(uint64(id)%8)) == 0
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
		m.RestoreAt(op.ids[0], op.flags, op.count, op.expiresAt, op.prio)
		r.maxID = max(r.maxID, op.ids[0])
	case snapOpAddConsumer:
		p("add %v", m.AddConsumer(op.spec))
	case snapOpRemoveConsumer:
		p("remove %v", m.RemoveConsumer(op.spec.ID))
	case snapOpCheckoutAt, snapOpCheckout:
		if op.kind == snapOpCheckoutAt {
			m.CheckoutAt(nil, op.max, reserve, op.now)
		} else {
			m.Checkout(nil, op.max, reserve)
		}
		p("reserve %v", calls)
	case snapOpGetAt, snapOpGet:
		if op.kind == snapOpGetAt {
			m.GetAt(op.noAck, op.now)
		} else {
			m.Get(op.noAck)
		}
	case snapOpSettle:
		p("settle %v", m.Settle(op.ids[0]))
	case snapOpSettleMany:
		for _, id := range op.ids {
			f, ok := m.SettleEntry(id)
			p("settle %d %v;", f, ok)
		}
	case snapOpReturnAt:
		d, ok := m.ReturnAt(op.ids[0])
		p("returnAt %v %s", ok, snapDeadsString(d))
	case snapOpReturn:
		p("return %v", m.Return(op.ids[0]))
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
	case snapOpCancelGiveBack:
		m.apply(Command{Type: CmdCancel, Consumer: op.spec.ID, GiveBack: true}, op.now)
	case snapOpPurge:
		p("purge %d", m.Purge())
	case snapOpTimedOut:
		next, ok := m.NextTimeout(timeout)
		p("timedOut %v next %d %v", m.TimedOut(op.now, timeout), next, ok)
	case snapOpNextExpiry:
		d, ok := m.NextExpiry()
		p("nextExpiry %d %v", d, ok)
	case snapOpStaleTag:
		// A settlement naming an earlier delivery of the message (a retry) touches nothing.
		t := m.tag(op.ids[0])
		t.Count++
		m.apply(Command{Type: snapPick(rand.New(rand.NewPCG(op.ids[0], 1)), CmdSettle, CmdReturn, CmdDiscard), Tags: []Tag{t}}, op.now)
	case snapOpTick:
	case snapOpCredit:
		m.apply(Command{Type: CmdCredit, Consumer: op.spec.ID, Credit: op.credit}, op.now)
	case snapOpEnqueueID, snapOpDedupe:
		msg := op.msgs[0]
		if op.kind == snapOpDedupe {
			cp := *msg
			cp.Dedupe = op.key
			msg = &cp
		}
		m.apply(Command{Type: CmdEnqueue, Msg: msg, Producer: op.producer, Seq: op.seq, Flags: op.flags}, op.now)
	case snapOpGetID:
		m.apply(Command{Type: CmdGet, NoAck: op.noAck, Producer: op.producer, Seq: op.seq,
			Owner: uint32(op.producer>>48)<<16 | uint32(uint16(op.producer>>32))}, op.now)
	case snapOpPurgeID:
		m.apply(Command{Type: CmdPurge, Producer: op.producer, Seq: op.seq}, op.now)
	case snapOpDeadLettered:
		m.apply(Command{Type: CmdDeadLettered, Seqs: op.ids}, op.now)
	case snapOpNodeReset:
		m.apply(Command{Type: CmdNodeReset, Node: op.node, Epochs: op.epochs, Except: op.except}, op.now)
	}
	active, hasActive := m.ActiveConsumer()
	p(" | ready %d unacked %d bytes %d len %d consumers %d active %d %v cfg %+v dl %d excl %d", m.Ready(), m.Unacked(),
		m.ReadyBytes(), m.Len(), m.Consumers(), active, hasActive, m.Config(), m.s.DeadLetters(), m.s.exclusive)
	for _, id := range snapCIDs {
		p(" c%d:%v/%d", snapCIndex(id), m.HasConsumer(id), m.ConsumerUnacked(id))
	}
	r.dlSeq = m.s.dlxSeq
	r.desc = b.String()
	return r
}

// snapDecode decodes a snapshot, failing the test on error, and checks that re-encoding the
// decoded state gives the same bytes.
func snapDecode(t testing.TB, b []byte) *driver {
	t.Helper()
	m, err := decodeDriver(b)
	if err != nil {
		t.Fatalf("DecodeState: %v", err)
	}
	if b2 := m.AppendSnapshot(nil); !bytes.Equal(b, b2) {
		t.Fatalf("re-encoded snapshot differs: %d bytes, want %d", len(b2), len(b))
	}
	return m
}

func decodeDriver(b []byte) (*driver, error) {
	s, err := DecodeState(b)
	if err != nil {
		return nil, err
	}
	return fromState(s), nil
}

// runSnapshotProperty runs one random scenario: copies are decoded from snapshots at random points
// (of the original or of an earlier copy) and must then behave exactly like the original.
func runSnapshotProperty(t *testing.T, seed uint64, steps int, replicated bool) {
	g := newSnapGen(seed)
	m := newDriverState(StateConfig{Config: snapConfig(g.rng), Replicated: replicated, Source: 77})
	var copies []*driver
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
				if cs := c.AppendSnapshot(nil); !bytes.Equal(cs, snap) {
					at := 0
					for at < len(cs) && at < len(snap) && cs[at] == snap[at] {
						at++
					}
					t.Fatalf("seed %d step %d: snapshot of copy %d differs from the original's at byte %d of %d/%d:\n got  %x\n want %x",
						seed, step, i, at, len(cs), len(snap), cs[max(0, at-8):min(len(cs), at+24)], snap[max(0, at-8):min(len(snap), at+24)])
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
		runSnapshotProperty(t, seed+1, steps, false)
	}
	for seed := range uint64(seeds / 2) {
		runSnapshotProperty(t, seed+1, steps, true)
	}
}

// snapRich returns a machine in a state that uses every part of the snapshot: priorities, TTL
// (tombstones, queued and unqueued timed records, atOnce), paged entries, returned messages,
// consumers of several priorities with pending sent records, a removed owner whose ID was reused,
// basic.get unacked messages and single active consumer state.
func snapRich(t testing.TB, replicated bool) *driver {
	t.Helper()
	cfg := DefaultConfig()
	cfg.MaxPriority = 3
	cfg.MessageTTL = 1000
	cfg.DeliveryLimit = 5
	cfg.SingleActiveConsumer = true
	m := newDriverState(StateConfig{Config: cfg, Replicated: replicated, Source: 5})
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
	c1, c2, c3, c4 := snapCIDs[0], snapCIDs[1], snapCIDs[3], snapCIDs[5]
	if replicated {
		return snapRichReplicated(t, m, pub, now)
	}
	m.AddConsumer(ConsumerSpec{ID: c1, Prefetch: 2})
	m.AddConsumer(ConsumerSpec{ID: c2, Priority: 1})
	for i := range 8 {
		pub(uint8(i%4), 0)
	}
	m.PublishEntry(nil, 77, 3, 0, 0, now)
	m.CheckoutAt(nil, 0, nil, now)
	m.RemoveConsumer(c1) // its unacked messages stay, owned by a removed consumer
	m.AddConsumer(ConsumerSpec{ID: c1, Prefetch: 3, Priority: 1})
	m.AddConsumer(ConsumerSpec{ID: c3, Priority: -1, Credited: true, Credit: 1})
	m.apply(Command{Type: CmdGet, Producer: 9, Seq: 1, Owner: 1<<16 | 1}, now)
	m.apply(Command{Type: CmdGet, NoAck: true, Producer: 9, Seq: 2}, now)
	m.apply(Command{Type: CmdPurge, Producer: 9, Seq: 3}, now)
	m.apply(Command{Type: CmdEnqueue, Producer: 9, Seq: 4, Msg: &Message{Body: []byte("dedupe")}}, now)
	m.apply(Command{Type: CmdEnqueue, Msg: &Message{Body: []byte("dl"), Dedupe: DedupeKey{Source: 3, Seq: 8}}}, now)
	for i := range 3 {
		pub(uint8(i), 0)
	}
	pub(0, now+10)
	m.CheckoutAt(nil, 1, nil, now)
	for id := uint64(1); id < 4; id++ {
		m.ReturnAt(id)
	}
	m.DiscardDead(4) // a dead letter (recorded when replicated)
	now += 50
	m.Expire(now)                                    // a tombstone
	pub(1, now)                                      // already due, a consumer can take it: atOnce
	m.AddConsumer(ConsumerSpec{ID: c4, Priority: 5}) // the active consumer has unacked messages: quiescing
	if len(m.atOnce) == 0 || m.tombs == 0 || len(m.unacked) < 3 || m.ready < 2 || !m.sacQuiescing ||
		len(m.s.producers) == 0 || len(m.s.sources) == 0 {
		t.Fatalf("rich state not rich: atOnce %d tombs %d unacked %d ready %d quiescing %v", len(m.atOnce),
			m.tombs, len(m.unacked), m.ready, m.sacQuiescing)
	}
	return m
}

// snapRichReplicated builds the rich state of a replicated queue, where every command is followed
// by a checkout to the consumers that have credit.
func snapRichReplicated(t testing.TB, m *driver, pub func(uint8, int64) uint64, now int64) *driver {
	t.Helper()
	c1, c2, c3 := snapCIDs[0], snapCIDs[1], snapCIDs[3]
	m.apply(Command{Type: CmdPurge, Producer: 9, Seq: 1}, now)
	m.AddConsumer(ConsumerSpec{ID: c1, Prefetch: 2, Credited: true, Credit: 100})
	for i := range 8 {
		pub(uint8(i%4), 0) // c1 takes the first two
	}
	m.PublishEntry(nil, 77, 3, 0, 0, now)
	m.AddConsumer(ConsumerSpec{ID: c2, Priority: 1, Credited: true, Credit: 2}) // c1 has unacked: quiescing
	m.AddConsumer(ConsumerSpec{ID: c3, Priority: -1, Credited: true, Credit: 1})
	m.apply(Command{Type: CmdGet, Producer: 9, Seq: 2, Owner: 1<<16 | 1}, now)
	m.apply(Command{Type: CmdGet, NoAck: true, Producer: 9, Seq: 3}, now)
	m.apply(Command{Type: CmdEnqueue, Producer: 9, Seq: 4, Msg: &Message{Body: []byte("dedupe")}}, now)
	m.apply(Command{Type: CmdEnqueue, Msg: &Message{Body: []byte("dl"), Dedupe: DedupeKey{Source: 3, Seq: 8}}}, now)
	pub(0, now+10)
	m.DiscardDead(1) // a recorded dead letter; c1 still has one unacked
	m.Expire(now + 50)
	if len(m.unacked) < 2 || !m.sacQuiescing || len(m.s.producers) == 0 || len(m.s.sources) == 0 ||
		m.s.DeadLetters() < 2 || len(m.s.getOwner) == 0 || m.ready < 3 {
		t.Fatalf("rich replicated state not rich: unacked %d quiescing %v dead letters %d gets %d ready %d",
			len(m.unacked), m.sacQuiescing, m.s.DeadLetters(), len(m.s.getOwner), m.ready)
	}
	return m
}

func TestSnapshotRichRoundTrip(t *testing.T) {
	for _, replicated := range []bool{false, true} {
		testSnapshotRichRoundTrip(t, replicated)
	}
}

func testSnapshotRichRoundTrip(t *testing.T, replicated bool) {
	m := snapRich(t, replicated)
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
	m := newDriver(DefaultConfig())
	m.AddConsumer(ConsumerSpec{ID: 7, Prefetch: 1})
	m.Enqueue(&Message{Body: []byte("a")})
	m.Enqueue(&Message{Body: []byte("b")})
	m.Checkout(nil, 0, nil)
	m.RemoveConsumer(7)
	m.AddConsumer(ConsumerSpec{ID: 7, Prefetch: 1})
	m.Checkout(nil, 0, nil)
	c := snapDecode(t, m.AppendSnapshot(nil))
	for _, x := range []*driver{m, c} {
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
	for _, replicated := range []bool{false, true} {
		a, b := snapRich(t, replicated), snapRich(t, replicated)
		sa := a.AppendSnapshot(nil)
		for range 20 {
			if !bytes.Equal(sa, a.AppendSnapshot(nil)) || !bytes.Equal(sa, b.AppendSnapshot(nil)) {
				t.Fatal("equal states give different snapshots")
			}
		}
		if sa[0] != stateSnapshotVersion {
			t.Fatalf("first byte %d, want the version %d", sa[0], stateSnapshotVersion)
		}
	}
}

func TestSnapshotVersion(t *testing.T) {
	b := newDriver(DefaultConfig()).AppendSnapshot(nil)
	b[0] = stateSnapshotVersion + 1
	if _, err := DecodeState(b); err == nil || !strings.Contains(err.Error(), "version") {
		t.Fatalf("DecodeState of another version: %v", err)
	}
	if _, err := DecodeState(nil); err == nil {
		t.Fatal("DecodeState(nil) succeeded")
	}
}

// snapExercise drives a decoded machine with random operations: it must not panic, and its
// snapshot must stay decodable.
func snapExercise(t testing.TB, m *driver, seed uint64, steps int) {
	t.Helper()
	g := newSnapGen(seed)
	g.maxID = m.nextID
	for range steps {
		op := g.next()
		g.observe(op, snapApply(m, op, g.timeout))
	}
	if _, err := DecodeState(m.AppendSnapshot(nil)); err != nil {
		t.Fatalf("snapshot of an exercised state: %v", err)
	}
}

// snapCheckCorrupt decodes possibly corrupt input: an error is fine; a machine must re-encode to a
// snapshot that decodes to itself, and survive being driven.
func snapCheckCorrupt(t testing.TB, b []byte, seed uint64) {
	t.Helper()
	m, err := decodeDriver(b)
	if err != nil {
		if !errors.Is(err, errSnapshot) {
			t.Fatalf("error does not wrap errSnapshot: %v", err)
		}
		return
	}
	b2 := m.AppendSnapshot(nil)
	m2, err := decodeDriver(b2)
	if err != nil {
		t.Fatalf("snapshot of an accepted machine does not decode: %v", err)
	}
	if !bytes.Equal(m2.AppendSnapshot(nil), b2) {
		t.Fatal("snapshot of an accepted machine is not a fixed point")
	}
	snapExercise(t, m, seed, 40)
}

func TestSnapshotCorrupt(t *testing.T) {
	small := snapRich(t, true).AppendSnapshot(nil)
	big := func() []byte {
		g := newSnapGen(7)
		m := newDriverState(StateConfig{Config: snapConfig(g.rng), Replicated: true})
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
			if _, err := DecodeState(b[:n]); err == nil {
				t.Fatalf("truncation to %d of %d bytes decoded", n, len(b))
			}
		}
		if _, err := DecodeState(append(slices.Clip(b), 0)); err == nil {
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
		if _, err := DecodeState(b); err == nil {
			accepted++
		}
		snapCheckCorrupt(t, b, uint64(i))
	}
	t.Logf("%d of 1500 corrupted snapshots decoded to a valid state", accepted)
}

func FuzzDecodeState(f *testing.F) {
	f.Add(newDriver(DefaultConfig()).AppendSnapshot(nil))
	f.Add(snapRich(f, false).AppendSnapshot(nil))
	f.Add(snapRich(f, true).AppendSnapshot(nil))
	for seed := range uint64(3) {
		g := newSnapGen(seed + 11)
		m := newDriverState(StateConfig{Config: snapConfig(g.rng), Replicated: seed%2 == 1})
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
	m := newDriver(DefaultConfig())
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

// TestSnapshotCoversAllFields fails when a field is added to the state: the snapshot (snapshot.go
// and codec.go) must then be extended, or the field listed here with the reason it need not be
// written (State.reserve: a classic queue's hook, never set in a replicated state; State.tags:
// scratch; Delivery and Reply travel in the reply cache and in answers).
func TestSnapshotCoversAllFields(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{machine{}, "cfg nextID levels top ready readyBytes tombs unacked timed expiry queuedLive atOnce " +
			"consumers groups skipped seq sacActive sacQuiescing"},
		{State{}, "m replicated source reserve now ops exclusive producers sources getOwner dlx dlxLive dlxSeq tags"},
		{producer{}, "w replies"},
		{seqWindow{}, "max bits last"},
		{deadRecord{}, "seq dead gone"},
		{Dead{}, "ID Msg Reason DeliveryCount Key flags size"},
		{Reply{}, "Status Duplicate Stale ID Delivery OK Remaining Count Refused"},
		{Delivery{}, "Consumer ID Msg Redelivered DeliveryCount Settled flags"},
		{Config{}, "MaxPriority MessageTTL MaxLength MaxLengthBytes Overflow DeliveryLimit SingleActiveConsumer"},
		{Message{}, "Exchange RoutingKey Props Body Persistent Priority BCC ExpiresAt Dedupe FilterValue PublisherID PublishingID"}, // FilterValue, PublisherID, PublishingID: streams only
		{consumerSpec{}, "ID Prefetch Priority NoAck Credited Credit"},
		{entry{}, "id msg count size flags prio redelivered timed"},
		{unackedEntry{}, "entry owner deadline"},
		{consumer{}, "spec group unacked active standby seq delivered sent"},
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
