package stream

import (
	"errors"
	"fmt"
	"time"

	"warren/storage"
	"warren/stream/osiris"
)

// Append queues records; done (may be nil) is called once they are committed (durable here for a
// single replica, on a majority for a replicated stream) with the offset of the first record
// stored, or with an error (ErrNotLeader when this replica is not writing, ErrClosed). Records of
// one call stay contiguous and in order. Records that are duplicates of a writer's earlier records
// are dropped; done then waits for those earlier records to be committed. The Log keeps recs and
// their slices until done runs: do not modify them. Append returns at once unless the queue is
// full (Options.QueueBytes), then it blocks until the writer catches up. done runs on a storage or
// replication goroutine: it must be quick and must not call Append; after Close it gets ErrClosed.
func (l *Log) Append(recs []Record, done func(first uint64, err error)) {
	var size int64
	for i := range recs {
		size += int64(nativeRecordSize(&recs[i]) + len(recs[i].Raw) + 4)
	}
	l.qmu.Lock()
	for !l.qclosed && len(l.queue) > 0 && l.queueBytes+size > l.opts.QueueBytes {
		l.qspace.Wait()
	}
	if l.qclosed {
		l.qmu.Unlock()
		if done != nil {
			done(0, ErrClosed)
		}
		return
	}
	l.queue = append(l.queue, appendReq{recs: recs, done: done, ts: time.Now().UnixMilli(), bytes: size})
	l.queueBytes += size
	l.qmu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run is the writer goroutine.
func (l *Log) run() {
	defer close(l.writerDone)
	var ticker *time.Ticker
	var tick <-chan time.Time
	retick := func() {
		if ticker != nil {
			ticker.Stop()
			ticker, tick = nil, nil
		}
		if _, maxAge := l.retentionLimits(); maxAge > 0 {
			ticker = time.NewTicker(min(5*time.Second, max(maxAge/10, 250*time.Millisecond)))
			tick = ticker.C
		}
	}
	retick()
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	stopping := false
	var buf []appendReq // reused between rounds; swapped with l.queue
	for {
		if !stopping {
			select {
			case <-l.wake:
			case <-tick:
				l.ApplyRetention(time.Now())
				continue
			case <-l.retune:
				retick()
				l.ApplyRetention(time.Now())
				continue
			case <-l.stop:
				stopping = true
			}
		}
		l.qmu.Lock()
		reqs := l.queue
		l.queue, buf = buf[:0], nil
		l.queueBytes = 0
		l.qspace.Broadcast()
		l.qmu.Unlock()
		for from := 0; from < len(reqs); {
			reqs, from = l.writeSome(reqs, from)
		}
		clear(reqs)
		buf = reqs[:0]
		if len(reqs) == 0 && stopping {
			return
		}
	}
}

// gapAt reports whether a request's first record with a writer sequence would leave a hole in
// that writer's sequence (an earlier record of the writer is missing).
func gapAt(recs []Record, seen func(string, uint64) (trackEntry, bool)) bool {
	for i := range recs {
		if w := recs[i].WriterID; w != "" {
			if recs[i].WriterResync {
				return false
			}
			e, _ := seen(w, recs[i].WriterSeq)
			return recs[i].WriterSeq > e.seq+1
		}
	}
	return false
}

// staged is a chunk on its way into the index: built by the writer or received by a follower.
type staged struct {
	info    chunkInfo
	blob    []byte
	trailer []byte
}

// takeQueued appends the queued appends to dst and empties the queue.
func (l *Log) takeQueued(dst []appendReq) []appendReq {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	if len(l.queue) == 0 {
		return dst
	}
	dst = append(dst, l.queue...)
	clear(l.queue)
	l.queue = l.queue[:0]
	l.queueBytes = 0
	l.qspace.Broadcast()
	return dst
}

// writeSome turns the appends of reqs[from:] that fit in maxChunksPerBatch chunks (at least one
// request) into chunks, puts them in the index and submits them as one storage batch. It returns
// reqs, with the appends it took from the queue added, and the index of the first request it did
// not handle.
//
// The writer keeps one storage batch in flight (writeSem): it builds the next batch while the
// previous one commits, and once that commit is done it takes what was appended meanwhile into
// the same batch before submitting it, when the batch is small (under lateTakeBytes). Without that
// second look an append that arrives during a commit would wait for two more (the batch already
// built, then its own), and a publisher with a window of unconfirmed messages would see its
// confirms spread over three commits instead of two. A large batch is submitted as built: under a
// heavy load the commit time is spent writing, not waiting for the disk, and building the late
// appends while the committer idles would only make the rounds longer.
func (l *Log) writeSome(reqs []appendReq, from int) ([]appendReq, int) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.RLock()
	writing, failed, epoch, base := l.writing, l.failed, l.epoch, l.written
	l.mu.RUnlock()
	if !writing || failed != nil {
		err := ErrNotLeader
		if failed != nil {
			err = failed
		}
		for i := range reqs[from:] {
			if d := reqs[from+i].done; d != nil {
				d(0, err)
			}
		}
		return reqs, len(reqs)
	}

	var (
		chunks  []staged
		cb      = &l.builder
		cbFirst uint64
		cbTs    int64
		open    bool
		curSize int
		curRecs int
		off     = base
		nreq    = from
		dones   []pendingDone
	)
	flush := func() error {
		if !open {
			return nil
		}
		blob, err := cb.finish()
		if err != nil {
			return err
		}
		pc, err := splitChunk(blob)
		if err != nil {
			return err
		}
		chunks = append(chunks, staged{info: chunkInfo{first: pc.hdr.ChunkID, count: pc.hdr.NumRecords, size: int64(len(blob)),
			firstTs: cbTs, lastTs: cbTs, epoch: epoch}, blob: blob, trailer: pc.trailer})
		open = false
		return nil
	}
	l.mu.RLock()
	var tab buildTable // the table under the chunks being built; used under l.mu.RLock only
	seen := tab.seen
	var buildErr error
	var gapped []appendReq
	held := false // a writeSem token is held for this batch
	build := func() {
		tab.use(l.table)
		for nreq < len(reqs) && len(chunks) < maxChunksPerBatch && buildErr == nil {
			r := &reqs[nreq]
			if gapAt(r.recs, seen) {
				gapped = append(gapped, *r)
				r.done = nil // answered with ErrGap below, and not again if the batch fails
				nreq++
				continue
			}
			first, kept := off, 0
			var waitFor uint64 // a duplicate's original chunk must be committed first
			for i := range r.recs {
				rec := &r.recs[i]
				dup := false
				if rec.PublisherID != "" {
					if e, d := seen(rec.PublisherID, rec.PublishingID); d {
						dup, waitFor = true, max(waitFor, e.chunk+1)
					}
				}
				if rec.WriterID != "" {
					if e, d := seen(rec.WriterID, rec.WriterSeq); d {
						dup, waitFor = true, max(waitFor, e.chunk+1)
					}
				}
				if dup {
					continue
				}
				sz := nativeRecordSize(rec) + len(rec.Raw) + 4
				if open && (curRecs >= l.opts.ChunkMaxRecords || curSize+sz > l.opts.ChunkMaxBytes) {
					if buildErr = flush(); buildErr != nil {
						break
					}
				}
				ts := rec.Timestamp
				if ts == 0 {
					ts = r.ts
				}
				if !open {
					cbFirst, cbTs = off, ts
					// What the chunk will hold: the rest of the requests, up to a chunk's size.
					rest := 0
					for k := nreq; k < len(reqs) && rest < l.opts.ChunkMaxBytes; k++ {
						rest += int(reqs[k].bytes)
					}
					cb.b.SizeHint(osiris.HeaderSize + osiris.DefaultBloomSize + max(sz, min(rest, l.opts.ChunkMaxBytes)) + 256)
					cb.reset(cbFirst, cbTs, epoch)
					open, curSize, curRecs = true, osiris.HeaderSize, 0
				} else if ts > cbTs {
					cbTs = ts
					cb.b.SetTimestamp(ts)
				}
				if buildErr = cb.add(rec); buildErr != nil {
					break
				}
				if rec.PublisherID != "" {
					tab.note(rec.PublisherID, rec.PublishingID, cbFirst)
				}
				if rec.WriterID != "" {
					tab.note(rec.WriterID, rec.WriterSeq, cbFirst)
				}
				n := recordCount(rec)
				curSize += sz
				curRecs += n
				off += uint64(n)
				kept++
			}
			end := max(off, waitFor)
			if kept == 0 {
				end = waitFor
			}
			dones = append(dones, pendingDone{end: end, first: first, done: r.done})
			nreq++
		}
	}
	build()
	l.mu.RUnlock()
	if buildErr == nil && (open || len(chunks) > 0) {
		// Wait for the batch in flight, then add what arrived while it committed.
		l.writeSem <- struct{}{}
		held = true
		built := curSize
		for i := range chunks {
			built += int(chunks[i].info.size)
		}
		if len(chunks) < maxChunksPerBatch && built < lateTakeBytes {
			reqs = l.takeQueued(reqs)
			if len(reqs) > nreq {
				l.mu.RLock()
				build()
				l.mu.RUnlock()
			}
		}
	}
	release := func() {
		if held {
			<-l.writeSem
			held = false
		}
	}
	for _, g := range gapped {
		if g.done != nil {
			g.done(0, ErrGap)
		}
	}
	if buildErr == nil {
		buildErr = flush()
	}
	if buildErr != nil {
		err := fmt.Errorf("stream %d: build chunk at offset %d: %w", l.id, base, buildErr)
		l.log.Error("stream write failed", "stream_id", l.id, "err", err)
		release()
		for i := range reqs[from:nreq] {
			if d := reqs[from+i].done; d != nil {
				d(0, err)
			}
		}
		return reqs, nreq
	}
	var onCommit func()
	if held {
		onCommit = func() { <-l.writeSem }
	}
	submitted, err := l.commitStagedIf(chunks, dones, true, 0, onCommit)
	if !submitted {
		release()
	}
	if err != nil {
		for i := range reqs[from:nreq] {
			if d := reqs[from+i].done; d != nil {
				d(0, err)
			}
		}
	}
	return reqs, nreq
}

