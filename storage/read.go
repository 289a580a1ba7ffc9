package storage

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/dgraph-io/badger/v4"
)

// Get returns a copy of the value stored under key, or ErrNotFound.
func (d *DB) Get(key []byte) ([]byte, error) { return d.GetInto(key, nil) }

// GetInto is Get copying the value into dst's storage when it has the capacity (a buffer
// reused from read to read: stream chunks read for delivery), into a new slice otherwise.
func (d *DB) GetInto(key, dst []byte) ([]byte, error) {
	if err := d.readLock(); err != nil {
		return nil, err
	}
	defer d.closeMu.RUnlock()
	var val []byte
	err := d.bdb.View(func(txn *badger.Txn) error {
		item, err := txn.Get(key)
		if err != nil {
			return err
		}
		val, err = item.ValueCopy(dst[:0])
		if err == nil && valueDamaged(len(val), item.ValueSize()) {
			// badger logs and swallows value-log read errors, returning an empty value.
			return fmt.Errorf("%w: the value of key %x (%d bytes) cannot be read", ErrCorrupt, key, item.ValueSize())
		}
		return err
	})
	switch {
	case err == nil:
		d.noteRead(len(val))
		d.statReads.Add(1)
		return val, nil
	case errors.Is(err, badger.ErrKeyNotFound):
		return nil, ErrNotFound
	case errors.Is(err, badger.ErrDBClosed):
		return nil, ErrClosed
	case errors.Is(err, ErrCorrupt):
		return nil, err
	}
	return nil, fmt.Errorf("storage: get %x: %w", key, err)
}

// Scan calls fn for every key with the prefix, in key order. With keysOnly the values are not read and
// value is nil. key and value are only valid during the call. An error from fn stops the scan and is
// returned as is. Scan sees a consistent snapshot; it is meant for boot, never for the hot path.
// A key whose value cannot be read (a damaged value log) is skipped with an Error log line rather than
// stopping the scan; Get on it returns ErrCorrupt.
func (d *DB) Scan(prefix []byte, keysOnly bool, fn func(key, value []byte) error) error {
	if err := d.readLock(); err != nil {
		return err
	}
	defer d.closeMu.RUnlock()
	d.mapMu.RLock() // closing the iterator may finish a deferred value-log delete (see trim.go)
	defer d.mapMu.RUnlock()
	var fnErr error
	err := d.bdb.View(func(txn *badger.Txn) error {
		io := badger.DefaultIteratorOptions
		io.Prefix = prefix
		io.PrefetchValues = !keysOnly
		io.PrefetchSize = 16
		it := txn.NewIterator(io)
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			item := it.Item()
			if keysOnly {
				fnErr = fn(item.Key(), nil)
			} else {
				verr := item.Value(func(v []byte) error {
					if valueDamaged(len(v), item.ValueSize()) {
						d.log.Error("skipping a record whose value cannot be read (damaged value log)",
							"key", fmt.Sprintf("%x", item.Key()), "size", item.ValueSize())
						return nil
					}
					fnErr = fn(item.Key(), v)
					return nil
				})
				if verr != nil {
					return verr
				}
			}
			if fnErr != nil {
				return fnErr
			}
		}
		return nil
	})
	if fnErr != nil {
		return fnErr
	}
	if err != nil {
		return fmt.Errorf("storage: scan %x: %w", prefix, err)
	}
	return nil
}

// DeleteRange deletes every key with the prefix and returns how many it deleted. It iterates keys only
// and deletes through a badger WriteBatch (never DropPrefix, which stalls all writes). It is synchronous.
// Keys written under the prefix while it runs may survive. Its deletes are charged like a batch that
// only deletes (space.go): on a disk down to the floor it stops with ErrNoSpace, having deleted a part.
func (d *DB) DeleteRange(prefix []byte) (int, error) {
	if err := d.readLock(); err != nil {
		return 0, err
	}
	defer d.closeMu.RUnlock()
	d.mapMu.RLock() // writes and iterators may move or unmap value-log mappings (see trim.go)
	defer d.mapMu.RUnlock()
	wb := d.bdb.NewWriteBatch()
	defer wb.Cancel()
	n := 0
	var delErr error
	var budget int64 // charged (space.go) and not yet used
	err := d.bdb.View(func(txn *badger.Txn) error {
		io := badger.DefaultIteratorOptions
		io.Prefix = prefix
		io.PrefetchValues = false
		it := txn.NewIterator(io)
		defer it.Close()
		for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
			key := it.Item().KeyCopy(nil)
			if d.space != nil {
				// A tombstone in the WAL, and later in a level-0 table (see chargeOf).
				c := (int64(len(key)) + entryOverhead) * 21 / 10
				if c > budget {
					chunk := max(c, deleteRangeCharge)
					if delErr = d.space.admit(chunk, true); delErr != nil {
						return delErr
					}
					budget += chunk
				}
				budget -= c
			}
			if delErr = wb.Delete(key); delErr != nil {
				return delErr
			}
			n++
		}
		return nil
	})
	if err == nil {
		err = wb.Flush()
	}
	if err == nil {
		err = d.syncFailed()
	}
	if err != nil {
		return 0, fmt.Errorf("storage: delete range %x: %w", prefix, err)
	}
	if d.space != nil {
		d.space.addDeletes(n)
	}
	return n, nil
}

// deleteRangeCharge is how much DeleteRange charges at a time: one lock for about a thousand deletes.
const deleteRangeCharge = 64 << 10

// Stats are cumulative counters for benchmarks and metrics.
type Stats struct {
	Batches   uint64 // Commit calls completed
	Txns      uint64 // badger transactions committed (each one fsync with SyncWrites) — "fsyncs"
	Ops       uint64 // Set+Delete operations written
	Reads     uint64 // values read by Get and GetInto
	LSMBytes  int64  // disk space used by the LSM tree (*.sst and *.mem files)
	VlogBytes int64  // disk space used by the value log (*.vlog files)
	// RoundSeconds is the time the group committer took per round (write and fsync);
	// RoundBatches the Commit calls it merged per round. Empty for a DB not opened with Open.
	RoundSeconds, RoundBatches HistogramSnapshot
}

// Stats returns the counters. The byte sizes are the blocks allocated on disk (badger preallocates its
// log files sparsely, so file sizes would overstate them); they are 0 in memory.
func (d *DB) Stats() Stats {
	s := Stats{Batches: d.statBatches.Load(), Txns: d.statTxns.Load(), Ops: d.statOps.Load(), Reads: d.statReads.Load()}
	if d.statCommit.roundSeconds != nil {
		s.RoundSeconds, s.RoundBatches = d.statCommit.roundSeconds.snapshot(), d.statCommit.roundBatches.snapshot()
	}
	if d.dir == "" {
		return s
	}
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return s
	}
	for _, e := range entries {
		name := e.Name()
		isVlog := strings.HasSuffix(name, ".vlog")
		if !isVlog && !strings.HasSuffix(name, ".sst") && !strings.HasSuffix(name, ".mem") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		size := info.Size()
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			size = min(size, st.Blocks*512)
		}
		if isVlog {
			s.VlogBytes += size
		} else {
			s.LSMBytes += size
		}
	}
	return s
}

// valueDamaged reports a value badger could not read: it logs value-log read errors and hands back an
// empty value. ValueSize is only an estimate for values in the value log (it assumes a 6-byte entry
// header, large values have 7 or more), so only a difference bigger than the header can explain
// means damage.
func valueDamaged(got int, size int64) bool {
	if got == 0 && size > 0 {
		return true
	}
	d := int64(got) - size
	return d > 8 || d < -8
}
