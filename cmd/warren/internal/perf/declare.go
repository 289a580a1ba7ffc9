package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DeclareConfig describes a declare run: what a new user does to a broker with many queues.
// Queues durable classic queues are declared, each bound to amq.direct with its own name as
// routing key, by Channels channels working in parallel (each takes the next number, declares
// the queue, binds it, and waits for both replies before taking another).
type DeclareConfig struct {
	URI         string
	Queues      int           // queue+bind pairs to declare
	Channels    int           // channels declaring in parallel (default 8)
	Connections int           // the channels are spread over this many connections (default 1)
	Pattern     string        // queue names, a fmt pattern with one %d numbered from 1 (default "perf-declare-%d")
	Window      int           // pairs over which the first and last rates are taken (default 1,000)
	Timeout     time.Duration // bound on the declaring; 0: none. Reaching it is not an error
	// PID, when not 0, is the broker's process: its CPU time is read as the first and the last
	// window begin and end, giving the broker's CPU cost per pair.
	PID int
	// Progress, when set, receives a line every ProgressEvery (default 10 s).
	Progress      io.Writer
	ProgressEvery time.Duration
}

func (c *DeclareConfig) setDefaults() {
	if c.Channels == 0 {
		c.Channels = 8
	}
	if c.Connections == 0 {
		c.Connections = 1
	}
	if c.Pattern == "" {
		c.Pattern = "perf-declare-%d"
	}
	if c.Window == 0 {
		c.Window = 1000
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = 10 * time.Second
	}
}

func (c *DeclareConfig) validate() error {
	switch {
	case c.Queues < 1:
		return errors.New("at least one queue must be declared")
	case c.Channels < 1 || c.Connections < 1:
		return errors.New("channels and connections must be at least 1")
	case c.Connections > c.Channels:
		return fmt.Errorf("%d connections for %d channels: every connection needs a channel", c.Connections, c.Channels)
	case c.Window < 1:
		return errors.New("the rate window must be at least 1 pair")
	}
	return nil
}

