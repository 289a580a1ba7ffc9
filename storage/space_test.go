package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// virtualFS makes a data directory look like it is alone on a file system of size bytes: the free
// space is size minus the disk blocks the directory's files hold (the ballast and badger's sparse files
// by what they really hold). Lowering size is another process filling the disk.
type virtualFS struct {
	size atomic.Int64
}

func newVirtualFS(size int64) *virtualFS {
	v := &virtualFS{}
	v.size.Store(size)
	return v
}

func (v *virtualFS) statfs(dir string) (avail, total int64, err error) {
	size := v.size.Load()
	return max(size-duBlocks(dir), 0), size, nil
}

// duBlocks returns the bytes of disk blocks held by the files under dir.
func duBlocks(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			if info, err := e.Info(); err == nil {
				n += allocated(info)
			}
		}
		return nil
	})
	return n
}

// fillDisk makes the virtual disk under dir full: nothing free. The blocks a closed DB's files hold
// settle first (ext4 gives back delayed-allocation reservations and preallocations when it writes
// them back, which can be after Close): a later Open would otherwise find free space again.
func (v *virtualFS) fillDisk(t *testing.T, dir string) {
	t.Helper()
	syscall.Sync()
	last, stable := duBlocks(dir), 0
	for deadline := time.Now().Add(10 * time.Second); stable < 3 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if n := duBlocks(dir); n == last {
			stable++
		} else {
			last, stable = n, 0
		}
	}
	free, _, _ := v.statfs(dir)
	v.size.Add(-free)
}

// fillUntilRefused commits batches of n values of size bytes (keys from next on) until one is refused
// and returns the next key and the refusal. It fails the test if the virtual free space ever drops
// below the floor.
func fillUntilRefused(t *testing.T, d *DB, v *virtualFS, next uint64, n, size int) (uint64, error) {
	t.Helper()
	for range 10000 {
		var b Batch
		for i := range n {
			b.Set(MessageKey(1, next+uint64(i)), value(i, size))
		}
		err := d.CommitSync(&b)
		free, _, _ := v.statfs(d.dir)
		if sp := d.Space(); free < sp.Floor {
			t.Fatalf("free space %d went below the floor %d", free, sp.Floor)
		}
		if err != nil {
			return next, err
		}
		next += uint64(n)
	}
	t.Fatal("never refused")
	return 0, nil
}

const (
	testDeleteRoom = 4 << 20
	testBallast    = 8 << 20
)

func spaceOpts(dir string, v *virtualFS) Options {
	return Options{Dir: dir, NoSync: true, GCInterval: -1, statfs: v.statfs, deleteRoom: testDeleteRoom,
		ballastSize: testBallast, maintainEvery: 20 * time.Millisecond, valueLogFileSize: 4 << 20}
}

// TestChargeOfTable checks the charge of a batch against badger's encoding.
func TestChargeOfTable(t *testing.T) {
	k := make([]byte, 17)
	for _, tc := range []struct {
		name string
		ops  []op
		want int64
		dels int
	}{
		{"empty", nil, batchOverhead * 21 / 10, 0},
		{"delete", []op{{key: k, del: true}}, (batchOverhead + 17 + entryOverhead) * 21 / 10, 1},
		{"small value stays in the WAL", []op{{key: k, value: make([]byte, 100)}},
			(batchOverhead + 17 + entryOverhead + 100) * 21 / 10, 0},
		{"large value goes to the value log", []op{{key: k, value: make([]byte, 16384)}},
			17 + entryOverhead + 16384 + (batchOverhead+17+entryOverhead+valuePointerSize)*21/10, 0},
		{"mixed", []op{{key: k, value: make([]byte, 512)}, {key: k, del: true}},
			17 + entryOverhead + 512 + (batchOverhead+2*(17+entryOverhead)+valuePointerSize)*21/10, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, dels := chargeOf(tc.ops, 512)
			if want := tc.want + tc.want/fsOverheadDiv; got != want || dels != tc.dels {
				t.Errorf("chargeOf = %d, %d deletes; want %d, %d", got, dels, tc.want+tc.want/fsOverheadDiv, tc.dels)
			}
		})
	}
}

