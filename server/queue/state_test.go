package queue

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// sampleCommands has one command of every encoded type, with every field its type uses set.
func sampleCommands() []Command {
	msg := &Message{Exchange: "ex", RoutingKey: "rk", Props: []byte{0x10, 0, 2}, Body: []byte("body"),
		Persistent: true, Priority: 3, BCC: []string{"b1", "b2"}, ExpiresAt: 123456, Dedupe: DedupeKey{Source: 5, Seq: 77}}
	return []Command{
		{Type: CmdEnqueue, Msg: msg, Producer: 1<<48 | 9, Seq: 1 << 40},
		{Type: CmdEnqueue, Msg: &Message{}},
		{Type: CmdConfigure, Limits: Config{MessageTTL: -1, MaxLength: 2, MaxLengthBytes: 1 << 40, Overflow: RejectPublishDLX, DeliveryLimit: 5}},
		{Type: CmdSettle, Tags: []Tag{{ID: 1, Count: 0}, {ID: 1 << 60, Count: 1 << 31}}},
		{Type: CmdReturn, Tags: []Tag{{ID: 3, Count: 2}}},
		{Type: CmdDiscard, Tags: []Tag{{ID: 4, Count: 0}}},
		{Type: CmdConsume, Consumer: 1<<48 | 1<<32 | 5, Prefetch: 1 << 30, Priority: -7, NoAck: true, Exclusive: true, Credited: true, Credit: 256},
		{Type: CmdConsume, Consumer: 2, Priority: 1 << 30},
		{Type: CmdCancel, Consumer: 7, GiveBack: true},
		{Type: CmdCredit, Consumer: 7, Credit: 1 << 50},
		{Type: CmdGet, NoAck: true, Owner: 3<<16 | 4, Producer: 11, Seq: 12},
		{Type: CmdPurge, Producer: 11, Seq: 13},
		{Type: CmdTake, Owner: 3<<16 | 4, Producer: 11, Seq: 14, ID: 1 << 45},
		{Type: CmdTick},
		{Type: CmdNodeReset, Node: 9, Except: true, Epochs: []uint16{1, 65535}},
		{Type: CmdNodeReset, Node: 9},
		{Type: CmdDeadLettered, Seqs: []uint64{1, 2, 1 << 63}},
	}
}

// normalise makes nil and empty slices equal for comparison.
func normalise(c Command) Command {
	if len(c.Tags) == 0 {
		c.Tags = nil
	}
	if len(c.Epochs) == 0 {
		c.Epochs = nil
	}
	if len(c.Seqs) == 0 {
		c.Seqs = nil
	}
	if c.Msg != nil {
		m := *c.Msg
		if len(m.Props) == 0 {
			m.Props = nil
		}
		if len(m.Body) == 0 {
			m.Body = nil
		}
		if len(m.BCC) == 0 {
			m.BCC = nil
		}
		c.Msg = &m
	}
	return c
}

func TestCommandRoundTrip(t *testing.T) {
	var dec Command
	for i, cmd := range sampleCommands() {
		b := AppendCommand([]byte("pre"), &cmd, -42)
		if !bytes.HasPrefix(b, []byte("pre")) {
			t.Fatal("AppendCommand does not append")
		}
		now, err := DecodeCommand(b[3:], &dec)
		if err != nil {
			t.Fatalf("command %d (%d): %v", i, cmd.Type, err)
		}
		if now != -42 || !reflect.DeepEqual(normalise(dec), normalise(cmd)) {
			t.Fatalf("command %d: decoded %+v at %d, want %+v", i, dec, now, cmd)
		}
		// Fields appended by a later version are ignored.
		if _, err := DecodeCommand(append(b[3:], 1, 2, 3), &dec); err != nil && cmd.Type != CmdEnqueue {
			t.Fatalf("command %d with trailing bytes: %v", i, err)
		}
		for n := 0; n < len(b)-3; n++ {
			if _, err := DecodeCommand(b[3:3+n], &dec); err == nil && cmd.Type != CmdEnqueue && cmd.Type != CmdTick {
				// Truncations that still parse are fine only for the variable-length tail of a
				// message; other commands must fail.
				if n < len(b)-3 {
					t.Fatalf("command %d truncated to %d of %d bytes decoded", i, n, len(b)-3)
				}
			}
		}
	}
	for _, local := range []CommandType{CmdCheckout, CmdRecover, 0, cmdTypes} {
		if b := AppendCommand(nil, &Command{Type: local}, 0); len(b) != 0 {
			t.Fatalf("local command %d encoded to %d bytes", local, len(b))
		}
	}
	if _, err := DecodeCommand([]byte{commandVersion + 1, 1}, &dec); !errors.Is(err, errCommandVersion) {
		t.Fatalf("unknown version: %v", err)
	}
	if _, err := DecodeCommand([]byte{commandVersion, byte(CmdCheckout), 0}, &dec); !errors.Is(err, errCommandType) {
		t.Fatalf("local type over the wire: %v", err)
	}
}

