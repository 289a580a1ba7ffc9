package storage

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Disk space: badger must never meet a full disk.
//
// Badger writes its value log (*.vlog), its memtable write-ahead logs (*.mem), its tables (*.sst) and
// its DISCARD file through shared memory mappings of files it made with ftruncate, which are sparse:
// a page gets its disk block only when it is first touched. When the file system has no block left,
// that touch is a SIGBUS, not an error (on tmpfs even a read of a hole allocates, which is why a full
// disk also crashes badger's Open: it reads the WAL up to its first hole). Go cannot turn a SIGBUS on
// a mapped page into an error, so storage keeps badger away from the last free bytes.
//
// With our options (badgerOptions) badger pre-allocates, sparsely:
//   - value log: each file is created at 2 x ValueLogFileSize = 40 MiB and mapped whole; it is
//     rotated after the write that takes it past 20 MiB (one round of the committer: at most 16 MiB
//     more) and truncated to its end. Only the newest file is written.
//   - memtables: MemTableSize 8 MiB, NumMemtables 2. Each memtable's WAL is created at 2 x 8 MiB =
//     16 MiB; it is full when the WAL or the skiplist reaches 8 MiB, then it is flushed to a level-0
//     table and its WAL deleted. Values of at least ValueThreshold (512 bytes) go to the value log, so
//     the WAL holds their keys and 12-byte value pointers; smaller values are in the WAL itself.
//   - tables: a flush or a compaction writes each new table into a file created at the table's size;
//     the inputs are deleted only after the outputs are written.
//   - DISCARD: 1 MiB, grows by doubling (16 bytes per value-log file, so it never does for us).
//
// Sparse pre-allocation takes no space by itself, so what must be kept free is what badger writes on
// its own, between our checks. Everything Warren writes goes through Commit or DeleteRange; the
// committer charges each batch, before badger sees it, for what it will add on disk (chargeOf:
// value-log entry + WAL entry + the level-0 table that WAL entry becomes). Free space is measured with
// statfs(2) after every 1 MiB of charges or 250 ms, before a decision near a limit (at most every
// 10 ms), and once a second by the maintenance goroutine: never once per write. The size of the LSM
// tree (a directory listing) is read at most once a second. Badger's own writes are bounded by the
// size of the LSM tree: a memtable flush writes a table
// no bigger than the WAL it replaces, and a compaction writes no more than it reads, and two
// compactions never read the same table; value-log GC is run by us and charged like a commit. So:
//
//	floor   = 4 MiB + 1.1 x LSM      (LSM = blocks of *.sst and *.mem; 4 MiB covers new log-file
//	                                  headers, the pages badger reads or writes at open, MANIFEST
//	                                  and DISCARD growth, page rounding)
//	reserve = floor + 16 MiB         (room for deletes: acks, queue deletes, stream retention, raft)
//	ballast = 32 MiB                 (file Dir/BALLAST, fully allocated)
//
// A batch that adds data (a publish, a stream chunk) is refused with ErrNoSpace once free space
// would fall below the limit: the reserve, plus 1.5 times the ballast while the ballast is given up
// (its room, kept for what it was given up for, and half of it again so that it can be made again
// before publishes take the room). A batch that only deletes, or one marked with UseReserve (acks
// and settlements in a raft log, raft votes, requeue counts, metadata, stream offsets and
// retention), may go down to the floor; if it does not fit there the ballast is deleted and the
// batch tried again. Nothing goes below the floor. SpaceLow is raised when free space is below the
// limit or a write was refused, and cleared 2 MiB above the limit; the server raises the disk alarm
// while it is, whatever --disk-free-limit says, so publishers are blocked (after the nacks of what
// was already on its way).
//
// At Open, before badger opens: if free space is below the reserve, the ballast is deleted (so that
// the broker starts, alarm raised, and consumers can drain); if it is still below the floor, Open
// fails with a message saying how much is needed, rather than letting badger crash. The ballast is
// created (fallocate, or written with zeros where that is not supported, then fsynced; never sparse)
// at Open and made again by the maintenance goroutine as soon as free space is at the limit.
//
// Deleted messages give their space back only when badger has compacted the deletes (which records
// how much of each value-log file is dead) and value-log GC has dropped the dead files. On a full
// disk that would wait for writes that never come, so while space is low and deletes happened the
// maintenance goroutine asks the committer to flush the memtable and compact level 0 (reclaim) and
// then runs value-log GC with a discard ratio chosen so that its rewrite fits (gcBudget).
//
// Other processes writing to the same file system between two measurements are not charged: keep
// Warren's data directory on a file system of its own, or keep --disk-free-limit well above the
// reserve. Lock order: space.mu is a leaf (no other lock is taken while it is held); DeleteRange
// takes it under closeMu and mapMu, the committer with no lock held.