// TestChargeCoversWhatBadgerWrites writes batches of several shapes (values in the value log and in the
// WAL, deletes, long keys, enough to flush memtables into tables and compact them) and checks that,
// once badger's background work has settled, the disk blocks the directory gained do not exceed what
// was charged.
func TestChargeCoversWhatBadgerWrites(t *testing.T) {
	dir := t.TempDir()
	d := openT(t, Options{Dir: dir, NoSync: true, GCInterval: -1, ballastSize: -1, memTableSize: 4 << 20})
	before := duBlocks(dir)
	var charged int64
	commit := func(b *Batch) {
		c, _ := chargeOf(b.ops, d.valueThresh)
		charged += c
		if err := d.CommitSync(b); err != nil {
			t.Fatal(err)
		}
	}
	for _, shape := range []struct {
		name       string
		batches, n int
		size       int // 0: delete the keys of the 100-byte shape
		key        func(i int) []byte
	}{
		{"16 KiB values", 40, 50, 16 << 10, func(i int) []byte { return MessageKey(1, uint64(i)) }},
		{"100-byte values past several memtables", 100, 1000, 100, func(i int) []byte { return MessageKey(2, uint64(i)) }},
		{"deletes", 100, 1000, 0, func(i int) []byte { return MessageKey(2, uint64(i)) }},
		{"long keys", 20, 500, 600, func(i int) []byte { return []byte(fmt.Sprintf("%0200d", i)) }},
	} {
		for bi := range shape.batches {
			var b Batch
			for i := range shape.n {
				if key := shape.key(bi*shape.n + i); shape.size == 0 {
					b.Delete(key)
				} else {
					b.Set(key, value(i, shape.size))
				}
			}
			commit(&b)
		}
		grew := duBlocks(dir) - before
		t.Logf("after %s: charged %d KiB in all, the directory grew by %d KiB", shape.name, charged>>10, grew>>10)
		if grew > charged+64<<10 {
			t.Errorf("after %s the directory grew by %d bytes, more than the %d charged", shape.name, grew, charged)
		}
	}
	// Flushes and compactions run in the background: wait until the directory stops changing.
	deadline := time.Now().Add(20 * time.Second)
	last := duBlocks(dir)
	for stable := 0; stable < 5; {
		time.Sleep(100 * time.Millisecond)
		now := duBlocks(dir)
		if now == last {
			stable++
		} else {
			stable, last = 0, now
		}
		if time.Now().After(deadline) {
			break
		}
	}
	grew := last - before
	t.Logf("settled: charged %d KiB, the directory grew by %d KiB", charged>>10, grew>>10)
	// One page per file may be allocated ahead of the bytes charged; the floor's fixed part covers it.
	if grew > charged+64<<10 {
		t.Errorf("the directory grew by %d bytes, more than the %d charged", grew, charged)
	}
}

// TestSpaceRefusesDataAtTheReserve fills a virtual file system until a data write is refused, then
// checks that the refusal is ErrNoSpace, that deletes and UseReserve batches still work, that the
// ballast was kept, and that a data write stays refused.
func TestSpaceRefusesDataAtTheReserve(t *testing.T) {
	v := newVirtualFS(64 << 20)
	logger, logs := testLogger(t)
	opts := spaceOpts(t.TempDir(), v)
	opts.Logger = logger
	d := openT(t, opts)
	if sp := d.Space(); !sp.Ballast {
		t.Fatalf("no ballast after Open: %+v", sp)
	}
	next, err := fillUntilRefused(t, d, v, 0, 16, 16<<10)
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("refusal: %v, want ErrNoSpace", err)
	}
	sp := d.Space()
	free, _, _ := v.statfs(d.dir)
	t.Logf("refused after %d values of 16 KiB: %v; free %d KiB, %+v", next, err, free>>10, sp)
	if !d.SpaceLow() || !sp.Low || !sp.Ballast {
		t.Fatalf("after the refusal: SpaceLow %v, %+v", d.SpaceLow(), sp)
	}
	if free < sp.Reserve-16*(16<<10+1024) {
		t.Errorf("free %d is more than one batch below the reserve %d", free, sp.Reserve)
	}
	if !strings.Contains(logs.String(), "storage: free disk space is down to the reserve") {
		t.Errorf("no log line about the reserve:\n%s", logs.String())
	}

	var data Batch // the batch that was refused
	for i := range 16 {
		data.Set(MessageKey(2, uint64(i)), value(i, 16<<10))
	}
	if err := d.CommitSync(&data); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("data batch at the reserve: %v, want ErrNoSpace", err)
	}
	if _, err := d.Get(MessageKey(2, 0)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the refused write is readable: %v", err)
	}
	mustGet(t, d, MessageKey(1, next-1), value(int((next-1)%16), 16<<10))
	var small Batch
	small.Set([]byte("meta"), value(1, 100))
	small.UseReserve()
	if err := d.CommitSync(&small); err != nil {
		t.Fatalf("UseReserve batch at the reserve: %v", err)
	}
	var del Batch
	for i := range next / 2 {
		del.Delete(MessageKey(1, i))
	}
	if err := d.CommitSync(&del); err != nil {
		t.Fatalf("delete-only batch at the reserve: %v", err)
	}
	if !d.Space().Ballast {
		t.Errorf("the ballast was given up without need")
	}
}

