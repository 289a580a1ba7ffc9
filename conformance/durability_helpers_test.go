package conformance

// Helpers of the durability tests: a data directory with the warren process currently running on
// it, confirm-mode publishing, draining, running `warren serve` to an expected failure, sampling
// the broker's resident set, and reading badger value-log files.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server/netserve"
)

// node is one data directory and the warren process currently running on it. Restarts start a
// new process (on a new port) on the same directory.
type node struct {
	t       testing.TB
	dir     string
	args    []string // more `warren serve` flags
	b       *broker
	lives   int
	history []string // tails of the logs of earlier processes, for failure reports
}

// newNode starts warren on a fresh data directory. The process running when the test ends is
// stopped with SIGTERM; on failure the logs of the last processes are printed.
func newNode(t testing.TB) *node {
	t.Helper()
	return newNodeAt(t, t.TempDir())
}

// newNodeAt is newNode on data directory dir, with more `warren serve` flags.
func newNodeAt(t testing.TB, dir string, args ...string) *node {
	t.Helper()
	if testEnv.bin == "" {
		t.Skipf("needs its own warren process; %s is set", envAddr)
	}
	n := &node{t: t, dir: dir, args: args}
	n.start()
	t.Cleanup(func() {
		if n.b != nil {
			if err := n.b.stop(); err != nil {
				t.Errorf("stop broker: %v", err)
			}
			n.checkRace(n.b.logs())
		}
		if t.Failed() {
			for i, h := range n.history[max(0, len(n.history)-2):] {
				t.Logf("log of an earlier broker process (%d of the last ones):\n%s", i+1, h)
			}
			if n.b != nil {
				t.Logf("log of the last broker process (last 6 KB):\n%s", tail(n.b.logs(), 6<<10))
			}
		}
	})
	return n
}

// start launches warren on the node's directory and waits until it accepts connections.
func (n *node) start() {
	n.t.Helper()
	start := time.Now()
	b, err := launchBroker(testEnv.bin, n.dir, n.args...)
	if err != nil {
		n.t.Fatalf("start broker on %s (start #%d, %v after launch): %v", n.dir, n.lives+1, time.Since(start), err)
	}
	n.b = b
	n.lives++
}

// checkRace fails the test if a broker built with -race reported a data race in logs.
func (n *node) checkRace(logs string) {
	if i := strings.Index(logs, "WARNING: DATA RACE"); i >= 0 {
		n.t.Errorf("broker process #%d reported a data race:\n%s", n.lives, logs[i:min(len(logs), i+8<<10)])
	}
}

// retire keeps the tail of the current process's log and forgets the process.
func (n *node) retire() {
	logs := n.b.logs()
	n.checkRace(logs)
	n.history = append(n.history, tail(logs, 4<<10))
	if len(n.history) > 4 {
		n.history = n.history[1:]
	}
	n.b = nil
}

// stopTerm sends SIGTERM and requires a clean exit with status 0.
func (n *node) stopTerm() {
	n.t.Helper()
	err := n.b.stop()
	logs := n.b.logs()
	n.retire()
	if err != nil {
		n.t.Fatalf("SIGTERM: %v\nbroker log:\n%s", err, tail(logs, 4096))
	}
}

// kill9 ends the process with SIGKILL.
func (n *node) kill9() {
	n.t.Helper()
	if err := n.b.exitedEarly(); err != nil {
		n.t.Fatalf("the broker died before it was killed: %v\nits log:\n%s", err, tail(n.b.logs(), 4096))
	}
	_ = n.b.kill()
	n.retire()
}

// restartTerm stops the broker with SIGTERM and starts it again on the same directory.
func (n *node) restartTerm() {
	n.t.Helper()
	n.stopTerm()
	n.start()
}

// restartKill kills the broker with SIGKILL and starts it again on the same directory.
func (n *node) restartKill() {
	n.t.Helper()
	n.kill9()
	n.start()
}

// confirmChannel opens a channel on conn and puts it into confirm mode.
func confirmChannel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	return ch
}

// publishConfirmed publishes msgs to exchange with routing key on ch (in confirm mode) and waits
// until the broker has confirmed every one of them.
func publishConfirmed(t testing.TB, ch *amqp.Channel, exchange, key string, msgs ...amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dcs := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for i, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, m)
		if err != nil {
			t.Fatalf("publish %d of %d to %q/%q: %v", i+1, len(msgs), exchange, key, err)
		}
		dcs = append(dcs, dc)
	}
	for i, dc := range dcs {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			t.Fatalf("no confirm for publish %d of %d (body %q): %v", i+1, len(msgs), abbrev(msgs[i].Body), err)
		}
		if !ok {
			t.Fatalf("publish %d of %d (body %q) was nacked or its channel closed", i+1, len(msgs), abbrev(msgs[i].Body))
		}
	}
}

