package core

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"warren/amqp"
	"warren/server/queue"
	"warren/storage"
)

// Consumer groups over AMQP 0-9-1 (basic.consume with x-stream-consumer-group G on a super
// stream S, or on a plain stream: one partition). The group's state (members, and for each
// partition its owner and the member it moves to) is cluster-wide: it lives in the metadata raft
// group, one record per group, and every change (join, leave, release of a partition, a node
// gone, an operator's reset) is one command applied by the same deterministic code on every node.
// The metadata group holds it because a group spans partitions whose coordination groups may
// have different leaders, membership changes are rare next to messages, and every node already
// applies the metadata group (so every node knows every member). Offsets do not go through it:
// acks commit each partition's named offset G through that stream's own group.
//
// Assignment is balanced (the member counts differ by at most one) and sticky: on a join or a
// leave only the partitions that must move do. A partition moves in two steps: the group names
// the member it goes to (the target); the owner's node stops delivering from it and, once every
// delivery it made from the partition is settled (or its channel closed), proposes its release
// with the committed offset; the release makes the target the owner, which starts right after
// that offset. A member whose node is gone loses its partitions at once. So no two members ever
// hold unacknowledged messages of one partition.

// kindGroup is the record kind of consumer groups.
const kindGroup byte = 'G'

// opGroup carries one consumer-group command.
const opGroup metaOp = 9

// groupKey names a group: a (super) stream and the group's name in a vhost.
type groupKey struct{ vhost, stream, group string }

func (k groupKey) recordKey() []byte { return metaKey(kindGroup, k.vhost, k.stream, k.group) }

// groupMember is a member of a group.
type groupMember struct {
	ID   uint64 // the consumer's id (node tag | boot epoch | counter)
	Node string
	Tag  string // consumer tag
	Seq  uint64 // join order
	// Only is 1 + the one slot the member may hold, 0 when it may hold any: a stream-protocol
	// subscription reads one partition, an AMQP 0-9-1 consumer all of them.
	Only int
}

// eligible reports whether the member may hold slot i.
func (m groupMember) eligible(i int) bool { return m.Only == 0 || m.Only == i+1 }

// groupSlot is a partition's assignment.
type groupSlot struct {
	Owner  uint64 // the member holding the partition (0: none)
	Target uint64 // the member it moves to once the owner released it (0: none)
	Start  int64  // where the next owner starts (-1: the committed offset, or its x-stream-offset)
	Exact  bool   // Start was set by an operator: it wins over the committed offset
	Gen    uint64 // counts the changes of Owner: a release names the ownership it ends
}

// setOwner changes a slot's owner.
func (s *groupSlot) setOwner(o uint64) {
	if s.Owner != o {
		s.Owner = o
		s.Gen++
	}
}

// groupState is one group's replicated state.
type groupState struct {
	key        groupKey
	Partitions []string
	Members    []groupMember
	Slots      []groupSlot
	NextSeq    uint64
}

func (g *groupState) member(id uint64) (groupMember, bool) {
	for _, m := range g.Members {
		if m.ID == id {
			return m, true
		}
	}
	return groupMember{}, false
}

// effective is who holds or will hold slot i among the members (0: nobody).
func (g *groupState) effective(i int, isMember map[uint64]bool) uint64 {
	s := g.Slots[i]
	if s.Target != 0 {
		return s.Target
	}
	if isMember[s.Owner] {
		return s.Owner
	}
	return 0
}