// TestSpaceBallastForDeletes takes the last free bytes away (another process fills the disk) and
// checks that a delete then gives up the ballast and succeeds, that data stays refused, and that the
// ballast comes back (allocated, not sparse) once space is freed.
func TestSpaceBallastForDeletes(t *testing.T) {
	v := newVirtualFS(64 << 20)
	logger, logs := testLogger(t)
	opts := spaceOpts(t.TempDir(), v)
	opts.Logger = logger
	d := openT(t, opts)
	next, err := fillUntilRefused(t, d, v, 0, 16, 16<<10)
	if !errors.Is(err, ErrNoSpace) {
		t.Fatal(err)
	}
	free, _, _ := v.statfs(d.dir)
	v.size.Add(-free) // nothing left
	waitSpace(t, d, "the store sees the full disk", func(sp Space) bool { return sp.Free == 0 })
	var del Batch // a few acks: too few for a reclaim to free a value-log file
	for i := range min(next, 16) {
		del.Delete(MessageKey(1, i))
	}
	if err := d.CommitSync(&del); err != nil {
		t.Fatalf("delete on a full disk with a ballast: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.dir, ballastName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ballast still there after a delete needed its room: %v", err)
	}
	if !strings.Contains(logs.String(), "storage: gave up the ballast file") {
		t.Errorf("no log line about the ballast:\n%s", logs.String())
	}
	var data Batch
	data.Set(MessageKey(2, 0), value(1, 1024))
	if err := d.CommitSync(&data); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("data write after the ballast was given up: %v, want ErrNoSpace", err)
	}

	// Space comes back: the ballast is made again, then data writes are accepted.
	v.size.Add(free + 3*testBallast)
	waitSpace(t, d, "the ballast is back", func(sp Space) bool { return sp.Ballast && !sp.Low })
	info, err := os.Stat(filepath.Join(d.dir, ballastName))
	if err != nil {
		t.Fatal(err)
	}
	if got := allocated(info); got < testBallast {
		t.Errorf("ballast holds %d bytes of disk, want %d (not sparse)", got, testBallast)
	}
	if err := d.CommitSync(&data); err != nil {
		t.Fatalf("data write after space came back: %v", err)
	}
}