// getAll takes every message from queue with basic.get and acknowledges it, until the queue
// reports empty. It fails the test if that takes longer than d.
func getAll(t testing.TB, ch *amqp.Channel, queue string, d time.Duration) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	deadline := time.Now().Add(d)
	for {
		m, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatalf("basic.get from %q after %d messages: %v", queue, len(out), err)
		}
		if !ok {
			return out
		}
		if err := m.Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
		out = append(out, m)
		if time.Now().After(deadline) {
			t.Fatalf("basic.get from %q still returned messages after %v (%d so far)", queue, d, len(out))
		}
	}
}

// bodies returns the bodies of ds as strings.
func bodies(ds []amqp.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = string(d.Body)
	}
	return out
}

// abbrev shortens a body for messages.
func abbrev(b []byte) string {
	if len(b) <= 40 {
		return string(b)
	}
	return string(b[:40]) + "..."
}

// expectNotFound checks that err is a channel error 404 NOT_FOUND.
func expectNotFound(t testing.TB, what string, err error) {
	t.Helper()
	var aerr *amqp.Error
	switch {
	case err == nil:
		t.Errorf("%s: exists; want 404 NOT_FOUND", what)
	case !errors.As(err, &aerr):
		t.Errorf("%s: %v; want a 404 NOT_FOUND channel error", what, err)
	case aerr.Code != amqp.NotFound:
		t.Errorf("%s: %d %s; want 404 NOT_FOUND", what, aerr.Code, aerr.Reason)
	}
}

// serveToExit runs `warren serve` on dataDir (on a free port) and expects it to exit by itself
// within d. It returns the exit code and everything the process wrote. If the process is still
// running after d, it is killed and the test fails.
func serveToExit(t testing.TB, dataDir string, d time.Duration) (int, string) {
	t.Helper()
	port, err := netserve.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(testEnv.bin, "serve", "--amqp-listen", addr, "--http-listen", "", "--prometheus-listen", "", "--stream-listen", "", "--data-dir", dataDir)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := startChild(cmd); err != nil {
		t.Fatalf("start %s: %v", testEnv.bin, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0, out.String()
		case errors.As(err, &ee):
			return ee.ExitCode(), out.String()
		default:
			t.Fatalf("wait for warren serve: %v", err)
		}
	case <-time.After(d):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
		t.Fatalf("warren serve --data-dir %s kept running for %v; want it to refuse the directory and exit non-zero\noutput:\n%s",
			dataDir, d, out.String())
	}
	return 0, ""
}

// memSample is one reading of a process's resident set, in bytes.
type memSample struct {
	RSS, Anon, File int64
	At              time.Duration // since sampling started
}

func (m memSample) String() string {
	return fmt.Sprintf("%d MB (anon %d MB, file %d MB) at %v", m.RSS>>20, m.Anon>>20, m.File>>20, m.At.Round(100*time.Millisecond))
}

// readMem reads VmRSS, RssAnon and RssFile from a /proc/PID/status file.
func readMem(statusPath string) (memSample, error) {
	b, err := os.ReadFile(statusPath)
	if err != nil {
		return memSample{}, err
	}
	var m memSample
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *int64
		switch name {
		case "VmRSS":
			dst = &m.RSS
		case "RssAnon":
			dst = &m.Anon
		case "RssFile":
			dst = &m.File
		default:
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return m, fmt.Errorf("unexpected line %q in %s", line, statusPath)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return m, fmt.Errorf("parse %q: %w", line, err)
		}
		*dst = kb << 10
	}
	if m.RSS == 0 {
		return m, fmt.Errorf("no VmRSS in %s", statusPath)
	}
	return m, nil
}

// rssSampler reads a process's resident set every interval and keeps the peak of each named phase.
type rssSampler struct {
	statusPath string
	begin      time.Time
	phase      atomic.Pointer[string]
	mu         sync.Mutex
	peak       map[string]memSample
	last       memSample
	errs       int
	// When a phase's peak exceeds detailAbove (bytes, 0 = never), the largest mappings at that
	// moment are kept in detail.
	detailAbove int64
	smapsPath   string
	detail      map[string]string
	stopOnce    sync.Once
	stop        chan struct{}
	done        chan struct{}
}

