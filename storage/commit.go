package storage

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/skl"
)

const (
	maxNodeSize = skl.MaxNodeSize
	maxKeySize  = 65000 // badger's limit
	// perEntryOverhead mirrors badger's txn size estimate: 2 meta bytes + 10 for the version in the key.
	perEntryOverhead = 12
	valuePointerSize = 12
)

const badgerReservedPrefix = "!badger!"

// op is one write of a Batch.
type op struct {
	key, value []byte
	del        bool
}

// Batch is a set of writes committed together. A batch that fits in one badger transaction is atomic;
// a larger one is split over several (each one atomic), so after a crash a prefix of its transactions may
// be present. A Batch is not safe for concurrent use.
type Batch struct {
	ops     []op
	bytes   int64
	reserve bool
}

// Set adds a write of value under key. The batch keeps both slices: the caller must not modify them until
// the commit's done callback has run.
func (b *Batch) Set(key, value []byte) {
	b.ops = append(b.ops, op{key: key, value: value})
	b.bytes += int64(len(key) + len(value))
}

// Delete adds a deletion of key. The batch keeps the slice (see Set).
func (b *Batch) Delete(key []byte) {
	b.ops = append(b.ops, op{key: key, del: true})
	b.bytes += int64(len(key))
}

// UseReserve lets the batch use the room storage keeps for deletes when the disk is nearly full (see
// space.go): down to the floor rather than the reserve. It is for small writes that must still work
// so that a full disk can be drained: acknowledgements and settlements kept in a raft log, raft votes,
// a requeued message's delivery count, metadata, stream offsets and retention. A batch that only
// deletes uses the reserve without it. Reset clears the mark.
func (b *Batch) UseReserve() { b.reserve = true }

// Len returns the number of operations in the batch.
func (b *Batch) Len() int { return len(b.ops) }

// Reset empties the batch, keeping its capacity.
func (b *Batch) Reset() {
	clear(b.ops)
	b.ops = b.ops[:0]
	b.bytes = 0
	b.reserve = false
}

// pending is one queued Commit.
type pending struct {
	ops       []op
	bytes     int64
	charge    int64 // disk space the batch will take (space.go); 0 when nothing is checked
	dels      int   // delete operations
	essential bool  // may go below the reserve, down to the floor
	done      func(error)
	err       error // set when the batch was rejected before writing; it is not written
}

