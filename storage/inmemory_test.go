package storage

import "testing"

// In memory, a value at badger's threshold (1 MiB) is refused with an error; badger itself
// would panic on it (it has no value log to put it in).
func TestInMemoryRefusesAValueAtTheThreshold(t *testing.T) {
	m, err := Open(Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var b Batch
	b.Set([]byte("k"), make([]byte, 1<<20))
	if err := m.CommitSync(&b); err == nil {
		t.Fatal("a 1 MiB value was accepted in memory")
	}
	b.Set([]byte("k"), make([]byte, 1<<20-1))
	if err := m.CommitSync(&b); err != nil {
		t.Fatalf("a value of 1 MiB - 1 byte: %v", err)
	}
}