// rebalance assigns the partitions among the members: balanced, moving as few as it can.
func (g *groupState) rebalance() {
	isMember := make(map[uint64]bool, len(g.Members))
	for _, m := range g.Members {
		isMember[m.ID] = true
	}
	for i := range g.Slots {
		if t := g.Slots[i].Target; t != 0 && !isMember[t] || t == g.Slots[i].Owner {
			g.Slots[i].Target = 0
		}
	}
	n := len(g.Members)
	if n == 0 {
		return // owners keep what they hold until they release it
	}
	if g.onlyRestricted() {
		g.rebalanceRoundRobin()
		return
	}
	count := make(map[uint64]int, n)
	for i := range g.Slots {
		if e := g.effective(i, isMember); e != 0 {
			count[e]++
		}
	}
	// The larger quotas go to the members that hold the most already.
	order := slices.Clone(g.Members)
	slices.SortStableFunc(order, func(a, b groupMember) int {
		if c := cmp.Compare(count[b.ID], count[a.ID]); c != 0 {
			return c
		}
		return cmp.Compare(a.Seq, b.Seq)
	})
	base, extra := len(g.Slots)/n, len(g.Slots)%n
	quota := make(map[uint64]int, n)
	for i, m := range order {
		quota[m.ID] = base
		if i < extra {
			quota[m.ID]++
		}
	}
	kept := make(map[uint64]int, n)
	var free []int
	for i := range g.Slots {
		if e := g.effective(i, isMember); e != 0 && kept[e] < quota[e] {
			kept[e]++
			continue
		}
		free = append(free, i)
	}
	for _, i := range free {
		var pick uint64
		for _, m := range g.Members {
			if kept[m.ID] >= quota[m.ID] || !m.eligible(i) {
				continue
			}
			if pick == 0 || kept[m.ID] < kept[pick] {
				pick = m.ID
			}
		}
		if pick == 0 {
			// Nobody eligible has room (members restricted to one partition took quotas they
			// cannot use): the slot stays with its holder, or goes to the least loaded member
			// that may hold it.
			if e := g.effective(i, isMember); e != 0 {
				kept[e]++
				continue
			}
			for _, m := range g.Members {
				if m.eligible(i) && (pick == 0 || kept[m.ID] < kept[pick]) {
					pick = m.ID
				}
			}
			if pick == 0 {
				continue
			}
		}
		kept[pick]++
		g.assign(i, pick)
	}
}

// assign makes member id the holder of slot i: at once when nobody holds it, else once the
// owner released it.
func (g *groupState) assign(i int, id uint64) {
	s := &g.Slots[i]
	switch {
	case s.Owner == id:
		s.Target = 0
	case s.Owner == 0:
		s.setOwner(id)
		s.Target = 0
	default:
		s.Target = id
	}
}

// onlyRestricted reports whether every member may hold one slot only (stream-protocol
// subscriptions alone).
func (g *groupState) onlyRestricted() bool {
	for _, m := range g.Members {
		if m.Only == 0 {
			return false
		}
	}
	return true
}

// rebalanceRoundRobin is RabbitMQ's single-active-consumer rule, used while the group has only
// stream-protocol members (each subscribed to one partition): slot i goes to member i mod n of
// the n members subscribed to it, in join order. Clients that subscribe one consumer to every
// partition in the same order so spread the partitions over their consumers, as on RabbitMQ.
func (g *groupState) rebalanceRoundRobin() {
	for i := range g.Slots {
		var cands []uint64
		for _, m := range g.Members {
			if m.eligible(i) {
				cands = append(cands, m.ID)
			}
		}
		if len(cands) == 0 {
			continue
		}
		g.assign(i, cands[i%len(cands)])
	}
}

// encode and decodeGroup store a group as a record.
func (g *groupState) encode() []byte {
	parts := make([]any, len(g.Partitions))
	for i, p := range g.Partitions {
		parts[i] = p
	}
	members := make([]any, len(g.Members))
	for i, m := range g.Members {
		members[i] = amqp.Table{"id": int64(m.ID), "node": m.Node, "tag": m.Tag, "seq": int64(m.Seq), "only": int64(m.Only)}
	}
	slots := make([]any, len(g.Slots))
	for i, s := range g.Slots {
		slots[i] = amqp.Table{"owner": int64(s.Owner), "target": int64(s.Target), "start": s.Start, "exact": s.Exact, "gen": int64(s.Gen)}
	}
	return encodeRecord(amqp.Table{"vhost": g.key.vhost, "stream": g.key.stream, "group": g.key.group,
		"partitions": parts, "members": members, "slots": slots, "next_seq": int64(g.NextSeq)})
}