// FuzzDecodeCommand: any input decodes or fails without a panic; what decodes re-encodes to a
// command that decodes the same, and applies to a replicated state without a panic.
func FuzzDecodeCommand(f *testing.F) {
	for _, cmd := range sampleCommands() {
		f.Add(AppendCommand(nil, &cmd, 1000))
	}
	f.Add([]byte{1, v1Enqueue, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, v1Settle, 2, 1, 5})
	f.Add([]byte{1, v1NodeReset, 0, 1, 0, 2, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var cmd Command
		now, err := DecodeCommand(b, &cmd)
		if err != nil {
			return
		}
		s := NewState(StateConfig{Config: DefaultConfig(), Replicated: true, Source: 1})
		var fx Effects
		s.Apply(&Command{Type: CmdConsume, Consumer: 5, Credited: true, Credit: 10}, 0, &fx)
		s.Apply(&Command{Type: CmdEnqueue, Msg: body("x")}, 0, &fx)
		s.Apply(&cmd, now, &fx)
		if _, err := DecodeState(s.AppendSnapshot(nil)); err != nil {
			t.Fatalf("state after %+v does not snapshot: %v", cmd, err)
		}
		if b[0] != commandVersion {
			return // version 1 re-encodes as version 2
		}
		var again Command
		if now2, err := DecodeCommand(AppendCommand(nil, &cmd, now), &again); err != nil || now2 != now ||
			!reflect.DeepEqual(normalise(again), normalise(cmd)) {
			t.Fatalf("re-encoded %+v decodes to %+v, %v", cmd, again, err)
		}
	})
}

// replicated returns a replicated state with one credited consumer.
func replicatedState(t *testing.T) *driver {
	t.Helper()
	m := newDriverState(StateConfig{Config: DefaultConfig(), Replicated: true, Source: 9})
	return m
}