// commitStagedFenced is commitStagedIf for a follower's chunks of the leader of epoch.
func (l *Log) commitStagedFenced(chunks []staged, epoch uint64) error {
	_, err := l.commitStagedIf(chunks, nil, false, epoch, nil)
	return err
}

// commitStagedIf puts chunks (contiguous from written) in the index and the cache, submits them
// and their index records as one storage batch, and queues dones for the commit. assignSegs says
// whether this replica numbers segments (the writer) or the chunks carry the leader's numbers.
// It refuses (ErrFenced) when epoch > 0 is below the fence. wmu is held. onCommit (may be nil) runs first in the storage callback; submitted says whether the batch
// went to storage (then onCommit will run).
func (l *Log) commitStagedIf(chunks []staged, dones []pendingDone, assignSegs bool, epoch uint64, onCommit func()) (submitted bool, err error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false, ErrClosed
	}
	if epoch > 0 && epoch < l.fence {
		l.mu.Unlock()
		return false, ErrFenced
	}
	if l.failed != nil {
		err := l.failed
		l.mu.Unlock()
		return false, err
	}
	readBefore, writtenBefore := l.readableLocked(), l.written
	var lastSeg segInfo
	if n := len(l.segs); n > 0 {
		lastSeg = l.segs[n-1]
	}
	var b storage.Batch
	end := l.written
	for i := range chunks {
		st := &chunks[i]
		ci := &st.info
		if ci.first != end {
			l.mu.Unlock()
			return false, fmt.Errorf("stream %d: chunk at offset %d does not follow the log's end %d", l.id, ci.first, end)
		}
		if epoch > 0 {
			// A follower holds a chunk of an epoch only after that epoch's start marker.
			var last uint64
			if n := len(l.history); n > 0 {
				last = l.history[n-1].Epoch
			}
			if ci.epoch > last {
				l.mu.Unlock()
				return false, fmt.Errorf("stream %d: chunk at offset %d of epoch %d arrived before that epoch's start (last epoch %d)", l.id, ci.first, ci.epoch, last)
			}
		}
		if assignSegs {
			if lastSeg.bytes > 0 && lastSeg.bytes+ci.size > l.opts.MaxSegmentBytes {
				lastSeg = segInfo{num: lastSeg.num + 1}
			}
			ci.seg = lastSeg.num
			lastSeg.bytes += ci.size
		}
		var snap []byte
		if n := len(l.segs); n == 0 || l.segs[n-1].num != ci.seg {
			snap = l.table.encodeSnapshot() // the table before the segment's first chunk
		}
		if err := l.table.applyTrailer(st.trailer, ci.first); err != nil {
			l.log.Error("stream chunk with a malformed trailer", "stream_id", l.id, "first", ci.first, "err", err)
		}
		b.Set(storage.StreamChunkKey(l.id, ci.first), st.blob)
		b.Set(indexKey(l.id, ci.first), encodeIndex(ci, st.trailer, snap))
		ci.maxTs = ci.lastTs
		if n := len(l.chunks); n > 0 {
			ci.maxTs = max(ci.maxTs, l.chunks[n-1].maxTs)
		}
		l.chunks = append(l.chunks, *ci)
		l.unstored[ci.first] = st.blob
		l.addToSegs(ci)
		l.bytes += ci.size
		end = ci.end()
	}
	l.written = end
	l.pend = append(l.pend, dones...)
	due := l.advanceLocked(readBefore, writtenBefore)
	l.mu.Unlock()
	for i := range chunks {
		l.cache.put(chunks[i].info.first, chunks[i].blob, nil)
	}
	runDone(due, nil)
	if len(chunks) == 0 {
		return false, nil
	}
	l.async.Add(1)
	l.chunkWrites.Add(1)
	l.db.Commit(&b, func(err error) {
		defer l.async.Done()
		defer l.chunkWrites.Done()
		if onCommit != nil {
			onCommit() // first: stored may apply retention, which waits for the writer
		}
		l.stored(end, err)
	})
	return true, nil
}

