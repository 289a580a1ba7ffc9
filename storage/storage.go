// Package storage is Warren's durable storage engine: one badger DB per node, a group committer that packs
// many writes from many connections into few fsynced transactions, background value-log GC, recovery
// checks at open, and the disk-space reserve that keeps badger from ever meeting a full disk (space.go).
// It stores bytes and knows nothing about AMQP.
package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// FormatVersion is the on-disk format this build reads and writes; it is recorded in Dir/FORMAT.
const FormatVersion = 1

// Sentinel errors. Test with errors.Is: the errors returned carry more detail.
var (
	// ErrLocked means another process (or another Open in this process) holds the data directory.
	ErrLocked = errors.New("storage: data directory is locked")
	// ErrFormat means the data directory was written by an incompatible storage format.
	ErrFormat = errors.New("storage: incompatible storage format")
	// ErrNotFound is returned by Get for a missing key.
	ErrNotFound = errors.New("storage: key not found")
	// ErrCorrupt is returned by Get when a stored value cannot be read back (for example its value-log
	// entry was cut off by a torn write).
	ErrCorrupt = errors.New("storage: stored value is damaged")
	// ErrClosed is returned (or passed to done callbacks) after Close.
	ErrClosed = errors.New("storage: closed")
	// ErrSyncFailed means the disk failed to make a write durable (an fsync of the value log returned
	// an error: an I/O error, or a thin-provisioned volume out of room). After a failed fsync the
	// kernel may already have dropped the unwritten pages, so no later write can be trusted either:
	// every write is refused until the process restarts.
	ErrSyncFailed = errors.New("storage: the disk failed to make a write durable; writes are refused until restart")
)

const (
	lockFileName   = "LOCK"
	formatFileName = "FORMAT"
	formatPrefix   = "warren-storage "

	// The value threshold, memtable and value-log sizes decide what badger pre-allocates and writes on
	// its own, and so the disk-space reserve: see space.go.
	defaultValueThreshold = 512
	// 8 MiB memtables: each memtable is an arena of the heap, and the level-0 table a flush builds
	// from it is held whole in a table builder whose buffers badger's allocator pool keeps for the
	// next build; 16 MiB ones cost a 1,000,000-message quorum backlog 40-60 MB of heap per node.
	defaultMemTableSize   = 8 << 20
	defaultNumMemtables   = 2
	defaultBlockCacheSize = 16 << 20
	defaultIndexCacheSize = 16 << 20
	// defaultValueLogFileSize is small because value-log GC reads a whole file through its mapping:
	// the file size bounds the resident set a rewrite can add before the trimmer drops it (64 MiB
	// files put a 1,000,000-message quorum backlog's drain over 300 MB per node). It is also badger's
	// largest value, so it must hold the largest message (16 MiB, RabbitMQ 4.x's max_message_size)
	// with its record header: 20 MiB (32 MiB files left peaks of 280 MB in that drain, 16 MiB ones
	// under 240 MB).
	defaultValueLogFileSize = 20 << 20
	defaultNumCompactors    = 2
	defaultGCInterval       = time.Minute
	defaultGCDiscardRatio   = 0.5
	defaultMaxPendingBytes  = 16 << 20
	defaultMaxPendingOps    = 64 << 10
	inMemoryValueThreshold  = 1 << 20 // badger's maximum; in-memory mode has no value log
)

// Options configure the engine. Zero values mean the defaults noted.
type Options struct {
	Dir      string       // data directory (created if missing); unused with InMemory
	Logger   *slog.Logger // nil = slog.Default()
	InMemory bool         // tests only: badger in-memory mode, no lock/format files; values are limited to 1 MiB
	// NoSync turns off fsync per commit (tests/benchmarks only). Default: SyncWrites on.
	NoSync bool
	// ValueThreshold: values of at least this many bytes go to the value log, smaller ones stay in the LSM
	// tree. Default 512, so message bodies live in the value log and the LSM tree stays small.
	ValueThreshold int64
	// GCInterval is how often value-log GC runs. Default 1 minute; negative disables it.
	GCInterval time.Duration

	// Unexported knobs for tests and tuning.
	maxPendingBytes  int64         // committer queue bound in payload bytes (default 16 MiB)
	maxPendingOps    int           // committer queue bound in operations (default 64k)
	memTableSize     int64         // default 8 MiB
	valueLogFileSize int64         // default 20 MiB
	trimBudget       int64         // file-backed RSS above which the trimmer pages out (default 48 MiB; <0 = off)
	statfs           statfsFunc    // free-space source (default statfs(2)); see space.go
	deleteRoom       int64         // reserve - floor (default 16 MiB)
	ballastSize      int64         // default 32 MiB; <0 = no ballast
	maintainEvery    time.Duration // maintenance tick (default 1 s; reclaim.go)
	failedCloseWait  time.Duration // how long Close waits for badger after a write failure (default 30 s)
}