// Each command applied twice (a retry after a lost leadership) has the effect of one.
func TestStateRetriesAreIdempotent(t *testing.T) {
	const p = 1<<48 | 1<<32 | 77
	type result struct {
		ready, unacked, credits int
	}
	observe := func(m *driver) result {
		r := result{ready: m.ready, unacked: len(m.unacked)}
		if c := m.consumers[5]; c != nil {
			r.credits = int(c.spec.Credit)
		}
		return r
	}
	tests := []struct {
		name  string
		setup func(m *driver)
		cmd   func(m *driver) Command
	}{
		{"enqueue", nil, func(*driver) Command { return Command{Type: CmdEnqueue, Msg: body("a"), Producer: p, Seq: 1} }},
		{"dead letter", nil, func(*driver) Command {
			return Command{Type: CmdEnqueue, Msg: &Message{Body: []byte("d"), Dedupe: DedupeKey{Source: 3, Seq: 4}}}
		}},
		{"get", nil, func(*driver) Command { return Command{Type: CmdGet, Producer: p, Seq: 2, Owner: 1<<16 | 1} }},
		{"get no-ack", nil, func(*driver) Command { return Command{Type: CmdGet, NoAck: true, Producer: p, Seq: 2} }},
		{"purge", nil, func(*driver) Command { return Command{Type: CmdPurge, Producer: p, Seq: 3} }},
		{"settle", func(m *driver) { m.apply(Command{Type: CmdGet, Producer: p, Seq: 9}, 0) },
			func(m *driver) Command { return Command{Type: CmdSettle, Tags: []Tag{m.tag(1)}} }},
		{"return", func(m *driver) { m.apply(Command{Type: CmdGet, Producer: p, Seq: 9}, 0) },
			func(m *driver) Command { return Command{Type: CmdReturn, Tags: []Tag{m.tag(1)}} }},
		{"discard", func(m *driver) { m.apply(Command{Type: CmdGet, Producer: p, Seq: 9}, 0) },
			func(m *driver) Command { return Command{Type: CmdDiscard, Tags: []Tag{m.tag(1)}} }},
		{"credit", func(m *driver) { m.AddConsumer(ConsumerSpec{ID: 5, Credited: true, Credit: 1}) },
			func(*driver) Command { return Command{Type: CmdCredit, Consumer: 5, Credit: 2} }},
		{"consume", nil, func(*driver) Command {
			return Command{Type: CmdConsume, Consumer: 5, Credited: true, Credit: 2, Exclusive: true}
		}},
		{"cancel", func(m *driver) { m.AddConsumer(ConsumerSpec{ID: 5, Credited: true, Credit: 2}) },
			func(*driver) Command { return Command{Type: CmdCancel, Consumer: 5, GiveBack: true} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			once, twice := replicatedState(t), replicatedState(t)
			for _, m := range []*driver{once, twice} {
				for i := range 3 {
					m.apply(Command{Type: CmdEnqueue, Msg: body(fmt.Sprint(i))}, 0)
				}
				if tt.setup != nil {
					tt.setup(m)
				}
			}
			cmd := tt.cmd(once)
			once.apply(cmd, 0)
			want := observe(once)
			twice.apply(cmd, 0)
			first := twice.fx.Reply
			twice.apply(cmd, 0)
			if got := observe(twice); !reflect.DeepEqual(got, want) {
				t.Fatalf("applied twice: %+v\nonce: %+v", got, want)
			}
			switch cmd.Type {
			case CmdGet, CmdPurge:
				// The retry gets the first answer.
				r := twice.fx.Reply
				r.Duplicate = false
				if !twice.fx.Reply.Duplicate || !reflect.DeepEqual(r, first) {
					t.Fatalf("retry answered %+v, first answer %+v", twice.fx.Reply, first)
				}
			case CmdEnqueue:
				if r := twice.fx.Reply; !r.Duplicate || r.Status != Accepted {
					t.Fatalf("retried enqueue answered %+v", r)
				}
			}
			// The queue itself (messages, consumers, credit, records) is the same.
			if !bytes.Equal(once.s.m.appendSnapshot(nil), twice.s.m.appendSnapshot(nil)) ||
				once.s.DeadLetters() != twice.s.DeadLetters() || len(once.s.getOwner) != len(twice.s.getOwner) {
				t.Fatal("states differ after the retry")
			}
		})
	}
}

func TestSeqWindow(t *testing.T) {
	var w seqWindow
	for _, c := range []struct {
		seq     uint64
		oldSeen bool
		want    bool
	}{
		{1, true, false}, {1, true, true}, {3, true, false}, {2, true, false}, {2, true, true},
		{dedupeWindow + 3, true, false},                     // 3 is now the oldest the window holds
		{3, true, true}, {2, true, true}, {2, false, false}, // too old: a producer's retry is a duplicate, a dead letter is not
		{1 << 62, true, false}, {1<<62 - 1, true, false}, {1 << 62, true, true}, // a far jump clears the window at once
	} {
		if got := w.seen(c.seq, c.oldSeen); got != c.want {
			t.Fatalf("seen(%d, %v) = %v, want %v", c.seq, c.oldSeen, got, c.want)
		}
	}
}

// The state's records are bounded: reply caches per producer, windows per producer and source.
func TestStateRecordsBounded(t *testing.T) {
	m := replicatedState(t)
	const p = 77
	for i := range replyCache + 5 {
		m.apply(Command{Type: CmdEnqueue, Msg: body("x")}, 0)
		m.apply(Command{Type: CmdGet, NoAck: true, Producer: p, Seq: uint64(i + 1)}, 0)
	}
	if n := len(m.s.producers[p].replies); n != replyCache {
		t.Fatalf("%d cached replies", n)
	}
	if r := m.apply(Command{Type: CmdGet, NoAck: true, Producer: p, Seq: 1}, 0).Reply; !r.Stale || r.OK {
		t.Fatalf("retry older than the cache: %+v", r)
	}
	if r := m.apply(Command{Type: CmdGet, NoAck: true, Producer: p, Seq: replyCache + 5}, 0).Reply; !r.Duplicate || !r.OK {
		t.Fatalf("retry in the cache: %+v", r)
	}
	for i := range maxWindows + 10 {
		m.apply(Command{Type: CmdEnqueue, Msg: body("x"), Producer: uint64(1000 + i), Seq: 1}, 0)
		m.apply(Command{Type: CmdEnqueue, Msg: &Message{Dedupe: DedupeKey{Source: uint64(1000 + i), Seq: 1}}}, 0)
	}
	if len(m.s.producers) != maxWindows || len(m.s.sources) != maxWindows {
		t.Fatalf("%d producer and %d source windows", len(m.s.producers), len(m.s.sources))
	}
	if _, ok := m.s.producers[p]; ok {
		t.Fatal("the least recently used producer was not evicted")
	}
}

