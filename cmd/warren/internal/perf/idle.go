package perf

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// IdleResult describes a --connections-only run.
type IdleResult struct {
	Requested   int     `json:"requested"`
	Opened      int     `json:"opened"`
	Failed      int     `json:"failed"`
	OpenSeconds float64 `json:"open_seconds"`
	OpenRate    float64 `json:"open_rate"` // connections per second
	HeldSeconds float64 `json:"held_seconds"`
	FirstError  string  `json:"first_error,omitempty"`
}

// idleConns is a set of open idle connections.
type idleConns struct {
	conns []*amqp.Connection
	res   IdleResult
}

const (
	idleDialers  = 32 // connections opened at once
	idleMaxFails = 64 // after this many failures no new connection is attempted
)

// openIdle opens up to n connections with one channel each. It stops trying after
// idleMaxFails failures (a broker out of file descriptors would otherwise make every attempt
// wait for its timeout) or when ctx ends.
func openIdle(ctx context.Context, uri string, n int) *idleConns {
	ic := &idleConns{res: IdleResult{Requested: n}}
	var (
		mu     sync.Mutex
		next   atomic.Int64
		failed atomic.Int64
		wg     sync.WaitGroup
	)
	start := time.Now()
	for w := 0; w < idleDialers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && failed.Load() < idleMaxFails {
				if int(next.Add(1)) > n {
					return
				}
				conn, err := amqp.DialConfig(uri, amqp.Config{Locale: "en_US", Dial: amqp.DefaultDial(5 * time.Second)})
				if err == nil {
					if _, cerr := conn.Channel(); cerr != nil {
						_ = conn.Close()
						err = fmt.Errorf("open channel: %w", cerr)
					}
				}
				mu.Lock()
				if err != nil {
					failed.Add(1)
					ic.res.Failed++
					if ic.res.FirstError == "" {
						ic.res.FirstError = err.Error()
					}
				} else {
					ic.conns = append(ic.conns, conn)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	ic.res.Opened = len(ic.conns)
	ic.res.OpenSeconds = time.Since(start).Seconds()
	if ic.res.OpenSeconds > 0 {
		ic.res.OpenRate = float64(ic.res.Opened) / ic.res.OpenSeconds
	}
	return ic
}

// close closes every connection, several at a time.
func (ic *idleConns) close() {
	var wg sync.WaitGroup
	work := make(chan *amqp.Connection)
	for w := 0; w < idleDialers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range work {
				_ = c.CloseDeadline(time.Now().Add(5 * time.Second))
			}
		}()
	}
	for _, c := range ic.conns {
		work <- c
	}
	close(work)
	wg.Wait()
	ic.conns = nil
}

// runIdle performs a --connections-only run.
func runIdle(ctx context.Context, cfg RunConfig) (*Result, error) {
	if err := raiseFileLimit(); err != nil {
		return nil, err
	}
	ic := openIdle(ctx, cfg.URI, cfg.ConnectionsOnly)
	defer ic.close()
	if ic.res.Opened == 0 {
		return nil, fmt.Errorf("no connection opened to %s: %s", redact(cfg.URI), ic.res.FirstError)
	}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "%d connections open (%d failed) in %.2f s; holding them for %s\n",
			ic.res.Opened, ic.res.Failed, ic.res.OpenSeconds, cfg.Duration)
	}
	if cfg.OnPhase != nil {
		cfg.OnPhase("hold")
	}
	held := time.Now()
	t := time.NewTimer(cfg.Duration)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	ic.res.HeldSeconds = time.Since(held).Seconds()
	res := ic.res
	if cfg.OnPhase != nil {
		cfg.OnPhase("done")
	}
	return &Result{Connections: &res}, nil
}

// raiseFileLimit raises this process's soft limit on open files to its hard limit, so that
// thousands of connections fit; child processes (a broker the bench starts) inherit it.
func raiseFileLimit() error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("read open-files limit: %w", err)
	}
	// Set it even when it is already at the maximum (Go raises it at start-up): an explicit
	// Setrlimit stops Go from restoring the original limit in child processes.
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("raise open-files limit to %d: %w", lim.Max, err)
	}
	return nil
}