// startRSSSampler starts sampling /proc/pid/status in phase. When a phase's peak exceeds
// detailAbove bytes (0 = never), the largest mappings at that moment are recorded (Details).
func startRSSSampler(pid int, interval time.Duration, phase string, detailAbove int64) *rssSampler {
	s := &rssSampler{
		statusPath:  fmt.Sprintf("/proc/%d/status", pid),
		smapsPath:   fmt.Sprintf("/proc/%d/smaps", pid),
		detailAbove: detailAbove,
		detail:      make(map[string]string),
		begin:       time.Now(),
		peak:        make(map[string]memSample),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	s.phase.Store(&phase)
	go func() {
		defer close(s.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			s.sample()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) sample() {
	m, err := readMem(s.statusPath)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.errs++
		return
	}
	m.At = time.Since(s.begin)
	ph := *s.phase.Load()
	s.last = m
	if m.RSS > s.peak[ph].RSS {
		s.peak[ph] = m
		if s.detailAbove > 0 && m.RSS > s.detailAbove {
			s.detail[ph] = topMappings(s.smapsPath, 8)
		}
	}
}

// setPhase takes one sample for the ending phase and switches to the next.
func (s *rssSampler) setPhase(phase string) {
	s.sample()
	s.phase.Store(&phase)
	s.sample()
}

// lastRSS returns the latest sample.
func (s *rssSampler) lastRSS() memSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Stop ends sampling and returns the peak of every phase.
func (s *rssSampler) Stop() map[string]memSample {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// Details returns, per phase whose peak exceeded the detail threshold, the largest mappings
// at the peak.
func (s *rssSampler) Details() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.detail)
}

// topMappings reads an smaps file and returns the n largest resident sets per mapped file
// ("[anon]" for anonymous memory), one per line.
func topMappings(smapsPath string, n int) string {
	b, err := os.ReadFile(smapsPath)
	if err != nil {
		return err.Error()
	}
	rss := make(map[string]int64)
	cur := "[anon]"
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") { // a mapping header: addr perms offset dev inode [path]
			cur = "[anon]"
			if len(f) >= 6 {
				cur = strings.Join(f[5:], " ")
			}
			continue
		}
		if f[0] == "Rss:" && len(f) >= 2 {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			rss[cur] += kb << 10
		}
	}
	names := make([]string, 0, len(rss))
	for k := range rss {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return rss[names[i]] > rss[names[j]] })
	var sb strings.Builder
	for _, k := range names[:min(n, len(names))] {
		fmt.Fprintf(&sb, "%6d MB  %s\n", rss[k]>>20, k)
	}
	return sb.String()
}

// gcTraceSummary summarises the Go runtime's gctrace lines (GODEBUG=gctrace=1) in a log: the
// number of collections, the largest heap at the start of a collection, the largest live heap
// after one, and the largest heap goal. It returns "" when the log has none.
func gcTraceSummary(log string) string {
	var n int
	var maxStart, maxLive, maxGoal int64
	for _, line := range strings.Split(log, "\n") {
		if !strings.HasPrefix(line, "gc ") {
			continue
		}
		f := strings.Fields(line)
		for i, w := range f {
			if a, rest, ok := strings.Cut(w, "->"); ok && i+1 < len(f) && strings.HasPrefix(f[i+1], "MB") {
				_, c, _ := strings.Cut(rest, "->")
				x, _ := strconv.ParseInt(a, 10, 64)
				z, _ := strconv.ParseInt(c, 10, 64)
				maxStart, maxLive = max(maxStart, x), max(maxLive, z)
				n++
			}
			if w == "goal," && i >= 2 && f[i-1] == "MB" {
				g, _ := strconv.ParseInt(f[i-2], 10, 64)
				maxGoal = max(maxGoal, g)
			}
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d GCs; largest heap at GC start %d MB, largest live heap %d MB, largest heap goal %d MB",
		n, maxStart, maxLive, maxGoal)
}

// smapsRollup returns /proc/pid/smaps_rollup (for reports when memory is over budget).
func smapsRollup(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// procStatusMem returns the memory lines of /proc/pid/status.
func procStatusMem(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err.Error()
	}
	var sb strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Vm") || strings.HasPrefix(line, "Rss") {
			sb.WriteString(line)
			sb.WriteByte('\n')
		}
	}
	return sb.String()
}

