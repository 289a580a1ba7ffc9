package raftstore

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/goleak"

	"warren/storage"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// openDB opens a storage DB in dir (a fresh temporary directory when dir is empty); it is closed at the
// end of the test unless the test closes it first.
func openDB(t testing.TB, dir string) *storage.DB {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	db, err := storage.Open(storage.Options{Dir: dir, Logger: slog.New(slog.DiscardHandler), GCInterval: -1})
	if err != nil {
		t.Fatalf("storage.Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func newStore(t testing.TB, db *storage.DB, group uint64) *Store {
	t.Helper()
	s, err := New(db, group)
	if err != nil {
		t.Fatalf("New(group %d): %v", group, err)
	}
	return s
}

// entry builds a log entry whose fields all depend on idx.
func entry(idx uint64, data string) *raft.Log {
	return &raft.Log{
		Index:      idx,
		Term:       idx/3 + 1,
		Type:       raft.LogCommand,
		Data:       []byte(data),
		Extensions: []byte(fmt.Sprintf("ext-%d", idx)),
		AppendedAt: time.Unix(1_700_000_000+int64(idx), int64(idx)*1000),
	}
}

func entries(from, to uint64) []*raft.Log {
	var out []*raft.Log
	for i := from; i <= to; i++ {
		out = append(out, entry(i, fmt.Sprintf("log%d", i)))
	}
	return out
}

func mustStore(t testing.TB, s *Store, logs []*raft.Log) {
	t.Helper()
	if err := s.StoreLogs(logs); err != nil {
		t.Fatalf("StoreLogs: %v", err)
	}
}

// sameLog compares entries field by field (AppendedAt by instant, not by location).
func sameLog(a, b *raft.Log) bool {
	return a.Index == b.Index && a.Term == b.Term && a.Type == b.Type && bytes.Equal(a.Data, b.Data) &&
		bytes.Equal(a.Extensions, b.Extensions) && a.AppendedAt.Equal(b.AppendedAt)
}

func wantLog(t testing.TB, s *Store, want *raft.Log) {
	t.Helper()
	var got raft.Log
	if err := s.GetLog(want.Index, &got); err != nil {
		t.Fatalf("GetLog(%d): %v", want.Index, err)
	}
	if !sameLog(&got, want) {
		t.Fatalf("GetLog(%d) = %+v, want %+v", want.Index, got, *want)
	}
}

func wantMissing(t testing.TB, s *Store, idx uint64) {
	t.Helper()
	var got raft.Log
	if err := s.GetLog(idx, &got); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog(%d) = %v, %+v; want raft.ErrLogNotFound", idx, err, got)
	}
}

func wantBounds(t testing.TB, s *Store, first, last uint64) {
	t.Helper()
	f, err := s.FirstIndex()
	if err != nil {
		t.Fatalf("FirstIndex: %v", err)
	}
	l, err := s.LastIndex()
	if err != nil {
		t.Fatalf("LastIndex: %v", err)
	}
	if f != first || l != last {
		t.Fatalf("FirstIndex, LastIndex = %d, %d; want %d, %d", f, l, first, last)
	}
}

func TestFirstAndLastIndex(t *testing.T) {
	s := newStore(t, openDB(t, ""), 1)
	wantBounds(t, s, 0, 0) // an empty log reports 0 for both

	mustStore(t, s, entries(1, 3))
	wantBounds(t, s, 1, 3)

	// Appending moves only the last index.
	mustStore(t, s, entries(4, 10))
	wantBounds(t, s, 1, 10)
}

func TestGetLog(t *testing.T) {
	s := newStore(t, openDB(t, ""), 1)
	wantMissing(t, s, 1) // nothing stored yet

	logs := entries(1, 3)
	mustStore(t, s, logs)
	for _, l := range logs {
		wantLog(t, s, l)
	}
	wantMissing(t, s, 0)
	wantMissing(t, s, 4)
}

func TestStoreLog(t *testing.T) {
	s := newStore(t, openDB(t, ""), 1)
	l := entry(1, "log1")
	if err := s.StoreLog(l); err != nil {
		t.Fatalf("StoreLog: %v", err)
	}
	wantLog(t, s, l)
	wantBounds(t, s, 1, 1)

	// Every entry type and the edge cases of the encoding come back as stored.
	cases := []*raft.Log{
		{Index: 2, Term: 1, Type: raft.LogNoop},                                 // no data, no time
		{Index: 3, Term: 1 << 62, Type: raft.LogConfiguration, Data: []byte{0}}, // big term
		{Index: 4, Term: 2, Type: raft.LogBarrier, Extensions: []byte("only-ext")},
		{Index: 5, Term: 2, Type: raft.LogCommand, Data: bytes.Repeat([]byte("x"), 4096), // in the value log
			AppendedAt: time.Unix(-5, 999_999_999)},
		{Index: 6, Term: 2, Type: raft.LogType(200), Data: []byte("unknown type survives")},
	}
	for _, l := range cases {
		if err := s.StoreLog(l); err != nil {
			t.Fatalf("StoreLog(%d): %v", l.Index, err)
		}
	}
	for _, l := range cases {
		wantLog(t, s, l)
	}
	var got raft.Log
	if err := s.GetLog(2, &got); err != nil || got.Data != nil || got.Extensions != nil || !got.AppendedAt.IsZero() {
		t.Fatalf("GetLog(2) = %v, %+v; want empty data, extensions and time", err, got)
	}
	wantBounds(t, s, 1, 6)
}

func TestStoreLogsRefusesBadEntries(t *testing.T) {
	s := newStore(t, openDB(t, ""), 1)
	if err := s.StoreLogs([]*raft.Log{entry(1, "a"), {Index: 0}}); err == nil {
		t.Fatal("StoreLogs with index 0 succeeded")
	}
	if err := s.StoreLogs([]*raft.Log{nil}); err == nil {
		t.Fatal("StoreLogs with a nil entry succeeded")
	}
	if err := s.StoreLogs(nil); err != nil {
		t.Fatalf("StoreLogs(nil) = %v", err)
	}
	wantBounds(t, s, 0, 0) // a refused batch writes nothing
	wantMissing(t, s, 1)
}

func TestStoreLogs(t *testing.T) {
	s := newStore(t, openDB(t, ""), 1)
	logs := entries(1, 2)
	mustStore(t, s, logs)
	for _, l := range logs {
		wantLog(t, s, l)
	}

	// A batch out of order, and one that is not contiguous with the stored entries (raft leaves such a
	// gap behind a snapshot).
	mustStore(t, s, []*raft.Log{entry(5, "five"), entry(3, "three"), entry(4, "four")})
	mustStore(t, s, entries(20, 21))
	wantBounds(t, s, 1, 21)
	for i := uint64(6); i < 20; i++ {
		wantMissing(t, s, i)
	}
	wantLog(t, s, entry(3, "three"))

	// Storing an index again replaces the entry.
	mustStore(t, s, []*raft.Log{entry(4, "four again")})
	wantLog(t, s, entry(4, "four again"))

	// A batch of many entries with large data: one call, durable when it returns.
	var big []*raft.Log
	for i := uint64(22); i < 22+300; i++ {
		big = append(big, entry(i, string(bytes.Repeat([]byte{byte(i)}, 3000))))
	}
	mustStore(t, s, big)
	wantBounds(t, s, 1, 321)
	wantLog(t, s, big[150])
}

func TestDeleteRange(t *testing.T) {
	s := newStore(t, openDB(t, ""), 1)
	mustStore(t, s, entries(1, 20))

	// The head (log compaction).
	if err := s.DeleteRange(1, 5); err != nil {
		t.Fatalf("DeleteRange(1, 5): %v", err)
	}
	for i := uint64(1); i <= 5; i++ {
		wantMissing(t, s, i)
	}
	wantLog(t, s, entry(6, "log6"))
	wantBounds(t, s, 6, 20)

	// The tail (a conflicting suffix on a follower).
	if err := s.DeleteRange(18, 20); err != nil {
		t.Fatalf("DeleteRange(18, 20): %v", err)
	}
	wantMissing(t, s, 18)
	wantBounds(t, s, 6, 17)

	// A range reaching beyond the log is clamped; one outside the log or inverted is a no-op.
	if err := s.DeleteRange(1, 7); err != nil {
		t.Fatalf("DeleteRange(1, 7): %v", err)
	}
	wantBounds(t, s, 8, 17)
	for _, r := range [][2]uint64{{1, 7}, {18, 100}, {12, 10}} {
		if err := s.DeleteRange(r[0], r[1]); err != nil {
			t.Fatalf("DeleteRange(%d, %d): %v", r[0], r[1], err)
		}
		wantBounds(t, s, 8, 17)
	}

	// The middle leaves the bounds alone.
	if err := s.DeleteRange(10, 12); err != nil {
		t.Fatalf("DeleteRange(10, 12): %v", err)
	}
	wantMissing(t, s, 11)
	wantLog(t, s, entry(9, "log9"))
	wantLog(t, s, entry(13, "log13"))
	wantBounds(t, s, 8, 17)

	// Everything.
	if err := s.DeleteRange(0, ^uint64(0)); err != nil {
		t.Fatalf("DeleteRange(all): %v", err)
	}
	wantBounds(t, s, 0, 0)
	wantMissing(t, s, 13)

	// A store emptied by deletes accepts new entries anywhere.
	mustStore(t, s, entries(100, 101))
	wantBounds(t, s, 100, 101)
}

func TestDeleteRangeAcrossGaps(t *testing.T) {
	db := openDB(t, "")
	s := newStore(t, db, 1)
	mustStore(t, s, entries(1, 5))
	mustStore(t, s, entries(10, 12))
	mustStore(t, s, entries(30, 31))

	// Deleting the head up to a gap: the next stored index becomes the first.
	if err := s.DeleteRange(1, 7); err != nil {
		t.Fatalf("DeleteRange: %v", err)
	}
	wantBounds(t, s, 10, 31)
	// Deleting the tail down to a gap: the previous stored index becomes the last.
	if err := s.DeleteRange(20, 31); err != nil {
		t.Fatalf("DeleteRange: %v", err)
	}
	wantBounds(t, s, 10, 12)
	// The cached bounds agree with what is on disk.
	wantBounds(t, newStore(t, db, 1), 10, 12)
}

func TestDeleteLargeRange(t *testing.T) {
	db := openDB(t, "")
	s := newStore(t, db, 1)
	const n = deleteChunk*2 + 100 // several storage batches
	for from := uint64(1); from <= n; from += 1000 {
		var logs []*raft.Log
		for i := from; i < from+1000 && i <= n; i++ {
			logs = append(logs, &raft.Log{Index: i, Term: 1})
		}
		mustStore(t, s, logs)
	}
	if err := s.DeleteRange(1, n-10); err != nil {
		t.Fatalf("DeleteRange: %v", err)
	}
	wantBounds(t, s, n-9, n)
	if err := s.DeleteRange(5, n-5); err != nil { // the tail goes downwards
		t.Fatalf("DeleteRange: %v", err)
	}
	wantBounds(t, s, n-4, n)
	wantBounds(t, newStore(t, db, 1), n-4, n)
}

func TestSetGet(t *testing.T) {
	s := newStore(t, openDB(t, ""), 1)

	// A missing key: the error raft recognises by its text.
	val, err := s.Get([]byte("bad"))
	if !errors.Is(err, ErrKeyNotFound) || err.Error() != "not found" || val != nil {
		t.Fatalf("Get(missing) = %q, %v; want nil, %q", val, err, "not found")
	}

	k, v := []byte("hello"), []byte("world")
	if err := s.Set(k, v); err != nil {
		t.Fatalf("Set: %v", err)
	}
	if val, err := s.Get(k); err != nil || !bytes.Equal(val, v) {
		t.Fatalf("Get = %q, %v; want %q", val, err, v)
	}

	// Overwrite, and an empty value, which raft can tell from a missing one.
	if err := s.Set(k, []byte("again")); err != nil {
		t.Fatalf("Set: %v", err)
	}
	if val, err := s.Get(k); err != nil || string(val) != "again" {
		t.Fatalf("Get = %q, %v; want %q", val, err, "again")
	}
	if err := s.Set([]byte("empty"), nil); err != nil {
		t.Fatalf("Set(empty): %v", err)
	}
	if val, err := s.Get([]byte("empty")); err != nil || val == nil || len(val) != 0 {
		t.Fatalf("Get(empty) = %#v, %v; want a non-nil empty slice", val, err)
	}

	// The stable store and the log of a group do not collide.
	mustStore(t, s, entries(1, 1))
	if _, err := s.Get(storage.RaftLogKey(1, 1)[9:]); !errors.Is(err, ErrKeyNotFound) {
		t.Fatalf("Get(log key suffix) = %v; want ErrKeyNotFound", err)
	}
}

func TestSetUint64GetUint64(t *testing.T) {
	s := newStore(t, openDB(t, ""), 1)
	if v, err := s.GetUint64([]byte("bad")); !errors.Is(err, ErrKeyNotFound) || err.Error() != "not found" || v != 0 {
		t.Fatalf("GetUint64(missing) = %d, %v; want 0, %q", v, err, "not found")
	}
	for _, v := range []uint64{123, 0, 1 << 63, ^uint64(0)} {
		if err := s.SetUint64([]byte("abc"), v); err != nil {
			t.Fatalf("SetUint64(%d): %v", v, err)
		}
		if got, err := s.GetUint64([]byte("abc")); err != nil || got != v {
			t.Fatalf("GetUint64 = %d, %v; want %d", got, err, v)
		}
	}
	// A value that is not 8 bytes is reported as damaged, not read as a number.
	if err := s.Set([]byte("short"), []byte{1, 2}); err != nil {
		t.Fatalf("Set: %v", err)
	}
	if _, err := s.GetUint64([]byte("short")); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("GetUint64(2-byte value) = %v; want storage.ErrCorrupt", err)
	}
}