func decodeGroup(b []byte) (*groupState, error) {
	t, err := decodeRecord(b)
	if err != nil {
		return nil, err
	}
	g := &groupState{key: groupKey{str(t, "vhost"), str(t, "stream"), str(t, "group")}, Partitions: stringList(t["partitions"])}
	n, _ := amqp.AsInt64(t["next_seq"])
	g.NextSeq = uint64(n)
	ms, _ := t["members"].([]any)
	for _, x := range ms {
		mt, _ := x.(amqp.Table)
		id, _ := amqp.AsInt64(mt["id"])
		seq, _ := amqp.AsInt64(mt["seq"])
		only, _ := amqp.AsInt64(mt["only"])
		g.Members = append(g.Members, groupMember{ID: uint64(id), Node: str(mt, "node"), Tag: str(mt, "tag"), Seq: uint64(seq), Only: int(only)})
	}
	ss, _ := t["slots"].([]any)
	for _, x := range ss {
		st, _ := x.(amqp.Table)
		o, _ := amqp.AsInt64(st["owner"])
		tg, _ := amqp.AsInt64(st["target"])
		start, ok := amqp.AsInt64(st["start"])
		if !ok {
			start = -1
		}
		gen, _ := amqp.AsInt64(st["gen"])
		g.Slots = append(g.Slots, groupSlot{Owner: uint64(o), Target: uint64(tg), Start: start, Exact: boolean(st, "exact"), Gen: uint64(gen)})
	}
	if len(g.Slots) != len(g.Partitions) {
		return nil, fmt.Errorf("%w: consumer group with %d partitions and %d slots", errBadRecord, len(g.Partitions), len(g.Slots))
	}
	return g, nil
}

// groups is the node's copy of every consumer group and its local members.
type groups struct {
	mu     sync.Mutex
	byKey  map[groupKey]*groupState
	local  map[uint64]groupLocal // members consuming through this node, by consumer id
	closed bool
}

// groupCmd is one consumer-group command.
type groupCmd struct {
	Op         string // join, leave, release, node, reset
	Key        groupKey
	Partitions []string
	Member     groupMember
	Slot       int
	Gen        uint64 // release: the ownership it ends
	Committed  int64
	NodeTag    uint16
	KeepEpoch  int64 // node: members of this boot stay (-1: none)
	Starts     []int64
	Free       bool // leave: the member's slots are free at once (it has nothing to settle)
}

// groupLocal is a member consuming through this node: an AMQP 0-9-1 consumer (localMember) or a
// stream-protocol subscription (subMember).
type groupLocal interface {
	groupKey() groupKey
	// sync brings the member in line with its group's new state (never with groups.mu held).
	sync(g *groupState)
	// close stops the member's readers (broker shutdown).
	close()
}

func (c *groupCmd) encode() []byte {
	parts := make([]any, len(c.Partitions))
	for i, p := range c.Partitions {
		parts[i] = p
	}
	starts := make([]any, len(c.Starts))
	for i, s := range c.Starts {
		starts[i] = s
	}
	return encodeRecord(amqp.Table{"op": c.Op, "vhost": c.Key.vhost, "stream": c.Key.stream, "group": c.Key.group,
		"partitions": parts, "member": amqp.Table{"id": int64(c.Member.ID), "node": c.Member.Node, "tag": c.Member.Tag, "only": int64(c.Member.Only)}, "free": c.Free,
		"slot": int64(c.Slot), "gen": int64(c.Gen), "committed": c.Committed, "node_tag": int64(c.NodeTag), "keep_epoch": c.KeepEpoch, "starts": starts})
}

func decodeGroupCmd(b []byte) (*groupCmd, error) {
	t, err := decodeRecord(b)
	if err != nil {
		return nil, err
	}
	c := &groupCmd{Op: str(t, "op"), Key: groupKey{str(t, "vhost"), str(t, "stream"), str(t, "group")}, Partitions: stringList(t["partitions"])}
	mt := table(t, "member")
	id, _ := amqp.AsInt64(mt["id"])
	only, _ := amqp.AsInt64(mt["only"])
	c.Member = groupMember{ID: uint64(id), Node: str(mt, "node"), Tag: str(mt, "tag"), Only: int(only)}
	c.Free = boolean(t, "free")
	slot, _ := amqp.AsInt64(t["slot"])
	c.Slot = int(slot)
	gen, _ := amqp.AsInt64(t["gen"])
	c.Gen = uint64(gen)
	c.Committed, _ = amqp.AsInt64(t["committed"])
	tag, _ := amqp.AsInt64(t["node_tag"])
	c.NodeTag = uint16(tag)
	c.KeepEpoch, _ = amqp.AsInt64(t["keep_epoch"])
	arr, _ := t["starts"].([]any)
	for _, x := range arr {
		n, _ := amqp.AsInt64(x)
		c.Starts = append(c.Starts, n)
	}
	return c, nil
}

