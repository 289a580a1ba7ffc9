package core

import (
	"math/rand/v2"
	"testing"
)

// settle releases every moving slot (its owner acked everything) until nothing moves.
func settle(g *groupState) {
	for moved := true; moved; {
		moved = false
		for i, s := range g.Slots {
			_, ownerMember := g.member(s.Owner)
			if s.Owner != 0 && (s.Target != 0 || !ownerMember) {
				g.apply(&groupCmd{Op: "release", Member: groupMember{ID: s.Owner}, Slot: i, Gen: s.Gen, Committed: -1})
				moved = true
			}
		}
	}
}

func owners(g *groupState) map[uint64]int {
	out := map[uint64]int{}
	for _, s := range g.Slots {
		out[s.Owner]++
	}
	return out
}

func newGroup(parts int) *groupState {
	g := &groupState{}
	for range parts {
		g.Partitions = append(g.Partitions, "p")
		g.Slots = append(g.Slots, groupSlot{Start: -1})
	}
	return g
}

func TestRebalanceMovesOnlyWhatMust(t *testing.T) {
	g := newGroup(4)
	join := func(id uint64) { g.apply(&groupCmd{Op: "join", Member: groupMember{ID: id}}) }
	leave := func(id uint64) { g.apply(&groupCmd{Op: "leave", Member: groupMember{ID: id}}) }
	join(1)
	if o := owners(g); o[1] != 4 {
		t.Fatalf("one member owns %v", o)
	}
	before := append([]groupSlot(nil), g.Slots...)
	join(2)
	moving := 0
	for i, s := range g.Slots {
		if s.Target != 0 {
			moving++
			if s.Owner != 1 || s.Target != 2 {
				t.Fatalf("slot %d: %+v", i, s)
			}
		}
	}
	if moving != 2 {
		t.Fatalf("%d slots move to the second member, want 2", moving)
	}
	settle(g)
	if o := owners(g); o[1] != 2 || o[2] != 2 {
		t.Fatalf("after the join: %v", o)
	}
	changed := 0
	for i := range g.Slots {
		if g.Slots[i].Owner != before[i].Owner {
			changed++
		}
	}
	if changed != 2 {
		t.Fatalf("%d slots changed owner", changed)
	}
	before = append([]groupSlot(nil), g.Slots...)
	join(3)
	settle(g)
	changed = 0
	for i := range g.Slots {
		if g.Slots[i].Owner != before[i].Owner {
			changed++
			if g.Slots[i].Owner != 3 {
				t.Fatalf("slot %d moved to %d, not to the new member", i, g.Slots[i].Owner)
			}
		}
	}
	if changed != 1 {
		t.Fatalf("the third member took %d slots, want 1", changed)
	}
	// The member with two leaves: only its two slots move.
	o := owners(g)
	var big uint64
	for id, n := range o {
		if n == 2 {
			big = id
		}
	}
	before = append([]groupSlot(nil), g.Slots...)
	leave(big)
	settle(g)
	for i := range g.Slots {
		if before[i].Owner != big && g.Slots[i].Owner != before[i].Owner {
			t.Fatalf("slot %d moved from %d although its owner stayed", i, before[i].Owner)
		}
	}
	if o := owners(g); o[big] != 0 || len(o) != 2 {
		t.Fatalf("after the leave: %v", o)
	}
}

func TestRebalanceStaysBalanced(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for round := range 200 {
		parts := 1 + rng.IntN(9)
		g := newGroup(parts)
		var ids []uint64
		next := uint64(1)
		for step := range 30 {
			if len(ids) == 0 || rng.IntN(3) > 0 {
				g.apply(&groupCmd{Op: "join", Member: groupMember{ID: next}})
				ids = append(ids, next)
				next++
			} else {
				k := rng.IntN(len(ids))
				g.apply(&groupCmd{Op: "leave", Member: groupMember{ID: ids[k]}})
				ids = append(ids[:k], ids[k+1:]...)
			}
			settle(g)
			o := owners(g)
			lo, hi := parts, 0
			for _, id := range ids {
				lo, hi = min(lo, o[id]), max(hi, o[id])
			}
			if len(ids) > 0 && (hi-lo > 1 || o[0] != 0) {
				t.Fatalf("round %d step %d: %d partitions over members %v: %v", round, step, parts, ids, o)
			}
			for _, s := range g.Slots {
				if _, ok := g.member(s.Owner); s.Owner != 0 && !ok {
					t.Fatalf("round %d step %d: slot owned by %d, not a member", round, step, s.Owner)
				}
			}
		}
	}
}

