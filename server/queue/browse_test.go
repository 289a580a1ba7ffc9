package queue

import (
	"bytes"
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func bodiesOf(ds []Delivery) string {
	var s []string
	for _, d := range ds {
		if d.Msg == nil {
			s = append(s, "<nil>")
			continue
		}
		s = append(s, string(d.Msg.Body))
	}
	return strings.Join(s, ",")
}

// TestPeekOrderAndTake checks that peek lists the ready messages in the order deliveries take
// them (priority, then requeued before new, by id), skips expired ones, changes nothing, and that
// CmdTake takes exactly the named message.
func TestPeekOrderAndTake(t *testing.T) {
	const now = 1_000_000
	type step struct {
		cmd  Command
		at   int64
		peek string // the bodies a peek of 10 shows afterwards
	}
	enq := func(b string, prio uint8, expires int64) Command {
		return Command{Type: CmdEnqueue, Msg: &Message{Body: []byte(b), Priority: prio, ExpiresAt: expires}}
	}
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{"fifo", DefaultConfig(), []step{
			{cmd: enq("a", 0, 0), peek: "a"},
			{cmd: enq("b", 0, 0), peek: "a,b"},
			{cmd: enq("c", 0, 0), peek: "a,b,c"},
			{cmd: Command{Type: CmdTake, ID: 2}, peek: "a,c"},
			{cmd: Command{Type: CmdTake, ID: 2}, peek: "a,c"}, // not ready any more: nothing
			{cmd: Command{Type: CmdReturn, Tags: []Tag{{ID: 2, Count: 0}}}, peek: "a,b,c"},
			{cmd: Command{Type: CmdTake, ID: 3}, peek: "a,b"},
			{cmd: Command{Type: CmdSettle, Tags: []Tag{{ID: 3, Count: 0}}}, peek: "a,b"},
		}},
		{"priorities", cfgWith(func(c *Config) { c.MaxPriority = 3 }), []step{
			{cmd: enq("low", 0, 0), peek: "low"},
			{cmd: enq("high", 3, 0), peek: "high,low"},
			{cmd: enq("mid", 2, 0), peek: "high,mid,low"},
			{cmd: Command{Type: CmdGet}, peek: "mid,low"},
			{cmd: Command{Type: CmdReturn, Tags: []Tag{{ID: 2, Count: 0}}}, peek: "high,mid,low"},
			{cmd: Command{Type: CmdTake, ID: 2}, peek: "mid,low"},
			{cmd: Command{Type: CmdTake, ID: 1}, peek: "mid"},
		}},
		{"expiry", DefaultConfig(), []step{
			{cmd: enq("soon", 0, now+10), at: now, peek: "soon"},
			{cmd: enq("later", 0, now+1000), at: now, peek: "soon,later"},
			{cmd: Command{Type: CmdTouch}, at: now + 20, peek: "later"}, // due, not yet expired
			{cmd: Command{Type: CmdTake, ID: 1}, at: now + 20, peek: "later"},
			{cmd: Command{Type: CmdTake, ID: 2}, at: now + 20, peek: ""},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewState(StateConfig{Config: tt.cfg})
			var fx Effects
			for i, st := range tt.steps {
				at := st.at
				if at == 0 {
					at = now
				}
				fx.Reset()
				cmd := st.cmd
				s.Apply(&cmd, at, &fx)
				if cmd.Type == CmdTake {
					want := cmd.ID
					if fx.Reply.OK && (fx.Reply.Delivery.ID != want || fx.Reply.Delivery.Settled) {
						t.Fatalf("step %d: took %+v, want message %d unacked", i, fx.Reply.Delivery, want)
					}
				}
				ready, unacked := s.Ready(), s.Unacked()
				for range 2 {
					if got := bodiesOf(peekState(s, 10, at)); got != st.peek {
						t.Fatalf("step %d: peek %q, want %q", i, got, st.peek)
					}
				}
				if s.Ready() != ready || s.Unacked() != unacked {
					t.Fatalf("step %d: peek changed the counts", i)
				}
				if got := bodiesOf(peekState(s, 1, at)); st.peek != "" && !strings.HasPrefix(st.peek, got) {
					t.Fatalf("step %d: peek of 1 %q, want the head of %q", i, got, st.peek)
				}
			}
		})
	}
}

