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