// DB is the node's storage engine. All methods are safe for concurrent use.
type DB struct {
	bdb    *badger.DB
	opts   Options
	log    *slog.Logger
	dir    string
	lockFd *os.File

	// Size limits of one badger transaction, mirrored from badger so that batches are not split.
	txnMaxSize  int64
	txnMaxCount int64
	valueThresh int64

	// Committer queue; see commit.go.
	mu           sync.Mutex
	wake         chan struct{} // capacity 1: poked after every queued batch and on close
	spaceCond    *sync.Cond    // signalled when the queue drains or on close
	queue        []pending
	spare        []pending
	queuedBytes  int64
	queuedOps    int
	closed       bool
	inCallbacks  bool // the committer is running done callbacks: Commit does not block then
	committerEnd chan struct{}

	// The maintenance goroutine (reclaim.go): value-log GC and the disk-space work; closed by Close.
	gcStop chan struct{}
	gcEnd  chan struct{}

	// Disk-space accounting (space.go); nil in memory. reclaimWanted asks the committer to flush the
	// memtable, compact level 0 and run value-log GC (reclaim.go).
	space         *space
	reclaimWanted atomic.Bool

	// RSS trimmer; see trim.go. mapMu is held shared by everything that can make badger unmap or move a
	// value-log mapping outside a commit, and exclusively by the trim.
	mapMu         sync.RWMutex
	sinceTrim     int64     // committer goroutine only
	lastTrimCheck time.Time // committer goroutine only
	// readAtTrimCheck is readSinceTrim at the last check (committer goroutine only): unchanged and
	// nothing written means the DB was idle since.
	readAtTrimCheck int64
	readSinceTrim   atomic.Int64
	trimWanted      atomic.Bool
	// trimmed (capacity 1) is poked after every trim check that held mapMu: value-log GC waits for
	// one between its file rewrites, which would otherwise keep the trim's TryLock failing.
	trimmed chan struct{}

	// closeMu is held shared by reads (Get, Scan, DeleteRange) and exclusively by Close around closing
	// badger, so that no read touches badger's unmapped files; dbClosed is set under it.
	closeMu  sync.RWMutex
	dbClosed bool

	closeOnce sync.Once
	closeErr  error

	// syncFailure is set (once, never cleared) when badger reports that an fsync of the value log
	// failed; see noteSyncFailure.
	syncFailure atomic.Pointer[error]

	statBatches atomic.Uint64
	statTxns    atomic.Uint64
	statOps     atomic.Uint64
	statReads   atomic.Uint64
	statCommit  commitStats // histograms of the committer's rounds
}

// dirError is an error whose text is exactly msg and which matches kind with errors.Is.
type dirError struct {
	msg  string
	kind error
}

func (e *dirError) Error() string { return e.msg }
func (e *dirError) Unwrap() error { return e.kind }

