package conformance

// Disk full: a broker whose data directory's file system fills up with persistent messages nacks
// publishes instead of crashing (badger writes through memory mappings, so a full disk would be a
// SIGBUS), starts again on a disk that is completely full, lets consumers drain, finds every
// confirmed message, and gets its space back once they have. See storage/space.go.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	diskFullFS     = 160 << 20 // the tmpfs: the size the SIGBUS was first seen with
	diskFullBody   = 16 << 10  // persistent message body
	diskFullWindow = 64        // unconfirmed publishes in flight
	diskFullQueue  = "diskfull"
)

// TestDiskFull fills a 160 MiB tmpfs with persistent 16 KB messages under confirms, once with the
// disk alarm off (--disk-free-limit 0: the storage reserve alone stops the publisher, with nacks),
// once with it on (50MB), and once into a quorum queue with it off, then SIGKILLs the broker, fills
// what is left of the file system, restarts the broker on it, drains the queue and checks that every
// confirmed message is there, none twice, and (classic queues) that the alarm clears once the drained
// space is reclaimed.
func TestDiskFull(t *testing.T) {
	for _, tc := range []struct {
		name, limit string
		args        amqp.Table
	}{
		{"alarm off", "0", nil},
		{"alarm on", "50MB", nil},
		{"quorum queue, alarm off", "0", amqp.Table{"x-queue-type": "quorum"}},
	} {
		t.Run(tc.name, func(t *testing.T) { testDiskFull(t, tc.limit, tc.args) })
	}
}

