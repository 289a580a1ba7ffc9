package storage

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

const childEnv = "WARREN_STORAGE_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "crash":
		round, _ := strconv.ParseUint(os.Getenv("WARREN_STORAGE_TEST_ROUND"), 10, 64)
		crashChild(os.Getenv("WARREN_STORAGE_TEST_DIR"), round)
		return
	case "lock":
		lockChild(os.Getenv("WARREN_STORAGE_TEST_DIR"))
		return
	case "syncfail":
		syncFailChild(os.Getenv("WARREN_STORAGE_TEST_DIR"))
		return
	}
	goleak.VerifyTestMain(m)
}

// logBuffer is a concurrency-safe sink for slog text output.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func testLogger(t testing.TB) (*slog.Logger, *logBuffer) {
	lb := &logBuffer{}
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelInfo})), lb
}

func openT(t testing.TB, opts Options) *DB {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger, _ = testLogger(t)
	}
	d, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func value(i, size int) []byte {
	v := bytes.Repeat([]byte{byte('a' + i%26)}, size)
	copy(v, strconv.Itoa(i))
	return v
}

func mustGet(t testing.TB, d *DB, key, want []byte) {
	t.Helper()
	got, err := d.Get(key)
	if err != nil {
		t.Fatalf("Get(%x): %v", key, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Get(%x) = %d bytes %.20q..., want %d bytes %.20q...", key, len(got), got, len(want), want)
	}
}

func TestBasics(t *testing.T) {
	for _, mode := range []string{"disk", "memory"} {
		t.Run(mode, func(t *testing.T) {
			opts := Options{Dir: t.TempDir(), NoSync: true}
			if mode == "memory" {
				opts = Options{InMemory: true}
			}
			d := openT(t, opts)

			if _, err := d.Get([]byte("missing")); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get(missing) = %v, want ErrNotFound", err)
			}
			var b Batch
			for i := range 100 {
				b.Set(MessageKey(7, uint64(i)), value(i, 100+i*20)) // small and value-log sized bodies
			}
			b.Set(MessageKey(8, 1), []byte("other queue"))
			b.Set(MetaKey(1, "q1"), []byte("meta"))
			if b.Len() != 102 {
				t.Fatalf("Len = %d, want 102", b.Len())
			}
			if err := d.CommitSync(&b); err != nil {
				t.Fatalf("CommitSync: %v", err)
			}
			if b.Len() != 0 {
				t.Fatalf("Len after Commit = %d, want 0 (Commit takes the ops)", b.Len())
			}
			mustGet(t, d, MessageKey(7, 42), value(42, 100+42*20))
			mustGet(t, d, MetaKey(1, "q1"), []byte("meta"))

			var ids []uint64
			err := d.Scan(MessagePrefix(7), true, func(k, v []byte) error {
				q, id, ok := ParseMessageKey(k)
				if !ok || q != 7 || v != nil {
					t.Fatalf("Scan keysOnly gave key %x value %v", k, v)
				}
				ids = append(ids, id)
				return nil
			})
			if err != nil {
				t.Fatalf("Scan: %v", err)
			}
			if len(ids) != 100 || ids[0] != 0 || ids[99] != 99 {
				t.Fatalf("Scan ids = %v", ids)
			}
			n := 0
			err = d.Scan(MessagePrefix(7), false, func(k, v []byte) error {
				_, id, _ := ParseMessageKey(k)
				if !bytes.Equal(v, value(int(id), 100+int(id)*20)) {
					t.Fatalf("Scan value of %d wrong", id)
				}
				n++
				return nil
			})
			if err != nil || n != 100 {
				t.Fatalf("Scan values: n=%d err=%v", n, err)
			}
			stop := errors.New("stop")
			if err := d.Scan(MessagePrefix(7), true, func(k, v []byte) error { return stop }); err != stop {
				t.Fatalf("Scan with failing fn = %v, want the fn's error", err)
			}

			b.Delete(MessageKey(7, 0))
			b.Set(MessageKey(7, 1), []byte("overwritten"))
			if err := d.CommitSync(&b); err != nil {
				t.Fatalf("CommitSync: %v", err)
			}
			if _, err := d.Get(MessageKey(7, 0)); !errors.Is(err, ErrNotFound) {
				t.Fatalf("deleted key: %v", err)
			}
			mustGet(t, d, MessageKey(7, 1), []byte("overwritten"))

			cnt, err := d.DeleteRange(MessagePrefix(7))
			if err != nil || cnt != 99 {
				t.Fatalf("DeleteRange = %d, %v; want 99", cnt, err)
			}
			if err := d.Scan(MessagePrefix(7), true, func(k, v []byte) error {
				return fmt.Errorf("key %x survived DeleteRange", k)
			}); err != nil {
				t.Fatal(err)
			}
			mustGet(t, d, MessageKey(8, 1), []byte("other queue"))

			// Invalid batches fail alone, in order, without harming their neighbours.
			var b1, b2, b3 Batch
			b1.Set([]byte("ok1"), []byte("1"))
			b2.Set(nil, []byte("empty key"))
			b3.Set([]byte("ok3"), []byte("3"))
			var mu sync.Mutex
			var got []string
			var wg sync.WaitGroup
			wg.Add(3)
			for i, bb := range []*Batch{&b1, &b2, &b3} {
				d.Commit(bb, func(err error) {
					mu.Lock()
					got = append(got, fmt.Sprintf("%d:%v", i, err != nil))
					mu.Unlock()
					wg.Done()
				})
			}
			wg.Wait()
			if strings.Join(got, ",") != "0:false,1:true,2:false" {
				t.Fatalf("results = %v", got)
			}
			mustGet(t, d, []byte("ok3"), []byte("3"))
		})
	}
}

