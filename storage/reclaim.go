package storage

import (
	"errors"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Maintenance: value-log GC, the ballast, and giving the space of deleted records back when the disk
// is nearly full (see space.go).

const (
	defaultMaintainEvery = time.Second // how often the maintenance goroutine looks at the disk
	reclaimEvery         = 5           // at most one reclaim per this many maintenance ticks while space is low
	// gcRewriteFactor: a GC rewrite writes each live value to the value log again and its pointer to the
	// WAL (and later a table); 1.2 times the live bytes bounds both.
	gcRewriteFactor = 1.2
	gcMaxRatio      = 0.99 // beyond this a rewrite frees too little to be worth running
)

// reclaimKey is written and dropped by reclaim: DropPrefix flushes the memtables only when some key
// has the prefix it is given.
var reclaimKey = []byte{prefixReclaim}

// maintain runs until Close: every tick (a second) it measures free space (so that space freed by others
// is seen even with no writes), asks for a reclaim while space is low and records were deleted, runs
// value-log GC every gcInterval and recreates the ballast when there is room. A negative gcInterval
// turns off the periodic GC only (a reclaim still runs its own).
func (d *DB) maintain(gcInterval time.Duration) {
	defer close(d.gcEnd)
	every := d.opts.maintainEvery
	t := time.NewTicker(every)
	defer t.Stop()
	lastGC := time.Now()
	var lastReclaim time.Time
	for {
		select {
		case <-d.gcStop:
			return
		case <-t.C:
		}
		if d.space != nil {
			d.space.measure(every / 2)
		}
		if gcInterval > 0 && time.Since(lastGC) >= gcInterval {
			d.runGC()
			lastGC = time.Now()
		}
		if d.space == nil {
			continue
		}
		if d.space.wantReclaim() && time.Since(lastReclaim) >= reclaimEvery*every {
			lastReclaim = time.Now()
			d.reclaimWanted.Store(true)
			select {
			case d.wake <- struct{}{}:
			default:
			}
		}
		d.space.maybeCreateBallast()
	}
}

// gcTrimWait bounds how long value-log GC waits for the committer's trim between two rewrites (the
// committer may be in a long commit).
const gcTrimWait = 200 * time.Millisecond

// runGC rewrites value-log files while badger finds one with enough garbage, each time with a discard
// ratio whose rewrite fits in the free space (gcBudget). It stops early on Close. It holds mapMu shared
// around each rewrite (see trim.go).
func (d *DB) runGC() (rewrites int) {
	return d.gcRuns(true)
}

// gcRuns is runGC; with lock false the caller holds mapMu (exclusively: reclaim).
func (d *DB) gcRuns(lock bool) (rewrites int) {
	maxFile := d.opts.valueLogFileSize + d.opts.maxPendingBytes // a file ends after the write that passes the size
	low := d.space != nil && d.space.low.Load()
	var before int64
	if low {
		before = d.space.snapshot().Free
	}
	defer func() {
		switch {
		case low && rewrites > 0:
			d.log.Info("storage: value-log GC freed disk space", "rewritten_files", rewrites,
				"free_mib_before", before>>20, "free_mib_after", d.space.snapshot().Free>>20)
		case rewrites > 0:
			d.log.Debug("value-log GC done", "rewritten_files", rewrites)
		}
	}()
	for {
		select {
		case <-d.gcStop:
			return rewrites
		default:
		}
		ratio := defaultGCDiscardRatio
		if d.space != nil {
			if ratio = d.space.gcBudget(maxFile); ratio == 0 {
				return rewrites
			}
		}
		if lock {
			d.mapMu.RLock()
		}
		err := d.bdb.RunValueLogGC(ratio)
		if lock {
			d.mapMu.RUnlock()
		}
		if d.space != nil {
			d.space.measure(0) // the charge was an estimate; a rewritten file is gone
		}
		// The rewrite read a whole value-log file through its mapping: ask the committer to trim now,
		// and let it, before the next rewrite takes mapMu again (back-to-back rewrites of a drained
		// backlog starved the trim's TryLock, and file-backed RSS grew past 700 MB).
		select {
		case <-d.trimmed:
		default:
		}
		d.trimWanted.Store(true)
		select {
		case d.wake <- struct{}{}:
		default:
		}
		if lock && err == nil {
			select {
			case <-d.trimmed:
			case <-d.gcStop:
			case <-time.After(gcTrimWait):
			}
		}
		if err != nil {
			if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) {
				d.log.Warn("value-log GC failed", "err", err)
			}
			return rewrites
		}
		rewrites++
	}
}