// DeclareResult is what a declare run measured. Rates are queue+bind pairs per second, taken
// from the moment the pairs completed (both replies in), in the order they completed.
type DeclareResult struct {
	Requested   int     `json:"requested"`
	Declared    int     `json:"declared"` // pairs completed
	Channels    int     `json:"channels"`
	Connections int     `json:"connections"`
	Window      int     `json:"window"`
	Seconds     float64 `json:"seconds"`    // from the first declare to the last bind-ok
	Rate        float64 `json:"rate"`       // Declared / Seconds
	FirstRate   float64 `json:"first_rate"` // over the first Window pairs (all of them if fewer)
	LastRate    float64 `json:"last_rate"`  // over the last Window pairs completed
	// Broker CPU milliseconds per pair over the first and the last window (for a run cut short,
	// from the last window edge before its last window); 0 if not read.
	FirstCPUms float64 `json:"first_cpu_ms_per_pair,omitempty"`
	LastCPUms  float64 `json:"last_cpu_ms_per_pair,omitempty"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	Last       string  `json:"last"` // the queue whose pair completed last
	FirstError string  `json:"first_error,omitempty"`
}

// declareClock records when each pair completed, and the broker's CPU time at the window edges.
type declareClock struct {
	start  time.Time
	n      int // pairs asked for
	window int
	pid    int

	done  atomic.Int64 // pairs completed
	at    []int64      // at[k]: nanoseconds from start to the k-th completion (at[0] = 0)
	which []int32      // which[k]: the number of the queue of the k-th completion

	cpuMu   sync.Mutex
	cpu     map[int]time.Duration // broker CPU time at completion count k (0: at start)
	cpuErr  error
	cpuWant map[int]bool
}

func newDeclareClock(n, window, pid int) *declareClock {
	c := &declareClock{n: n, window: window, pid: pid, at: make([]int64, n+1), which: make([]int32, n+1), cpu: map[int]time.Duration{}}
	// Every window's end, so that a run cut short by its timeout still has a reading near the
	// start of its last window; and the exact edges of a full run's last window.
	w := min(window, n)
	c.cpuWant = map[int]bool{w: true, n - w: true, n: true}
	if c.pid != 0 {
		for k := w; k <= n; k += w {
			c.cpuWant[k] = true
		}
	}
	return c
}

// end takes the last CPU reading once every writer has stopped.
func (c *declareClock) end() {
	if d := int(c.done.Load()); d > 0 {
		c.cpuMu.Lock()
		_, ok := c.cpu[d]
		c.cpuMu.Unlock()
		if !ok {
			c.readCPU(d)
		}
	}
}

// begin starts the clock.
func (c *declareClock) begin() {
	c.readCPU(0)
	c.start = time.Now()
}

// complete records that queue number q's pair is done.
func (c *declareClock) complete(q int) {
	k := int(c.done.Add(1))
	c.at[k] = int64(time.Since(c.start))
	c.which[k] = int32(q)
	if c.cpuWant[k] {
		c.readCPU(k)
	}
}

func (c *declareClock) readCPU(k int) {
	if c.pid == 0 {
		return
	}
	v, err := procCPU(c.pid)
	c.cpuMu.Lock()
	defer c.cpuMu.Unlock()
	if err != nil {
		c.cpuErr = err
		return
	}
	c.cpu[k] = v
}

// cpuPerPair is the broker's CPU milliseconds per pair between completion counts a and b, or,
// when there is no reading at a, from the last reading before a.
func (c *declareClock) cpuPerPair(a, b int) float64 {
	c.cpuMu.Lock()
	defer c.cpuMu.Unlock()
	y, ok := c.cpu[b]
	if !ok {
		return 0
	}
	from := -1
	for k := range c.cpu {
		if k <= a && k > from {
			from = k
		}
	}
	if from < 0 || b <= from {
		return 0
	}
	return float64(y-c.cpu[from]) / float64(time.Millisecond) / float64(b-from)
}

// fill sets the result's counts and rates from the completions recorded so far. Every writer
// must have stopped.
func (c *declareClock) fill(res *DeclareResult) {
	d := int(c.done.Load())
	res.Declared = d
	if d == 0 {
		return
	}
	res.Seconds = time.Duration(c.at[d]).Seconds()
	res.Rate = windowRate(c.at, 0, d)
	w := min(c.window, d)
	res.FirstRate = windowRate(c.at, 0, w)
	res.LastRate = windowRate(c.at, d-w, d)
	res.FirstCPUms = c.cpuPerPair(0, w)
	res.LastCPUms = c.cpuPerPair(d-w, d)
}

// windowRate is the completions per second between completion counts a and b (a < b), where
// at[k] is the time of the k-th completion in nanoseconds and at[0] the start.
func windowRate(at []int64, a, b int) float64 {
	if b <= a || b >= len(at) {
		return 0
	}
	dt := time.Duration(at[b] - at[a]).Seconds()
	if dt <= 0 {
		return 0
	}
	return float64(b-a) / dt
}

// declareChannels opens cfg.Channels channels spread over cfg.Connections connections.
func declareChannels(uri, name string, channels, connections int) ([]*amqp.Connection, []*amqp.Channel, error) {
	var conns []*amqp.Connection
	var chans []*amqp.Channel
	closeAll := func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	for i := 0; i < connections; i++ {
		props := amqp.NewConnectionProperties()
		props.SetClientConnectionName(fmt.Sprintf("%s %d", name, i+1))
		conn, err := amqp.DialConfig(uri, amqp.Config{Properties: props, Locale: "en_US", Dial: amqp.DefaultDial(10 * time.Second)})
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("connect to %s: %w", redact(uri), err)
		}
		conns = append(conns, conn)
	}
	for i := 0; i < channels; i++ {
		ch, err := conns[i%connections].Channel()
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("open channel %d: %w", i+1, err)
		}
		chans = append(chans, ch)
	}
	return conns, chans, nil
}

// Declare runs cfg. It returns an error only when nothing could be declared at all (no
// connection); a refused declare ends the run and is reported in FirstError, and reaching
// cfg.Timeout ends it with TimedOut set.
func Declare(ctx context.Context, cfg DeclareConfig) (*DeclareResult, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	conns, chans, err := declareChannels(cfg.URI, "warren-perf declare", cfg.Channels, cfg.Connections)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range conns {
			_ = c.CloseDeadline(time.Now().Add(10 * time.Second))
		}
	}()
	res := &DeclareResult{Requested: cfg.Queues, Channels: cfg.Channels, Connections: cfg.Connections, Window: cfg.Window}
	clock := newDeclareClock(cfg.Queues, cfg.Window, cfg.PID)
	var (
		next     atomic.Int64
		stop     atomic.Bool
		errOnce  sync.Once
		timedOut atomic.Bool
		wg       sync.WaitGroup
	)
	var deadline time.Time
	if cfg.Timeout > 0 {
		deadline = time.Now().Add(cfg.Timeout)
	}
	fail := func(err error) {
		errOnce.Do(func() { res.FirstError = err.Error() })
		stop.Store(true)
	}
	clock.begin()
	for _, ch := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if ctx.Err() != nil {
					stop.Store(true)
					return
				}
				if !deadline.IsZero() && time.Now().After(deadline) {
					timedOut.Store(true)
					stop.Store(true)
					return
				}
				q := int(next.Add(1))
				if q > cfg.Queues {
					return
				}
				name := fmt.Sprintf(cfg.Pattern, q)
				if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
					fail(fmt.Errorf("declare %s: %w", name, err))
					return
				}
				if err := ch.QueueBind(name, name, "amq.direct", false, nil); err != nil {
					fail(fmt.Errorf("bind %s to amq.direct: %w", name, err))
					return
				}
				clock.complete(q)
			}
		}()
	}
	stopProgress := declareProgress(&cfg, clock, &wg)
	wg.Wait()
	stopProgress()
	clock.end()
	clock.fill(res)
	res.TimedOut = timedOut.Load()
	if res.Declared > 0 {
		res.Last = fmt.Sprintf(cfg.Pattern, clock.which[res.Declared])
	}
	if res.Declared == 0 && res.FirstError != "" {
		return res, fmt.Errorf("nothing declared: %s", res.FirstError)
	}
	return res, nil
}

// declareProgress writes a line every cfg.ProgressEvery while the workers of wg run.
func declareProgress(cfg *DeclareConfig, clock *declareClock, wg *sync.WaitGroup) (stop func()) {
	if cfg.Progress == nil {
		return func() {}
	}
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(cfg.ProgressEvery)
		defer t.Stop()
		last := 0
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			d := int(clock.done.Load())
			fmt.Fprintf(cfg.Progress, "declare: %s of %s pairs after %.0f s (%s pairs/s over the last %s)\n",
				fmtInt(uint64(d)), fmtInt(uint64(cfg.Queues)), time.Since(clock.start).Seconds(),
				fmtRate(float64(d-last)/cfg.ProgressEvery.Seconds()), cfg.ProgressEvery)
			last = d
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// queueCheck is the outcome of checkQueues.
type queueCheck struct {
	Present      int
	Missing      int
	FirstMissing string
	Err          error // the check could not finish
}

// checkQueues passively declares queues 1..n of pattern over channels channels and counts the
// ones the broker has.
func checkQueues(ctx context.Context, uri, pattern string, n, channels int) queueCheck {
	conns, chans, err := declareChannels(uri, "warren-perf declare check", channels, 1)
	if err != nil {
		return queueCheck{Err: err}
	}
	defer func() { _ = conns[0].CloseDeadline(time.Now().Add(10 * time.Second)) }()
	var (
		next     atomic.Int64
		mu       sync.Mutex
		res      queueCheck
		firstMis = n + 1
		wg       sync.WaitGroup
	)
	for i := range chans {
		wg.Add(1)
		go func(ch *amqp.Channel) {
			defer wg.Done()
			for ctx.Err() == nil {
				q := int(next.Add(1))
				if q > n {
					return
				}
				_, err := ch.QueueDeclarePassive(fmt.Sprintf(pattern, q), true, false, false, false, nil)
				mu.Lock()
				var ae *amqp.Error
				switch {
				case err == nil:
					res.Present++
				case errors.As(err, &ae) && ae.Code == amqp.NotFound:
					res.Missing++
					firstMis = min(firstMis, q)
				default:
					if res.Err == nil {
						res.Err = fmt.Errorf("passive declare of %s: %w", fmt.Sprintf(pattern, q), err)
					}
				}
				failed := err != nil
				mu.Unlock()
				if failed {
					// A 404 closes the channel: carry on with a new one.
					if ch, err = conns[0].Channel(); err != nil {
						mu.Lock()
						if res.Err == nil {
							res.Err = fmt.Errorf("reopen channel: %w", err)
						}
						mu.Unlock()
						return
					}
				}
			}
		}(chans[i])
	}
	wg.Wait()
	if res.Missing > 0 {
		res.FirstMissing = fmt.Sprintf(pattern, firstMis)
	}
	if res.Err == nil && ctx.Err() != nil {
		res.Err = ctx.Err()
	}
	return res
}

// checkBindings publishes one transient message through amq.direct with each named queue's
// name as routing key and gets it back from that queue: the binding routes.
func checkBindings(ctx context.Context, uri string, names []string) error {
	conn, err := dial(uri, "warren-perf declare binding check")
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	for _, name := range names {
		if err := ch.PublishWithContext(ctx, "amq.direct", name, true, false, amqp.Publishing{Body: []byte("binding check")}); err != nil {
			return fmt.Errorf("publish to amq.direct with key %s: %w", name, err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, ok, err := ch.Get(name, true)
			if err != nil {
				return fmt.Errorf("get from %s: %w", name, err)
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("a message published to amq.direct with key %s did not reach queue %s within 5s", name, name)
			}
			if !sleepCtx(ctx, 10*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	return nil
}

// deleteQueues deletes queues 1..n of pattern over channels channels; a queue that does not
// exist counts as deleted (RabbitMQ and Warren reply delete-ok). It returns the first error.
func deleteQueues(ctx context.Context, uri, pattern string, n, channels int) error {
	conns, chans, err := declareChannels(uri, "warren-perf declare cleanup", channels, 1)
	if err != nil {
		return err
	}
	defer func() { _ = conns[0].CloseDeadline(time.Now().Add(10 * time.Second)) }()
	var (
		next     atomic.Int64
		errOnce  sync.Once
		firstErr error
		wg       sync.WaitGroup
	)
	for _, ch := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				q := int(next.Add(1))
				if q > n {
					return
				}
				if _, err := ch.QueueDelete(fmt.Sprintf(pattern, q), false, false, false); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("delete %s: %w", fmt.Sprintf(pattern, q), err) })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}