// blockCommitter queues a batch whose callback holds the committer until the returned func is called, so
// that everything committed meanwhile is merged into the next round.
func blockCommitter(t testing.TB, d *DB) (release func()) {
	started, unblock := make(chan struct{}), make(chan struct{})
	var b Batch
	b.Set([]byte("blocker"), []byte("x"))
	d.Commit(&b, func(err error) {
		close(started)
		<-unblock
	})
	<-started
	return func() { close(unblock) }
}

func TestCallbacksInSubmissionOrder(t *testing.T) {
	d := openT(t, Options{Dir: t.TempDir()})
	release := blockCommitter(t, d)
	txns := d.Stats().Txns

	const n = 500
	var order []int
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		var b Batch
		b.Set(MessageKey(1, uint64(i)), value(i, 1024))
		if i%3 == 0 {
			b.Delete(MessageKey(1, uint64(i))) // later op in a batch wins
		}
		d.Commit(&b, func(err error) {
			if err != nil {
				t.Errorf("batch %d: %v", i, err)
			}
			order = append(order, i) // callbacks run on the one committer goroutine
			wg.Done()
		})
	}
	d.Commit(&Batch{}, nil) // empty batch, nil callback
	release()
	wg.Wait()
	for i, v := range order {
		if v != i {
			t.Fatalf("callback %d was for batch %d", i, v)
		}
	}
	if got := d.Stats().Txns - txns; got != 1 {
		t.Errorf("%d batches queued behind a blocked committer took %d transactions, want 1", n, got)
	}
	for i := range n {
		_, err := d.Get(MessageKey(1, uint64(i)))
		if i%3 == 0 && !errors.Is(err, ErrNotFound) || i%3 != 0 && err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
}