func TestRestartKeepsEverything(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	s := newStore(t, db, 7)
	mustStore(t, s, entries(1, 50))
	if err := s.DeleteRange(1, 10); err != nil {
		t.Fatalf("DeleteRange: %v", err)
	}
	if err := s.DeleteRange(45, 50); err != nil {
		t.Fatalf("DeleteRange: %v", err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 9); err != nil {
		t.Fatalf("SetUint64: %v", err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("node-2")); err != nil {
		t.Fatalf("Set: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	s = newStore(t, openDB(t, dir), 7)
	wantBounds(t, s, 11, 44)
	for i := uint64(11); i <= 44; i++ {
		wantLog(t, s, entry(i, fmt.Sprintf("log%d", i)))
	}
	wantMissing(t, s, 10)
	wantMissing(t, s, 45)
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 9 {
		t.Fatalf("GetUint64 after restart = %d, %v; want 9", v, err)
	}
	if v, err := s.Get([]byte("LastVoteCand")); err != nil || string(v) != "node-2" {
		t.Fatalf("Get after restart = %q, %v; want node-2", v, err)
	}
}

func TestGroupsAreIsolated(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	a, b := newStore(t, db, 1), newStore(t, db, 2)
	if a.Group() != 1 || b.Group() != 2 {
		t.Fatalf("Group() = %d, %d", a.Group(), b.Group())
	}

	mustStore(t, a, entries(1, 10))
	mustStore(t, b, []*raft.Log{entry(5, "b5"), entry(6, "b6")})
	wantBounds(t, a, 1, 10)
	wantBounds(t, b, 5, 6)
	wantLog(t, a, entry(5, "log5"))
	wantLog(t, b, entry(5, "b5"))
	wantMissing(t, b, 1)

	if err := a.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatalf("SetUint64: %v", err)
	}
	if _, err := b.GetUint64([]byte("CurrentTerm")); !errors.Is(err, ErrKeyNotFound) {
		t.Fatalf("group 2 sees group 1's stable key: %v", err)
	}
	if err := b.SetUint64([]byte("CurrentTerm"), 8); err != nil {
		t.Fatalf("SetUint64: %v", err)
	}

	// Deleting all of one group's log leaves the other alone.
	if err := a.DeleteRange(1, 10); err != nil {
		t.Fatalf("DeleteRange: %v", err)
	}
	wantBounds(t, a, 0, 0)
	wantLog(t, b, entry(6, "b6"))

	// So does a restart, and dropping a group.
	mustStore(t, a, entries(20, 21))
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	db = openDB(t, dir)
	a, b = newStore(t, db, 1), newStore(t, db, 2)
	wantBounds(t, a, 20, 21)
	wantBounds(t, b, 5, 6)
	if err := b.Drop(); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	wantBounds(t, b, 0, 0)
	wantMissing(t, b, 5)
	if _, err := b.GetUint64([]byte("CurrentTerm")); !errors.Is(err, ErrKeyNotFound) {
		t.Fatalf("stable key survived Drop: %v", err)
	}
	wantBounds(t, newStore(t, db, 2), 0, 0)
	wantBounds(t, a, 20, 21)
	if v, err := a.GetUint64([]byte("CurrentTerm")); err != nil || v != 3 {
		t.Fatalf("group 1 after dropping group 2: %d, %v; want 3", v, err)
	}
}

func TestDropRemovesAppliedIndex(t *testing.T) {
	db := openDB(t, "")
	s := newStore(t, db, 3)
	var b storage.Batch
	b.Set(storage.RaftAppliedKey(3), []byte{1})
	b.Set(storage.RaftAppliedKey(4), []byte{2})
	if err := db.CommitSync(&b); err != nil {
		t.Fatalf("CommitSync: %v", err)
	}
	if err := s.Drop(); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	if _, err := db.Get(storage.RaftAppliedKey(3)); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("applied index of the dropped group: %v", err)
	}
	if _, err := db.Get(storage.RaftAppliedKey(4)); err != nil {
		t.Fatalf("applied index of another group: %v", err)
	}
}

func TestDamagedEntry(t *testing.T) {
	db := openDB(t, "")
	s := newStore(t, db, 1)
	mustStore(t, s, entries(1, 3))
	good := AppendLog(nil, entry(2, "log2"))
	for name, val := range map[string][]byte{
		"empty":             {},
		"unknown version":   append([]byte{9}, good[1:]...),
		"truncated header":  good[:3],
		"extensions beyond": good[:len(good)-len("log2")-3],
	} {
		var b storage.Batch
		b.Set(storage.RaftLogKey(1, 2), val)
		if err := db.CommitSync(&b); err != nil {
			t.Fatalf("CommitSync: %v", err)
		}
		var got raft.Log
		if err := s.GetLog(2, &got); !errors.Is(err, storage.ErrCorrupt) {
			t.Errorf("%s: GetLog = %v; want storage.ErrCorrupt", name, err)
		}
	}
	// An entry stored under the wrong index is damage too.
	var b storage.Batch
	b.Set(storage.RaftLogKey(1, 2), AppendLog(nil, entry(3, "log3")))
	if err := db.CommitSync(&b); err != nil {
		t.Fatalf("CommitSync: %v", err)
	}
	var got raft.Log
	if err := s.GetLog(2, &got); !errors.Is(err, storage.ErrCorrupt) {
		t.Errorf("misplaced entry: GetLog = %v; want storage.ErrCorrupt", err)
	}
}

func TestClosedDB(t *testing.T) {
	db := openDB(t, "")
	s := newStore(t, db, 1)
	mustStore(t, s, entries(1, 3))
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	var l raft.Log
	if err := s.GetLog(2, &l); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("GetLog = %v; want storage.ErrClosed", err)
	}
	if err := s.StoreLog(entry(4, "x")); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("StoreLog = %v; want storage.ErrClosed", err)
	}
	if err := s.DeleteRange(1, 2); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("DeleteRange = %v; want storage.ErrClosed", err)
	}
	if err := s.Set([]byte("k"), []byte("v")); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("Set = %v; want storage.ErrClosed", err)
	}
	if _, err := s.Get([]byte("k")); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("Get = %v; want storage.ErrClosed", err)
	}
	if _, err := New(db, 1); !errors.Is(err, storage.ErrClosed) {
		t.Errorf("New = %v; want storage.ErrClosed", err)
	}
	if _, err := New(nil, 1); err == nil {
		t.Error("New(nil) succeeded")
	}
}

