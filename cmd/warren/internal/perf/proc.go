package perf

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"warren/server/netserve"
)

// brokerProc is a Warren broker the bench starts itself: `<bin> serve` on a free loopback
// port with a fresh temporary data directory each time it starts (restart keeps both).
type brokerProc struct {
	bin    string
	base   string // temporary directory holding data directories and logs
	starts int

	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	addr   string        // host:port the broker listens on
	uri    string
	data   string

	// name, port and extra serve a node of a bench-started cluster: a fixed AMQP port (0: a
	// free one each start) and more `serve` flags.
	name  string
	port  int
	extra []string
}

func newBrokerProc(bin string) (*brokerProc, error) {
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find this executable to start Warren: %w", err)
		}
		bin = exe
	}
	base, err := os.MkdirTemp("", "warren-bench-")
	if err != nil {
		return nil, fmt.Errorf("create bench directory: %w", err)
	}
	return &brokerProc{bin: bin, base: base}, nil
}

// start runs the broker on a new free port with a new data directory and waits until it
// accepts AMQP connections.
func (b *brokerProc) start(ctx context.Context) error {
	port := b.port
	if port == 0 {
		var err error
		if port, err = netserve.FreePort(); err != nil {
			return err
		}
	}
	b.data = filepath.Join(b.base, fmt.Sprintf("data%s-%d", b.name, b.starts+1))
	b.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	b.uri = "amqp://guest:guest@" + b.addr + "/"
	return b.launch(ctx, 50*time.Millisecond, 20*time.Second)
}

// restart stops the broker with SIGTERM and starts it again on the same data directory and
// port. It returns how long the old process took to exit, and how long after the new one was
// started its port accepted a TCP connection (polled every 10 ms, for at most limit).
func (b *brokerProc) restart(ctx context.Context, limit time.Duration) (stopped, accepted time.Duration, err error) {
	if b.cmd == nil {
		return 0, 0, errors.New("broker not running")
	}
	began := time.Now()
	b.stopKeepData()
	stopped = time.Since(began)
	began = time.Now()
	if err := b.launch(ctx, 10*time.Millisecond, limit); err != nil {
		return stopped, 0, err
	}
	return stopped, time.Since(began), nil
}

// launch runs `serve` on b.addr and b.data and polls the port until it accepts.
func (b *brokerProc) launch(ctx context.Context, poll, limit time.Duration) error {
	b.starts++
	logPath := filepath.Join(b.base, fmt.Sprintf("warren%s-%d.log", b.name, b.starts))
	logFile, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("create broker log: %w", err)
	}
	defer logFile.Close() // the child keeps its own descriptor
	addr := b.addr
	args := append([]string{"serve", "--amqp-listen", addr, "--http-listen", "", "--prometheus-listen", "", "--stream-listen", "", "--data-dir", b.data, "--log-level", "warn"}, b.extra...)
	cmd := exec.Command(b.bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s serve: %w", b.bin, err)
	}
	b.cmd = cmd
	b.exited = make(chan struct{})
	exited := b.exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s serve exited at start-up (log: %s)", b.bin, logPath)
		case <-ctx.Done():
			b.stop()
			return ctx.Err()
		case <-time.After(poll):
		}
		if time.Now().After(deadline) {
			b.stop()
			return fmt.Errorf("%s serve did not listen on %s within %s (log: %s)", b.bin, addr, limit, logPath)
		}
	}
}

// pid is the running broker's process id, 0 if none.
func (b *brokerProc) pid() int {
	if b.cmd == nil || b.cmd.Process == nil {
		return 0
	}
	return b.cmd.Process.Pid
}

// stop sends SIGTERM, waits up to 15 s, then kills; it removes the data directory.
func (b *brokerProc) stop() {
	if b.cmd == nil {
		return
	}
	b.stopKeepData()
	_ = os.RemoveAll(b.data)
}

// stopKeepData is stop without removing the data directory.
func (b *brokerProc) stopKeepData() {
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(15 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
	b.cmd = nil
}

// close stops the broker and removes the bench directory.
func (b *brokerProc) close() {
	b.stop()
	_ = os.RemoveAll(b.base)
}

// readRSS returns the resident set size of process pid in bytes, from /proc/PID/status.
func readRSS(pid int) (uint64, error) {
	return readStatusKB(pid, "VmRSS:")
}

func readStatusKB(pid int, field string) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read memory of process %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			kb, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s of process %d: %w", field, pid, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// openFilesLimit returns the soft open-files limit of process pid, from /proc/PID/limits.
func openFilesLimit(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, fmt.Errorf("read limits of process %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				return strconv.ParseUint(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no open-files limit in /proc/%d/limits", pid)
}

// uriPort returns the TCP port an AMQP URI points at.
func uriPort(uri string) (int, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return 0, fmt.Errorf("parse URI: %w", err)
	}
	p := u.Port()
	if p == "" {
		if u.Scheme == "amqps" {
			return 5671, nil
		}
		return 5672, nil
	}
	return strconv.Atoi(p)
}

// pidListeningOn finds the process listening on a local TCP port: the socket's inode from
// /proc/net/tcp (and tcp6), then the process holding that inode among /proc/*/fd.
func pidListeningOn(port int) (int, error) {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" { // 0A: LISTEN
				continue
			}
			i := strings.LastIndexByte(fields[1], ':')
			lp, err := strconv.ParseUint(fields[1][i+1:], 16, 16)
			if err != nil || int(lp) != port {
				continue
			}
			inodes["socket:["+fields[9]+"]"] = true
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("no listening socket on port %d", port)
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("list processes: %w", err)
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fdDir := filepath.Join("/proc", p.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, fd := range fds {
			if link, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil && inodes[link] {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no readable process holds the socket listening on port %d", port)
}

// pidByCommand finds a process whose executable name is exe and whose command line or
// environment contains every one of words.
func pidByCommand(exe string, words ...string) (int, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("list processes: %w", err)
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if filepath.Base(args[0]) != exe {
			continue
		}
		line := strings.Join(args, " ")
		// RabbitMQ's scripts pass the node name through the environment (RABBITMQ_NODENAME).
		if env, err := os.ReadFile(filepath.Join("/proc", p.Name(), "environ")); err == nil {
			line += " " + strings.ReplaceAll(string(env), "\x00", " ")
		}
		ok := true
		for _, w := range words {
			ok = ok && strings.Contains(line, w)
		}
		if ok {
			return pid, nil
		}
	}
	return 0, errors.New("no " + exe + " process with " + strings.Join(words, " ") + " on its command line")
}

// selfCPU is the CPU time (user + system) this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is the CPU time (user + system) process pid has used, from /proc/PID/stat
// (clock ticks of 1/100 s, Linux's USER_HZ).
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read CPU time of process %d: %w", pid, err)
	}
	// The command name, in parentheses, may hold spaces: fields start after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat times", pid)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}
