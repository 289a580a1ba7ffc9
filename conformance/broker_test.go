package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"warren/server/netserve"
)

const (
	// envBin names a prebuilt warren binary; without it TestMain builds ./cmd/warren once.
	envBin = "WARREN_BIN"
	// envAddr points the tests at an already running broker (host:port, user guest/guest)
	// instead of starting the binary. Tests that need their own process then skip.
	envAddr = "WARREN_CONFORMANCE_ADDR"
)

// env is what TestMain prepared for the tests. It is written once, before any test runs.
type env struct {
	bin    string  // path of the warren binary ("" in external mode)
	shared *broker // the broker most tests share
}

var testEnv env

// envOrphanProbe makes the test binary the parent of TestChildrenDieWithTheHarness instead of
// running the tests.
const envOrphanProbe = "WARREN_CONFORMANCE_ORPHAN_PROBE"

func TestMain(m *testing.M) {
	if os.Getenv(envOrphanProbe) != "" {
		os.Exit(orphanProbe())
	}
	os.Exit(runMain(m))
}

// startChild starts a process the tests own (a broker, a client driver, Prometheus). The kernel
// kills it when the test binary dies (Pdeathsig), so an interrupted or timed-out run leaves no
// broker behind holding its ports and data directory. Pdeathsig follows the thread that started
// the child; Go keeps its threads unless a goroutine exits while locked to one, which these tests
// never do.
func startChild(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	return cmd.Start()
}

// orphanProbe starts a long sleep with startChild, prints its pid and waits to be killed.
func orphanProbe() int {
	cmd := exec.Command("sleep", "300")
	if err := startChild(cmd); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(cmd.Process.Pid)
	time.Sleep(time.Hour)
	return 0
}

func runMain(m *testing.M) int {
	raiseFileLimit()
	tmp, err := os.MkdirTemp("", "warren-conformance-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "conformance: %v\n", err)
		return 1
	}
	defer os.RemoveAll(tmp)

	if addr := os.Getenv(envAddr); addr != "" {
		testEnv.shared = &broker{Addr: addr, URL: "amqp://guest:guest@" + addr + "/"}
		return m.Run()
	}

	root, err := repoRoot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "conformance: %v\n", err)
		return 1
	}
	testEnv.bin = os.Getenv(envBin)
	switch {
	case testEnv.bin == "":
		testEnv.bin = filepath.Join(tmp, "warren")
		if err := buildWarren(root, testEnv.bin); err != nil {
			fmt.Fprintf(os.Stderr, "conformance: %v\n", err)
			return 1
		}
	case !filepath.IsAbs(testEnv.bin):
		// go test runs in the package directory; a relative path means the repository root,
		// where one would type `WARREN_BIN=bin/warren go test ./conformance/`.
		testEnv.bin = filepath.Join(root, testEnv.bin)
	}

	shared, err := launchBroker(testEnv.bin, filepath.Join(tmp, "shared"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "conformance: start shared broker: %v\n", err)
		return 1
	}
	testEnv.shared = shared
	code := m.Run()
	if err := shared.exitedEarly(); err != nil {
		fmt.Fprintf(os.Stderr, "conformance: the shared broker died during the tests: %v\nits log:\n%s\n",
			err, shared.logs())
		code = 1
	}
	if err := shared.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "conformance: stopping the shared broker: %v\nits log:\n%s\n", err, shared.logs())
		code = 1
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "conformance: shared broker log (last 4 KB):\n%s\n", tail(shared.logs(), 4096))
	}
	return code
}

// repoRoot returns the repository's top directory (the parent of this package's source).
func repoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the conformance package source")
	}
	return filepath.Dir(filepath.Dir(file)), nil
}

// buildWarren compiles root/cmd/warren into out.
func buildWarren(root, out string) error {
	cmd := exec.Command("go", "build", "-o", out, "./cmd/warren")
	cmd.Dir = root
	var outBuf bytes.Buffer
	cmd.Stdout = &outBuf
	cmd.Stderr = &outBuf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/warren in %s: %w\n%s", root, err, outBuf.String())
	}
	return nil
}