// Commit queues b for the group committer and returns at once. Commit takes b's operations: on return b is
// empty and may be reused at once, but the key and value slices given to Set/Delete must stay unmodified
// until done runs.
//
// The committer merges every batch queued meanwhile (from many goroutines) into as few badger
// transactions as possible, ideally one and so one fsync per round, commits, and then calls each done
// callback in submission order with the result (nil = durable). done runs on the committer goroutine: it
// must be quick and must not call CommitSync, but it may call Commit. A nil done is allowed.
//
// Back-pressure: the queue is bounded (16 MiB of payload or 64k operations); Commit blocks while it is
// full, except while the committer is running callbacks (so a callback's Commit cannot deadlock). After
// Close, Commit calls done(ErrClosed) on the calling goroutine.
//
// Disk space: when the file system is down to the reserve storage keeps (space.go), the committer
// refuses the batch instead of writing it and done gets an error matching ErrNoSpace; batches that
// only delete, or are marked with UseReserve, may go further, down to the floor.
func (d *DB) Commit(b *Batch, done func(error)) {
	p := pending{ops: b.ops, bytes: b.bytes, done: done}
	reserve := b.reserve
	b.ops, b.bytes, b.reserve = nil, 0, false
	p.err = d.validate(p.ops)
	if d.space != nil && len(p.ops) > 0 {
		p.charge, p.dels = chargeOf(p.ops, d.valueThresh)
		p.essential = reserve || p.dels == len(p.ops)
	}

	d.mu.Lock()
	// While the committer runs callbacks it is not draining the queue; a callback may call Commit, so
	// nobody waits then (the bound is exceeded by at most what arrives during the callbacks).
	for !d.closed && !d.inCallbacks && len(d.queue) > 0 &&
		(d.queuedBytes+p.bytes > d.opts.maxPendingBytes || d.queuedOps+len(p.ops) > d.opts.maxPendingOps) {
		d.spaceCond.Wait()
	}
	if d.closed {
		d.mu.Unlock()
		if done != nil {
			done(ErrClosed)
		}
		return
	}
	d.queue = append(d.queue, p)
	d.queuedBytes += p.bytes
	d.queuedOps += len(p.ops)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// CommitSync is Commit plus waiting for the result. It must not be called from a done callback.
func (d *DB) CommitSync(b *Batch) error {
	ch := make(chan error, 1)
	d.Commit(b, func(err error) { ch <- err })
	return <-ch
}

// validate rejects, before queueing, writes badger would refuse, so that one bad batch cannot fail the
// batches merged with it.
func (d *DB) validate(ops []op) error {
	for i := range ops {
		o := &ops[i]
		switch {
		case len(o.key) == 0:
			return errors.New("storage: commit: empty key")
		case len(o.key) > maxKeySize:
			return fmt.Errorf("storage: commit: key of %d bytes exceeds the %d-byte limit", len(o.key), maxKeySize)
		case strings.HasPrefix(string(o.key), badgerReservedPrefix):
			return fmt.Errorf("storage: commit: key %q uses badger's reserved prefix", o.key)
		case d.opts.InMemory && len(o.value) >= inMemoryValueThreshold:
			// badger keeps only values below its threshold with their keys; one at the threshold
			// would go to the value log, which in-memory mode does not have (badger panics).
			return fmt.Errorf("storage: commit: value of %d bytes exceeds the in-memory limit of %d",
				len(o.value), inMemoryValueThreshold-1)
		case !d.opts.InMemory && int64(len(o.value)) >= d.opts.valueLogFileSize:
			return fmt.Errorf("storage: commit: value of %d bytes exceeds the %d-byte limit",
				len(o.value), d.opts.valueLogFileSize)
		}
	}
	return nil
}

// Linger bounds: after a round of k batches, the committer waits a little for the callers it just
// answered to come back (CommitSync callers, publishers waiting for confirms), so that k callers take one
// transaction per round instead of splitting into two alternating halves.
const (
	lingerMin = 20 * time.Microsecond
	lingerMax = 2 * time.Millisecond
)

// committer is the group-commit goroutine: it takes everything queued, writes it in as few transactions
// as possible, and runs the callbacks. It exits once Close was called and the queue is empty.
func (d *DB) committer() {
	defer close(d.committerEnd)
	var round []pending
	var errs []error
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	lastRound := 0               // batches in the previous round
	var lastCommit time.Duration // how long the previous round's commit took
	for {
		if !d.waitForWork(lastRound, lastCommit, timer) {
			return
		}
		d.mu.Lock()
		round, d.queue, d.spare = d.queue, d.spare, nil
		d.queuedBytes, d.queuedOps = 0, 0
		d.spaceCond.Broadcast()
		d.mu.Unlock()

		start := time.Now()
		if d.space != nil {
			d.space.admitRound(round)
		}
		errs = d.commitRound(round, errs[:0])
		lastCommit = time.Since(start)
		// Counted before the callbacks run, so a caller that was answered sees its batch counted.
		d.statBatches.Add(uint64(len(round)))
		d.statCommit.observeRound(lastCommit, len(round))
		d.mu.Lock()
		d.inCallbacks = true
		d.mu.Unlock()
		for i := range round {
			if round[i].done != nil {
				round[i].done(errs[i])
			}
		}
		d.mu.Lock()
		d.inCallbacks = false
		d.mu.Unlock()
		lastRound = len(round)
		var written int64
		for i := range round {
			written += round[i].bytes
		}
		d.maybeTrim(written)
		d.maybeReclaim()

		clear(round)
		d.mu.Lock()
		if d.spare == nil {
			d.spare = round[:0]
		}
		d.mu.Unlock()
	}
}

// waitForWork blocks until there is something to commit and returns true, or returns false once the DB
// is closed and the queue is empty. When the previous round had several batches it lingers (at most half
// the previous commit time, within lingerMin..lingerMax) until as many batches are queued again.
func (d *DB) waitForWork(lastRound int, lastCommit time.Duration, timer *time.Timer) bool {
	lingering := lastRound > 1
	var deadline time.Time
	if lingering {
		deadline = time.Now().Add(min(max(lastCommit/2, lingerMin), lingerMax))
	}
	for {
		d.mu.Lock()
		n, closed := len(d.queue), d.closed
		d.mu.Unlock()
		switch {
		case n == 0 && closed:
			return false
		case n > 0 && (!lingering || closed || n >= lastRound || d.queuedFull()):
			return true
		case n > 0:
			wait := time.Until(deadline)
			if wait <= 0 {
				return true
			}
			timer.Reset(wait)
			select {
			case <-d.wake:
			case <-timer.C:
			}
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		default:
			// Idle: still check the resident set now and then (reads also fault pages in).
			if d.readSinceTrim.Load() == d.readAtTrimCheck && d.sinceTrim == 0 {
				timer.Reset(trimIdleCheckEvery) // nothing read or written since the last check
			} else {
				timer.Reset(trimCheckEvery)
			}
			select {
			case <-d.wake:
			case <-timer.C:
			}
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			d.maybeTrim(0)
			d.maybeReclaim()
		}
	}
}

// queuedFull reports whether the queue is at half its bound, when lingering no longer pays.
func (d *DB) queuedFull() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queuedBytes*2 >= d.opts.maxPendingBytes || d.queuedOps*2 >= d.opts.maxPendingOps
}

