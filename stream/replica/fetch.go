package replica

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"warren/stream"
	"warren/stream/osiris"
)

// Serve handles a connection another node's replica of this stream opened (kind is the byte
// after the stream id). It returns when the connection is done; the caller closes it.
func (r *Replica) Serve(kind byte, c net.Conn, br *bufio.Reader) {
	if !r.track(c) {
		return
	}
	defer r.untrack(c)
	r.wg.Add(1)
	defer r.wg.Done()
	switch kind {
	case KindFence:
		r.serveFence(c, br)
	case KindFetch:
		r.serveFetch(c, br)
	case KindPublish:
		r.servePublish(c, br)
	}
}

func (r *Replica) serveFence(c net.Conn, br *bufio.Reader) {
	_ = c.SetDeadline(time.Now().Add(fenceTimeout))
	typ, body, err := readFrame(br)
	if err != nil || typ != frFence {
		return
	}
	d := dec{b: body}
	epoch := d.u64()
	if d.done() != nil {
		return
	}
	tail, fence, err := r.log.Fence(epoch)
	if err != nil {
		r.logger.Warn("stream fence failed", "epoch", epoch, "err", err)
		return
	}
	var e enc
	e.u64(tail.LastEpoch)
	e.u64(tail.Written)
	e.u64(tail.First)
	e.u64(fence)
	_, _ = c.Write(appendFrame(nil, frTail, e.b))
}

// refuse answers a hello with a refusal.
func refuse(w *bufio.Writer, reason string) {
	var e enc
	e.str(reason)
	_, _ = w.Write(appendFrame(nil, frRefuse, e.b))
	_ = w.Flush()
}