func testDiskFull(t *testing.T, limit string, queueArgs amqp.Table) {
	if testEnv.bin == "" {
		t.Skipf("needs its own warren process; %s is set", envAddr)
	}
	mnt := mountTmpfs(t, diskFullFS)
	n := newNodeAt(t, filepath.Join(mnt, "data"), "--disk-free-limit", limit)
	startLog := n.b.logs()

	// Fill.
	f := fillDisk(t, n.b, queueArgs)
	freeAtKill := fsFree(t, mnt)
	t.Logf("filled: published %d, confirmed %d, nacked %d, unconfirmed %d; %d KiB free on the tmpfs",
		f.published, len(f.confirmed), len(f.nacked), f.published-len(f.confirmed)-len(f.nacked), freeAtKill>>10)
	fillLog := n.b.logs()
	if len(f.confirmed) == 0 {
		t.Fatalf("no publish was confirmed\nbroker log:\n%s", tail(fillLog, 4096))
	}
	if !f.blocked {
		t.Errorf("the publisher never got connection.blocked")
	}
	if limit == "0" && !strings.Contains(fillLog, "storage: free disk space is down to the reserve") {
		t.Errorf("with the disk alarm off, the storage reserve did not stop the publisher\nbroker log:\n%s", tail(fillLog, 4096))
	}
	if _, err := os.Stat(filepath.Join(n.dir, "BALLAST")); err != nil {
		t.Errorf("no ballast file after the fill: %v", err)
	}

	// SIGKILL, then take the rest of the file system, as another process could.
	n.kill9()
	filler := fillFS(t, mnt)
	t.Logf("filler file took %d KiB; %d KiB free", filler>>10, fsFree(t, mnt)>>10)

	// The broker starts on the full disk, with the alarm raised.
	n.start()
	restartLog := n.b.logs()
	for _, want := range []string{"storage: gave up the ballast file", "disk alarm raised"} {
		if !waitLog(n.b, want, 5*time.Second) {
			t.Errorf("after the restart on a full disk the log has no %q\nbroker log:\n%s", want, tail(n.b.logs(), 4096))
		}
	}

	// Drain.
	conn, err := amqp.Dial(n.b.URL)
	if err != nil {
		t.Fatalf("dial after the restart: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	got := drainQueue(t, ch, diskFullQueue, 2*time.Minute)
	seen := make(map[int]int, len(got))
	recoveredNacked, recoveredUnconfirmed := 0, 0
	for _, d := range got {
		id, ok := diskFullID(d.Body)
		if !ok || id >= f.published {
			t.Fatalf("drained a message that was not published: %q", abbrev(d.Body))
		}
		seen[id]++
		switch {
		case f.nacked[id]:
			recoveredNacked++
		case !f.confirmed[id]:
			recoveredUnconfirmed++
		}
	}
	var missing, twice []int
	for id := range f.confirmed {
		if seen[id] == 0 {
			missing = append(missing, id)
		}
	}
	for id, c := range seen {
		if c > 1 {
			twice = append(twice, id)
		}
	}
	t.Logf("%s; recovered %d messages: %d confirmed, %d nacked, %d unconfirmed; %d confirmed ones missing, %d delivered twice",
		storageNumbers(startLog), len(got), len(got)-recoveredNacked-recoveredUnconfirmed, recoveredNacked,
		recoveredUnconfirmed, len(missing), len(twice))
	if len(missing) > 0 {
		t.Errorf("%d confirmed messages were lost (ids %v...)", len(missing), missing[:min(10, len(missing))])
	}
	if len(twice) > 0 {
		t.Errorf("%d messages were delivered twice in one drain (ids %v...)", len(twice), twice[:min(10, len(twice))])
	}

	// The drained space comes back (reclaim and value-log GC), although the filler is still there:
	// the alarm clears and publishes are confirmed again. A quorum queue's acks are raft entries: its
	// space comes back after raft's next snapshot (checked every 30-60 s), which this test does not wait for.
	if queueArgs["x-queue-type"] == "quorum" {
		return
	}
	if !waitLog(n.b, "disk alarm cleared", 60*time.Second) {
		t.Fatalf("the disk alarm did not clear within 60 s of the drain (%d KiB free)\nbroker log since the restart:\n%s",
			fsFree(t, mnt)>>10, tail(strings.TrimPrefix(n.b.logs(), restartLog), 6<<10))
	}
	t.Logf("after the drain: %d KiB free", fsFree(t, mnt)>>10)
	pch := confirmChannel(t, conn)
	publishConfirmed(t, pch, "", diskFullQueue, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("after")})
	if after := drainQueue(t, ch, diskFullQueue, 10*time.Second); len(after) != 1 || string(after[0].Body) != "after" {
		t.Fatalf("after the drain got %q, want [after]", bodies(after))
	}
}

// drainQueue consumes queue on ch (prefetch 500, acks with multiple every 100 deliveries) until it is
// empty: nothing delivered for 500 ms, everything acked, and queue.declare-ok counting no message.
// It fails the test if that takes longer than d.
func drainQueue(t *testing.T, ch *amqp.Channel, queue string, d time.Duration) []amqp.Delivery {
	t.Helper()
	if err := ch.Qos(500, 0, false); err != nil {
		t.Fatalf("basic.qos: %v", err)
	}
	tag := fmt.Sprintf("drain-%d", time.Now().UnixNano())
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("basic.consume on %q: %v", queue, err)
	}
	var out []amqp.Delivery
	unacked := 0
	deadline := time.After(d)
	for {
		select {
		case m, ok := <-deliveries:
			if !ok {
				t.Fatalf("the consumer on %q was cancelled after %d messages", queue, len(out))
			}
			out = append(out, m)
			if unacked++; unacked == 100 {
				if err := m.Ack(true); err != nil {
					t.Fatalf("ack: %v", err)
				}
				unacked = 0
			}
		case <-time.After(500 * time.Millisecond):
			if unacked > 0 {
				if err := out[len(out)-1].Ack(true); err != nil {
					t.Fatalf("ack: %v", err)
				}
				unacked = 0
			}
			q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			if err != nil {
				t.Fatalf("queue.declare passive %q: %v", queue, err)
			}
			if q.Messages == 0 {
				if err := ch.Cancel(tag, false); err != nil {
					t.Fatalf("basic.cancel: %v", err)
				}
				return out
			}
		case <-deadline:
			t.Fatalf("%q still delivered messages after %v (%d so far)", queue, d, len(out))
		}
	}
}

// fillResult is what the publisher saw.
type fillResult struct {
	published int
	confirmed map[int]bool
	nacked    map[int]bool
	blocked   bool // connection.blocked arrived
}

