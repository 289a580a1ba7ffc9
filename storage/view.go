package storage

import (
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// View is a consistent, point-in-time read view of the database (a badger read transaction). A
// raft snapshot takes one while its state machine is paused and persists from it afterwards, while
// writes go on. Close it when done: an open view keeps Close of the DB waiting.
type View struct {
	d   *DB
	txn *badger.Txn
}

// NewView opens a read view of everything committed so far.
func (d *DB) NewView() (*View, error) {
	if err := d.readLock(); err != nil {
		return nil, err
	}
	return &View{d: d, txn: d.bdb.NewTransaction(false)}, nil
}

// Scan calls fn for every key with the prefix in the view, in key order; key and value are only
// valid during the call. An error from fn stops the scan and is returned as is.
func (v *View) Scan(prefix []byte, fn func(key, value []byte) error) error {
	v.d.mapMu.RLock() // closing the iterator may finish a deferred value-log delete (see trim.go)
	defer v.d.mapMu.RUnlock()
	io := badger.DefaultIteratorOptions
	io.Prefix = prefix
	io.PrefetchSize = 16
	it := v.txn.NewIterator(io)
	defer it.Close()
	for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
		item := it.Item()
		var fnErr error
		if err := item.Value(func(val []byte) error {
			fnErr = fn(item.Key(), val)
			return nil
		}); err != nil {
			return fmt.Errorf("storage: view scan %x: %w", prefix, err)
		}
		if fnErr != nil {
			return fnErr
		}
	}
	return nil
}

// Close releases the view.
func (v *View) Close() {
	if v.txn == nil {
		return
	}
	v.txn.Discard()
	v.txn = nil
	v.d.closeMu.RUnlock()
}

// ScanChunks is Scan for long scans (a raft snapshot streaming a queue's bodies): it reads at most
// chunk entries at a time into copies, under the storage lock that Scan holds throughout, and calls
// fn for them with no lock held, so that the RSS trimmer and value-log GC run between chunks (a
// Scan holds them off for its whole length, and the value-log pages it faults in would stay
// resident). What it reads counts towards the trimmer's next check.
func (v *View) ScanChunks(prefix []byte, chunk int, fn func(key, value []byte) error) error {
	if chunk <= 0 {
		chunk = 1024
	}
	type kv struct{ k, v []byte }
	var buf []kv
	var arena []byte
	seek := prefix
	for {
		buf, arena = buf[:0], arena[:0]
		var next []byte
		err := func() error {
			v.d.mapMu.RLock()
			defer v.d.mapMu.RUnlock()
			io := badger.DefaultIteratorOptions
			io.Prefix = prefix
			io.PrefetchSize = 16
			it := v.txn.NewIterator(io)
			defer it.Close()
			for it.Seek(seek); it.ValidForPrefix(prefix); it.Next() {
				item := it.Item()
				if len(buf) == chunk {
					next = item.KeyCopy(nil)
					return nil
				}
				k0 := len(arena)
				arena = append(arena, item.Key()...)
				v0 := len(arena)
				if err := item.Value(func(val []byte) error {
					arena = append(arena, val...)
					return nil
				}); err != nil {
					return fmt.Errorf("storage: view scan %x: %w", prefix, err)
				}
				buf = append(buf, kv{k: arena[k0:v0:v0], v: arena[v0:len(arena):len(arena)]})
			}
			return nil
		}()
		if err != nil {
			return err
		}
		// arena may have moved while it grew: re-slice the entries from their offsets.
		off := 0
		for i := range buf {
			k, val := len(buf[i].k), len(buf[i].v)
			buf[i].k = arena[off : off+k : off+k]
			buf[i].v = arena[off+k : off+k+val : off+k+val]
			off += k + val
		}
		v.d.noteRead(len(arena))
		for _, e := range buf {
			if err := fn(e.k, e.v); err != nil {
				return err
			}
		}
		if next == nil {
			return nil
		}
		seek = next
	}
}