// serveFetch serves a follower (or a recovering leader): the hello exchange, then the stream of
// chunks, epoch markers and commit offsets.
func (r *Replica) serveFetch(c net.Conn, br *bufio.Reader) {
	w := bufio.NewWriterSize(c, 256<<10)
	var h hello
	for round := 0; ; round++ {
		if round > 64 {
			refuse(w, "too many rounds")
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(r.cfg.ReadTimeout))
		typ, body, err := readFrame(br)
		if err != nil || typ != frHello {
			return
		}
		if h, err = decodeHello(body); err != nil {
			return
		}
		r.mu.Lock()
		role, epoch := r.role, r.epoch
		r.mu.Unlock()
		writing, _ := r.log.Writing()
		switch {
		case h.recovery != 0:
			if writing || h.recovery < r.log.Fenced() {
				refuse(w, fmt.Sprintf("not fenced for epoch %d", h.recovery))
				return
			}
		case role != roleLeading:
			refuse(w, "not the leader")
			return
		case h.fence > epoch:
			refuse(w, fmt.Sprintf("the follower knows epoch %d, later than %d", h.fence, epoch))
			return
		}
		lt := r.log.Tail()
		if h.tail.Written < lt.First || h.tail.First > lt.Written {
			var e enc
			e.u64(lt.First)
			encodeHistory(&e, r.log.History())
			e.bytes(r.log.TrackingSnapshot())
			_, _ = w.Write(appendFrame(nil, frReset, e.b))
			if w.Flush() != nil {
				return
			}
			continue
		}
		e0, end := r.log.EpochEnd(h.tail.LastEpoch)
		if e0 == h.tail.LastEpoch && end >= h.tail.Written {
			var e enc
			e.u64(epoch)
			e.u64(r.log.Committed())
			_, _ = w.Write(appendFrame(nil, frAccept, e.b))
			if w.Flush() != nil {
				return
			}
			break
		}
		var e enc
		e.u64(min(end, h.tail.Written))
		e.u64(e0)
		_, _ = w.Write(appendFrame(nil, frTruncate, e.b))
		if w.Flush() != nil {
			return
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	r.streamTo(c, br, w, h)
}

// streamTo sends chunks from the follower's end, epoch markers and commit offsets, and takes its
// acknowledgements, until the connection fails or this replica stops serving it.
func (r *Replica) streamTo(c net.Conn, br *bufio.Reader, w *bufio.Writer, h hello) {
	r.mu.Lock()
	leadEpoch, roleCh := r.epoch, r.roleCh
	r.mu.Unlock()
	recovery := h.recovery != 0
	gone := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(gone)
		for {
			_ = c.SetReadDeadline(time.Now().Add(r.cfg.ReadTimeout))
			typ, body, err := readFrame(br)
			if err != nil || typ != frAck {
				return
			}
			d := dec{b: body}
			a := ack{durable: d.u64(), lastEpoch: d.u64()}
			if d.done() != nil {
				return
			}
			if recovery || !h.voter {
				continue
			}
			r.mu.Lock()
			if r.role == roleLeading && r.epoch == leadEpoch {
				r.acks[h.node] = a
			}
			r.mu.Unlock()
			r.recompute()
		}
	}()
	defer func() {
		_ = c.Close()
		wg.Wait()
		r.mu.Lock()
		if !recovery && r.epoch == leadEpoch {
			delete(r.acks, h.node)
		}
		r.mu.Unlock()
	}()

	pos := h.tail.Written
	lastEpoch := h.tail.LastEpoch
	hist := r.log.History()
	sentCommit := uint64(0)
	// With nothing new to send, a heartbeat every third of the read timeout: rarely enough
	// that idle streams cost little (a frame per stream and follower each way).
	heartbeat := time.NewTicker(r.cfg.ReadTimeout / 3)
	defer heartbeat.Stop()
	for {
		// Epoch markers for the epochs that start where the follower's log ends.
		for _, e := range hist {
			if e.Epoch > lastEpoch && e.Start == pos {
				var b enc
				b.u64(e.Epoch)
				b.u64(e.Start)
				if _, err := w.Write(appendFrame(nil, frEpoch, b.b)); err != nil {
					return
				}
				lastEpoch = e.Epoch
			}
		}
		chunks, err := r.log.ReadChunks(pos, fetchBytes)
		// A batch stops where the next epoch starts: its marker goes first.
		for _, e := range hist {
			if e.Epoch > lastEpoch && e.Start > pos {
				for i, ch := range chunks {
					if h, herr := osiris.ParseHeader(ch.Blob); herr == nil && h.ChunkID >= e.Start {
						chunks = chunks[:i]
						break
					}
				}
				break
			}
		}
		if err != nil {
			if !errors.Is(err, stream.ErrBelowFirst) && !errors.Is(err, stream.ErrClosed) {
				r.logger.Warn("stream: cannot read chunks for a follower", "follower", h.node, "offset", pos, "err", err)
			}
			return // the follower starts again (with a reset if it is now behind retention)
		}
		if len(chunks) > 0 {
			if _, err := w.Write(appendFrame(nil, frChunks, encodeChunks(chunks))); err != nil {
				return
			}
			last, _ := osiris.ParseHeader(chunks[len(chunks)-1].Blob)
			pos = last.NextChunkID()
		}
		if c := r.log.Committed(); c != sentCommit {
			var b enc
			b.u64(c)
			if _, err := w.Write(appendFrame(nil, frCommit, b.b)); err != nil {
				return
			}
			sentCommit = c
		}
		if len(chunks) > 0 && w.Buffered() < 128<<10 {
			continue // more may be ready: fill the buffer before a write
		}
		if err := w.Flush(); err != nil {
			return
		}
		if len(chunks) > 0 {
			continue
		}
		r.mu.Lock()
		commitCh := r.commitCh
		stale := !recovery && (r.role != roleLeading || r.epoch != leadEpoch)
		r.mu.Unlock()
		if stale {
			return
		}
		select {
		case <-r.log.WaitWritten(pos):
		case <-commitCh:
		case <-roleCh:
			if !recovery {
				return
			}
			r.mu.Lock()
			roleCh = r.roleCh
			r.mu.Unlock()
		case <-heartbeat.C:
			sentCommit = ^uint64(0) // send the commit again: a heartbeat
		case <-gone:
			return
		case <-r.stop:
			return
		}
	}
}

// fetch follows node's log (the leader's, or for a recovering leader of epoch recovery, the most
// advanced replica's) until ctx ends or the connection fails; with target, it returns nil once
// this log's tail is target.
func (r *Replica) fetch(ctx context.Context, node string, recovery uint64, target *stream.Tail) error {
	c, err := r.cfg.Transport.Dial(ctx, node, KindFetch)
	if err != nil {
		return err
	}
	if !r.track(c) {
		c.Close()
		return ErrClosed
	}
	defer r.untrack(c)
	stopWatch := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stopWatch()
	defer c.Close()
	br := bufio.NewReaderSize(c, 256<<10)
	w := bufio.NewWriterSize(c, 4<<10)
	reached := func() bool {
		if target == nil {
			return false
		}
		t := r.log.Tail()
		return t.Written == target.Written && t.LastEpoch == target.LastEpoch
	}

	var leaderEpoch uint64
	for accepted := false; !accepted; {
		h := hello{node: r.cfg.Self, voter: r.Voter(), fence: r.log.Fenced(), recovery: recovery, tail: r.log.Tail()}
		if _, err := w.Write(appendFrame(nil, frHello, h.encode())); err != nil {
			return err
		}
		if err := w.Flush(); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(r.cfg.ReadTimeout))
		typ, body, err := readFrame(br)
		if err != nil {
			return err
		}
		d := dec{b: body}
		switch typ {
		case frRefuse:
			return fmt.Errorf("refused: %s", d.str())
		case frTruncate:
			to, maxEpoch := d.u64(), d.u64()
			if err := d.done(); err != nil {
				return err
			}
			if err := r.log.Truncate(to, maxEpoch); err != nil {
				return err
			}
		case frReset:
			first := d.u64()
			hist := decodeHistory(&d)
			snap := d.bytes()
			if err := d.done(); err != nil {
				return err
			}
			if err := r.log.ResetTo(first, hist, snap); err != nil {
				return err
			}
		case frAccept:
			leaderEpoch = d.u64()
			committed := d.u64()
			if err := d.done(); err != nil {
				return err
			}
			if recovery == 0 {
				if _, _, err := r.log.Fence(leaderEpoch); err != nil {
					return err
				}
			}
			r.log.SetCommitted(committed)
			accepted = true
		default:
			return fmt.Errorf("%w: frame %d in the hello exchange", errFrame, typ)
		}
	}
	if reached() {
		return nil
	}
	sessionEpoch := leaderEpoch // chunks are refused once this replica promised a later leader
	if recovery != 0 {
		sessionEpoch = recovery
	}

	// Acknowledgements go out from the durable hook, coalesced, and in answer to every commit
	// frame (the leader's heartbeat among them) even when nothing changed: the leader reads
	// this connection with a deadline, so an idle follower must still be heard from.
	ackWake := make(chan struct{}, 1)
	poke := func() {
		select {
		case ackWake <- struct{}{}:
		default:
		}
	}
	var answer atomic.Bool // the next ack goes out even if unchanged
	r.log.SetDurableHook(func(uint64) { poke() })
	defer r.log.SetDurableHook(nil)
	ackDone := make(chan struct{})
	ackCtx, ackStop := context.WithCancel(ctx)
	go func() {
		defer close(ackDone)
		var sent ack
		for {
			select {
			case <-ackCtx.Done():
				return
			case <-ackWake:
			}
			t := r.log.Tail()
			a := ack{durable: r.log.Durable(), lastEpoch: t.LastEpoch}
			if a == sent && !answer.Swap(false) {
				continue
			}
			var e enc
			e.u64(a.durable)
			e.u64(a.lastEpoch)
			_ = c.SetWriteDeadline(time.Now().Add(r.cfg.ReadTimeout))
			if _, err := c.Write(appendFrame(nil, frAck, e.b)); err != nil {
				_ = c.Close()
				return
			}
			sent = a
		}
	}()
	defer func() {
		ackStop()
		<-ackDone
	}()
	poke()

	for {
		if reached() {
			return nil
		}
		_ = c.SetReadDeadline(time.Now().Add(r.cfg.ReadTimeout))
		typ, body, err := readFrame(br)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		switch typ {
		case frChunks:
			chunks, err := decodeChunks(body)
			if err != nil {
				return err
			}
			if err := r.log.AppendChunks(sessionEpoch, chunks); err != nil {
				return err
			}
		case frEpoch:
			d := dec{b: body}
			e := stream.EpochStart{Epoch: d.u64(), Start: d.u64()}
			if err := d.done(); err != nil {
				return err
			}
			if err := r.log.AddEpoch(sessionEpoch, e); err != nil {
				return err
			}
			poke()
		case frCommit:
			d := dec{b: body}
			committed := d.u64()
			if err := d.done(); err != nil {
				return err
			}
			r.log.SetCommitted(committed)
			answer.Store(true)
			poke()
		default:
			return fmt.Errorf("%w: frame %d while fetching", errFrame, typ)
		}
	}
}