const (
	spaceFixed         = 4 << 20  // the floor's fixed part (see above)
	defaultDeleteRoom  = 16 << 20 // reserve - floor
	defaultBallastSize = 32 << 20
	// entryOverhead bounds badger's per-entry bytes besides key and value: the header (meta, user
	// meta and three uvarints: at most 22 bytes), the CRC32 (4) and the 8-byte version in the key.
	entryOverhead = 40
	// batchOverhead covers the transaction-end marker badger writes to the WAL (about 50 bytes).
	batchOverhead   = 64
	fsOverheadDiv   = 64                     // chargeOf adds 1/fsOverheadDiv for file-system metadata
	measureEvery    = 1 << 20                // charged bytes after which free space is measured again
	measureMaxAge   = 250 * time.Millisecond // and a measurement older than this is renewed by a write
	measureRetry    = 10 * time.Millisecond  // near a limit, a write measures again at most this often
	measureLSMEvery = time.Second            // the LSM size is read (a directory listing) at most this often
	// lowHysteresis: SpaceLow clears once free space is this much above the limit again.
	lowHysteresis = 2 << 20
	ballastName   = "BALLAST"
)

// ErrNoSpace means a write was refused because the file system of the data directory is down to the
// reserve storage keeps so that badger never meets a full disk. Nothing of the batch was written.
var ErrNoSpace = errors.New("storage: not enough free disk space")

// Space describes the free space storage sees on its file system and the limits it keeps (bytes).
type Space struct {
	Free    int64 // free space as last measured, minus what was written since
	Total   int64 // size of the file system
	Floor   int64 // nothing is written below this
	Reserve int64 // writes that add data are refused below this
	Limit   int64 // Reserve, plus 1.5 times the ballast's size while it is given up
	Ballast bool  // the ballast file is in place
	Low     bool  // Free < Limit: writes that add data are refused
}

// statfsFunc returns the bytes available to us and the size of the file system holding dir.
type statfsFunc func(dir string) (avail, total int64, err error)

func statfs(dir string) (avail, total int64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Bavail) * st.Bsize, int64(st.Blocks) * st.Bsize, nil
}

// space is the free-space accounting of one DB (see above).
type space struct {
	dir        string
	log        *slog.Logger
	statfs     statfsFunc
	deleteRoom int64
	ballastLen int64

	low atomic.Bool // SpaceLow (see updateLowLocked)

	mu         sync.Mutex
	avail      int64 // bytes available at the last measurement, minus charges since
	total      int64
	lsm        int64 // allocated bytes of *.sst and *.mem at the last listing
	charged    int64 // charged since the last measurement
	measuredAt time.Time
	lsmAt      time.Time
	ballast    bool // Dir/BALLAST is in place (or being made: creating)
	creating   bool
	deletes    int64 // delete operations admitted since the last reclaim
	starved    bool  // an essential write was refused (logged once per episode)
	measureErr bool  // statfs failed (logged once)
}

