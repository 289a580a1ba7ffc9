package perf

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// machineInfo describes the host a benchmark ran on.
type machineInfo struct {
	CPU     string
	Cores   int
	RAM     string
	Kernel  string
	OS      string
	GoVer   string
	FileLim string
}

func describeMachine() machineInfo {
	m := machineInfo{CPU: "unknown", Cores: runtime.NumCPU(), RAM: "unknown", Kernel: "unknown", OS: runtime.GOOS, GoVer: runtime.Version()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.Join(strings.Fields(v), " ")
				break
			}
		}
	}
	if kb, err := readMeminfoKB("MemTotal:"); err == nil {
		m.RAM = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(data))
	}
	if data, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	if n, err := openFilesLimit(os.Getpid()); err == nil {
		m.FileLim = strconv.FormatUint(n, 10)
	}
	return m
}

func readMeminfoKB(field string) (uint64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read /proc/meminfo: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				return strconv.ParseUint(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s in /proc/meminfo", field)
}

// loadAverage returns the 1, 5 and 15 minute load averages from /proc/loadavg.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}

// syncLatency measures what a commit waits for on the disk under dir: the median time to append
// 64 KiB to a new file and fdatasync it, over n rounds. Warren confirms stream and quorum
// publishes after such syncs while RabbitMQ's streams confirm before any, so the ratios of the
// confirm-bound scenarios move with it, and this disk's latency changes through the day.
func syncLatency(dir string, n int) (time.Duration, error) {
	f, err := os.CreateTemp(dir, "warren-perf-sync-*")
	if err != nil {
		return 0, fmt.Errorf("sync probe: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 64<<10)
	times := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if _, err := f.Write(buf); err != nil {
			return 0, fmt.Errorf("sync probe: %w", err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return 0, fmt.Errorf("sync probe: fdatasync: %w", err)
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}

// describeSync is syncLatency for a report line.
func describeSync() string {
	d, err := syncLatency(os.TempDir(), 25)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000)
}