// stored runs once the storage batch of the chunks ending at end is committed.
func (l *Log) stored(end uint64, err error) {
	l.mu.Lock()
	if err != nil {
		if l.failed == nil {
			l.failed = fmt.Errorf("stream %d: store chunks up to offset %d: %w", l.id, end, err)
			l.log.Error("stream write failed; the replica stops writing", "stream_id", l.id, "err", l.failed)
		}
		l.writing = false
		due := l.pend
		l.pend = nil
		failed := l.failed
		l.mu.Unlock()
		runDone(due, failed)
		return
	}
	readBefore := l.readableLocked()
	if end > l.durable && end <= l.written {
		l.durable = end
	}
	for first := range l.unstored {
		if first < end {
			delete(l.unstored, first)
		}
	}
	if l.autoCommit && l.durable > l.committed {
		l.committed = l.durable
	}
	due := l.advanceLocked(readBefore, l.written)
	hook, durable, auto := l.onDurable, l.durable, l.autoCommit
	l.mu.Unlock()
	if auto {
		// Retention before the callbacks: once an append is confirmed, the limits hold again.
		l.ApplyRetention(time.Now())
	}
	runDone(due, nil)
	if hook != nil {
		hook(durable)
	}
}

// StartWriting makes this replica the writer for epoch: it records in the epoch history that the
// epoch starts at Written() (durably, before it returns), and Append writes chunks of that epoch
// from then on.
func (l *Log) StartWriting(epoch uint64) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	if l.failed != nil {
		err := l.failed
		l.mu.Unlock()
		return err
	}
	if epoch < l.fence {
		fence := l.fence
		l.mu.Unlock()
		return fmt.Errorf("stream %d: cannot lead epoch %d: this replica follows epoch %d", l.id, epoch, fence)
	}
	l.fence = epoch
	if n := len(l.history); n == 0 || l.history[n-1].Epoch != epoch {
		l.history = append(l.history, EpochStart{Epoch: epoch, Start: l.written})
	}
	l.mu.Unlock()
	if err := l.writeMetaSync(); err != nil {
		return err
	}
	l.mu.Lock()
	l.writing, l.epoch = true, epoch
	l.mu.Unlock()
	return nil
}