// applyGroup applies a consumer-group command on this node (the metadata FSM) and brings the
// local members in line.
func (b *Broker) applyGroup(data []byte, batch *storage.Batch) {
	c, err := decodeGroupCmd(data)
	if err != nil {
		b.log.Error("malformed consumer group command", "err", err)
		return
	}
	gs := &b.groups
	gs.mu.Lock()
	var changed []*groupState
	switch c.Op {
	case "node":
		for _, g := range gs.byKey {
			if g.dropNode(c.NodeTag, c.KeepEpoch) {
				changed = append(changed, g)
			}
		}
	default:
		g := gs.byKey[c.Key]
		if g == nil {
			if c.Op != "join" && c.Op != "reset" {
				gs.mu.Unlock()
				return
			}
			g = &groupState{key: c.Key, Partitions: c.Partitions}
			for range c.Partitions {
				g.Slots = append(g.Slots, groupSlot{Start: -1})
			}
			gs.byKey[c.Key] = g
		}
		if g.apply(c) {
			changed = append(changed, g)
		}
	}
	for _, g := range changed {
		batch.Set(g.key.recordKey(), g.encode())
	}
	local := make([]groupLocal, 0, len(gs.local))
	for _, m := range gs.local {
		local = append(local, m)
	}
	snap := make(map[groupKey]*groupState, len(changed))
	for _, g := range changed {
		snap[g.key] = g.clone()
	}
	gs.mu.Unlock()
	for _, m := range local {
		if g := snap[m.groupKey()]; g != nil {
			m.sync(g)
		}
	}
}

func (g *groupState) clone() *groupState {
	return &groupState{key: g.key, Partitions: slices.Clone(g.Partitions), Members: slices.Clone(g.Members),
		Slots: slices.Clone(g.Slots), NextSeq: g.NextSeq}
}

// apply changes the group for one command; it reports whether anything changed.
func (g *groupState) apply(c *groupCmd) bool {
	switch c.Op {
	case "join":
		if _, ok := g.member(c.Member.ID); ok {
			return false
		}
		g.NextSeq++
		m := c.Member
		m.Seq = g.NextSeq
		g.Members = append(g.Members, m)
	case "leave":
		i := slices.IndexFunc(g.Members, func(m groupMember) bool { return m.ID == c.Member.ID })
		if i < 0 {
			return false
		}
		g.Members = slices.Delete(g.Members, i, i+1)
		if c.Free {
			for j := range g.Slots {
				if s := &g.Slots[j]; s.Owner == c.Member.ID {
					s.setOwner(s.Target)
					s.Target = 0
				}
			}
		}
	case "release":
		if c.Slot < 0 || c.Slot >= len(g.Slots) || g.Slots[c.Slot].Owner != c.Member.ID || g.Slots[c.Slot].Gen != c.Gen {
			return false
		}
		s := &g.Slots[c.Slot]
		s.setOwner(s.Target)
		s.Target = 0
		if c.Committed >= 0 {
			s.Start, s.Exact = c.Committed+1, false
		}
	case "reset":
		if len(g.Members) > 0 || len(c.Starts) != len(g.Slots) {
			return false
		}
		for i := range g.Slots {
			s := &g.Slots[i]
			s.setOwner(0)
			s.Target, s.Start, s.Exact = 0, c.Starts[i], true
		}
		return true
	default:
		return false
	}
	g.rebalance()
	return true
}

// dropNode removes the members of node tag (but those of boot keepEpoch): their node is gone, so
// their partitions are free at once.
func (g *groupState) dropNode(tag uint16, keepEpoch int64) bool {
	gone := func(id uint64) bool {
		cid := queue.ConsumerID(id)
		return queue.ConsumerNode(cid) == tag && (keepEpoch < 0 || int64(queue.ConsumerEpoch(cid)) != keepEpoch)
	}
	changed := false
	keep := g.Members[:0]
	for _, m := range g.Members {
		if gone(m.ID) {
			changed = true
			continue
		}
		keep = append(keep, m)
	}
	g.Members = keep
	for i := range g.Slots {
		if s := &g.Slots[i]; s.Owner != 0 && gone(s.Owner) {
			s.setOwner(s.Target)
			s.Target = 0
			changed = true
		}
	}
	if changed {
		g.rebalance()
	}
	return changed
}

