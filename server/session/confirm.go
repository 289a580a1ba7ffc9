package session

import (
	"errors"
	"sync"
	"sync/atomic"

	"warren/amqp"
	"warren/server/queue"
	"warren/server/stats"
)

// A channel in confirm mode gives every publish the next sequence number; every target queue
// reports the outcome of its write for it (queue.Done), and the channel sends basic.ack / nack in
// sequence order from those outcomes alone: a confirm goes out only once every earlier publish has
// finished, runs of successes as one basic.ack (multiple), a failed write as basic.nack.
//
// Outcomes that arrive from a commit callback (a storage round, a Raft apply) come one publish at
// a time, usually a whole round of them in a row. They are not encoded where they arrive: the
// channel is queued on its connection's writer (outbound.queueConfirms), which encodes whatever is
// due when it next runs, so a round of 100 publishes is answered with one basic.ack (multiple)
// rather than 100, as RabbitMQ does.
//
// Lock order: confirms.mu -> outbound.mu. Queue types call Done with none of their locks held.

// confirmState is one publish awaiting its confirm.
type confirmState struct {
	done, failed bool
}

// confirms tracks a channel's unconfirmed publishes.
type confirms struct {
	mu     sync.Mutex
	next   uint64         // last sequence number handed out
	acked  uint64         // highest sequence number the client has been told about
	states []confirmState // states[head+i] is sequence acked+1+i
	head   int
	closed bool // the channel is gone: nothing more is sent
	queued bool // the channel waits in its connection writer's queue (outbound.queueConfirms)
}

// add hands out the next sequence number.
func (t *confirms) add() uint64 {
	t.mu.Lock()
	t.next++
	seq := t.next
	t.states = append(t.states, confirmState{})
	t.mu.Unlock()
	return seq
}

// complete records a publish's outcome. With async (an outcome that arrived from a commit
// callback) the channel is queued on the connection's writer, which sends the confirms due when it
// runs; otherwise the reader sends them when it runs out of input (flushConfirms), so a read batch
// of publishes gets one basic.ack.
func (t *confirms) complete(ch *channel, seq uint64, failed, async bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := t.head + int(seq-t.acked-1)
	if seq <= t.acked || i >= len(t.states) {
		return
	}
	t.states[i] = confirmState{done: true, failed: failed}
	if async && !t.queued && !t.closed && i == t.head {
		// Only the oldest outstanding publish makes confirms due; later ones wait for it.
		t.queued = ch.c.out.queueConfirms(ch)
	}
}

// flushQueued is the writer's side of queueConfirms: it sends the confirms that are due.
func (t *confirms) flushQueued(ch *channel) {
	t.mu.Lock()
	t.queued = false
	t.flushLocked(ch)
	t.mu.Unlock()
}

// flush sends the confirms that are due.
func (t *confirms) flush(ch *channel) {
	t.mu.Lock()
	t.flushLocked(ch)
	t.mu.Unlock()
}

func (t *confirms) flushLocked(ch *channel) {
	n := 0
	for t.head+n < len(t.states) && t.states[t.head+n].done {
		n++
	}
	if n == 0 {
		return
	}
	first := t.acked + 1
	o := ch.c.out
	if !t.closed && o.lockAppend() {
		ok := n
		for i := 0; i < n; i++ {
			if !t.states[t.head+i].failed {
				continue
			}
			ok--
			seq := first + uint64(i)
			if seq-1 > t.acked {
				o.buf = amqp.AppendBasicAck(o.buf, ch.id, seq-1, seq-1-t.acked > 1)
			}
			o.buf = amqp.AppendBasicNack(o.buf, ch.id, seq, false, false)
			t.acked = seq
		}
		if last := first + uint64(n) - 1; last > t.acked {
			o.buf = amqp.AppendBasicAck(o.buf, ch.id, last, last-t.acked > 1)
		}
		o.unlockAppend()
		ch.counters.Add(stats.Confirmed, uint64(ok))
	}
	t.acked = first + uint64(n) - 1
	t.head += n
	if t.head == len(t.states) {
		t.states, t.head = t.states[:0], 0
	} else if t.head > 1024 && t.head*2 > len(t.states) {
		k := copy(t.states, t.states[t.head:])
		t.states, t.head = t.states[:k], 0
	}
}

// close stops sending: the channel is closing.
func (t *confirms) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
}

// pubOutcome collects the outcomes one publish waits for: a hold the reader keeps while it
// routes, plus one per target queue. The last one finishes the publish: it gives the bytes back
// to the connection's credit, confirms (confirm mode) or counts towards the transaction (tx).
type pubOutcome struct {
	ch        *channel
	seq       uint64  // confirm sequence number; 0 outside confirm mode
	tx        *txWait // set inside a transaction
	bytes     int64   // counted against the connection's credit
	remaining atomic.Int32
	failed    atomic.Bool
	// abandoned is set when the publish itself failed (a channel error: unknown exchange, ...):
	// as in RabbitMQ, it is neither acked nor nacked, the channel closes.
	abandoned atomic.Bool
}

// Done implements queue.Done: one queue's outcome. A queue deleted meanwhile (ErrGone) simply
// did not take the message, as if it had not been routed there.
func (p *pubOutcome) Done(err error) {
	if err != nil && !errors.Is(err, queue.ErrGone) {
		p.failed.Store(true)
	}
	if p.remaining.Add(-1) == 0 {
		p.finish(true)
	}
}

// release drops the reader's hold once routing is done.
func (p *pubOutcome) release() {
	if p.remaining.Add(-1) == 0 {
		p.finish(false)
	}
}

// finish runs once, when every outcome is in; async is set when the last one came from a queue
// (another goroutine, or a callback after routing), not from the reader's release.
func (p *pubOutcome) finish(async bool) {
	ch := p.ch
	if p.bytes > 0 {
		ch.c.credit.release(p.bytes)
	}
	if p.tx != nil {
		p.tx.finish(p.failed.Load())
	}
	if p.seq != 0 && !p.abandoned.Load() {
		ch.confirms.complete(ch, p.seq, p.failed.Load(), async)
		if !async {
			ch.c.markConfirmDirty(ch)
		}
	}
}

// txWait counts a transaction's publishes until every queue has them: tx.commit-ok means the
// messages are as safe as each queue type promises (on disk, on a majority), for every type.
type txWait struct {
	mu      sync.Mutex
	pending int
	failed  bool
	done    chan struct{}
}

func newTxWait(n int) *txWait {
	w := &txWait{pending: n, done: make(chan struct{})}
	if n == 0 {
		close(w.done)
	}
	return w
}

func (w *txWait) finish(failed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failed = w.failed || failed
	w.pending--
	if w.pending == 0 {
		close(w.done)
	}
}
