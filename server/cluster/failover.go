package cluster

import (
	"encoding/binary"
	"hash/fnv"
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

// Node-level failure detection for every group.
//
// Raft's heartbeat timeout is long here (heartbeatTimeout) so that idle groups cost little. When a
// member answers no ping for suspectAfter, this node makes each group whose leader is that member,
// and of which it is a follower that has not heard from the leader for as long, elect a new leader
// at once: exactly one of the group's live voters (by a per-group order every node computes alike)
// gets a TimeoutNow from its own transport, the RPC a leader sends to hand over its leadership. It
// becomes a candidate without a pre-vote and asks for votes with the leadership-transfer flag, which
// the other voters grant even though they still know the old leader (they would refuse an ordinary
// candidate until their own, long, timeout). If that voter cannot win (its log is behind), the next
// one in the order tries kickStagger later, and so on.
//
// Safety does not depend on any of this: a TimeoutNow only starts an election, and an election
// elects at most one leader per term however it started (one vote per voter and term, and only for
// a candidate whose log is at least as up to date). A wrong suspicion (a leader that lives but did
// not answer pings for suspectAfter) costs a leader change, not a confirmed write.

// kickStagger separates the voters' turns at forcing an election.
const kickStagger = time.Second

// kickFresh is how recently another voter must have answered a ping to count towards the majority
// a forced election needs. "Not suspected" is not enough: each member's pinger has its own phase,
// so when a node is cut off from both its peers, the leader may turn suspected up to a PingInterval
// before the other peer does, and in between the cut-off node would count that peer and force an
// election it cannot win (raising its term: see kick). At the leader's suspicion (no answer for
// suspectAfter) a peer cut off at the same moment has answered nothing for more than
// suspectAfter-PingInterval (1 s); a live one answers every PingInterval. The half interval between
// is room for a slow answer on one side and for a second peer lost a little later on the other. A
// live peer whose answer is later than that only delays the election: the ping loop asks again at
// its next tick (failover with repeatTurn).
const kickFresh = PingInterval + PingInterval/2

// failover forces elections in the groups that member peer led and whose followers have not
// heard from it since quietSince: peer is suspected down (no ping answered for suspectAfter, or
// its address refused a connection at quietSince), or it restarted (at quietSince), so whatever it
// led before then it leads no more. The ping loop calls it when the peer becomes suspected (first)
// and again at every tick while it stays so: a group that still heard from its leader at first (a
// degraded link that lost the pings first) is kicked once it has not for suspectAfter. A restart
// is handled once. Only what changes is logged.
func (n *Node) failover(peer string, first bool, quietSince time.Time, restarted bool) {
	n.mu.Lock()
	groups := make([]*Group, 0, len(n.groups))
	for _, g := range n.groups {
		groups = append(groups, g)
	}
	n.mu.Unlock()
	kicked, later := 0, 0
	turn := 0
	if !first || restarted {
		// A restart may come after a first voter's election failed (the peer was suspected,
		// then back before the next voter's turn, which only the ping loop's repeated calls
		// would have started): take the groups with an unknown leader too, as a repeated call.
		turn = repeatTurn
	}
	for _, g := range groups {
		switch g.kick(peer, turn, quietSince) {
		case kickNow:
			kicked++
		case kickLater:
			later++
		}
	}
	if restarted {
		if kicked > 0 || later > 0 {
			n.log.Warn("cluster peer restarted: electing new leaders for the groups it led",
				"peer", peer, "restarted", quietSince, "elections", kicked, "deferred", later)
		}
		return
	}
	if kicked > 0 || (first && later > 0) {
		n.log.Warn("cluster peer answers no pings: electing new leaders for the groups it led",
			"peer", peer, "after", suspectAfter, "elections", kicked, "deferred", later)
	}
}

type kickOutcome int

const (
	kickNone kickOutcome = iota
	kickNow
	kickLater
)

// repeatTurn is kick's turn for the ping loop's repeated calls while a peer stays suspected.
const repeatTurn = -1

// kick forces an election of group g on this node if peer, suspected down, leads it, this node has
// not heard from it since quietSince (suspectAfter before the suspicion, or the time of a refused
// connection or of a restart: the process that led is gone since), and it is this node's turn:
// its rank among the group's voters that answered a ping within kickFresh is at most turn (a later
// turn is scheduled otherwise). With repeatTurn (the peer is still suspected, or restarted) it also
// takes a group whose leader became unknown, as an earlier voter's failed election leaves it: the
// first voter is kicked only while the peer is still its leader (never twice: a second election of
// a voter that cannot win would disrupt the next voter's), the others schedule their turns.
func (g *Group) kick(peer string, turn int, quietSince time.Time) kickOutcome {
	if g.gt == nil || g.raft.State() != raft.Follower {
		return kickNone
	}
	_, lid := g.raft.LeaderWithID()
	// On a later turn the leader may be unknown: an earlier voter's failed election cleared it.
	if string(lid) != peer && (turn == 0 || lid != "") {
		return kickNone
	}
	if g.raft.LastContact().After(quietSince) {
		return kickNone
	}
	conf, err := g.configuration()
	if err != nil {
		return kickNone
	}
	var live []string
	voters := 0
	for _, s := range conf.Servers {
		id := string(s.ID)
		if s.Suffrage == raft.Voter {
			voters++
		}
		if s.Suffrage == raft.Voter && id != peer && (id == g.n.cfg.NodeID || g.n.live.answeredWithin(id, kickFresh)) {
			live = append(live, id)
		}
	}
	if len(live) < voters/2+1 {
		// This node sees no majority of the group's voters: it is the one cut off, most likely. A
		// forced election could not win, and as it skips the pre-vote it would raise this node's
		// term, which deposes the majority's leader when the link heals (the group then waits for
		// raft's own timeout to elect again: 24-48 s).
		return kickNone
	}
	slices.SortFunc(live, func(a, b string) int {
		ha, hb := kickOrder(g.id, a), kickOrder(g.id, b)
		switch {
		case ha < hb:
			return -1
		case ha > hb:
			return 1
		}
		return 0
	})
	rank := slices.Index(live, g.n.cfg.NodeID)
	if rank < 0 {
		return kickNone // not a voter
	}
	if turn == repeatTurn {
		if rank == 0 && string(lid) != peer {
			return kickNone // its election was forced already, and failed: the next voter's turn
		}
		turn = 0
	}
	if rank > turn {
		g.emu.Lock()
		defer g.emu.Unlock()
		if g.kickArmed {
			return kickNone // this node's turn is scheduled already (a repeated call)
		}
		if g.kickTimer != nil {
			g.kickTimer.Stop()
		}
		g.kickArmed = true
		g.kickTimer = time.AfterFunc(time.Duration(rank-turn)*kickStagger, func() {
			g.emu.Lock()
			g.kickArmed = false
			g.emu.Unlock()
			g.kick(peer, rank, quietSince)
		})
		return kickLater
	}
	g.gt.enqueue(inReq{kind: kindTimeoutNow, cmd: &raft.TimeoutNowRequest{RPCHeader: raft.RPCHeader{
		ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(g.n.cfg.NodeID), Addr: []byte(g.n.addr),
	}}, reply: func(raft.RPCResponse) {}})
	return kickNow
}

// kickOrder is voter id's place in group gid's order of turns (a hash: turns differ per group, so
// the elections after a node's loss spread over the survivors).
func kickOrder(gid uint64, id string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(binary.BigEndian.AppendUint64(nil, gid))
	_, _ = h.Write([]byte(id))
	return h.Sum64()
}
