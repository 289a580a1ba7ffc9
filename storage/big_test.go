package storage

import (
	"bufio"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// memStatus returns VmRSS, RssAnon and RssFile of this process in MiB.
func memStatus(t testing.TB) (rss, anon, file float64) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(fields[1], 64)
		switch fields[0] {
		case "VmRSS:":
			rss = kb / 1024
		case "RssAnon:":
			anon = kb / 1024
		case "RssFile:":
			file = kb / 1024
		}
	}
	return rss, anon, file
}

// smapsBreakdown sums the resident MiB of this process's mappings by file extension (or "anon").
func smapsBreakdown(t testing.TB) map[string]int {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]int{}
	cur := "anon"
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 5 && strings.Contains(fields[0], "-") {
			cur = "anon"
			if len(fields) >= 6 {
				cur = filepath.Ext(fields[5])
				if cur == "" {
					cur = fields[5]
				}
				if len(fields) > 6 {
					cur += "(deleted)"
				}
			}
			continue
		}
		if len(fields) >= 2 && fields[0] == "Rss:" {
			kb, _ := strconv.Atoi(fields[1])
			out[cur] += kb / 1024
		}
	}
	return out
}

// rssWatcher samples RSS every 100 ms until stopped and keeps the peak.
type rssWatcher struct {
	t    testing.TB
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	peak [3]float64
}

func watchRSS(t testing.TB) *rssWatcher {
	w := &rssWatcher{t: t, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			w.sample()
			select {
			case <-w.stop:
				return
			case <-tk.C:
			}
		}
	}()
	return w
}

func (w *rssWatcher) sample() {
	r, a, f := memStatus(w.t)
	w.mu.Lock()
	defer w.mu.Unlock()
	if r > w.peak[0] {
		w.peak = [3]float64{r, a, f}
		if os.Getenv("WARREN_STORAGE_BIG_DEBUG") != "" {
			w.t.Logf("new peak %.0f: %v", r, smapsBreakdown(w.t))
		}
	}
}

func (w *rssWatcher) Stop() [3]float64 {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak
}

// TestBigBacklog writes 1,000,000 values of 1 KB through Commit (8 publishers, 10 values per batch, fsync
// on), then drains them (point Get + Delete in batches, as consumers acking would), reporting rates and
// peak RSS. Run with WARREN_STORAGE_BIG=1 (takes a minute or two and ~1.2 GB of disk).
func TestBigBacklog(t *testing.T) {
	if os.Getenv("WARREN_STORAGE_BIG") == "" {
		t.Skip("set WARREN_STORAGE_BIG=1 to run")
	}
	const (
		total      = 1_000_000
		publishers = 8
		perBatch   = 10
		size       = 1024
	)
	dir := os.Getenv("WARREN_STORAGE_BIG_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	opts := Options{Dir: dir, GCInterval: 10 * time.Second}
	if os.Getenv("WARREN_STORAGE_BIG_DEBUG") != "" {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug - 4}))
	}
	d := openT(t, opts)
	body := value(7, size)

	w := watchRSS(t)
	start := time.Now()
	var acked atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	per := total / publishers
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b Batch
			for i := 0; i < per; i += perBatch {
				for j := i; j < i+perBatch && j < per; j++ {
					b.Set(MessageKey(uint64(p), uint64(j)), body)
				}
				n := int64(b.Len())
				d.Commit(&b, func(err error) {
					if err != nil {
						failed.Add(1)
					}
					acked.Add(n)
				})
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Minute)
	for acked.Load() < total && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	fill := time.Since(start)
	fillPeak := w.Stop()
	if acked.Load() != total || failed.Load() != 0 {
		t.Fatalf("acked %d of %d, %d failed", acked.Load(), total, failed.Load())
	}
	s := d.Stats()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if prof := os.Getenv("WARREN_STORAGE_BIG_HEAPPROFILE"); prof != "" {
		runtime.GC()
		if f, err := os.Create(prof); err == nil {
			_ = pprof.WriteHeapProfile(f)
			_ = f.Close()
		}
	}
	t.Logf("fill: %d x %d B in %v = %.0f msg/s (%.1f MB/s); Batches=%d Txns=%d (%.1f batches/txn); LSM %.1f MiB, vlog %.1f MiB",
		total, size, fill.Round(time.Millisecond), total/fill.Seconds(), total*size/fill.Seconds()/1e6,
		s.Batches, s.Txns, float64(s.Batches)/float64(s.Txns), float64(s.LSMBytes)/(1<<20), float64(s.VlogBytes)/(1<<20))
	t.Logf("fill peak RSS %.0f MiB (anon %.0f, file %.0f); Go heap in use %.0f MiB, sys %.0f MiB",
		fillPeak[0], fillPeak[1], fillPeak[2], float64(ms.HeapInuse)/(1<<20), float64(ms.Sys)/(1<<20))

	// Drain: read every value back and delete it, 100 per batch, like a consumer acking.
	w = watchRSS(t)
	start = time.Now()
	var dwg sync.WaitGroup
	for p := range publishers {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			var b Batch
			for j := range per {
				k := MessageKey(uint64(p), uint64(j))
				v, err := d.Get(k)
				if err != nil || len(v) != size {
					t.Errorf("Get %x: %d bytes, %v", k, len(v), err)
					return
				}
				b.Delete(k)
				if b.Len() == 100 || j == per-1 {
					d.Commit(&b, nil)
				}
			}
		}()
	}
	dwg.Wait()
	var sync Batch
	sync.Set([]byte("drain-done"), nil)
	if err := d.CommitSync(&sync); err != nil {
		t.Fatal(err)
	}
	drain := time.Since(start)
	drainPeak := w.Stop()
	t.Logf("smaps MiB by file: %v", smapsBreakdown(t))
	t.Logf("drain: %d Get+Delete in %v = %.0f msg/s; peak RSS %.0f MiB (anon %.0f, file %.0f)",
		total, drain.Round(time.Millisecond), total/drain.Seconds(), drainPeak[0], drainPeak[1], drainPeak[2])
	gcStart := time.Now()
	rewrites := d.runGC()
	s = d.Stats()
	t.Logf("after drain: value-log GC rewrote %d files in %v; LSM %.1f MiB, vlog %.1f MiB",
		rewrites, time.Since(gcStart).Round(time.Millisecond), float64(s.LSMBytes)/(1<<20), float64(s.VlogBytes)/(1<<20))
	if fillPeak[0] > 300 || drainPeak[0] > 300 {
		t.Errorf("RSS went over 300 MiB (fill %.0f, drain %.0f)", fillPeak[0], drainPeak[0])
	}
}
