package conformance

// The warren process itself: signals, exit status, the version command, bind failures.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"warren/server/netserve"
)

// TestShutdownSignal sends SIGTERM (and, separately, SIGINT) to a broker with connected
// clients: each client receives connection.close 320 CONNECTION_FORCED and the process exits 0.
func TestShutdownSignal(t *testing.T) {
	for name, sig := range map[string]os.Signal{"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := ownBroker(t)
			var closes []chan *amqp.Error
			for i := 0; i < 3; i++ {
				conn := dial(t, b.URL)
				if _, err := conn.Channel(); err != nil {
					t.Fatalf("open channel: %v", err)
				}
				closes = append(closes, conn.NotifyClose(make(chan *amqp.Error, 1)))
			}

			if err := b.signal(sig); err != nil {
				t.Fatalf("send %s: %v", name, err)
			}
			for i, ch := range closes {
				select {
				case aerr := <-ch:
					if aerr == nil {
						t.Fatalf("client %d: connection ended without a connection.close", i)
					}
					if aerr.Code != codeConnectionForced || !aerr.Server {
						t.Errorf("client %d: close %+v; want a server-sent code 320", i, aerr)
					}
					if !strings.HasPrefix(aerr.Reason, "CONNECTION_FORCED") {
						t.Errorf("client %d: reason %q; want it to start with CONNECTION_FORCED", i, aerr.Reason)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("client %d: no connection.close within 10s of %s", i, name)
				}
			}
			exited, err := b.wait(15 * time.Second)
			if !exited {
				t.Fatalf("warren still running 15s after %s", name)
			}
			if err != nil {
				t.Fatalf("warren exited with %v after %s; want status 0", err, name)
			}
			if nc, err := net.DialTimeout("tcp", b.Addr, time.Second); err == nil {
				nc.Close()
				t.Errorf("%s still accepts connections after the broker exited", b.Addr)
			}
		})
	}
}

func TestVersionCommand(t *testing.T) {
	if testEnv.bin == "" {
		t.Skipf("needs the warren binary; %s is set", envAddr)
	}
	out, err := exec.Command(testEnv.bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("warren version: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "warren ") || len(strings.TrimSpace(string(out))) <= len("warren") {
		t.Fatalf("warren version printed %q; want \"warren <version>\"", out)
	}
}

// TestServeAddressInUse: a port that cannot be bound makes `warren serve` exit non-zero with
// a message naming the address, instead of running without a listener.
func TestServeAddressInUse(t *testing.T) {
	if testEnv.bin == "" {
		t.Skipf("needs the warren binary; %s is set", envAddr)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	cmd := exec.Command(testEnv.bin, "serve", "--amqp-listen", addr, "--http-listen", "", "--prometheus-listen", "", "--stream-listen", "", "--data-dir", t.TempDir())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := startChild(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Fatalf("warren serve on a taken port ended with %v; want a non-zero exit\n%s", err, out.String())
		}
		if !strings.Contains(out.String(), addr) {
			t.Errorf("the error output does not name %s:\n%s", addr, out.String())
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("warren serve kept running with its port taken\n%s", out.String())
	}
}

// TestServeFromEnvironment configures the listener and data directory through environment
// variables only, and checks a client can connect and the data directory is created.
func TestServeFromEnvironment(t *testing.T) {
	if testEnv.bin == "" {
		t.Skipf("needs the warren binary; %s is set", envAddr)
	}
	port, err := netserve.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	b := &broker{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), out: &syncBuffer{}, done: make(chan struct{})}
	b.URL = "amqp://guest:guest@" + b.Addr + "/"
	dataDir := filepath.Join(t.TempDir(), "nested", "data")
	b.cmd = exec.Command(testEnv.bin, "serve")
	b.cmd.Env = append(os.Environ(),
		"WARREN_AMQP_LISTEN="+b.Addr, "WARREN_DATA_DIR="+dataDir, "WARREN_LOG_LEVEL=debug", "WARREN_PROMETHEUS_LISTEN=127.0.0.1:0")
	b.cmd.Stdout, b.cmd.Stderr = b.out, b.out
	if err := startChild(b.cmd); err != nil {
		t.Fatal(err)
	}
	go func() { b.waitErr = b.cmd.Wait(); close(b.done) }()
	t.Cleanup(func() {
		if err := b.stop(); err != nil {
			t.Errorf("stop: %v\n%s", err, b.logs())
		}
	})
	if err := b.waitAccepting(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	dial(t, b.URL)
	if fi, err := os.Stat(dataDir); err != nil || !fi.IsDir() {
		t.Errorf("data dir %s not created: %v", dataDir, err)
	}
}

// TestChildrenDieWithTheHarness: a process started with startChild (every broker the tests run)
// is killed by the kernel when the test binary is SIGKILLed, e.g. by `go test -timeout` or an
// interrupted CI job, instead of living on with its ports and data directory.
func TestChildrenDieWithTheHarness(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	probe := exec.Command(self)
	probe.Env = append(os.Environ(), envOrphanProbe+"=1")
	out, err := probe.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	probe.Stderr = os.Stderr
	if err := probe.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = probe.Process.Kill()
		_ = probe.Wait()
		t.Fatalf("probe printed no child pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("probe printed %q", line)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	_ = probe.Process.Kill()
	_ = probe.Wait()
	// Gone, or a zombie waiting for whoever adopted it to reap it.
	gone := func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		i := bytes.LastIndexByte(stat, ')')
		return i > 0 && i+2 < len(stat) && stat[i+2] == 'Z'
	}
	deadline := time.Now().Add(5 * time.Second)
	for !gone() {
		if time.Now().After(deadline) {
			t.Fatalf("child %d still runs 5 s after its parent was killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