// raiseFileLimit lifts the soft open-file limit to the hard one. Calling Setrlimit explicitly
// also makes brokers started from this process inherit the raised limit.
func raiseFileLimit() {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	lim.Cur = lim.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// sharedBroker returns the broker most tests use: the one TestMain started, or the external
// one named by WARREN_CONFORMANCE_ADDR.
func sharedBroker(t testing.TB) *broker {
	t.Helper()
	if err := testEnv.shared.exitedEarly(); err != nil {
		t.Fatalf("the shared broker is no longer running: %v\nits log:\n%s", err, tail(testEnv.shared.logs(), 4096))
	}
	return testEnv.shared
}

// ownBroker starts a broker process for this test alone and stops it when the test ends.
// In external mode (WARREN_CONFORMANCE_ADDR set) the test is skipped.
func ownBroker(t testing.TB) *broker {
	t.Helper()
	if testEnv.bin == "" {
		t.Skipf("needs its own warren process; %s is set", envAddr)
	}
	b, err := launchBroker(testEnv.bin, t.TempDir())
	if err != nil {
		t.Fatalf("start broker: %v", err)
	}
	t.Cleanup(func() {
		if err := b.stop(); err != nil {
			t.Errorf("stop broker: %v", err)
		}
		if t.Failed() {
			t.Logf("broker log (last 4 KB):\n%s", tail(b.logs(), 4096))
		}
	})
	return b
}

// broker is a warren process started by the tests, or an external broker (cmd == nil).
type broker struct {
	Addr string // host:port of the AMQP listener
	URL  string // amqp://guest:guest@Addr/

	cmd     *exec.Cmd
	out     *syncBuffer
	done    chan struct{} // closed when the process has exited
	waitErr error         // valid after done is closed
}

// external reports whether the broker was started outside the tests.
func (b *broker) external() bool { return b.cmd == nil }

// PID of the broker process (0 for an external broker).
func (b *broker) PID() int {
	if b.cmd == nil {
		return 0
	}
	return b.cmd.Process.Pid
}

// launchBroker starts `warren serve` on a free loopback port with its data in dataDir and
// waits until it accepts connections. A port taken between probing and binding is retried.
func launchBroker(bin, dataDir string, extraArgs ...string) (*broker, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := netserve.FreePort()
		if err != nil {
			return nil, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		b := &broker{
			Addr: addr,
			URL:  "amqp://guest:guest@" + addr + "/",
			out:  &syncBuffer{},
			done: make(chan struct{}),
		}
		args := append([]string{"serve", "--amqp-listen", addr, "--http-listen", "", "--prometheus-listen", "", "--stream-listen", "", "--data-dir", dataDir}, extraArgs...)
		b.cmd = exec.Command(bin, args...)
		b.cmd.Stdout = b.out
		b.cmd.Stderr = b.out
		if err := startChild(b.cmd); err != nil {
			return nil, fmt.Errorf("start %s: %w", bin, err)
		}
		go func() {
			b.waitErr = b.cmd.Wait()
			close(b.done)
		}()
		if err := b.waitAccepting(15 * time.Second); err != nil {
			lastErr = err
			_ = b.kill()
			continue
		}
		return b, nil
	}
	return nil, lastErr
}

// waitAccepting polls until the broker accepts a TCP connection, its process exits, or d passes.
func (b *broker) waitAccepting(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		select {
		case <-b.done:
			return fmt.Errorf("warren exited before accepting connections (%v); output:\n%s", b.waitErr, b.logs())
		default:
		}
		nc, err := net.DialTimeout("tcp", b.Addr, time.Second)
		if err == nil {
			nc.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("warren did not accept on %s within %v: %v; output:\n%s", b.Addr, d, err, b.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exitedEarly returns an error if a started broker's process has already exited.
func (b *broker) exitedEarly() error {
	if b == nil || b.cmd == nil {
		return nil
	}
	select {
	case <-b.done:
		return fmt.Errorf("warren exited: %v", b.waitErr)
	default:
		return nil
	}
}

// signal sends sig to the broker process.
func (b *broker) signal(sig os.Signal) error {
	return b.cmd.Process.Signal(sig)
}

// wait waits up to d for the process to exit and returns its exit error (nil = status 0).
func (b *broker) wait(d time.Duration) (exited bool, err error) {
	select {
	case <-b.done:
		return true, b.waitErr
	case <-time.After(d):
		return false, nil
	}
}

// stop sends SIGTERM and waits for a clean exit; after 15 s it kills the process.
// It returns an error if the broker had to be killed or exited with a non-zero status.
func (b *broker) stop() error {
	if b.cmd == nil {
		return nil
	}
	select {
	case <-b.done:
		return nil // already gone; exitedEarly reports that where it matters
	default:
	}
	if err := b.signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("SIGTERM: %w", err)
	}
	if exited, err := b.wait(15 * time.Second); exited {
		if err != nil {
			return fmt.Errorf("warren exited with %v after SIGTERM", err)
		}
		return nil
	}
	_ = b.kill()
	return errors.New("warren did not exit within 15s of SIGTERM; killed")
}

// kill ends the process at once and waits for it.
func (b *broker) kill() error {
	if b.cmd == nil {
		return nil
	}
	_ = b.cmd.Process.Kill()
	<-b.done
	return nil
}

// logs returns everything the process wrote to stdout and stderr so far.
func (b *broker) logs() string {
	if b == nil || b.out == nil {
		return ""
	}
	return b.out.String()
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "...\n" + s
}

// syncBuffer is a bytes.Buffer that a process writes while tests read it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