func newSpace(dir string, log *slog.Logger, opts Options) *space {
	s := &space{
		dir:        dir,
		log:        log,
		statfs:     opts.statfs,
		deleteRoom: opts.deleteRoom,
		ballastLen: opts.ballastSize,
	}
	if s.statfs == nil {
		s.statfs = statfs
	}
	if s.deleteRoom <= 0 {
		s.deleteRoom = defaultDeleteRoom
	}
	if s.ballastLen == 0 {
		s.ballastLen = defaultBallastSize
	}
	return s
}

func (s *space) ballastPath() string { return filepath.Join(s.dir, ballastName) }

// floorLocked, reserveLocked and limitLocked are the levels described above.
func (s *space) floorLocked() int64   { return spaceFixed + s.lsm + s.lsm/10 }
func (s *space) reserveLocked() int64 { return s.floorLocked() + s.deleteRoom }
func (s *space) limitLocked() int64 {
	l := s.reserveLocked()
	if !s.ballast && s.ballastLen > 0 {
		// Its room, and half of it again: maybeCreateBallast makes it as soon as free space is here,
		// so writes that add data can never keep it from coming back.
		l += s.ballastLen + s.ballastLen/2
	}
	return l
}

// measureLocked reads the free space (and, at most every measureLSMEvery or when forced, the LSM
// size) and forgets the charges made since the previous measurement.
func (s *space) measureLocked(forceLSM bool) {
	now := time.Now()
	avail, total, err := s.statfs(s.dir)
	if err != nil {
		if !s.measureErr {
			s.measureErr = true
			s.log.Warn("storage: cannot measure free disk space; keeping the last measurement", "dir", s.dir, "err", err)
		}
	} else {
		s.measureErr = false
		s.avail, s.total, s.charged = avail, total, 0
	}
	s.measuredAt = now
	if forceLSM || now.Sub(s.lsmAt) >= measureLSMEvery {
		s.lsm = allocatedLSM(s.dir)
		s.lsmAt = now
	}
	s.updateLowLocked(false)
}

// allocatedLSM returns the disk blocks of dir's *.sst and *.mem files in bytes.
func allocatedLSM(dir string) int64 {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".sst") && !strings.HasSuffix(name, ".mem") {
			continue
		}
		if info, err := e.Info(); err == nil {
			n += allocated(info)
		}
	}
	return n
}

// allocated returns the bytes of disk blocks a file holds (its size where that is unknown).
func allocated(info os.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return info.Size()
}

// updateLowLocked raises low when free space is below the limit or a write was just refused, and
// clears it once free space is lowHysteresis above the limit (so the disk alarm does not flap). It
// logs the changes.
func (s *space) updateLowLocked(refused bool) {
	was := s.low.Load()
	var low bool
	switch {
	case refused || s.avail < s.limitLocked():
		low = true
	case was:
		low = s.avail < s.limitLocked()+lowHysteresis
	}
	if low == was {
		return
	}
	s.low.Store(low)
	if low {
		s.log.Warn("storage: free disk space is down to the reserve: refusing writes that add data "+
			"(publishes are nacked); acks and deletes still work",
			"free_mib", s.avail>>20, "reserve_mib", s.reserveLocked()>>20, "floor_mib", s.floorLocked()>>20,
			"ballast", s.ballast, "dir", s.dir)
	} else {
		s.starved = false
		s.log.Info("storage: free disk space is above the reserve again: accepting all writes",
			"free_mib", s.avail>>20, "limit_mib", s.limitLocked()>>20)
	}
}

// snapshot returns the current numbers.
func (s *space) snapshot() Space {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshotLocked()
}

func (s *space) snapshotLocked() Space {
	return Space{
		Free: s.avail, Total: s.total, Floor: s.floorLocked(), Reserve: s.reserveLocked(),
		Limit: s.limitLocked(), Ballast: s.ballast && !s.creating, Low: s.low.Load(),
	}
}

