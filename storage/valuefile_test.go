package storage

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// A large value is found in its value-log file, byte for byte; a small one, a missing key and
// an in-memory database say so instead.
func TestGetFileFindsLargeValues(t *testing.T) {
	d, err := Open(Options{Dir: t.TempDir(), NoSync: true, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	values := map[string][]byte{}
	var b Batch
	for i, size := range []int{4 << 10, 300 << 10, 1 << 20, 100} {
		v := make([]byte, size)
		for j := range v {
			v[j] = byte(rng.Uint32())
		}
		k := []byte{'k', byte(i)}
		values[string(k)] = v
		b.Set(k, v)
	}
	if err := d.CommitSync(&b); err != nil {
		t.Fatal(err)
	}
	for k, v := range values {
		vf, err := d.GetFile([]byte(k), 100)
		if len(v) < 512 {
			if !errors.Is(err, ErrNotInFile) {
				t.Fatalf("GetFile(%q) of a %d-byte value = %v, want ErrNotInFile", k, len(v), err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("GetFile(%q): %v", k, err)
		}
		got := make([]byte, vf.Len)
		_, err = vf.File.ReadAt(got, vf.Offset)
		vf.File.Close()
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("GetFile(%q): the %d bytes at %d are not the value (%v)", k, vf.Len, vf.Offset, err)
		}
		if !bytes.Equal(vf.Head, v[:100]) {
			t.Fatalf("GetFile(%q): Head is %d bytes, not the value's first 100", k, len(vf.Head))
		}
	}
	if _, err := d.GetFile([]byte("nope"), 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetFile of a missing key = %v, want ErrNotFound", err)
	}
	m, err := Open(Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var mb Batch
	mb.Set([]byte("k"), make([]byte, 1<<19))
	if err := m.CommitSync(&mb); err != nil {
		t.Fatal(err)
	}
	if _, err := m.GetFile([]byte("k"), 0); !errors.Is(err, ErrNotInFile) {
		t.Fatalf("GetFile in memory = %v, want ErrNotInFile", err)
	}
}