func TestBackPressureAndCommitFromCallback(t *testing.T) {
	d := openT(t, Options{Dir: t.TempDir(), NoSync: true, maxPendingOps: 4})

	// A callback may call Commit even when the queue is full: no deadlock.
	var wg sync.WaitGroup
	wg.Add(10)
	var first Batch
	first.Set([]byte("first"), []byte("1"))
	d.Commit(&first, func(error) {
		for i := range 10 {
			var b Batch
			b.Set([]byte(fmt.Sprintf("from-callback-%d", i)), []byte("x"))
			d.Commit(&b, func(err error) {
				if err != nil {
					t.Errorf("commit from callback: %v", err)
				}
				wg.Done()
			})
		}
	})
	wg.Wait()
	mustGet(t, d, []byte("from-callback-9"), []byte("x"))

	// With the committer busy, a publisher blocks once 4 operations are queued.
	started, unblock := make(chan struct{}), make(chan struct{})
	var blocker Batch
	blocker.Set([]byte("blocker"), []byte("x"))
	d.Commit(&blocker, func(error) {
		d.mu.Lock()
		d.inCallbacks = false // pretend the committer is busy committing rather than calling back
		d.mu.Unlock()
		close(started)
		<-unblock
	})
	<-started
	var returned atomic.Int32
	errs := make(chan error, 10)
	go func() {
		for i := range 10 {
			var b Batch
			b.Set([]byte(fmt.Sprintf("bp-%d", i)), []byte("x"))
			d.Commit(&b, func(err error) { errs <- err })
			returned.Add(1)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for returned.Load() < 4 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // give a wrongly unblocked publisher time to show itself
	if got := returned.Load(); got != 4 {
		t.Fatalf("%d Commit calls returned with the queue bound at 4 operations, want 4", got)
	}
	close(unblock)
	for range 10 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func TestCloseWhileBusy(t *testing.T) {
	d := openT(t, Options{Dir: t.TempDir(), NoSync: true})
	var b Batch
	b.Set([]byte("k"), value(1, 2048))
	if err := d.CommitSync(&b); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var acked, closedErrs atomic.Int64
	for w := range 4 {
		wg.Add(2)
		go func() { // writer
			defer wg.Done()
			for i := 0; ; i++ {
				var b Batch
				b.Set(MessageKey(uint64(w), uint64(i)), value(i, 1024))
				err := d.CommitSync(&b)
				if errors.Is(err, ErrClosed) {
					closedErrs.Add(1)
					return
				}
				if err != nil {
					t.Errorf("CommitSync: %v", err)
					return
				}
				acked.Add(1)
			}
		}()
		go func() { // reader
			defer wg.Done()
			for {
				_, err := d.Get([]byte("k"))
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Get: %v", err)
					return
				}
				if err := d.Scan([]byte("k"), false, func(k, v []byte) error { return nil }); errors.Is(err, ErrClosed) {
					return
				}
			}
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for acked.Load() < 200 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if closedErrs.Load() != 4 {
		t.Fatalf("%d writers saw ErrClosed, want 4", closedErrs.Load())
	}
}

func TestConcurrentCommitsAreMerged(t *testing.T) {
	d := openT(t, Options{Dir: t.TempDir()}) // real fsync per transaction
	const workers, perWorker = 8, 2000
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b Batch
			for i := range perWorker {
				b.Set(MessageKey(uint64(w), uint64(i)), value(i, 1024))
				if err := d.CommitSync(&b); err != nil {
					t.Errorf("CommitSync: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	s := d.Stats()
	t.Logf("%d workers x %d CommitSync: Batches=%d Txns=%d Ops=%d in %v (%.0f batches/s, %.0f txns/s)",
		workers, perWorker, s.Batches, s.Txns, s.Ops, el, float64(s.Batches)/el.Seconds(), float64(s.Txns)/el.Seconds())
	if s.Batches != workers*perWorker || s.Ops != workers*perWorker {
		t.Fatalf("Batches=%d Ops=%d, want %d", s.Batches, s.Ops, workers*perWorker)
	}
	if s.Txns >= s.Batches/4 {
		t.Fatalf("Txns=%d not much smaller than Batches=%d: commits are not merged", s.Txns, s.Batches)
	}
	for w := range workers {
		mustGet(t, d, MessageKey(uint64(w), perWorker-1), value(perWorker-1, 1024))
	}
}

func TestRoundLargerThanOneTxn(t *testing.T) {
	d := openT(t, Options{Dir: t.TempDir(), NoSync: true})
	// 16 MiB memtable: one badger transaction holds about 2.4 MB of LSM data. Values under the 512-byte
	// threshold are stored in the LSM tree, so 60,000 x 300 bytes is about 8x that, in one batch...
	var big Batch
	for i := range 60000 {
		big.Set(MessageKey(1, uint64(i)), value(i, 300))
	}
	txns := d.Stats().Txns
	if err := d.CommitSync(&big); err != nil {
		t.Fatalf("CommitSync of an oversized batch: %v", err)
	}
	if got := d.Stats().Txns - txns; got < 2 {
		t.Errorf("oversized batch took %d transactions; expected a split", got)
	}
	// ... and many batches merged into one round.
	release := blockCommitter(t, d)
	errs := make(chan error, 1000)
	for i := range 1000 {
		var b Batch
		for j := range 50 {
			b.Set(MessageKey(2, uint64(i*50+j)), value(j, 300))
		}
		d.Commit(&b, func(err error) { errs <- err })
	}
	release()
	for range 1000 {
		if err := <-errs; err != nil {
			t.Fatalf("batch failed: %v", err)
		}
	}
	for _, q := range []uint64{1, 2} {
		n := 0
		if err := d.Scan(MessagePrefix(q), true, func(k, v []byte) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		if n != 50000 && n != 60000 {
			t.Fatalf("queue %d has %d keys", q, n)
		}
	}
	mustGet(t, d, MessageKey(1, 59999), value(59999, 300))
	mustGet(t, d, MessageKey(2, 49999), value(49, 300))
}

func TestRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	d := openT(t, Options{Dir: dir})
	var b Batch
	for i := range 1000 {
		b.Set(MessageKey(3, uint64(i)), value(i, 2000))
	}
	b.Set(SeqKey("queue-id"), []byte{0, 0, 0, 9})
	if err := d.CommitSync(&b); err != nil {
		t.Fatal(err)
	}
	b.Delete(MessageKey(3, 5))
	if err := d.CommitSync(&b); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	var cb Batch
	cb.Set([]byte("late"), nil)
	var lateErr error
	d.Commit(&cb, func(err error) { lateErr = err })
	if !errors.Is(lateErr, ErrClosed) {
		t.Fatalf("Commit after Close gave %v, want ErrClosed", lateErr)
	}
	if _, err := d.Get([]byte("late")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close gave %v, want ErrClosed", err)
	}

	d2 := openT(t, Options{Dir: dir})
	for i := range 1000 {
		_, err := d2.Get(MessageKey(3, uint64(i)))
		if i == 5 && !errors.Is(err, ErrNotFound) || i != 5 && err != nil {
			t.Fatalf("after restart key %d: %v", i, err)
		}
	}
	mustGet(t, d2, MessageKey(3, 999), value(999, 2000))
	mustGet(t, d2, SeqKey("queue-id"), []byte{0, 0, 0, 9})
}

// crashChild commits forever with CommitSync from 4 goroutines, printing each acknowledged key id.
// Key ids are round<<40 | worker<<32 | i, so rounds never touch each other's keys.
func crashChild(dir string, round uint64) {
	d, err := Open(Options{Dir: dir, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b Batch
			for i := uint64(0); ; i++ {
				id := round<<40 | uint64(w)<<32 | i
				b.Set(MessageKey(1, id), value(int(i), 1024))
				if i%2 == 1 {
					b.Delete(MessageKey(1, id-1)) // an ack of the previous message
				}
				if err := d.CommitSync(&b); err != nil {
					fmt.Fprintln(os.Stderr, "commit:", err)
					os.Exit(3)
				}
				mu.Lock()
				fmt.Fprintf(out, "%d\n", id)
				out.Flush()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

func startChild(t *testing.T, mode, dir string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "WARREN_STORAGE_TEST_DIR="+dir)
	cmd.Env = append(cmd.Env, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if _, err := cmd.StdinPipe(); err != nil { // held open until the child exits
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("child stderr:\n%s", stderr.String())
		}
	})
	return cmd, bufio.NewScanner(stdout)
}

func TestCrashKeepsAcknowledgedWrites(t *testing.T) {
	dir := t.TempDir()
	acked := map[uint64]bool{}
	for round := range 3 {
		cmd, sc := startChild(t, "crash", dir, fmt.Sprintf("WARREN_STORAGE_TEST_ROUND=%d", round))
		want := 200 + round*150
		n := 0
		for n < want && sc.Scan() {
			id, err := strconv.ParseUint(sc.Text(), 10, 64)
			if err != nil {
				t.Fatalf("child printed %q", sc.Text())
			}
			acked[id] = true
			n++
		}
		if n < want {
			t.Fatalf("child stopped after %d acks", n)
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for sc.Scan() { // acks printed before the kill landed
			if id, err := strconv.ParseUint(sc.Text(), 10, 64); err == nil {
				acked[id] = true
			}
		}
		_ = cmd.Wait()

		logger, logs := testLogger(t)
		d, err := Open(Options{Dir: dir, Logger: logger})
		if err != nil {
			t.Fatalf("reopen after kill %d: %v", round, err)
		}
		present := 0
		for id := range acked {
			i := id & 0xffffffff
			v, err := d.Get(MessageKey(1, id))
			switch {
			case i%2 == 0 && acked[id+1]: // deleted by an acknowledged batch
				if err == nil {
					t.Errorf("kill %d: key %x was deleted by an acknowledged batch but is present", round, id)
				}
				continue
			case i%2 == 0 && errors.Is(err, ErrNotFound):
				// Deleted by the next batch, which was durable but not acknowledged before the kill:
				// then that batch's own key must be there too.
				if _, err := d.Get(MessageKey(1, id+1)); err != nil {
					t.Errorf("kill %d: acknowledged key %x lost (and %x absent: %v)", round, id, id+1, err)
				}
				continue
			case err != nil:
				t.Errorf("kill %d: acknowledged key %x lost: %v", round, id, err)
				continue
			case !bytes.Equal(v, value(int(i), 1024)):
				t.Errorf("kill %d: key %x has a wrong value", round, id)
			}
			present++
		}
		t.Logf("kill %d: %d acknowledged batches so far, %d keys checked present; log: %s",
			round, len(acked), present, strings.TrimSpace(logs.String()))
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if t.Failed() {
			return
		}
	}
}

func lockChild(dir string) {
	d, err := Open(Options{Dir: dir})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(0)
	}
	fmt.Println("locked")
	_, _ = io.Copy(io.Discard, os.Stdin) // hold the lock until the parent closes stdin or kills us
	_ = d.Close()
}

func TestLock(t *testing.T) {
	dir := t.TempDir()
	d := openT(t, Options{Dir: dir})
	abs, _ := filepath.Abs(dir)
	wantText := fmt.Sprintf("data directory %s is in use by another Warren process (pid %d)", abs, os.Getpid())

	// Same process: flock is per open file description, so a second Open must fail too.
	_, err := Open(Options{Dir: dir})
	if !errors.Is(err, ErrLocked) || err.Error() != wantText {
		t.Fatalf("second Open in the same process: %v\nwant %q (ErrLocked)", err, wantText)
	}
	// Another process.
	_, sc := startChild(t, "lock", dir)
	if !sc.Scan() || sc.Text() != "error: "+wantText {
		t.Fatalf("child Open said %q, want %q", sc.Text(), "error: "+wantText)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	// The child holds it now; we get its pid.
	cmd, sc := startChild(t, "lock", dir)
	if !sc.Scan() || sc.Text() != "locked" {
		t.Fatalf("child could not lock a free directory: %q", sc.Text())
	}
	_, err = Open(Options{Dir: dir})
	want := fmt.Sprintf("data directory %s is in use by another Warren process (pid %d)", abs, cmd.Process.Pid)
	if !errors.Is(err, ErrLocked) || err.Error() != want {
		t.Fatalf("Open while a child holds the lock: %v\nwant %q", err, want)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	// A killed holder releases the lock.
	d3 := openT(t, Options{Dir: dir})
	_ = d3.Close()
}

func TestFormat(t *testing.T) {
	dir := t.TempDir()
	abs, _ := filepath.Abs(dir)
	d := openT(t, Options{Dir: dir})
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "FORMAT"))
	if err != nil || string(data) != "warren-storage 1\n" {
		t.Fatalf("FORMAT = %q, %v", data, err)
	}
	cases := []struct{ content, found string }{
		{"warren-storage 99\n", "format version 99"},
		{"garbage", `FORMAT file containing "garbage"`},
	}
	for _, c := range cases {
		if err := os.WriteFile(filepath.Join(dir, "FORMAT"), []byte(c.content), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Open(Options{Dir: dir})
		want := fmt.Sprintf("data directory %s was written by an incompatible storage format (found %s, this Warren uses 1)", abs, c.found)
		if !errors.Is(err, ErrFormat) || err.Error() != want {
			t.Fatalf("FORMAT %q: Open = %v\nwant %q (ErrFormat)", c.content, err, want)
		}
	}
	if err := os.Remove(filepath.Join(dir, "FORMAT")); err != nil {
		t.Fatal(err)
	}
	_, err = Open(Options{Dir: dir})
	want := fmt.Sprintf("data directory %s was written by an incompatible storage format (found badger files without a FORMAT file, this Warren uses 1)", abs)
	if !errors.Is(err, ErrFormat) || err.Error() != want {
		t.Fatalf("no FORMAT: Open = %v\nwant %q", err, want)
	}
	// The lock was released by the failed Opens.
	if err := os.WriteFile(filepath.Join(dir, "FORMAT"), []byte("warren-storage 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	openT(t, Options{Dir: dir})
}

// newestDataVlog returns the newest *.vlog file in dir holding more than its header.
func newestDataVlog(t *testing.T, dir string) (string, int64) {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(dir, "*.vlog"))
	var best string
	var bestID uint64
	var size int64
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil || st.Size() <= 64 {
			continue
		}
		if id := fileID(filepath.Base(p)); best == "" || id > bestID {
			best, bestID, size = p, id, st.Size()
		}
	}
	if best == "" {
		t.Fatalf("no value-log file with data in %s (%v)", dir, paths)
	}
	return best, size
}

func TestTornValueLogTail(t *testing.T) {
	for _, damage := range []string{"garbage", "truncate"} {
		t.Run(damage, func(t *testing.T) {
			dir := t.TempDir()
			d := openT(t, Options{Dir: dir})
			const n = 200
			for i := range n {
				var b Batch
				b.Set(MessageKey(1, uint64(i)), value(i, 1024))
				if err := d.CommitSync(&b); err != nil {
					t.Fatal(err)
				}
			}
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			path, size := newestDataVlog(t, dir)
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			intact := n
			switch damage {
			case "garbage":
				junk := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef, 0x17}, 1000)
				_, err = f.WriteAt(junk, size)
			case "truncate":
				err = f.Truncate(size - 100) // cut the last entry in half
				intact = n - 1
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}

			logger, logs := testLogger(t)
			d2 := openT(t, Options{Dir: dir, Logger: logger})
			if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "incomplete or damaged entry") ||
				!strings.Contains(logs.String(), filepath.Base(path)) {
				t.Errorf("no Warn about the damaged tail of %s; log:\n%s", path, logs.String())
			}
			t.Logf("log: %s", strings.TrimSpace(logs.String()))
			for i := range intact {
				mustGet(t, d2, MessageKey(1, uint64(i)), value(i, 1024))
			}
			if intact < n {
				if _, err := d2.Get(MessageKey(1, n-1)); !errors.Is(err, ErrCorrupt) {
					t.Errorf("Get of the key whose value was cut off = %v, want ErrCorrupt", err)
				}
				seen := 0
				if err := d2.Scan(MessagePrefix(1), false, func(k, v []byte) error { seen++; return nil }); err != nil {
					t.Fatal(err)
				}
				if seen != n-1 {
					t.Errorf("Scan gave %d records, want %d (the damaged one skipped)", seen, n-1)
				}
			}
			// The store keeps working.
			var b Batch
			b.Set([]byte("after"), value(1, 2048))
			if err := d2.CommitSync(&b); err != nil {
				t.Fatal(err)
			}
			mustGet(t, d2, []byte("after"), value(1, 2048))
		})
	}
}

func TestValueLogGC(t *testing.T) {
	dir := t.TempDir()
	d := openT(t, Options{Dir: dir, NoSync: true, GCInterval: -1, valueLogFileSize: 1 << 20})
	for round := range 8 {
		var b Batch
		for i := range 1000 {
			b.Set(MessageKey(1, uint64(round*1000+i)), value(i, 1024))
		}
		if err := d.CommitSync(&b); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.DeleteRange(MessagePrefix(1)); err != nil {
		t.Fatal(err)
	}
	before := d.Stats()
	// Discard statistics reach the GC through flushes/compactions; poll with a deadline.
	deadline := time.Now().Add(10 * time.Second)
	rewrites := 0
	for rewrites == 0 && time.Now().Before(deadline) {
		var b Batch
		for i := range 2000 { // push memtables to disk so discard stats are computed
			b.Set(MessageKey(2, uint64(i)), value(i, 100))
		}
		if err := d.CommitSync(&b); err != nil {
			t.Fatal(err)
		}
		if err := d.bdb.Flatten(1); err != nil {
			t.Fatal(err)
		}
		rewrites = d.runGC()
	}
	after := d.Stats()
	t.Logf("vlog GC: %d rewrites; vlog bytes %d -> %d", rewrites, before.VlogBytes, after.VlogBytes)
	if rewrites == 0 {
		t.Skip("badger found no value-log file to rewrite in time (discard stats are asynchronous)")
	}
}

func TestEmptyLogFileLeftByKill(t *testing.T) {
	dir := t.TempDir()
	d := openT(t, Options{Dir: dir})
	var b Batch
	b.Set([]byte("k"), value(1, 1000))
	if err := d.CommitSync(&b); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// What a kill between badger's truncate-to-zero and unlink leaves behind.
	for _, name := range []string{"000099.mem", "000098.vlog"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	logger, logs := testLogger(t)
	d2 := openT(t, Options{Dir: dir, Logger: logger})
	mustGet(t, d2, []byte("k"), value(1, 1000))
	if !strings.Contains(logs.String(), "000099.mem") {
		t.Errorf("no log line about the empty file; log:\n%s", logs.String())
	}
}

func TestKeys(t *testing.T) {
	q, m, ok := ParseMessageKey(MessageKey(1<<40+5, 7))
	if !ok || q != 1<<40+5 || m != 7 {
		t.Fatal("MessageKey round trip")
	}
	if !bytes.HasPrefix(MessageKey(9, 1), MessagePrefix(9)) || bytes.HasPrefix(MessageKey(9, 1), MessagePrefix(8)) {
		t.Fatal("MessagePrefix")
	}
	if bytes.Compare(MessageKey(1, 255), MessageKey(1, 256)) >= 0 || bytes.Compare(MessageKey(1, 1<<63), MessageKey(2, 0)) >= 0 {
		t.Fatal("keys do not sort numerically")
	}
	if s, f, ok := ParseStreamChunkKey(StreamChunkKey(3, 4)); !ok || s != 3 || f != 4 {
		t.Fatal("StreamChunkKey")
	}
	if g, i, ok := ParseRaftLogKey(RaftLogKey(5, 6)); !ok || g != 5 || i != 6 || !bytes.HasPrefix(RaftLogKey(5, 6), RaftLogPrefix(5)) {
		t.Fatal("RaftLogKey")
	}
	if s, c, ok := ParseStreamOffsetKey(StreamOffsetKey(2, "consumer-1")); !ok || s != 2 || c != "consumer-1" {
		t.Fatal("StreamOffsetKey")
	}
	if k, n, ok := ParseMetaKey(MetaKey(4, "amq.direct")); !ok || k != 4 || n != "amq.direct" || !bytes.HasPrefix(MetaKey(4, "x"), MetaPrefix(4)) {
		t.Fatal("MetaKey")
	}
	if _, _, ok := ParseMessageKey(StreamChunkKey(1, 2)); ok {
		t.Fatal("ParseMessageKey accepted another prefix")
	}
	if got := U64Key(PrefixQueueState, 1, []byte("a"), []byte("bc")); !bytes.Equal(got, []byte{3, 0, 0, 0, 0, 0, 0, 0, 1, 'a', 'b', 'c'}) {
		t.Fatalf("U64Key = %x", got)
	}
	if !bytes.Equal(QueueStateKey(1, []byte("abc")), U64Key(PrefixQueueState, 1, []byte("abc"))) ||
		!bytes.Equal(AppendMessageKey(nil, 1, 2), MessageKey(1, 2)) {
		t.Fatal("QueueStateKey/AppendMessageKey")
	}
}

// BenchmarkCommitParallel measures group commit with fsync: every goroutine commits 1 KB batches with
// CommitSync.
func BenchmarkCommitParallel(b *testing.B) {
	d := openT(b, Options{Dir: b.TempDir()})
	body := value(1, 1024)
	var mu sync.Mutex
	next := uint64(0)
	b.SetParallelism(16)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		mu.Lock()
		next++
		q := next
		mu.Unlock()
		var batch Batch
		for i := uint64(0); pb.Next(); i++ {
			batch.Set(MessageKey(q, i), body)
			if err := d.CommitSync(&batch); err != nil {
				b.Error(err)
				return
			}
		}
	})
	el := time.Since(start).Seconds()
	s := d.Stats()
	b.ReportMetric(float64(s.Batches)/el, "batches/s")
	b.ReportMetric(float64(s.Txns)/el, "txns/s")
}

// TestLargestMessageFits: with the default options a value as large as the largest message Warren
// accepts (16 MiB, RabbitMQ 4.x's max_message_size) plus a record header commits and reads back whole
// (badger refuses values larger than a value-log file, which the defaults keep small), and a value
// larger than a value-log file is refused with an error, not a crash.
func TestLargestMessageFits(t *testing.T) {
	d := openT(t, Options{Dir: t.TempDir(), NoSync: true, GCInterval: -1})
	big := value(3, 16<<20+64<<10)
	var b Batch
	b.Set(U64Key(0x05, 1), big)
	if err := d.CommitSync(&b); err != nil {
		t.Fatalf("commit a %d-byte value: %v", len(big), err)
	}
	got, err := d.Get(U64Key(0x05, 1))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, big) {
		t.Fatalf("read back %d bytes, want the %d written", len(got), len(big))
	}
	b.Set(U64Key(0x05, 2), value(4, int(defaultValueLogFileSize)))
	if err := d.CommitSync(&b); err == nil {
		t.Fatal("a value as large as a value-log file was accepted")
	}
}

// TestOpenAfterLargerMemtables: a store left by a crash while it ran with larger memtables (16 MiB,
// the default before 8 MiB) holds write-ahead logs with more than an 8 MiB arena takes; opening it
// with today's defaults replays them whole instead of dying in badger's "Arena too small" panic.
func TestOpenAfterLargerMemtables(t *testing.T) {
	dir := t.TempDir()
	d := openT(t, Options{Dir: dir, GCInterval: -1, memTableSize: 16 << 20})
	const n = 120_000 // about 12 MiB of entries: more than an 8 MiB memtable, less than a 16 MiB one
	var b Batch
	for i := range n {
		b.Set(U64U64Key(0x05, 9, uint64(i+1)), value(i, 100))
		if b.Len() == 1000 {
			if err := d.CommitSync(&b); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A copy of the directory while the store is open is what a kill -9 leaves (everything was synced).
	crashed := filepath.Join(t.TempDir(), "crashed")
	if out, err := exec.Command("cp", "-a", dir, crashed).CombinedOutput(); err != nil {
		t.Fatalf("copy the data directory: %v: %s", err, out)
	}
	if err := os.Remove(filepath.Join(crashed, lockFileName)); err != nil {
		t.Fatal(err)
	}
	d2 := openT(t, Options{Dir: crashed, GCInterval: -1})
	got := 0
	if err := d2.Scan(U64Key(0x05, 9), true, func(_, _ []byte) error { got++; return nil }); err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Fatalf("recovered %d keys, want %d", got, n)
	}
}