// waitSpace polls d.Space until cond holds, for at most 10 s.
func waitSpace(t *testing.T, d *DB, what string, cond func(Space) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond(d.Space()) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s: %+v", what, d.Space())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSpaceOpenOnFullDisk reopens a store whose file system has no byte left: Open gives up the
// ballast and succeeds with SpaceLow set and deletes working; without a ballast it refuses with
// ErrNoSpace and says how much it needs.
func TestSpaceOpenOnFullDisk(t *testing.T) {
	v := newVirtualFS(64 << 20)
	dir := t.TempDir()
	d, err := Open(spaceOpts(dir, v))
	if err != nil {
		t.Fatal(err)
	}
	next, err := fillUntilRefused(t, d, v, 0, 16, 16<<10)
	if !errors.Is(err, ErrNoSpace) {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	v.fillDisk(t, dir)

	logger, logs := testLogger(t)
	opts := spaceOpts(dir, v)
	opts.Logger = logger
	d2, err := Open(opts)
	if err != nil {
		t.Fatalf("Open on a full disk with a ballast: %v", err)
	}
	if !d2.SpaceLow() || d2.Space().Ballast {
		t.Errorf("after Open on a full disk: SpaceLow %v, %+v", d2.SpaceLow(), d2.Space())
	}
	if !strings.Contains(logs.String(), "the disk is nearly full at start") {
		t.Errorf("no log line about the ballast at start:\n%s", logs.String())
	}
	mustGet(t, d2, MessageKey(1, next-1), value(int((next-1)%16), 16<<10))
	if n, err := d2.DeleteRange(MessagePrefix(1)); err != nil || n != int(next) {
		t.Fatalf("DeleteRange on the full disk: %d, %v; want %d", n, err, next)
	}
	if err := d2.Close(); err != nil {
		t.Fatal(err)
	}

	// No ballast left and nothing free: Open refuses instead of letting badger crash.
	v.fillDisk(t, dir)
	_, err = Open(spaceOpts(dir, v))
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "Warren needs at least") {
		t.Fatalf("Open on a full disk without a ballast: %v, want ErrNoSpace naming what it needs", err)
	}
	t.Logf("refused: %v", err)
}

// TestSpaceReclaimAfterDrain fills to the reserve, deletes everything and checks that the space comes
// back by itself (memtable flush, level-0 compaction, value-log GC) with no further writes.
func TestSpaceReclaimAfterDrain(t *testing.T) {
	v := newVirtualFS(96 << 20)
	logger, logs := testLogger(t)
	opts := spaceOpts(t.TempDir(), v)
	opts.Logger = logger
	d := openT(t, opts)
	next, err := fillUntilRefused(t, d, v, 0, 16, 16<<10)
	if !errors.Is(err, ErrNoSpace) {
		t.Fatal(err)
	}
	before, _, _ := v.statfs(d.dir)
	for lo := uint64(0); lo < next; lo += 1000 { // as acks come: many small delete batches
		var b Batch
		for i := lo; i < min(lo+1000, next); i++ {
			b.Delete(MessageKey(1, i))
		}
		if err := d.CommitSync(&b); err != nil {
			t.Fatal(err)
		}
	}
	waitSpace(t, d, "space reclaimed after deleting everything", func(sp Space) bool { return !sp.Low })
	after, _, _ := v.statfs(d.dir)
	t.Logf("deleted %d values of 16 KiB: free %d KiB -> %d KiB", next, before>>10, after>>10)
	if !strings.Contains(logs.String(), "storage: flushed the memtable and compacted level 0") {
		t.Errorf("no reclaim in the log:\n%s", logs.String())
	}
}

// TestDiskFullTmpfs fills a real tmpfs (where a touch of a sparse page beyond the last free block is a
// SIGBUS) through the committer and DeleteRange, and reopens the store on it once it is completely
// full. It needs root to mount the tmpfs.
func TestDiskFullTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root (CI runs as root)")
	}
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=96m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	dir := filepath.Join(mnt, "data")
	d, err := Open(Options{Dir: dir, GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	var next uint64
	for {
		var b Batch
		for i := range 16 {
			b.Set(MessageKey(1, next+uint64(i)), value(i, 16<<10))
		}
		err := d.CommitSync(&b)
		if free, _, _ := statfs(dir); free < spaceFixed/2 {
			t.Fatalf("free space on the tmpfs fell to %d", free)
		}
		if err != nil {
			if !errors.Is(err, ErrNoSpace) {
				t.Fatal(err)
			}
			break
		}
		next += 16
	}
	free, _, _ := statfs(dir)
	t.Logf("refused after %d values of 16 KiB with %d KiB free: %+v", next, free>>10, d.Space())
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// Another process takes the rest.
	f, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	d, err = Open(Options{Dir: dir, GCInterval: -1})
	if err != nil {
		t.Fatalf("Open on the full tmpfs: %v", err)
	}
	defer d.Close()
	mustGet(t, d, MessageKey(1, next-1), value(int((next-1)%16), 16<<10))
	if n, err := d.DeleteRange(MessagePrefix(1)); err != nil || n != int(next) {
		t.Fatalf("DeleteRange on the full tmpfs: %d, %v; want %d", n, err, next)
	}
}
