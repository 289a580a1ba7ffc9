package perf

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"
)

// FloorConfig describes a loopback floor measurement: what the latency scenario would measure
// if the broker did nothing but send every byte straight back. Messages of Size bytes, paced at
// Rate per second for Duration, go to a TCP echo server in another process and their round trip
// is timed as S5 times a delivery: one write in the tool, a wake-up and a write in the server, a
// wake-up in the tool.
type FloorConfig struct {
	Addr     string        // echo server to use; empty: start Bin's `perf echo-server`
	Bin      string        // binary to start the echo server from (default: this executable)
	Rate     float64       // messages per second (default 1,000)
	Size     int           // bytes per message, at least 8 (default 1,024)
	Duration time.Duration // default 10s
}

// FloorResult is a floor measurement.
type FloorResult struct {
	Sent     uint64       `json:"sent"`
	Received uint64       `json:"received"`
	Latency  LatencyStats `json:"latency_us"`
}

// Floor measures the loopback floor as cfg describes.
func Floor(ctx context.Context, cfg FloorConfig) (*FloorResult, error) {
	if cfg.Rate <= 0 {
		cfg.Rate = 1000
	}
	if cfg.Size < 8 {
		cfg.Size = 1024
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 10 * time.Second
	}
	addr := cfg.Addr
	if addr == "" {
		child, a, err := startEchoServer(cfg.Bin)
		if err != nil {
			return nil, err
		}
		defer child.stop()
		addr = a
	}
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("connect to the echo server: %w", err)
	}
	defer conn.Close()

	var hist histogram
	var received uint64
	readDone := make(chan error, 1)
	go func() {
		buf := make([]byte, cfg.Size)
		for {
			if _, err := io.ReadFull(conn, buf); err != nil {
				readDone <- err
				return
			}
			now := time.Now().UnixNano()
			hist.record(time.Duration(now - int64(binary.BigEndian.Uint64(buf))))
			received++
		}
	}()

	msg := make([]byte, cfg.Size)
	interval := float64(time.Second) / cfg.Rate
	pace := time.NewTimer(time.Hour)
	defer pace.Stop()
	start := time.Now()
	var sent uint64
	var werr error
	for time.Since(start) < cfg.Duration && ctx.Err() == nil {
		if d := time.Until(start.Add(time.Duration(float64(sent) * interval))); d > 0 {
			pace.Reset(d)
			select {
			case <-pace.C:
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
		}
		binary.BigEndian.PutUint64(msg, uint64(time.Now().UnixNano()))
		if _, werr = conn.Write(msg); werr != nil {
			break
		}
		sent++
	}
	// Let the last replies arrive, then end the reader by closing our side.
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	if tc, ok := conn.(*net.TCPConn); ok && werr == nil {
		_ = tc.CloseWrite() // the echo server closes its side once it has sent everything
	}
	rerr := <-readDone
	if werr != nil {
		return nil, fmt.Errorf("write to the echo server: %w", werr)
	}
	if !errors.Is(rerr, io.EOF) {
		return nil, fmt.Errorf("read from the echo server: %w", rerr)
	}
	var snap histSnapshot
	snap.addFinal(&hist)
	return &FloorResult{Sent: sent, Received: received, Latency: snap.stats()}, nil
}

// echoChild is an echo server running as a child process.
type echoChild struct{ cmd *exec.Cmd }

// startEchoServer runs `bin perf echo-server` and returns its address, which the child prints
// as its first line.
func startEchoServer(bin string) (*echoChild, string, error) {
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, "", fmt.Errorf("find this executable: %w", err)
		}
		bin = exe
	}
	cmd := exec.Command(bin, "perf", "echo-server", "--listen", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start %s perf echo-server: %w", bin, err)
	}
	c := &echoChild{cmd: cmd}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		c.stop()
		return nil, "", fmt.Errorf("%s perf echo-server printed no address: %w", bin, err)
	}
	return c, strings.TrimSpace(line), nil
}

func (c *echoChild) stop() {
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

// serveEcho accepts connections on ln and sends every byte back until ctx ends; a connection is
// closed once its client has closed its sending side and everything was echoed.
func serveEcho(ctx context.Context, ln net.Listener) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	defer stop()
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(c, c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			c.Close()
		}()
	}
}

func floorCommands() []*cli.Command {
	return []*cli.Command{
		{
			Name:  "floor",
			Usage: "time paced round trips through a TCP echo server in another process: the least latency S5 could show on this machine",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "echo", Usage: "`ADDRESS` of an echo server to use; empty: start `warren perf echo-server`"},
				&cli.Float64Flag{Name: "rate", Value: 1000, Usage: "messages per second"},
				&cli.IntFlag{Name: "size", Value: 1024, Usage: "message `BYTES` (at least 8)"},
				&cli.DurationFlag{Name: "duration", Value: 10 * time.Second, Usage: "how long to send"},
				&cli.BoolFlag{Name: "json", Usage: "print the result as one JSON object"},
			},
			Action: func(c *cli.Context) error {
				ctx, stop := signalContext(c)
				defer stop()
				res, err := Floor(ctx, FloorConfig{Addr: c.String("echo"), Rate: c.Float64("rate"), Size: c.Int("size"), Duration: c.Duration("duration")})
				if err != nil {
					return fmt.Errorf("perf floor: %w", err)
				}
				if c.Bool("json") {
					return writeJSON(c.App.Writer, res)
				}
				l := res.Latency
				_, err = fmt.Fprintf(c.App.Writer, "loopback floor: p50 %.0f µs  p75 %.0f µs  p95 %.0f µs  p99 %.0f µs  max %.0f µs  (%d of %d messages back)\n",
					l.P50, l.P75, l.P95, l.P99, l.Max, res.Received, res.Sent)
				return err
			},
		},
		{
			Name:   "echo-server",
			Usage:  "a TCP echo server for `perf floor` (prints its address, then serves until interrupted)",
			Hidden: true,
			Flags:  []cli.Flag{&cli.StringFlag{Name: "listen", Value: "127.0.0.1:0", Usage: "`ADDRESS` to listen on"}},
			Action: func(c *cli.Context) error {
				ln, err := net.Listen("tcp", c.String("listen"))
				if err != nil {
					return fmt.Errorf("perf echo-server: %w", err)
				}
				fmt.Fprintln(c.App.Writer, ln.Addr().String())
				ctx, stop := signalContext(c)
				defer stop()
				return serveEcho(ctx, ln)
			},
		},
	}
}