// TestClassicPeekPaged peeks a classic queue whose later messages are paged out to disk and takes
// a paged one by id.
func TestClassicPeekPaged(t *testing.T) {
	db := openDB(t, t.TempDir())
	defer db.Close()
	q := openClassic(t, OpenConfig{DB: db, ID: 1, Durable: true, Hooks: &thooks{}, Extra: &ClassicConfig{PageWindow: 2}})
	for _, b := range []string{"a", "b", "c", "d"} {
		d := newDone(t)
		q.Publish(&Message{Body: []byte(b), Persistent: true}, d)
		if err := d.wait(); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		ds, err := q.Peek(10)
		if err != nil || bodiesOf(ds) != "a,b,c,d" {
			t.Fatalf("peek: %q %v", bodiesOf(ds), err)
		}
		for _, d := range ds {
			if d.Redelivered || d.DeliveryCount != 0 {
				t.Fatalf("peeked %+v", d)
			}
		}
	}
	d, ok, err := q.GetID(3)
	if err != nil || !ok || string(d.Msg.Body) != "c" {
		t.Fatalf("GetID(3): %+v %v %v", d, ok, err)
	}
	if err := q.Settle(0, SettleAck, []Tag{d.Tag()}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := q.GetID(3); ok {
		t.Fatal("GetID(3) again took something")
	}
	ds, _ := q.Peek(10)
	if bodiesOf(ds) != "a,b,d" {
		t.Fatalf("peek after the take: %q", bodiesOf(ds))
	}
	for _, want := range []string{"a", "b", "d"} {
		g, _, ok, err := q.Get(true)
		if err != nil || !ok || string(g.Msg.Body) != want || g.Redelivered {
			t.Fatalf("get: %+v %v %v, want %q", g, ok, err, want)
		}
	}
}

// TestQuorumPeekAndTakeAgree peeks every replica of a quorum queue, takes a message from the
// middle through one of them and returns it: every replica applies the same take and the same
// return (the message goes back to its place), and all snapshot to the same bytes.
func TestQuorumPeekAndTakeAgree(t *testing.T) {
	c := newCluster(t)
	var qs []*Quorum
	for range 3 {
		qs = append(qs, c.add(t, OpenConfig{Lifecycle: DefaultConfig()}, false))
	}
	for _, b := range []string{"a", "b", "c"} {
		publishOK(t, qs[0], body(b))
	}
	peekAll := func(want string) {
		t.Helper()
		for i, q := range qs {
			waitFor(t, fmt.Sprintf("replica %d peeks %q", i, want), func() bool {
				ds, err := q.Peek(10)
				return err == nil && bodiesOf(ds) == want
			})
		}
	}
	peekAll("a,b,c")
	d, ok, err := qs[1].GetID(2)
	if err != nil || !ok || string(d.Msg.Body) != "b" || d.Redelivered {
		t.Fatalf("GetID(2) on replica 1: %+v %v %v", d, ok, err)
	}
	peekAll("a,c")
	if _, ok, err := qs[2].GetID(2); err != nil || ok {
		t.Fatalf("GetID(2) again: %v %v", ok, err)
	}
	if err := qs[1].Settle(0, SettleRequeue, []Tag{d.Tag()}); err != nil {
		t.Fatal(err)
	}
	peekAll("a,b,c")
	for i, q := range qs {
		ds, _ := q.Peek(10)
		if ds[0].Redelivered || !ds[1].Redelivered || ds[1].DeliveryCount != 1 || ds[2].Redelivered {
			t.Fatalf("replica %d after the return: %+v", i, ds)
		}
	}
	waitFor(t, "replicas applied", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.log) == 0
	})
	snap := qs[0].Snapshot()
	for i, q := range qs[1:] {
		if !bytes.Equal(q.Snapshot()[1:], snap[1:]) {
			t.Fatalf("replica %d's snapshot differs from replica 0's", i+1)
		}
	}
	// basic.get takes them in the order the peek showed.
	for _, want := range []string{"a", "b", "c"} {
		g, _, ok, err := qs[0].Get(true)
		if err != nil || !ok || string(g.Msg.Body) != want {
			t.Fatalf("get: %+v %v %v, want %q", g, ok, err, want)
		}
	}
}

// TestPeekMatchesDeliveryOrder applies random publishes, gets, takes, returns and acks and checks
// after each that a peek lists the ready messages exactly in the model's delivery order (highest
// priority first, smallest id within a priority, whatever was taken from the middle and returned)
// and that the next basic.get takes the first of them.
func TestPeekMatchesDeliveryOrder(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		s := NewState(StateConfig{Config: cfgWith(func(c *Config) { c.MaxPriority = 2 })})
		var fx Effects
		prio := map[uint64]uint8{}
		ready := map[uint64]bool{}
		var unacked []Tag
		apply := func(cmd Command) {
			fx.Reset()
			s.Apply(&cmd, 1000, &fx)
		}
		model := func() []uint64 {
			var ids []uint64
			for id := range ready {
				ids = append(ids, id)
			}
			slices.SortFunc(ids, func(a, b uint64) int {
				if prio[a] != prio[b] {
					return cmp.Compare(prio[b], prio[a])
				}
				return cmp.Compare(a, b)
			})
			return ids
		}
		for step := range 1500 {
			switch r := rng.IntN(10); {
			case r < 4:
				p := uint8(rng.IntN(3))
				apply(Command{Type: CmdEnqueue, Msg: &Message{Body: []byte("x"), Priority: p}})
				prio[fx.Reply.ID], ready[fx.Reply.ID] = p, true
			case r < 6 && len(ready) > 0:
				ids := model()
				id := ids[rng.IntN(len(ids))]
				apply(Command{Type: CmdTake, ID: id})
				if !fx.Reply.OK || fx.Reply.Delivery.ID != id {
					t.Fatalf("seed %d step %d: take %d: %+v", seed, step, id, fx.Reply)
				}
				delete(ready, id)
				unacked = append(unacked, fx.Reply.Delivery.Tag())
			case r < 7 && len(ready) > 0:
				apply(Command{Type: CmdGet})
				want := model()[0]
				if !fx.Reply.OK || fx.Reply.Delivery.ID != want {
					t.Fatalf("seed %d step %d: get took %d, want %d", seed, step, fx.Reply.Delivery.ID, want)
				}
				delete(ready, want)
				unacked = append(unacked, fx.Reply.Delivery.Tag())
			case r < 9 && len(unacked) > 0:
				i := rng.IntN(len(unacked))
				tag := unacked[i]
				unacked = slices.Delete(unacked, i, i+1)
				if rng.IntN(2) == 0 {
					apply(Command{Type: CmdReturn, Tags: []Tag{tag}})
					ready[tag.ID] = true
				} else {
					apply(Command{Type: CmdSettle, Tags: []Tag{tag}})
				}
			}
			got := peekState(s, len(ready)+1, 1000)
			want := model()
			if len(got) != len(want) {
				t.Fatalf("seed %d step %d: peek %d messages, want %d", seed, step, len(got), len(want))
			}
			for i := range got {
				if got[i].ID != want[i] {
					t.Fatalf("seed %d step %d: peek order %v, want %v", seed, step, ids(got), want)
				}
			}
		}
	}
}