// txnWriter fills badger transactions for one round.
type txnWriter struct {
	d        *DB
	txn      *badger.Txn
	size     int64 // badger's size estimate of txn
	count    int64
	firstBat int // index of the first batch with writes in txn
	errs     []error
	ops      uint64
}

// commitRound writes round and returns one error per batch (appended to errs).
func (d *DB) commitRound(round []pending, errs []error) []error {
	for i := range round {
		errs = append(errs, round[i].err)
	}
	if err := d.syncFailed(); err != nil {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	w := &txnWriter{d: d, errs: errs, firstBat: -1}
	for i := range round {
		p := &round[i]
		if p.err != nil || len(p.ops) == 0 {
			continue
		}
		// Keep a batch in one transaction when it fits in an empty one.
		size, count := d.estimate(p.ops)
		if w.txn != nil && (w.size+size > d.txnMaxSize || w.count+count > d.txnMaxCount) {
			w.flush(i - 1)
		}
		for j := range p.ops {
			w.add(&p.ops[j], i)
		}
	}
	w.flush(len(round) - 1)
	d.statOps.Add(w.ops)
	return w.errs
}

// estimate mirrors badger's transaction size accounting for ops.
func (d *DB) estimate(ops []op) (size, count int64) {
	for i := range ops {
		v := int64(len(ops[i].value))
		if v >= d.valueThresh {
			v = valuePointerSize
		}
		size += int64(len(ops[i].key)) + v + perEntryOverhead
	}
	return size, int64(len(ops))
}

// add writes o (of batch bat) into the current transaction, committing it first when it is full.
func (w *txnWriter) add(o *op, bat int) {
	for attempt := 0; ; attempt++ {
		if w.txn == nil {
			w.txn = w.d.bdb.NewTransaction(true)
			w.size, w.count, w.firstBat = 0, 0, bat
		}
		var err error
		if o.del {
			err = w.txn.Delete(o.key)
		} else {
			err = w.txn.Set(o.key, o.value)
		}
		if err == nil {
			v := int64(len(o.value))
			if v >= w.d.valueThresh {
				v = valuePointerSize
			}
			w.size += int64(len(o.key)) + v + perEntryOverhead
			w.count++
			w.ops++
			return
		}
		if errors.Is(err, badger.ErrTxnTooBig) && w.count > 0 && attempt == 0 {
			// The batch is split here: commit what we have and retry in a fresh transaction.
			w.flush(bat)
			continue
		}
		w.fail(bat, bat, fmt.Errorf("storage: commit: %w", err))
		return
	}
}

// flush commits the current transaction, which holds writes of batches firstBat..lastBat.
func (w *txnWriter) flush(lastBat int) {
	if w.txn == nil {
		return
	}
	txn := w.txn
	w.txn = nil
	if w.count == 0 {
		txn.Discard()
		return
	}
	if err := txn.Commit(); err != nil {
		if writePathFailure(err) {
			// An I/O error writing or syncing the write-ahead log: like a failed value-log
			// fsync, it may leave a hole that recovery stops at, so nothing later is trusted.
			w.d.noteSyncFailure(err.Error())
		}
		w.fail(w.firstBat, lastBat, fmt.Errorf("storage: commit: %w", err))
		return
	}
	w.d.statTxns.Add(1)
	if err := w.d.syncFailed(); err != nil {
		// badger reported the transaction written although the value log's fsync failed.
		w.fail(w.firstBat, lastBat, err)
	}
}

// writePathFailure tells an error of badger's write path (an I/O error writing or syncing its logs,
// which badger flattens into text) from the refusals it returns before writing anything.
func writePathFailure(err error) bool {
	for _, refused := range []error{badger.ErrConflict, badger.ErrTxnTooBig, badger.ErrDBClosed,
		badger.ErrBlockedWrites, badger.ErrEmptyKey, badger.ErrInvalidKey, badger.ErrBannedKey} {
		if errors.Is(err, refused) {
			return false
		}
	}
	return true
}

func (w *txnWriter) fail(from, to int, err error) {
	for i := from; i <= to && i < len(w.errs); i++ {
		if i >= 0 && w.errs[i] == nil {
			w.errs[i] = err
		}
	}
}