// gcBudget picks the discard ratio for one GC run and charges its rewrite: a file is rewritten only
// when at least ratio of it is garbage, so the rewrite copies at most (1-ratio) x maxFile bytes. The
// rewrite may take half the room above the limit (so GC never makes publishes fail) or, while space is
// low, half the room above the floor (GC is then what frees it; acks keep the other half). It returns
// 0 when not even a gcMaxRatio rewrite fits.
func (s *space) gcBudget(maxFile int64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	room := (s.avail - s.limitLocked()) / 2
	if s.low.Load() || room < 0 {
		room = (s.avail - s.floorLocked()) / 2
	}
	full := gcRewriteFactor * float64(maxFile)
	ratio := defaultGCDiscardRatio
	if cost := (1 - ratio) * full; cost > float64(room) {
		ratio = 1 - float64(room)/full
	}
	if ratio > gcMaxRatio {
		return 0
	}
	c := int64((1 - ratio) * full)
	s.avail -= c
	s.charged += c
	return ratio
}

// wantReclaim reports whether space is low and records were deleted since the last reclaim.
func (s *space) wantReclaim() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.low.Load() && s.deletes > 0
}

// maybeReclaim runs a requested reclaim and the value-log GC after it. It runs on the committer
// goroutine between rounds, like the trim: badger's DropPrefix refuses writes while it runs, so no
// commit may be in flight, and mapMu held exclusively keeps the periodic GC, scans and DeleteRange out.
// The GC runs there too, with no write beside it: badger v4.9.6 reads a memtable's max version for a
// rewrite without the lock its writer holds (a data race, harmless on 64-bit, that the race detector
// reports), and the commits it holds up wait on a nearly full disk anyway.
func (d *DB) maybeReclaim() {
	if d.space == nil || !d.reclaimWanted.Load() {
		return
	}
	if !d.mapMu.TryLock() {
		return // a scan, GC or a range delete is running: after the next round
	}
	defer d.mapMu.Unlock()
	d.reclaimWanted.Store(false)
	if d.reclaim() {
		d.gcRuns(false)
	}
}

// reclaim makes badger record which value-log bytes deleted records held, so that value-log GC can
// drop them: it flushes the memtables (where recent deletes are) into level 0 and compacts level 0,
// which drops the older versions of deleted keys and counts their values as garbage. badger has no
// call for only that; DropPrefix of a key of our own does it.
func (d *DB) reclaim() bool {
	start := time.Now()
	before := d.space.snapshot().Free
	d.space.mu.Lock()
	deletes := d.space.deletes
	d.space.deletes = 0
	d.space.mu.Unlock()
	err := d.bdb.Update(func(txn *badger.Txn) error { return txn.Set(reclaimKey, nil) })
	if err == nil {
		err = d.bdb.DropPrefix(reclaimKey)
	}
	d.space.measure(0)
	if err != nil {
		d.log.Warn("storage: cannot flush and compact to free disk space", "err", err)
		return false
	}
	d.log.Info("storage: flushed the memtable and compacted level 0 so that value-log GC can free "+
		"the space of deleted records", "deletes", deletes, "took", time.Since(start).Round(time.Millisecond),
		"free_mib_before", before>>20, "free_mib_after", d.space.snapshot().Free>>20)
	return true
}

// Space returns the free disk space storage sees and the limits it keeps (zero in memory, or where free
// space cannot be measured).
func (d *DB) Space() Space {
	if d == nil || d.space == nil {
		return Space{}
	}
	return d.space.snapshot()
}

// SpaceLow reports whether writes that add data are being refused because the disk is down to the
// reserve (space.go). It is cheap (an atomic load): the server polls it for the disk alarm. It is false
// for a nil DB and in memory.
func (d *DB) SpaceLow() bool {
	return d != nil && d.space != nil && d.space.low.Load()
}

// ReserveSpace charges n bytes that the caller is about to write to the data directory's file system
// outside the DB (a raft snapshot file), so that they are counted before the next measurement. It
// fails with ErrNoSpace when they do not fit above the floor; the ballast is not given up for them.
func (d *DB) ReserveSpace(n int64) error {
	if d.space == nil || n <= 0 {
		return nil
	}
	d.space.mu.Lock()
	defer d.space.mu.Unlock()
	if d.space.avail-n < d.space.floorLocked() {
		d.space.measureLocked(true)
		if d.space.avail-n < d.space.floorLocked() {
			return ErrNoSpace
		}
	}
	d.space.avail -= n
	d.space.charged += n
	d.space.updateLowLocked(false)
	return nil
}