// StopWriting ends this replica's writing (it lost the leadership): appends not yet written fail
// with ErrNotLeader, and so do the appends written but not committed (their records may still be
// committed by the next leader: a writer that retries with its writer id and sequence finds them).
func (l *Log) StopWriting() {
	l.wmu.Lock()
	l.mu.Lock()
	l.writing = false
	due := l.pend
	l.pend = nil
	l.mu.Unlock()
	l.wmu.Unlock()
	runDone(due, ErrNotLeader)
}

// Writing reports whether this replica is the writer, and its epoch.
func (l *Log) Writing() (bool, uint64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.writing, l.epoch
}

// SetAutoCommit makes committed follow durable (a replica that alone makes a majority).
func (l *Log) SetAutoCommit(on bool) {
	l.mu.Lock()
	l.autoCommit = on
	readBefore := l.readableLocked()
	if on && l.durable > l.committed {
		l.committed = l.durable
	}
	due := l.advanceLocked(readBefore, l.written)
	l.mu.Unlock()
	runDone(due, nil)
	l.writeMetaAsync()
}

// SetDurableHook sets the function told of every advance of the durable end (the replication
// leader counts its own copy; a follower acknowledges). It runs on the storage goroutine.
func (l *Log) SetDurableHook(fn func(durable uint64)) {
	l.mu.Lock()
	l.onDurable = fn
	l.mu.Unlock()
}

