package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"

	"github.com/dgraph-io/badger/v4"
)

// A large value (a stream chunk) is sent to a socket more cheaply from the file it is stored in,
// with sendfile, than read into memory and written: the kernel hands the page-cache pages to the
// socket instead of copying them through the process twice. GetFile finds where a value sits in
// badger's value log.
//
// It relies on two facts of badger v4's value log, both checked on every call so that a
// different layout falls back to reading (ErrNotInFile) instead of sending wrong bytes:
//   - an item whose value is in the value log carries a value pointer (file id, entry length,
//     entry offset; badger's valuePointer, 12 bytes in the machine's byte order) in its
//     unexported vptr field, with bit 1 of its meta field set;
//   - the entry at that offset is a header (meta and user-meta bytes, then the uvarint key
//     length, value length and expiry), the key with its 8-byte version, the value and a
//     4-byte CRC, in a file named %06d.vlog. Value-log files are only ever appended to and
//     deleted whole, so an entry's bytes do not change while the file is open.

// ErrNotInFile is returned by GetFile when the value is not in a value-log file the caller can
// read: a small value stored with its key, an in-memory database, a file already deleted, or
// an entry that does not look as expected.
var ErrNotInFile = errors.New("storage: value not in a value-log file")

// ValueFile is where a value's bytes are: File[Offset : Offset+Len]. File is opened for the
// caller, who closes it. Head is the value's first bytes, as many as GetFile was asked for (read
// with the entry's header, in the same system call).
type ValueFile struct {
	File   *os.File
	Offset int64
	Len    int
	Head   []byte
}

const (
	badgerBitValuePointer = 1 << 1 // badger's bitValuePointer
	badgerVptrSize        = 12     // badger's valuePointer: Fid, Len, Offset uint32
	badgerMaxHeaderSize   = 2 + binary.MaxVarintLen32*2 + binary.MaxVarintLen64
)

// GetFile returns where key's value is stored in the value log, with its first head bytes (or
// all of it, when shorter), or ErrNotFound, or ErrNotInFile (then read it with Get). The caller
// checks the bytes it sends (a stream chunk carries its own CRC): the rest is not read here.
func (d *DB) GetFile(key []byte, head int) (ValueFile, error) {
	if d.opts.InMemory || d.dir == "" {
		return ValueFile{}, ErrNotInFile
	}
	if err := d.readLock(); err != nil {
		return ValueFile{}, err
	}
	defer d.closeMu.RUnlock()
	var fid, entryLen, entryOff uint32
	var keyLen int
	err := d.bdb.View(func(txn *badger.Txn) error {
		item, err := txn.Get(key)
		if err != nil {
			return err
		}
		vptr, ok := valuePointerOf(item)
		if !ok {
			return ErrNotInFile
		}
		fid = binary.NativeEndian.Uint32(vptr[0:])
		entryLen = binary.NativeEndian.Uint32(vptr[4:])
		entryOff = binary.NativeEndian.Uint32(vptr[8:])
		keyLen = len(item.Key()) + 8
		return nil
	})
	switch {
	case errors.Is(err, badger.ErrKeyNotFound):
		return ValueFile{}, ErrNotFound
	case errors.Is(err, badger.ErrDBClosed):
		return ValueFile{}, ErrClosed
	case errors.Is(err, ErrNotInFile):
		return ValueFile{}, err
	case err != nil:
		return ValueFile{}, fmt.Errorf("storage: get %x: %w", key, err)
	}
	f, err := os.Open(filepath.Join(d.dir, fmt.Sprintf("%06d.vlog", fid)))
	if err != nil {
		return ValueFile{}, ErrNotInFile // collected by value-log GC meanwhile
	}
	// The entry's header and key, and the value's first bytes (the entry ends with a CRC, so
	// reading entryLen bytes never runs past the value into the next entry's).
	buf := make([]byte, min(int(entryLen), badgerMaxHeaderSize+keyLen+max(head, 0)))
	if _, err := f.ReadAt(buf, int64(entryOff)); err != nil {
		f.Close()
		return ValueFile{}, ErrNotInFile
	}
	hlen, klen, vlen, ok := decodeEntryHeader(buf)
	if !ok || klen != keyLen || hlen+klen > len(buf) || !bytes.Equal(buf[hlen:hlen+klen-8], key) ||
		uint64(hlen)+uint64(klen)+vlen+crc32.Size != uint64(entryLen) {
		f.Close()
		return ValueFile{}, ErrNotInFile
	}
	value := buf[hlen+klen:]
	value = value[:min(len(value), int(vlen), max(head, 0))]
	d.statReads.Add(1)
	return ValueFile{File: f, Offset: int64(entryOff) + int64(hlen+klen), Len: int(vlen), Head: value}, nil
}

// valuePointerOf returns the value pointer of an item whose value is in the value log.
func valuePointerOf(item *badger.Item) ([]byte, bool) {
	v := reflect.ValueOf(item).Elem()
	meta, vptr := v.FieldByName("meta"), v.FieldByName("vptr")
	if !meta.IsValid() || meta.Kind() != reflect.Uint8 || !vptr.IsValid() || vptr.Kind() != reflect.Slice ||
		vptr.Type().Elem().Kind() != reflect.Uint8 {
		return nil, false
	}
	if meta.Uint()&badgerBitValuePointer == 0 || vptr.Len() != badgerVptrSize {
		return nil, false
	}
	return vptr.Bytes(), true
}

// decodeEntryHeader decodes a value-log entry's header: its length, and the key and value
// lengths it gives.
func decodeEntryHeader(b []byte) (hlen, klen int, vlen uint64, ok bool) {
	if len(b) < 2 {
		return 0, 0, 0, false
	}
	i := 2
	k, n := binary.Uvarint(b[i:])
	if n <= 0 || k > 1<<16 {
		return 0, 0, 0, false
	}
	i += n
	v, n := binary.Uvarint(b[i:])
	if n <= 0 {
		return 0, 0, 0, false
	}
	i += n
	if _, n = binary.Uvarint(b[i:]); n <= 0 {
		return 0, 0, 0, false
	}
	return i + n, int(k), v, true
}