// proposeGroup replicates a consumer-group command and waits until this node applied it.
func (b *Broker) proposeGroup(ctx context.Context, c *groupCmd) *amqp.Error {
	return b.propose(ctx, opGroup, c.encode())
}

// groupsAfterRecovery loads the group records read at boot.
func (b *Broker) loadGroup(val []byte) error {
	g, err := decodeGroup(val)
	if err != nil {
		return err
	}
	b.groups.mu.Lock()
	b.groups.byKey[g.key] = g
	b.groups.mu.Unlock()
	return nil
}

// dropGroupsOf deletes the groups of a deleted (super) stream.
func (b *Broker) dropGroupsOf(vhost, stream string, batch *storage.Batch) {
	b.groups.mu.Lock()
	defer b.groups.mu.Unlock()
	for k := range b.groups.byKey {
		if k.vhost == vhost && k.stream == stream {
			delete(b.groups.byKey, k)
			batch.Delete(k.recordKey())
		}
	}
}

// forgetOwnBoots removes, cluster-wide, the group members this node had in earlier boots (their
// connections are gone): proposed once the metadata group runs.
func (b *Broker) forgetOwnBoots() {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.groups.mu.Lock()
		stale := false
		for _, g := range b.groups.byKey {
			for _, m := range g.Members {
				if queue.ConsumerNode(queue.ConsumerID(m.ID)) == b.tag && queue.ConsumerEpoch(queue.ConsumerID(m.ID)) != b.epoch {
					stale = true
				}
			}
			for _, s := range g.Slots {
				if s.Owner != 0 && queue.ConsumerNode(queue.ConsumerID(s.Owner)) == b.tag && queue.ConsumerEpoch(queue.ConsumerID(s.Owner)) != b.epoch {
					stale = true
				}
			}
		}
		b.groups.mu.Unlock()
		if !stale {
			return
		}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), metaTimeout)
			err := b.proposeGroup(ctx, &groupCmd{Op: "node", NodeTag: b.tag, KeepEpoch: int64(b.epoch)})
			cancel()
			if err == nil {
				return
			}
			select {
			case <-b.quit:
				return
			case <-time.After(time.Second):
			}
		}
	}()
}

// nodeGone removes the members of a node that went down (run by the metadata leader).
func (b *Broker) groupNodeGone(id string) {
	if b.meta == nil || !b.meta.IsLeader() {
		return
	}
	tag := nodeTag(id)
	b.groups.mu.Lock()
	has := false
	for _, g := range b.groups.byKey {
		for _, m := range g.Members {
			if queue.ConsumerNode(queue.ConsumerID(m.ID)) == tag {
				has = true
			}
		}
		for _, s := range g.Slots {
			if s.Owner != 0 && queue.ConsumerNode(queue.ConsumerID(s.Owner)) == tag {
				has = true
			}
		}
	}
	b.groups.mu.Unlock()
	if !has {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), metaTimeout)
		defer cancel()
		if err := b.proposeGroup(ctx, &groupCmd{Op: "node", NodeTag: tag, KeepEpoch: -1}); err != nil {
			b.log.Warn("cannot remove the consumer group members of a node that is down", "node", id, "err", err.Text)
		}
	}()
}

// restoreGroups makes the groups those of a metadata snapshot (have: the records on disk).
func (b *Broker) restoreGroups(have, want map[string][]byte, batch *storage.Batch) {
	b.groups.mu.Lock()
	for k := range have {
		if k[1] == kindGroup {
			if _, keep := want[k]; !keep {
				batch.Delete([]byte(k))
			}
		}
	}
	clear(b.groups.byKey)
	for k, val := range want {
		if k[1] != kindGroup {
			continue
		}
		g, err := decodeGroup(val)
		if err != nil {
			b.log.Error("malformed consumer group in a metadata snapshot", "err", err)
			continue
		}
		b.groups.byKey[g.key] = g
		batch.Set([]byte(k), val)
	}
	local := make([]groupLocal, 0, len(b.groups.local))
	for _, m := range b.groups.local {
		local = append(local, m)
	}
	b.groups.mu.Unlock()
	for _, m := range local {
		if g := b.groupState(m.groupKey()); g != nil {
			m.sync(g)
		}
	}
}
