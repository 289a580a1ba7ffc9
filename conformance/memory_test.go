package conformance

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	idleConnections      = 1000
	maxBytesPerIdleConn  = 40 * 1024
	idleDialParallelism  = 32
	rssStableTolerance   = 256 * 1024 // bytes between consecutive readings counted as "stable"
	rssStableReadings    = 4
	rssStabilizeDeadline = 20 * time.Second
)

// TestIdleConnectionMemory opens 1,000 amqp091-go connections with one channel each and
// measures how much the broker's resident set grows: it must stay under 40 KB per connection.
func TestIdleConnectionMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 1,000 connections; skipped with -short")
	}
	b := ownBroker(t)
	statusPath := fmt.Sprintf("/proc/%d/status", b.PID())
	if _, err := os.Stat(statusPath); err != nil {
		t.Skipf("cannot read the broker's RSS: %v", err)
	}

	// Warm up: one connection through the whole path, so one-time allocations are not
	// charged to the 1,000.
	warm := dial(t, b.URL)
	if _, err := warm.Channel(); err != nil {
		t.Fatalf("warm-up channel: %v", err)
	}

	before := stableRSS(t, statusPath)

	conns := make([]*amqp.Connection, idleConnections)
	var wg sync.WaitGroup
	errs := make(chan error, idleConnections)
	next := make(chan int)
	for w := 0; w < idleDialParallelism; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				conn, err := amqp.DialConfig(b.URL, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
				if err != nil {
					errs <- fmt.Errorf("connection %d: dial: %w", i, err)
					continue
				}
				conns[i] = conn
				if _, err := conn.Channel(); err != nil {
					errs <- fmt.Errorf("connection %d: channel: %w", i, err)
				}
			}
		}()
	}
	for i := range conns {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	defer closeAll(conns)
	for err := range errs {
		t.Fatal(err)
	}

	after := stableRSS(t, statusPath)
	perConn := (after - before) / idleConnections
	t.Logf("broker RSS %d KB before, %d KB with %d idle connections (one channel each): %.1f KB per connection",
		before/1024, after/1024, idleConnections, float64(after-before)/idleConnections/1024)
	if perConn > maxBytesPerIdleConn {
		t.Errorf("%d bytes of RSS per idle connection; want under %d", perConn, maxBytesPerIdleConn)
	}
	if err := b.exitedEarly(); err != nil {
		t.Fatalf("broker died holding %d connections: %v", idleConnections, err)
	}
}

// closeAll closes the connections in parallel.
func closeAll(conns []*amqp.Connection) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, idleDialParallelism)
	for _, c := range conns {
		if c == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_ = c.Close()
		}()
	}
	wg.Wait()
}

// stableRSS polls VmRSS until rssStableReadings consecutive readings agree within
// rssStableTolerance, and returns the last one (in bytes).
func stableRSS(t *testing.T, statusPath string) int64 {
	t.Helper()
	deadline := time.Now().Add(rssStabilizeDeadline)
	var readings []int64
	for {
		rss, err := readRSS(statusPath)
		if err != nil {
			t.Fatalf("read RSS: %v", err)
		}
		readings = append(readings, rss)
		if n := len(readings); n >= rssStableReadings {
			window := readings[n-rssStableReadings:]
			lo, hi := window[0], window[0]
			for _, r := range window {
				lo, hi = min(lo, r), max(hi, r)
			}
			if hi-lo <= rssStableTolerance {
				return rss
			}
		}
		if time.Now().After(deadline) {
			t.Logf("RSS did not settle within %v (readings %v); using the last", rssStabilizeDeadline, readings)
			return rss
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// readRSS returns VmRSS from a /proc/PID/status file, in bytes.
func readRSS(statusPath string) (int64, error) {
	f, err := os.Open(statusPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fields := strings.Fields(rest)
			if len(fields) != 2 || fields[1] != "kB" {
				return 0, fmt.Errorf("unexpected VmRSS line %q", line)
			}
			kb, err := strconv.ParseInt(fields[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %q: %w", line, err)
			}
			return kb * 1024, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no VmRSS in %s", statusPath)
}