// Dead letters of a replicated state are recorded with dedupe keys until CmdDeadLettered.
func TestStateDeadLetterRecords(t *testing.T) {
	m := replicatedState(t)
	for i := range 3 {
		m.apply(Command{Type: CmdEnqueue, Msg: body(fmt.Sprint(i))}, 0)
	}
	m.apply(Command{Type: CmdGet, Producer: 1, Seq: 1}, 0)
	m.apply(Command{Type: CmdGet, Producer: 1, Seq: 2}, 0)
	fx := m.apply(Command{Type: CmdDiscard, Tags: []Tag{m.tag(1), m.tag(2)}}, 0)
	if len(fx.Dead) != 0 || fx.DeadRecorded != 2 || m.s.DeadLetters() != 2 {
		t.Fatalf("dead %d recorded %d records %d", len(fx.Dead), fx.DeadRecorded, m.s.DeadLetters())
	}
	pending := m.s.pendingDeadLetters(nil, 10, func(uint64) bool { return false })
	if len(pending) != 2 || pending[0].Key != (DedupeKey{9, 1}) || pending[1].Key != (DedupeKey{9, 2}) ||
		string(pending[1].Msg.Body) != "1" || pending[1].Reason != ReasonRejected {
		t.Fatalf("pending %+v", pending)
	}
	m.apply(Command{Type: CmdDeadLettered, Seqs: []uint64{2, 7}}, 0)
	m.apply(Command{Type: CmdDeadLettered, Seqs: []uint64{2}}, 0) // again
	if m.s.DeadLetters() != 1 {
		t.Fatalf("records %d", m.s.DeadLetters())
	}
	c := snapDecode(t, m.AppendSnapshot(nil))
	if p := c.s.pendingDeadLetters(nil, 10, func(uint64) bool { return false }); len(p) != 1 || p[0].Key.Seq != 1 {
		t.Fatalf("restored records %+v", p)
	}
	m.apply(Command{Type: CmdDeadLettered, Seqs: []uint64{1}}, 0)
	if m.s.DeadLetters() != 0 || m.s.dlx.Len() != 0 {
		t.Fatalf("records %d (%d kept)", m.s.DeadLetters(), m.s.dlx.Len())
	}
	// Time never goes backwards in a replicated state.
	m.apply(Command{Type: CmdTick}, 500)
	m.apply(Command{Type: CmdTick}, 100)
	if m.s.now != 500 {
		t.Fatalf("now %d", m.s.now)
	}
}

// TestConfigureTrims: CmdConfigure's new length limit trims a drop-head queue from the head at
// once, and a replicated state applies it from its log like any command.
func TestConfigureTrims(t *testing.T) {
	for _, replicated := range []bool{false, true} {
		s := NewState(StateConfig{Config: DefaultConfig(), Replicated: replicated, Source: 7})
		var fx Effects
		for i := 0; i < 5; i++ {
			fx = Effects{}
			s.Apply(&Command{Type: CmdEnqueue, Msg: &Message{Body: []byte{byte('0' + i)}}}, 1000, &fx)
		}
		lim := DefaultConfig()
		lim.MaxLength = 2
		fx = Effects{}
		s.Apply(&Command{Type: CmdConfigure, Limits: lim}, 1001, &fx)
		if s.Ready() != 2 {
			t.Fatalf("replicated %v: %d ready after max-length 2, want 2", replicated, s.Ready())
		}
		if !replicated && len(fx.Dead) != 3 || replicated && fx.DeadRecorded != 3 {
			t.Fatalf("replicated %v: %d dead emitted, %d recorded, want 3 (max-length)", replicated, len(fx.Dead), fx.DeadRecorded)
		}
	}
}
