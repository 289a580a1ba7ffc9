package cluster

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"
)

// fingerprintLogEvery rate-limits the peer-list mismatch error per peer.
const fingerprintLogEvery = time.Minute

// hello is the first message of a ping connection, in both directions.
type hello struct {
	ID          string `json:"id"`
	Fingerprint uint64 `json:"fingerprint"`
	Join        bool   `json:"join,omitempty"`
	Peers       string `json:"peers"`
	Error       string `json:"error,omitempty"`
	// Incarnation is the sender's process instance (its start time in Unix nanoseconds) and
	// UptimeMS how long it has run: a pinger that sees a new incarnation knows the member restarted,
	// and when (in its own clock), however briefly it was gone (see pingLoop). Zero: an older
	// version that sends neither.
	Incarnation uint64 `json:"incarnation,omitempty"`
	UptimeMS    int64  `json:"uptime_ms,omitempty"`
}

// liveness tracks the last successful ping of every member.
type liveness struct {
	mu    sync.Mutex
	peers map[string]*peerState
	// wake (capacity 1) runs the ping loop before its next tick: a member's address refused a
	// connection, which is worth acting on at once.
	wake chan struct{}
}

type peerState struct {
	addr    string
	lastOK  time.Time
	since   time.Time // when the current ping connection was first answered (a restart opens a new one)
	up      bool
	suspect bool // no ping answered for suspectAfter
	heard   bool // a ping was ever answered (lastOK starts as a grace period, not an answer)
	stop    chan struct{}

	incarnation uint64    // the member's process instance, from its last hello (0: unknown)
	restartedAt time.Time // when its new incarnation started (this node's clock), if not yet handled
	// refusedAt: when a redial right after its ping connection broke was refused (nothing listens
	// on its address: the process is gone), until it answers again. Zero otherwise.
	refusedAt time.Time
}

func (l *liveness) init() {
	l.peers = make(map[string]*peerState)
	l.wake = make(chan struct{}, 1)
}

func (l *liveness) up(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.peers[id]
	return st != nil && st.up
}

// byAddrLocked returns the state of the member at addr (nil if none); l.mu is held.
func (l *liveness) byAddrLocked(addr string) *peerState {
	for _, st := range l.peers {
		if st.addr == addr {
			return st
		}
	}
	return nil
}

// suspectedAddr reports whether the member at addr has answered no ping for suspectAfter.
func (l *liveness) suspectedAddr(addr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.byAddrLocked(addr)
	return st != nil && st.suspect
}

// answeredSince reports whether the member at addr answered a ping less than d ago, and since when
// it has been answering on its current ping connection: an answer it gave before then may come
// from a process that has since restarted.
func (l *liveness) answeredSince(addr string, d time.Duration) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.byAddrLocked(addr)
	if st == nil || !st.heard || time.Since(st.lastOK) >= d {
		return time.Time{}, false
	}
	return st.since, true
}

// answeredWithin reports whether member id answered a ping less than d ago, and its address has
// not refused a connection since.
func (l *liveness) answeredWithin(id string, d time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.peers[id]
	return st != nil && st.heard && time.Since(st.lastOK) < d && st.refusedAt.IsZero()
}

// ok records an answered ping of member id; fresh: the first on a new connection.
func (l *liveness) ok(id string, fresh bool) {
	l.mu.Lock()
	if st := l.peers[id]; st != nil {
		st.lastOK = time.Now()
		st.refusedAt = time.Time{}
		if fresh || !st.heard {
			st.since = st.lastOK
		}
		st.heard = true
	}
	l.mu.Unlock()
}

// hello records the incarnation that member id's hello announced, and that it restarted if it had
// announced another one before: its process started at started (estimated in this node's clock).
func (l *liveness) hello(id string, incarnation uint64, started time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.peers[id]
	if st == nil || incarnation == 0 {
		return
	}
	if st.incarnation != 0 && st.incarnation != incarnation {
		st.restartedAt = started
	}
	st.incarnation = incarnation
}