// Open opens (creating if needed) the node's one badger DB under opts.Dir. See the package contract: it
// takes Dir/LOCK, checks or writes Dir/FORMAT, opens badger with small memory settings, reports a damaged
// log tail that badger repaired, and starts the group committer and the value-log GC goroutine.
func Open(opts Options) (*DB, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "storage")
	if opts.ValueThreshold <= 0 {
		opts.ValueThreshold = defaultValueThreshold
	}
	if opts.GCInterval == 0 {
		opts.GCInterval = defaultGCInterval
	}
	if opts.maxPendingBytes <= 0 {
		opts.maxPendingBytes = defaultMaxPendingBytes
	}
	if opts.maxPendingOps <= 0 {
		opts.maxPendingOps = defaultMaxPendingOps
	}
	if opts.memTableSize <= 0 {
		opts.memTableSize = defaultMemTableSize
	}
	if opts.valueLogFileSize <= 0 {
		opts.valueLogFileSize = defaultValueLogFileSize
	}
	if opts.trimBudget == 0 {
		opts.trimBudget = defaultTrimBudget
	}
	if opts.maintainEvery <= 0 {
		opts.maintainEvery = defaultMaintainEvery
	}

	d := &DB{opts: opts, log: log, statCommit: newCommitStats()}
	var logs []logInspection
	if !opts.InMemory {
		if opts.Dir == "" {
			return nil, errors.New("storage: open: no data directory given")
		}
		dir, err := filepath.Abs(opts.Dir)
		if err != nil {
			return nil, fmt.Errorf("storage: open %s: %w", opts.Dir, err)
		}
		d.dir = dir
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("storage: create data directory %s: %w", dir, err)
		}
		if d.lockFd, err = lockDir(dir); err != nil {
			return nil, err
		}
		if err := checkFormat(dir); err != nil {
			d.unlock()
			return nil, err
		}
		if err := removeEmptyLogs(dir, log); err != nil {
			d.unlock()
			return nil, err
		}
		logs = inspectLogs(dir, log)
		if sz := walMemTableSize(dir); sz > d.opts.memTableSize {
			log.Info("storage: opening with the memtable size the write-ahead logs were written with",
				"memtable_mib", sz>>20, "default_mib", d.opts.memTableSize>>20)
			d.opts.memTableSize = sz
		}
		// Before badger: on a full disk its Open would fault on a mapped page (space.go).
		d.space = newSpace(dir, log, opts)
		if ok, err := d.space.open(); err != nil {
			d.unlock()
			return nil, err
		} else if !ok {
			d.space = nil
		}
	}

	bopts := d.badgerOptions()
	bdb, err := badger.Open(bopts)
	if err != nil {
		d.unlock()
		return nil, fmt.Errorf("storage: open badger in %s: %w", d.dir, err)
	}
	d.bdb = bdb
	reportRepairs(logs, log)

	// Mirror badger's per-transaction limits (db.go: maxBatchSize = 15% of the memtable, maxBatchCount =
	// maxBatchSize / skl.MaxNodeSize), keeping a margin so a merged batch is rarely split.
	d.txnMaxSize = bopts.MemTableSize * 15 / 100 * 9 / 10
	d.txnMaxCount = d.txnMaxSize / int64(maxNodeSize)
	d.valueThresh = bopts.ValueThreshold

	d.wake = make(chan struct{}, 1)
	d.trimmed = make(chan struct{}, 1)
	d.spaceCond = sync.NewCond(&d.mu)
	d.committerEnd = make(chan struct{})
	go d.committer()

	d.gcStop = make(chan struct{})
	d.gcEnd = make(chan struct{})
	switch {
	case opts.InMemory || d.space == nil && opts.GCInterval < 0:
		close(d.gcEnd)
	default:
		if d.space != nil {
			d.space.measure(0)
			d.space.maybeCreateBallast()
		}
		go d.maintain(opts.GCInterval)
	}
	log.Debug("storage opened", "dir", d.dir, "in_memory", opts.InMemory, "sync", !opts.NoSync,
		"value_threshold", bopts.ValueThreshold)
	return d, nil
}