// SetCommitted raises the committed end (told by the replication leader, or computed by it). It
// never moves back.
func (l *Log) SetCommitted(c uint64) {
	l.mu.Lock()
	if c <= l.committed || l.closed {
		l.mu.Unlock()
		return
	}
	readBefore := l.readableLocked()
	l.committed = c
	due := l.advanceLocked(readBefore, l.written)
	l.mu.Unlock()
	l.ApplyRetention(time.Now())
	runDone(due, nil)
	l.writeMetaAsync()
}

// metaLocked snapshots the meta record's fields (mu held).
func (l *Log) metaLocked() logMeta {
	return logMeta{first: l.first, fence: l.fence, committed: min(l.committed, l.durable),
		history: append([]EpochStart(nil), l.history...)}
}

// writeMetaSync writes the meta record and waits until it is durable.
func (l *Log) writeMetaSync() error {
	ch := make(chan error, 1)
	l.metaMu.Lock()
	l.submitMetaLocked(func(err error) { ch <- err })
	l.metaMu.Unlock()
	if err := <-ch; err != nil {
		return fmt.Errorf("stream %d: write meta: %w", l.id, err)
	}
	return nil
}

// writeMetaAsync writes the meta record without waiting; writes are coalesced (at most one in
// flight, carrying the latest state). Each write snapshots the state and is submitted under
// metaMu, so the storage applies them in the order of their snapshots.
func (l *Log) writeMetaAsync() {
	l.metaMu.Lock()
	defer l.metaMu.Unlock()
	if l.metaClosed {
		return
	}
	if l.metaInflight {
		l.metaDirty = true
		return
	}
	l.metaInflight = true
	l.submitMetaLocked(func(err error) {
		if errors.Is(err, storage.ErrClosed) {
			return // called inside Commit, under metaMu: the storage is gone anyway
		}
		if err != nil {
			l.log.Error("cannot store stream meta", "stream_id", l.id, "err", err)
		}
		l.metaMu.Lock()
		l.metaInflight = false
		again := l.metaDirty
		l.metaDirty = false
		l.metaMu.Unlock()
		if again {
			l.writeMetaAsync()
		}
	})
}

// submitMetaLocked submits the current meta record (metaMu held); done runs once it is stored.
func (l *Log) submitMetaLocked(done func(error)) {
	l.mu.RLock()
	m := l.metaLocked()
	l.mu.RUnlock()
	var b storage.Batch
	b.Set(storage.StreamMetaKey(l.id), encodeMeta(&m))
	b.UseReserve() // watermarks and the first offset after retention: it must work on a nearly full disk
	l.async.Add(1)
	l.db.Commit(&b, func(err error) {
		done(err)
		l.async.Done()
	})
}