// refused records that member id, which was answering, refused a connection: no process
// listens on its address.
func (l *liveness) refused(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if st := l.peers[id]; st != nil && st.heard && st.refusedAt.IsZero() {
		st.refusedAt = time.Now()
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// heard reports whether member id has answered a ping since this node started.
func (l *liveness) heard(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.peers[id]
	return st != nil && st.heard
}

// pingLoop keeps one pinger per member and reports members going down or up. A member starts up (with a
// grace period of PeerDownAfter) so that a starting cluster reports no spurious failures.
func (n *Node) pingLoop() {
	defer n.wg.Done()
	t := time.NewTicker(PingInterval)
	defer t.Stop()
	var pwg sync.WaitGroup
	defer func() {
		n.live.mu.Lock()
		for id, st := range n.live.peers {
			close(st.stop)
			delete(n.live.peers, id)
		}
		n.live.mu.Unlock()
		pwg.Wait()
	}()
	for {
		members := n.Members()
		now := time.Now()
		type change struct {
			id string
			up bool
		}
		var changes []change
		var suspects, stillSuspect []string
		// quiet: for each suspect, the time before which its groups' followers must have last
		// heard from it for an election (see kick).
		quiet := make(map[string]time.Time)
		restarted := make(map[string]time.Time)
		n.live.mu.Lock()
		want := make(map[string]string, len(members))
		for _, m := range members {
			if m.ID != n.cfg.NodeID {
				want[m.ID] = m.Addr
			}
		}
		for id, st := range n.live.peers {
			if addr, ok := want[id]; !ok || addr != st.addr {
				close(st.stop)
				delete(n.live.peers, id)
			}
		}
		for id, addr := range want {
			st := n.live.peers[id]
			if st == nil {
				st = &peerState{addr: addr, lastOK: now, up: true, stop: make(chan struct{})}
				n.live.peers[id] = st
				pwg.Add(1)
				go func() {
					defer pwg.Done()
					n.pinger(id, addr, st.stop)
				}()
			}
			up := now.Sub(st.lastOK) < PeerDownAfter
			if up != st.up {
				st.up = up
				changes = append(changes, change{id, up})
			}
			// A refused connection says at once what suspectAfter without answers only
			// presumes: the process is gone, and whatever it led it stopped leading by then.
			sus := now.Sub(st.lastOK) >= suspectAfter || !st.refusedAt.IsZero()
			if sus && !st.suspect {
				suspects = append(suspects, id)
			} else if sus {
				stillSuspect = append(stillSuspect, id)
			}
			if sus {
				quiet[id] = now.Add(-suspectAfter)
				if st.refusedAt.After(quiet[id]) {
					quiet[id] = st.refusedAt
				}
			}
			st.suspect = sus
			if !st.restartedAt.IsZero() {
				restarted[id] = st.restartedAt
				st.restartedAt = time.Time{}
			}
		}
		n.live.mu.Unlock()
		n.runDeferredElections()
		for _, id := range suspects {
			n.failover(id, true, quiet[id], false)
		}
		// A peer that stays suspected is asked again at every tick: it may have been suspected
		// while its groups still heard from it (a degraded link), and lost them only later.
		for _, id := range stillSuspect {
			n.failover(id, false, quiet[id], false)
		}
		// A peer that restarted leads nothing any more, even if it was back before it was
		// suspected (killed and restarted within suspectAfter): the groups it led elect at once
		// rather than after raft's timeout or its recovery grace.
		for id, at := range restarted {
			if !slices.Contains(suspects, id) && !slices.Contains(stillSuspect, id) {
				n.failover(id, true, at, true)
			}
		}
		for _, c := range changes {
			if c.up {
				n.log.Info("cluster peer is up", "peer", c.id)
			} else {
				n.log.Warn("cluster peer is down", "peer", c.id, "after", PeerDownAfter)
			}
			if n.cfg.OnPeerChange != nil {
				n.cfg.OnPeerChange(c.id, c.up)
			}
		}
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		case <-n.live.wake:
		}
	}
}

// pinger pings member id at addr every PingInterval over one connection until stop.
func (n *Node) pinger(id, addr string, stop chan struct{}) {
	var c net.Conn
	var br *bufio.Reader
	defer func() {
		if c != nil {
			_ = c.Close()
		}
	}()
	t := time.NewTicker(PingInterval)
	defer t.Stop()
	// Closing the connection on stop unblocks a read in progress.
	var cmu sync.Mutex
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-stop:
		case <-n.ctx.Done():
		case <-done:
			return
		}
		cmu.Lock()
		if c != nil {
			_ = c.Close()
		}
		cmu.Unlock()
	}()
	closeConn := func() {
		cmu.Lock()
		if c != nil {
			_ = c.Close()
			c = nil
		}
		cmu.Unlock()
	}
	for {
		fresh := c == nil // only this goroutine sets c
		err := n.pingOnce(id, addr, &c, &br, &cmu)
		if err != nil && !fresh {
			// The connection broke: dial again at once, so that a process that is gone (its
			// address refuses connections) is known as such now rather than after suspectAfter.
			closeConn()
			fresh = true
			err = n.pingOnce(id, addr, &c, &br, &cmu)
		}
		if err != nil {
			closeConn()
			if errors.Is(err, syscall.ECONNREFUSED) {
				n.live.refused(id)
			}
		} else {
			n.live.ok(id, fresh)
		}
		select {
		case <-stop:
			return
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pingOnce sends one ping (connecting and exchanging hellos first if needed) and reads the answer.
func (n *Node) pingOnce(id, addr string, cp *net.Conn, brp **bufio.Reader, cmu *sync.Mutex) error {
	if *cp == nil {
		c, err := n.dialPeer(addr, tagPing, nil, dialTimeout)
		if err != nil {
			return err
		}
		cmu.Lock()
		*cp = c
		cmu.Unlock()
		select {
		case <-n.ctx.Done():
			return ErrClosed
		default:
		}
		*brp = bufio.NewReader(c)
		_ = c.SetDeadline(time.Now().Add(2 * PingInterval))
		if err := writeJSON(c, n.hello()); err != nil {
			return err
		}
		var them hello
		if err := readJSON(*brp, &them); err != nil {
			return err
		}
		if them.Error != "" || (!n.cfg.Join && !them.Join && them.Fingerprint != n.fp) {
			n.logPeerMismatch(id, them.Peers)
			return fmt.Errorf("peer %s refused the connection: %s", id, them.Error)
		}
		n.live.hello(id, them.Incarnation, time.Now().Add(-time.Duration(them.UptimeMS)*time.Millisecond))
	}
	c, br := *cp, *brp
	_ = c.SetDeadline(time.Now().Add(2 * PingInterval))
	if _, err := c.Write([]byte{'p'}); err != nil {
		return err
	}
	if _, err := br.ReadByte(); err != nil {
		return err
	}
	return nil
}

// servePing answers a ping connection: hello (with the fingerprint check), then one byte per ping.
func (n *Node) servePing(c net.Conn, br *bufio.Reader) {
	_ = c.SetDeadline(time.Now().Add(headerReadTimeout))
	var them hello
	if err := readJSON(br, &them); err != nil {
		return
	}
	me := n.hello()
	if !n.cfg.Join && !them.Join && them.Fingerprint != n.fp {
		n.logPeerMismatch(them.ID, them.Peers)
		me.Error = fmt.Sprintf("cluster peers disagree: node %s was started with %s, node %s with %s",
			n.cfg.NodeID, n.peersText, them.ID, them.Peers)
		_ = writeJSON(c, me)
		return
	}
	if err := writeJSON(c, me); err != nil {
		return
	}
	for {
		_ = c.SetDeadline(time.Now().Add(PeerDownAfter + 2*PingInterval))
		b, err := br.ReadByte()
		if err != nil {
			return
		}
		if _, err := c.Write([]byte{b}); err != nil {
			return
		}
	}
}

// hello is this node's hello.
func (n *Node) hello() hello {
	return hello{ID: n.cfg.NodeID, Fingerprint: n.fp, Join: n.cfg.Join, Peers: n.peersText,
		Incarnation: uint64(n.started.UnixNano()), UptimeMS: time.Since(n.started).Milliseconds()}
}

// logPeerMismatch logs (rate-limited per peer) that peer was started with another initial peer list.
func (n *Node) logPeerMismatch(peer, theirs string) {
	n.mu.Lock()
	last, seen := n.errTimes[peer]
	now := time.Now()
	if seen && now.Sub(last) < fingerprintLogEvery {
		n.mu.Unlock()
		return
	}
	n.errTimes[peer] = now
	n.mu.Unlock()
	n.log.Error(fmt.Sprintf("cluster peers disagree: node %s was started with %s, this node with %s",
		peer, theirs, n.peersText), "peer", peer)
}

func writeJSON(c net.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = c.Write(appendFrame(nil, b))
	return err
}

func readJSON(br *bufio.Reader, v any) error {
	b, err := readFrame(br)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