func (d *DB) badgerOptions() badger.Options {
	o := d.opts
	bo := badger.DefaultOptions(d.dir).
		WithLogger(badgerLogger{l: d.log.With("component", "badger"), syncFailed: d.noteSyncFailure}).
		WithSyncWrites(!o.NoSync).
		WithMemTableSize(o.memTableSize).
		WithNumMemtables(defaultNumMemtables).
		WithNumLevelZeroTables(4).
		WithNumLevelZeroTablesStall(10).
		WithBlockCacheSize(defaultBlockCacheSize).
		WithIndexCacheSize(defaultIndexCacheSize).
		WithValueThreshold(o.ValueThreshold).
		// No block compression: the tables hold keys, value pointers and small records, and a
		// compressing table builder keeps a second copy of every block in its buffers (heap).
		WithCompression(options.None).
		WithNumVersionsToKeep(1).
		WithValueLogFileSize(o.valueLogFileSize).
		WithNumCompactors(defaultNumCompactors).
		WithDetectConflicts(false).
		WithMetricsEnabled(false).
		WithNumGoroutines(4).
		WithVerifyValueChecksum(true).
		// We hold Dir/LOCK ourselves (with our pid and our error text); badger's own guard would take the
		// same file name.
		WithBypassLockGuard(true)
	if o.InMemory {
		bo = bo.WithDir("").WithValueDir("").WithInMemory(true).WithValueThreshold(inMemoryValueThreshold)
	}
	return bo
}

// Close stops the committer (after finishing queued batches) and the GC goroutine, closes badger and
// releases the lock. Later calls return the first call's result.
func (d *DB) Close() error {
	d.closeOnce.Do(func() {
		d.mu.Lock()
		d.closed = true
		d.spaceCond.Broadcast()
		d.mu.Unlock()
		select {
		case d.wake <- struct{}{}:
		default:
		}
		<-d.committerEnd
		close(d.gcStop)
		<-d.gcEnd
		d.closeMu.Lock()
		d.dbClosed = true
		if err := d.closeBadger(); err != nil {
			d.closeErr = fmt.Errorf("storage: close badger in %s: %w", d.dir, err)
		}
		d.closeMu.Unlock()
		d.unlock()
	})
	return d.closeErr
}

// closeBadger closes badger. Its Close flushes the memtable to a table file and retries a failed
// flush every second, forever; after a write failure (ErrSyncFailed) the disk may never take it, so
// then Close waits at most failedCloseWait and returns the failure, leaving badger's goroutines to the
// process's exit: a broker told to stop on a failed disk stops.
func (d *DB) closeBadger() error {
	failure := d.syncFailed()
	if failure == nil {
		return d.bdb.Close()
	}
	wait := d.opts.failedCloseWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	done := make(chan error, 1)
	go func() { done <- d.bdb.Close() }()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		d.log.Error("storage: gave up closing the store: the disk failed writes and still refuses the memtable flush; "+
			"what was not confirmed before the failure may be lost", "waited", wait, "dir", d.dir)
		return fmt.Errorf("%w; the memtable flush still failed after %v", failure, wait)
	}
}

// readLock takes closeMu shared for a read; it fails with ErrClosed once Close was called.
func (d *DB) readLock() error {
	d.closeMu.RLock()
	if d.dbClosed || d.isClosing() {
		d.closeMu.RUnlock()
		return ErrClosed
	}
	return nil
}

func (d *DB) isClosing() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// lockDir takes an exclusive non-blocking flock on dir/LOCK and writes our pid into it.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("storage: open lock file %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		buf := make([]byte, 32)
		n, _ := f.ReadAt(buf, 0)
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			pid := strings.TrimSpace(string(buf[:n]))
			if _, perr := strconv.Atoi(pid); perr != nil {
				pid = "unknown"
			}
			return nil, &dirError{
				msg:  fmt.Sprintf("data directory %s is in use by another Warren process (pid %s)", dir, pid),
				kind: ErrLocked,
			}
		}
		return nil, fmt.Errorf("storage: lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("storage: write lock file %s: %w", path, err)
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("storage: write lock file %s: %w", path, err)
	}
	return f, nil
}

// unlock releases the directory lock (closing the descriptor drops the flock).
func (d *DB) unlock() {
	if d.lockFd != nil {
		_ = d.lockFd.Close()
		d.lockFd = nil
	}
}

