package storage

import (
	"bytes"
	"fmt"
	"testing"
)

// TestViewScanChunks: a chunked scan of a view sees every key of the prefix once, in order, with
// its value, whatever the chunk size, and nothing written after the view was opened.
func TestViewScanChunks(t *testing.T) {
	d, err := Open(Options{Dir: t.TempDir(), NoSync: true, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const n = 2500
	var b Batch
	for i := 1; i <= n; i++ {
		b.Set(U64U64Key(0x05, 9, uint64(i)), bytes.Repeat([]byte{byte(i)}, i%300+1))
	}
	b.Set(U64U64Key(0x05, 10, 1), []byte("other prefix"))
	if err := d.CommitSync(&b); err != nil {
		t.Fatal(err)
	}
	v, err := d.NewView()
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	b.Set(U64U64Key(0x05, 9, n+1), []byte("after the view"))
	if err := d.CommitSync(&b); err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []int{1, 7, 1000, n, n + 1, 0} {
		t.Run(fmt.Sprint(chunk), func(t *testing.T) {
			next := uint64(1)
			err := v.ScanChunks(U64Key(0x05, 9), chunk, func(key, val []byte) error {
				_, id, ok := ParseU64U64Key(0x05, key)
				if !ok || id != next {
					return fmt.Errorf("key %x, want id %d", key, next)
				}
				if want := bytes.Repeat([]byte{byte(id)}, int(id)%300+1); !bytes.Equal(val, want) {
					return fmt.Errorf("id %d: value of %d bytes, want %d", id, len(val), len(want))
				}
				next++
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if next != n+1 {
				t.Fatalf("scanned %d keys, want %d", next-1, n)
			}
		})
	}
}