// admitLocked charges n bytes if they fit above the limit for their class (the floor for essential
// writes, the limit otherwise). It measures again after measureEvery bytes or measureMaxAge, and near
// the limit or before refusing (at most every measureRetry); for an essential write that does not fit
// it gives up the ballast.
func (s *space) admitLocked(n int64, essential bool) error {
	since := time.Since(s.measuredAt)
	if s.charged >= measureEvery || since >= measureMaxAge {
		s.measureLocked(false)
		since = 0
	}
	measured := since < measureRetry
	for {
		limit := s.limitLocked()
		if essential {
			limit = s.floorLocked()
		}
		fits := s.avail-n >= limit
		if !measured && s.avail-n < limit+measureEvery {
			// Near the limit (or past it): decide on a fresh measurement.
			measured = true
			s.measureLocked(false)
			continue
		}
		if fits {
			s.avail -= n
			s.charged += n
			s.updateLowLocked(false)
			return nil
		}
		if essential && s.ballast && !s.creating {
			s.releaseBallastLocked("a delete or an acknowledgement needs the room")
			s.measureLocked(true)
			continue
		}
		if essential && !s.starved {
			s.starved = true
			s.log.Error("storage: free disk space is down to the floor badger needs: refusing even deletes "+
				"and acknowledgements; free space on the file system",
				"free_mib", s.avail>>20, "floor_mib", s.floorLocked()>>20, "dir", s.dir)
		}
		s.updateLowLocked(true)
		return fmt.Errorf("%w on %s (%d MiB free, %d MiB kept in reserve)", ErrNoSpace, s.dir,
			max(s.avail, 0)>>20, limit>>20)
	}
}

// admit is admitLocked for one charge.
func (s *space) admit(n int64, essential bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.admitLocked(n, essential)
}

// admitRound decides, in order, which batches of a committer round may be written; refused ones get
// their err set and are not written.
func (s *space) admitRound(round []pending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range round {
		p := &round[i]
		if p.err != nil || p.charge == 0 {
			continue
		}
		if err := s.admitLocked(p.charge, p.essential); err != nil {
			p.err = err
			continue
		}
		s.deletes += int64(p.dels)
	}
}

// addDeletes counts deletes made outside the committer (DeleteRange) for wantReclaim.
func (s *space) addDeletes(n int) {
	s.mu.Lock()
	s.deletes += int64(n)
	s.mu.Unlock()
}

// measure measures now unless that was done within d.
func (s *space) measure(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.measuredAt) >= d {
		s.measureLocked(d == 0)
	}
}

// open runs before badger opens: it finds or clears the ballast, measures, gives the ballast up when
// the disk is nearly full and refuses to go on when even that leaves less than the floor. It returns
// false when free space cannot be measured at all (statfs fails): the DB then goes without.
func (s *space) open() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = os.Remove(s.ballastPath() + ".tmp") // an interrupted creation
	if info, err := os.Stat(s.ballastPath()); err == nil {
		if info.Mode().IsRegular() && s.ballastLen > 0 && allocated(info) >= s.ballastLen {
			s.ballast = true
		} else if err := os.Remove(s.ballastPath()); err != nil {
			return false, fmt.Errorf("storage: remove the incomplete ballast file: %w", err)
		}
	}
	s.measureLocked(true)
	if s.measureErr {
		s.log.Warn("storage: free disk space cannot be measured here: running without the reserve "+
			"that keeps badger from a full disk", "dir", s.dir)
		return false, nil
	}
	if s.avail < s.reserveLocked() && s.ballast {
		s.releaseBallastLocked("the disk is nearly full at start: consumers need room to drain")
		s.measureLocked(true)
	}
	if s.avail < s.floorLocked() {
		return false, fmt.Errorf("%w: the file system of %s has %d KiB free; Warren needs at least %d KiB there to "+
			"open its store without risking a crash (free some space, or move the data directory)",
			ErrNoSpace, s.dir, max(s.avail, 0)>>10, s.floorLocked()>>10)
	}
	sp := s.snapshotLocked()
	s.log.Info("storage: disk space", "free_mib", sp.Free>>20, "floor_mib", sp.Floor>>20,
		"reserve_mib", sp.Reserve>>20, "ballast", sp.Ballast, "ballast_mib", s.ballastLen>>20)
	return true, nil
}