// fillDisk publishes persistent messages to a durable queue under confirms until the broker blocks
// the connection, and waits (bounded) for the confirms of what it sent.
func fillDisk(t *testing.T, b *broker, queueArgs amqp.Table) fillResult {
	t.Helper()
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	// The broker does not read a blocked connection, so a plain Close would wait for close-ok forever.
	defer func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
	blockings := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	ch := confirmChannel(t, conn)
	if _, err := ch.QueueDeclare(diskFullQueue, true, false, false, false, queueArgs); err != nil {
		t.Fatalf("declare: %v", err)
	}
	res := fillResult{confirmed: map[int]bool{}, nacked: map[int]bool{}}
	type inflight struct {
		id int
		dc *amqp.DeferredConfirmation
	}
	var window []inflight
	settle := func(ctx context.Context, w inflight) bool {
		ok, err := w.dc.WaitContext(ctx)
		switch {
		case err != nil:
			return false // no answer (the broker stopped reading us)
		case ok:
			res.confirmed[w.id] = true
		default:
			res.nacked[w.id] = true
		}
		return true
	}
	limit := 3 * diskFullFS / diskFullBody // bound: three times what the file system holds
	deadline := time.Now().Add(2 * time.Minute)
publish:
	for res.published < limit && time.Now().Before(deadline) {
		select {
		case b := <-blockings:
			if b.Active {
				res.blocked = true
				break publish
			}
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", diskFullQueue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			Body:         diskFullMessage(res.published),
		})
		cancel()
		if err != nil {
			if exited, werr := b.wait(5 * time.Second); exited {
				t.Fatalf("the broker died while the disk filled (after %d publishes, %d confirmed): %v\n%s",
					res.published, len(res.confirmed), werr, crashLines(b.logs()))
			}
			t.Fatalf("publish %d: %v", res.published, err)
		}
		window = append(window, inflight{id: res.published, dc: dc})
		res.published++
		if len(window) >= diskFullWindow {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			answered := settle(ctx, window[0])
			cancel()
			if !answered {
				break // blocked: the rest of the window will not be answered either
			}
			window = window[1:]
		}
	}
	if res.published >= limit {
		t.Fatalf("published %d messages of %d bytes to a %d MiB file system and was never stopped",
			res.published, diskFullBody, diskFullFS>>20)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for _, w := range window {
		settle(ctx, w)
	}
	if !res.blocked {
		select {
		case b := <-blockings:
			res.blocked = b.Active
		case <-time.After(2 * time.Second):
		}
	}
	return res
}

// diskFullMessage is message id's body: "diskfull|<id>|" then filler up to diskFullBody bytes.
func diskFullMessage(id int) []byte {
	b := make([]byte, diskFullBody)
	copy(b, fmt.Sprintf("diskfull|%d|", id))
	for i := len(fmt.Sprintf("diskfull|%d|", id)); i < len(b); i++ {
		b[i] = byte('a' + (id+i)%26)
	}
	return b
}

// diskFullID parses a body made by diskFullMessage.
func diskFullID(body []byte) (int, bool) {
	s, ok := strings.CutPrefix(string(body[:min(len(body), 32)]), "diskfull|")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(s, "|")
	if !ok {
		return 0, false
	}
	id, err := strconv.Atoi(num)
	return id, err == nil
}

// mountTmpfs mounts a tmpfs of size bytes on a new directory and unmounts it when the test ends
// (after the brokers started later are stopped: cleanups run last-in first-out).
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs as the data directory's file system needs root (CI runs the conformance tests as root)")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("cannot mount a tmpfs although running as root (no CAP_SYS_ADMIN in this container?): %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			// Something still holds a file open: detach it now, the kernel finishes when it is let go.
			if err2 := syscall.Unmount(dir, syscall.MNT_DETACH); err2 != nil {
				t.Errorf("unmount the tmpfs at %s: %v; lazy unmount: %v", dir, err, err2)
			}
		}
	})
	return dir
}

// fsFree returns the bytes available on the file system holding dir.
func fsFree(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatalf("statfs %s: %v", dir, err)
	}
	return int64(st.Bavail) * st.Bsize
}

// fillFS writes a file in dir until its file system is full and returns the bytes it took.
func fillFS(t *testing.T, dir string) int64 {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n int64
	for _, chunk := range []int{1 << 20, 4 << 10} {
		buf := make([]byte, chunk)
		for {
			w, err := f.Write(buf)
			n += int64(w)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				t.Fatalf("fill %s: %v", dir, err)
			}
		}
	}
	if free := fsFree(t, dir); free >= 64<<10 {
		t.Fatalf("%d bytes still free after filling %s", free, dir)
	}
	return n
}

// crashLines returns the head of a Go crash report in log: the fault and the first goroutine's stack.
func crashLines(log string) string {
	i := strings.Index(log, "unexpected fault address")
	if i < 0 {
		i = strings.Index(log, "fatal error")
	}
	if i < 0 {
		return tail(log, 2048)
	}
	return log[i:min(len(log), i+2048)]
}

// waitLog polls the broker's log for s for at most d.
func waitLog(b *broker, s string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if strings.Contains(b.logs(), s) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var storageSpaceLine = regexp.MustCompile(`msg="storage: disk space".*?floor_mib=(\d+) reserve_mib=(\d+).*?ballast_mib=(\d+)`)

// storageNumbers returns the floor, reserve and ballast the broker logged at start.
func storageNumbers(log string) string {
	m := storageSpaceLine.FindStringSubmatch(log)
	if m == nil {
		return "no storage disk-space line in the log"
	}
	return fmt.Sprintf("storage floor %s MiB, reserve %s MiB, ballast %s MiB", m[1], m[2], m[3])
}