// badgerFile reports whether name is a file badger creates in its directory.
func badgerFile(name string) bool {
	switch name {
	case "MANIFEST", "KEYREGISTRY", "DISCARD":
		return true
	}
	for _, ext := range []string{".vlog", ".sst", ".mem"} {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	return false
}

// checkFormat verifies dir/FORMAT, or writes it for a new directory.
func checkFormat(dir string) error {
	path := filepath.Join(dir, formatFileName)
	incompatible := func(found string) error {
		return &dirError{
			msg: fmt.Sprintf("data directory %s was written by an incompatible storage format (found %s, "+
				"this Warren uses %d)", dir, found, FormatVersion),
			kind: ErrFormat,
		}
	}
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		s := strings.TrimSpace(string(data))
		if v, ok := strings.CutPrefix(s, formatPrefix); ok {
			if n, err := strconv.Atoi(v); err == nil {
				if n == FormatVersion {
					return nil
				}
				return incompatible(fmt.Sprintf("format version %d", n))
			}
		}
		if len(s) > 64 {
			s = s[:64] + "..."
		}
		return incompatible(fmt.Sprintf("FORMAT file containing %q", s))
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("storage: read %s: %w", path, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("storage: read data directory %s: %w", dir, err)
	}
	for _, e := range entries {
		if badgerFile(e.Name()) {
			return incompatible("badger files without a FORMAT file")
		}
	}
	return writeFileSync(dir, formatFileName, []byte(fmt.Sprintf("%s%d\n", formatPrefix, FormatVersion)))
}

// writeFileSync writes dir/name atomically and durably (temp file, fsync, rename, fsync dir).
func writeFileSync(dir, name string, data []byte) error {
	path := filepath.Join(dir, name)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("storage: write %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("storage: write %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// badgerLogger sends badger's log lines to slog: Infof at Debug, Warningf at Warn, Errorf at Error.
// It also catches the one failure badger only logs: with SyncWrites, an fsync error of the value log
// (value.go, "Error while curlf sync: ...") is logged and the write still reported as successful,
// which would confirm messages whose bodies never reached the disk.
type badgerLogger struct {
	l          *slog.Logger
	syncFailed func(msg string)
}

// vlogSyncErrorPrefix starts the message badger (v4.9.6, valueLog.write) logs when the value log's
// fsync after a write fails. TestValueLogSyncFailureRefusesWrites fails if it changes.
const vlogSyncErrorPrefix = "Error while curlf sync"

func (b badgerLogger) logf(level slog.Level, format string, args []any) {
	if !b.l.Enabled(context.Background(), level) {
		return
	}
	b.l.Log(context.Background(), level, strings.TrimSpace(fmt.Sprintf(format, args...)))
}

func (b badgerLogger) Errorf(f string, a ...any) {
	if b.syncFailed != nil && strings.HasPrefix(f, vlogSyncErrorPrefix) {
		b.syncFailed(strings.TrimSpace(fmt.Sprintf(f, a...)))
	}
	b.logf(slog.LevelError, f, a)
}

// noteSyncFailure records a failed write or fsync of badger's logs: a failed fsync of the value log
// (reported by its log line, on badger's write goroutine before the write's transaction returns, so
// the commit that wrote it sees the failure) or an I/O error a commit returned (commit.go).
func (d *DB) noteSyncFailure(msg string) {
	err := fmt.Errorf("%w (%s)", ErrSyncFailed, msg)
	if d.syncFailure.CompareAndSwap(nil, &err) {
		d.log.Error("storage: the disk failed to make a write durable; every write is refused until "+
			"restart (check the disk or volume of the data directory)", "dir", d.dir, "err", msg)
	}
}

// WriteFailure returns the error that made the DB refuse every write (an ErrSyncFailed), or nil.
// The server polls it for the disk alarm, so publishers are blocked rather than refused one by one.
func (d *DB) WriteFailure() error {
	if d == nil {
		return nil
	}
	return d.syncFailed()
}

// syncFailed returns the recorded fsync failure (an ErrSyncFailed), or nil.
func (d *DB) syncFailed() error {
	if p := d.syncFailure.Load(); p != nil {
		return *p
	}
	return nil
}

func (b badgerLogger) Warningf(f string, a ...any) { b.logf(slog.LevelWarn, f, a) }
func (b badgerLogger) Infof(f string, a ...any)    { b.logf(slog.LevelDebug, f, a) }
func (b badgerLogger) Debugf(f string, a ...any)   { b.logf(slog.LevelDebug-4, f, a) }
