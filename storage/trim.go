package storage

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Badger maps its value-log and table files into memory and reads and writes them through the mappings.
// Every page touched stays in the process's resident set (RssFile) until the kernel needs the memory, so
// a broker that wrote or read a 1 GB backlog would show more than 1 GB of RSS although its heap is small.
// The trimmer keeps that bounded: when RssFile is above the budget it drops the page-table entries of our
// *.vlog mappings with madvise(MADV_DONTNEED). For a shared file mapping that only unmaps the pages
// (dirty ones are marked dirty in the page cache and written back as usual); the data stays in the page
// cache, so the next access is a cheap minor fault. Table (*.sst) mappings get MADV_PAGEOUT instead.
//
// MADV_DONTNEED on memory that is no longer our file mapping would destroy data, so it must never race
// with badger unmapping or moving a value-log mapping. Badger v4.9.6 does that only (a) while writing
// (the value log grows or rotates with mremap), which happens only inside our commits, DeleteRange's
// write batch and value-log GC; (b) when value-log GC deletes a file, or an iterator closing finishes a
// deferred delete; (c) in Open and Close. So the trim runs on the committer goroutine between rounds
// (no commit in flight) while holding mapMu exclusively, and GC, Scan and DeleteRange hold mapMu shared;
// Open and Close do not overlap the committer. MADV_PAGEOUT is only a hint that never changes memory
// contents, so the *.sst mappings, which compactions unmap at any time, are safe with it.

const (
	madvRandom        = 1  // MADV_RANDOM
	madvDontneed      = 4  // MADV_DONTNEED
	madvPageout       = 21 // MADV_PAGEOUT, Linux 5.4+
	defaultTrimBudget = 48 << 20
	trimCheckEvery    = 50 * time.Millisecond
	// trimIdleCheckEvery is the check period while nothing is committed or read: only badger's own
	// background work (compactions) can then grow the mapped pages, and reading /proc every 50 ms was
	// a visible share of an idle node's CPU.
	trimIdleCheckEvery = time.Second
	trimAfterWriteSize = 32 << 20 // committed bytes that trigger a check before trimCheckEvery passed
	// Values read that trigger a check: a read faults in a whole readahead window, so mapped pages grow
	// much faster than the bytes read when several queues are read at different places of the log.
	trimAfterReadSize = 2 << 20
)

// noteRead counts value bytes read by Get and wakes the committer to check the resident set when enough
// were read since the last check.
func (d *DB) noteRead(n int) {
	if d.readSinceTrim.Add(int64(n)) < trimAfterReadSize {
		return
	}
	d.readSinceTrim.Store(0)
	d.trimWanted.Store(true)
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// maybeTrim runs on the committer goroutine between rounds and on idle ticks: at most every
// trimCheckEvery, or sooner after trimAfterWriteSize bytes were committed, it checks RssFile and trims.
func (d *DB) maybeTrim(written int64) {
	if d.opts.trimBudget < 0 || d.dir == "" {
		return
	}
	d.sinceTrim += written
	now := time.Now()
	every := trimCheckEvery
	if read := d.readSinceTrim.Load(); d.sinceTrim == 0 && read == d.readAtTrimCheck {
		every = trimIdleCheckEvery
	}
	if d.sinceTrim < trimAfterWriteSize && now.Sub(d.lastTrimCheck) < every &&
		!d.trimWanted.Swap(false) {
		return
	}
	d.sinceTrim, d.lastTrimCheck = 0, now
	d.readAtTrimCheck = d.readSinceTrim.Load()
	if !d.mapMu.TryLock() {
		return // GC, a scan or a range delete is running; try again later
	}
	defer d.mapMu.Unlock()
	d.trimFileRSS(d.opts.trimBudget)
	select {
	case d.trimmed <- struct{}{}:
	default:
	}
}

// trimFileRSS drops our file mappings from the resident set when RssFile exceeds budget. It returns how
// many mappings it advised (0 when under budget or when /proc is unavailable). The caller must hold mapMu
// exclusively and no commit may be in flight (see above).
func (d *DB) trimFileRSS(budget int64) (n int) {
	rssFile, ok := readRssFile()
	if !ok || rssFile <= budget {
		return 0
	}
	if d.log.Enabled(context.Background(), slog.LevelDebug-4) {
		start := time.Now()
		defer func() {
			after, _ := readRssFile()
			d.log.Log(context.Background(), slog.LevelDebug-4, "trimmed file-backed RSS", "mappings", n,
				"before_mib", rssFile>>20, "after_mib", after>>20, "took", time.Since(start))
		}()
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0
	}
	defer f.Close()
	prefix := d.dir + string(os.PathSeparator)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		// start-end perms offset dev inode path
		fields := strings.Fields(line)
		if len(fields) != 6 {
			continue // anonymous, or "(deleted)"
		}
		path := fields[5]
		if !strings.HasPrefix(path, prefix) ||
			(!strings.HasSuffix(path, ".vlog") && !strings.HasSuffix(path, ".sst")) {
			continue
		}
		startS, endS, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(startS, 16, 64)
		end, err2 := strconv.ParseUint(endS, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		if strings.HasSuffix(path, ".sst") {
			// May fail with EINVAL on kernels before 5.4: nothing to do then.
			_, _, _ = syscall.Syscall(syscall.SYS_MADVISE, uintptr(start), uintptr(end-start), madvPageout)
			n++
			continue
		}
		// MADV_RANDOM first: without it a read fault maps a whole readahead window (up to read_ahead_kb,
		// often several MB), so reading a few queues at different places of the log fills the resident
		// set hundreds of times faster than it reads. Then drop the mapped pages.
		_, _, _ = syscall.Syscall(syscall.SYS_MADVISE, uintptr(start), uintptr(end-start), madvRandom)
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(start), uintptr(end-start), madvDontneed); errno == 0 {
			n++
		}
	}
	return n
}

// readRssFile returns RssFile of this process in bytes.
func readRssFile() (int64, bool) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	i := bytes.Index(data, []byte("RssFile:"))
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(data[i+len("RssFile:"):]))
	if len(fields) == 0 {
		return 0, false
	}
	kb, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil {
		return 0, false
	}
	return kb << 10, true
}