// TestConcurrentUse runs what raft does at once: the leader appends while the snapshot goroutine
// compacts the head and replication goroutines read. Run with -race.
func TestConcurrentUse(t *testing.T) {
	s := newStore(t, openDB(t, ""), 1)
	const total, batch = 2000, 20
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errc := make(chan error, 8)
	report := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}

	wg.Add(1)
	go func() { // appender
		defer wg.Done()
		defer close(stop)
		for i := uint64(1); i <= total; i += batch {
			if err := s.StoreLogs(entries(i, i+batch-1)); err != nil {
				report(err)
				return
			}
		}
	}()
	wg.Add(1)
	go func() { // compactor: keeps at most 100 entries
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			first, _ := s.FirstIndex()
			last, _ := s.LastIndex()
			if last > first+100 {
				if err := s.DeleteRange(first, last-100); err != nil {
					report(err)
					return
				}
			}
		}
	}()
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() { // readers: an index inside the bounds is found unless compacted meanwhile
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				last, _ := s.LastIndex()
				if last == 0 {
					continue
				}
				var l raft.Log
				err := s.GetLog(last, &l)
				switch {
				case errors.Is(err, raft.ErrLogNotFound):
				case err != nil:
					report(err)
					return
				case !sameLog(&l, entry(last, fmt.Sprintf("log%d", last))):
					report(fmt.Errorf("GetLog(%d) = %+v", last, l))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	last, _ := s.LastIndex()
	if last != total {
		t.Fatalf("LastIndex = %d, want %d", last, total)
	}
	first, _ := s.FirstIndex()
	for i := first; i <= last; i++ {
		wantLog(t, s, entry(i, fmt.Sprintf("log%d", i)))
	}
}

func TestEncodingIsCompact(t *testing.T) {
	l := &raft.Log{Index: 1000, Term: 5, Type: raft.LogCommand, Data: []byte("0123456789")}
	if n := len(AppendLog(nil, l)); n > 2+2+1+1+1+10 {
		t.Fatalf("encoded size %d bytes for 10 bytes of data", n)
	}
	var got raft.Log
	if err := DecodeLog(AppendLog(nil, l), &got); err != nil || !reflect.DeepEqual(&got, l) {
		t.Fatalf("round trip = %+v, %v", got, err)
	}
}

// TestBootstrapOneBatch checks that the bootstrap view keeps the stable writes until the first entry is
// stored, serves them meanwhile, and then has written both.
func TestBootstrapOneBatch(t *testing.T) {
	db := openDB(t, "")
	s := newStore(t, db, 7)
	b := s.Bootstrap(func(err error) { t.Errorf("bootstrap write: %v", err) })
	if err := b.SetUint64([]byte("CurrentTerm"), 1); err != nil {
		t.Fatal(err)
	}
	if v, err := b.GetUint64([]byte("CurrentTerm")); err != nil || v != 1 {
		t.Fatalf("pending GetUint64 = %d, %v; want 1", v, err)
	}
	if _, err := s.GetUint64([]byte("CurrentTerm")); !errors.Is(err, ErrKeyNotFound) {
		t.Fatalf("the term is on the store before the entry: %v", err)
	}
	if err := b.StoreLog(entry(1, "conf")); err != nil {
		t.Fatal(err)
	}
	if last, _ := s.LastIndex(); last != 1 {
		t.Fatalf("LastIndex = %d, want 1", last)
	}
	// Queued or written, the store serves both at once.
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 1 {
		t.Fatalf("after StoreLog: GetUint64 = %d, %v; want 1", v, err)
	}
	var got raft.Log
	if err := s.GetLog(1, &got); err != nil || string(got.Data) != "conf" {
		t.Fatalf("after StoreLog: GetLog(1) = %+v, %v", got, err)
	}
	if err := b.Flush(); err != nil { // waits for the queued batch
		t.Fatal(err)
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 1 {
		t.Fatalf("after StoreLog and Flush: GetUint64 = %d, %v; want 1", v, err)
	}
	// A reopened store sees both.
	s2 := newStore(t, db, 7)
	var l raft.Log
	if err := s2.GetLog(1, &l); err != nil || string(l.Data) != "conf" {
		t.Fatalf("GetLog(1) = %+v, %v", l, err)
	}
	// Flush writes what no entry took.
	b2 := s2.Bootstrap(nil)
	if err := b2.Set([]byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := b2.Flush(); err != nil {
		t.Fatal(err)
	}
	if v, err := s2.Get([]byte("k")); err != nil || string(v) != "v" {
		t.Fatalf("after Flush: Get = %q, %v", v, err)
	}
}