func TestGroupRecordRoundTrip(t *testing.T) {
	g := newGroup(2)
	g.key = groupKey{"/", "s", "g"}
	g.apply(&groupCmd{Op: "join", Member: groupMember{ID: 1<<48 | 5, Node: "n1", Tag: "t"}})
	g2, err := decodeGroup(g.encode())
	if err != nil {
		t.Fatal(err)
	}
	if g2.key != g.key || len(g2.Members) != 1 || g2.Members[0] != g.Members[0] || g2.Slots[0] != g.Slots[0] || g2.NextSeq != g.NextSeq {
		t.Fatalf("round trip: %+v, want %+v", g2, g)
	}
}

// TestRebalanceRestrictedMembers: members that may hold one slot only (stream-protocol
// subscriptions) get only that slot; a group of them alone follows RabbitMQ's rule (slot i to
// its subscriber i mod n, in join order); mixed with members that may hold any slot, every slot
// still has exactly one eligible owner.
func TestRebalanceRestrictedMembers(t *testing.T) {
	cases := []struct {
		name    string
		members []groupMember // joined in this order
		slots   int
		want    map[int]uint64 // slot -> owner after settling
	}{
		{"one slot, oldest first", []groupMember{{ID: 1, Only: 1}, {ID: 2, Only: 1}}, 1, map[int]uint64{0: 1}},
		{"two consumers over two partitions", []groupMember{{ID: 1, Only: 1}, {ID: 2, Only: 2}, {ID: 3, Only: 1}, {ID: 4, Only: 2}}, 2,
			map[int]uint64{0: 1, 1: 4}},
		{"three partitions, two consumers", []groupMember{{ID: 1, Only: 1}, {ID: 2, Only: 2}, {ID: 3, Only: 3},
			{ID: 4, Only: 1}, {ID: 5, Only: 2}, {ID: 6, Only: 3}}, 3, map[int]uint64{0: 1, 1: 5, 2: 3}},
		{"AMQP member first keeps its slot", []groupMember{{ID: 1}, {ID: 2, Only: 1}}, 1, map[int]uint64{0: 1}},
		{"stream member first keeps its slot", []groupMember{{ID: 2, Only: 1}, {ID: 1}}, 1, map[int]uint64{0: 2}},
		{"restricted members only get their slot", []groupMember{{ID: 1}, {ID: 2, Only: 2}, {ID: 3, Only: 2}}, 2,
			map[int]uint64{0: 1, 1: 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := newGroup(tc.slots)
			for _, m := range tc.members {
				g.apply(&groupCmd{Op: "join", Member: m})
				settle(g)
			}
			for i, s := range g.Slots {
				if want, ok := tc.want[i]; ok && s.Owner != want {
					t.Fatalf("slot %d owned by %d, want %d (slots %+v)", i, s.Owner, want, g.Slots)
				}
				m, ok := g.member(s.Owner)
				if !ok || !m.eligible(i) {
					t.Fatalf("slot %d owned by %d, not an eligible member", i, s.Owner)
				}
			}
			// Leaving with Free hands the slot over at once.
			first := tc.members[0]
			g.apply(&groupCmd{Op: "leave", Member: groupMember{ID: first.ID}, Free: true})
			settle(g)
			for i, s := range g.Slots {
				if s.Owner == first.ID {
					t.Fatalf("slot %d still owned by the member that left", i)
				}
			}
		})
	}
}