// Badger value-log files (*.vlog): a 20-byte file header, then entries of
//
//	meta u8 | user meta u8 | uvarint key length | uvarint value length | uvarint expiry | key | value | crc32c
//
// where the key carries badger's 8-byte version suffix and the CRC (Castagnoli, big-endian) covers
// everything before it. A file is preallocated, so after a crash it continues with zeros. These
// tests read the format themselves so that they can damage a file exactly where they mean to.
const vlogHeaderSize = 20

// vlogEntry is one intact entry of a value-log file.
type vlogEntry struct {
	off, end int64 // the entry's bytes are [off, end) of the file
	key      []byte
	value    []byte
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// readVlog parses path's entries up to the first one that is missing, incomplete or fails its
// CRC, and returns them with the offset just after the last intact one.
func readVlog(path string) ([]vlogEntry, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	if _, err := io.ReadFull(r, make([]byte, vlogHeaderSize)); err != nil {
		return nil, 0, fmt.Errorf("%s: read header: %w", path, err)
	}
	var out []vlogEntry
	off := int64(vlogHeaderSize)
	for {
		e, n, ok := readVlogEntry(r)
		if !ok {
			return out, off, nil
		}
		e.off, e.end = off, off+n
		out = append(out, e)
		off += n
	}
}

// readVlogEntry reads one entry; ok is false at the end of the intact entries.
func readVlogEntry(r *bufio.Reader) (e vlogEntry, n int64, ok bool) {
	var hdr []byte
	readByte := func() (byte, error) {
		c, err := r.ReadByte()
		if err == nil {
			hdr = append(hdr, c)
		}
		return c, err
	}
	byteReader := readerFunc(readByte)
	if _, err := readByte(); err != nil { // meta
		return e, 0, false
	}
	if _, err := readByte(); err != nil { // user meta
		return e, 0, false
	}
	klen, err := binary.ReadUvarint(byteReader)
	if err != nil || klen == 0 || klen > 1<<16 {
		return e, 0, false
	}
	vlen, err := binary.ReadUvarint(byteReader)
	if err != nil || vlen > 1<<30 {
		return e, 0, false
	}
	if _, err := binary.ReadUvarint(byteReader); err != nil { // expiry
		return e, 0, false
	}
	kv := make([]byte, klen+vlen)
	if _, err := io.ReadFull(r, kv); err != nil {
		return e, 0, false
	}
	var crcBuf [4]byte
	if _, err := io.ReadFull(r, crcBuf[:]); err != nil {
		return e, 0, false
	}
	h := crc32.New(castagnoli)
	h.Write(hdr)
	h.Write(kv)
	if h.Sum32() != binary.BigEndian.Uint32(crcBuf[:]) {
		return e, 0, false
	}
	e.key, e.value = kv[:klen], kv[klen:]
	return e, int64(len(hdr)) + int64(len(kv)) + 4, true
}

// readerFunc adapts a function to io.ByteReader.
type readerFunc func() (byte, error)

func (f readerFunc) ReadByte() (byte, error) { return f() }

// newestDataVlog returns the value-log file in dir with the highest number among those holding at
// least one entry, with its entries and the offset after the last intact one.
func newestDataVlog(t testing.TB, dir string) (string, []vlogEntry, int64) {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.vlog"))
	if err != nil {
		t.Fatal(err)
	}
	fid := func(p string) uint64 {
		n, _ := strconv.ParseUint(strings.TrimSuffix(filepath.Base(p), ".vlog"), 10, 64)
		return n
	}
	sort.Slice(paths, func(i, j int) bool { return fid(paths[i]) > fid(paths[j]) })
	for _, p := range paths {
		entries, end, err := readVlog(p)
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		if len(entries) > 0 {
			return p, entries, end
		}
	}
	t.Fatalf("no value-log file with entries in %s (files: %v)", dir, paths)
	return "", nil, 0
}

// markedIDs returns, for each entry, the message id found in its value after marker (the digits
// up to the next '|'), or "" if there is none.
func markedIDs(entries []vlogEntry, marker string) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		j := bytes.Index(e.value, []byte(marker))
		if j < 0 {
			continue
		}
		rest := e.value[j+len(marker):]
		if k := bytes.IndexByte(rest, '|'); k > 0 {
			out[i] = marker + string(rest[:k])
		}
	}
	return out
}
