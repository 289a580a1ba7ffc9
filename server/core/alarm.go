package core

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"warren/storage"
)

// Alarms watches memory use and free disk space. While either alarm is raised, connections that
// publish are blocked: they get connection.blocked (if they asked for it) and their sockets are not
// read until the alarm clears, while consumers keep working. This is RabbitMQ's flow control.
//
// The disk alarm is raised below diskLimit and also, whatever diskLimit says (0 included), while the
// storage engine refuses writes because it is down to the reserve it keeps (storage/space.go), and
// for good once the disk failed to make a write durable (storage.ErrSyncFailed: until restart).
type Alarms struct {
	dataDir string
	log     logger
	store   spaceReporter // nil: the limit alone

	mu        sync.Mutex
	memLimit  int64 // bytes; 0 disables
	diskLimit int64 // bytes of free space below which the disk alarm is raised; 0 disables
	memory    bool
	disk      bool
	cleared   chan struct{} // closed when no alarm is raised; replaced when one is raised
	rss       int64
	free      int64

	quit chan struct{}
	done chan struct{}
}

// spaceReporter is the slice of storage.DB alarms need.
type spaceReporter interface {
	SpaceLow() bool
	Space() storage.Space
	WriteFailure() error
}

// logger is the slice of slog.Logger alarms need.
type logger interface {
	Warn(msg string, args ...any)
	Info(msg string, args ...any)
}

// NewAlarms starts the watchdog: it samples memory and disk at once and then every 500 ms until
// Stop. store (may be nil) reports when storage is down to its disk space reserve.
func NewAlarms(dataDir string, memLimit, diskLimit int64, store spaceReporter, log logger) *Alarms {
	a := &Alarms{
		dataDir:   dataDir,
		log:       log,
		store:     store,
		memLimit:  memLimit,
		diskLimit: diskLimit,
		cleared:   make(chan struct{}),
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	close(a.cleared)
	a.check()
	go a.run()
	return a
}

func (a *Alarms) run() {
	defer close(a.done)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-a.quit:
			return
		case <-t.C:
			a.check()
		}
	}
}

// Stop ends the watchdog.
func (a *Alarms) Stop() {
	close(a.quit)
	<-a.done
}

// check samples memory and disk and raises or clears the alarms.
func (a *Alarms) check() {
	rss := readRSS()
	var free int64 = -1
	var st syscall.Statfs_t
	if err := syscall.Statfs(a.dataDir, &st); err == nil {
		free = int64(st.Bavail) * int64(st.Bsize)
	}
	storeLow := a.store != nil && a.store.SpaceLow()
	var writeFailure error
	if a.store != nil {
		writeFailure = a.store.WriteFailure()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rss, a.free = rss, free
	mem := a.memLimit > 0 && rss > a.memLimit
	disk := a.diskLimit > 0 && free >= 0 && free < a.diskLimit || storeLow || writeFailure != nil
	if mem != a.memory {
		if mem {
			a.log.Warn("memory alarm raised: publishers are blocked", "rss", rss, "limit", a.memLimit)
		} else {
			a.log.Info("memory alarm cleared", "rss", rss, "limit", a.memLimit)
		}
	}
	if disk != a.disk {
		switch {
		case disk && writeFailure != nil:
			a.log.Warn("disk alarm raised: publishers are blocked until restart", "reason", writeFailure.Error(), "dir", a.dataDir)
		case disk && storeLow:
			sp := a.store.Space()
			a.log.Warn("disk alarm raised: publishers are blocked", "reason", "storage is down to its disk space reserve",
				"free", free, "limit", a.diskLimit, "storage_limit", sp.Limit, "dir", a.dataDir)
		case disk:
			a.log.Warn("disk alarm raised: publishers are blocked", "reason", "free space below --disk-free-limit",
				"free", free, "limit", a.diskLimit, "dir", a.dataDir)
		default:
			a.log.Info("disk alarm cleared", "free", free, "limit", a.diskLimit)
		}
	}
	was := a.memory || a.disk
	a.memory, a.disk = mem, disk
	now := mem || disk
	switch {
	case now && !was:
		a.cleared = make(chan struct{})
	case !now && was:
		close(a.cleared)
	}
}

// Blocked returns a non-empty reason and a channel closed when publishing may resume, or "" if
// no alarm is raised.
func (a *Alarms) Blocked() (string, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.memory && a.disk:
		return "low on memory and disk", a.cleared
	case a.memory:
		return "low on memory", a.cleared
	case a.disk:
		return "low on disk", a.cleared
	}
	return "", nil
}

// Raised names the alarms raised now.
func (a *Alarms) Raised() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	if a.memory {
		out = append(out, "memory")
	}
	if a.disk {
		out = append(out, "disk")
	}
	return out
}

// Usage is what the watchdog last measured, for the management API's nodes.
type Usage struct {
	RSS, MemLimit, DiskFree, DiskLimit int64
	MemoryAlarm, DiskAlarm             bool
}

// Usage reports the last measurement and the limits.
func (a *Alarms) Usage() Usage {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Usage{RSS: a.rss, MemLimit: a.memLimit, DiskFree: a.free, DiskLimit: a.diskLimit, MemoryAlarm: a.memory, DiskAlarm: a.disk}
}

// SetLimits changes the thresholds (operators and tests) and re-evaluates at once.
func (a *Alarms) SetLimits(memLimit, diskLimit int64) {
	a.mu.Lock()
	a.memLimit, a.diskLimit = memLimit, diskLimit
	a.mu.Unlock()
	a.check()
}

// readRSS returns the process's resident set size in bytes (0 if unknown).
func readRSS() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}

// TotalMemory returns the machine's RAM in bytes from /proc/meminfo (0 if unknown).
func TotalMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := bytes.Fields(sc.Bytes())
		if len(fields) >= 2 && string(fields[0]) == "MemTotal:" {
			kb, err := strconv.ParseInt(string(fields[1]), 10, 64)
			if err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}