// releaseBallastLocked deletes the ballast file.
func (s *space) releaseBallastLocked(why string) {
	if err := os.Remove(s.ballastPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Error("storage: cannot delete the ballast file", "file", s.ballastPath(), "err", err)
		return
	}
	_ = syncDir(s.dir)
	s.ballast = false
	s.log.Warn("storage: gave up the ballast file", "reason", why, "mib", s.ballastLen>>20,
		"free_before_mib", max(s.avail, 0)>>20)
}

// maybeCreateBallast makes the ballast file when it is missing and free space is at the limit (the
// reserve plus 1.5 times the ballast): room for it and half of it again. It returns whether it made one.
func (s *space) maybeCreateBallast() bool {
	s.mu.Lock()
	if s.ballast || s.ballastLen <= 0 || s.avail < s.limitLocked() {
		s.mu.Unlock()
		return false
	}
	// Take the room now, so that the writes made meanwhile cannot, and count the ballast as present so
	// that taking its room does not make the limit jump.
	s.ballast, s.creating = true, true
	s.avail -= s.ballastLen
	s.charged += s.ballastLen
	s.mu.Unlock()

	err := writeBallast(s.dir, s.ballastPath(), s.ballastLen)

	s.mu.Lock()
	defer s.mu.Unlock()
	s.creating = false
	if err != nil {
		s.ballast = false
		s.log.Warn("storage: cannot create the ballast file", "file", s.ballastPath(), "err", err)
	} else {
		s.log.Info("storage: created the ballast file", "file", s.ballastPath(), "mib", s.ballastLen>>20)
	}
	s.measureLocked(true)
	return err == nil
}

// writeBallast creates path with size bytes of allocated blocks (not a sparse file): fallocate, or
// zeros written where the file system does not support it. It goes through path.tmp and a rename, so
// a crash leaves no partial ballast behind that would pass for a whole one.
func writeBallast(dir, path string, size int64) (err error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if err = syscall.Fallocate(int(f.Fd()), 0, 0, size); err == nil {
		var info os.FileInfo
		if info, err = f.Stat(); err == nil && allocated(info) < size {
			err = syscall.EOPNOTSUPP // a file system that accepts fallocate without allocating
		}
	}
	if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
		err = writeZeros(f, size)
	}
	if err != nil {
		return fmt.Errorf("allocate %d bytes: %w", size, err)
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(dir)
}

func writeZeros(f *os.File, size int64) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for size > 0 {
		n := min(size, int64(len(buf)))
		if _, err := f.Write(buf[:n]); err != nil {
			return err
		}
		size -= n
	}
	return nil
}

// chargeOf returns what ops will add on disk, in bytes, and how many of them delete: each value of at
// least valueThresh bytes goes to the value log; each entry goes to the memtable's WAL (with a value
// pointer for values in the value log) and, once the memtable is flushed, into a level-0 table that
// counts 1.1 times the WAL entry in the floor. A 64th more covers the file system's own blocks: ext4
// allocated 0.6% more than badger wrote to a value-log file through its mapping (tmpfs 0.01%).
func chargeOf(ops []op, valueThresh int64) (charge int64, dels int) {
	var vlog, wal int64 = 0, batchOverhead
	for i := range ops {
		o := &ops[i]
		k := int64(len(o.key)) + entryOverhead
		v := int64(len(o.value))
		switch {
		case o.del:
			dels++
			wal += k
		case v >= valueThresh:
			vlog += k + v
			wal += k + valuePointerSize
		default:
			wal += k + v
		}
	}
	c := vlog + wal + wal + wal/10
	return c + c/fsOverheadDiv, dels
}
