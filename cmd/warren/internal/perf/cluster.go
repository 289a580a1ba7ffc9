package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"warren/server/cluster"
	"warren/server/netserve"
)

// ClusterConfig configures `warren perf cluster`: the per-queue cost of quorum queues on a
// cluster of nodes on loopback. Queues durable quorum queues are declared through node 1 with
// Channels channels in parallel; the nodes then idle for Idle (after Settle) while their CPU time
// is read from /proc/PID/stat, and their RSS is compared with that of the fresh nodes. With
// Failover, a publisher on another node publishes with confirms to one queue while its leader's
// node is killed (SIGKILL), and the longest confirm stall is reported.
type ClusterConfig struct {
	Bin      string        // warren binary whose `serve` is started (default: this executable)
	Nodes    int           // nodes started (default 3)
	Queues   int           // quorum queues declared through node 1 (default 300)
	Channels int           // channels declaring in parallel (default 10)
	Settle   time.Duration // pause between the last declare and the idle window (default 2 s)
	Idle     time.Duration // idle window over which CPU is measured (default 15 s)
	Failover bool          // also run the failover check
	// FailoverRun is how long the failover publisher runs after the kill (default 10 s).
	FailoverRun time.Duration
	Runs        int // whole runs (fresh cluster each); medians are reported (default 1)
	// URIs of an already running cluster (RabbitMQ), node 1 first: nothing is started, the node
	// processes are found by their AMQP port, the queues are deleted at the end, and the
	// failover check is skipped.
	URIs []string
	// ProfileDir, if set, makes every started node write a Go CPU profile of its whole run to
	// ProfileDir/<node id>.prof, heap and goroutine profiles taken when it is stopped to
	// <node id>.heap and <node id>.heap.goroutines, and its log to <node id>.log (kept after the run).
	ProfileDir string
	Log        io.Writer // progress lines; nil = none
}

// ClusterResult is one run of `warren perf cluster`.
type ClusterResult struct {
	Nodes          int       `json:"nodes"`
	Queues         int       `json:"queues"`
	Declared       int       `json:"declared"`
	Channels       int       `json:"channels"`
	DeclareSeconds float64   `json:"declare_seconds"`
	DeclareRate    float64   `json:"declare_rate"` // queues per second
	DeclareError   string    `json:"declare_error,omitempty"`
	IdleSeconds    float64   `json:"idle_seconds"`
	IdleCPU        float64   `json:"idle_cpu_percent"`       // sum over the nodes, % of one core
	NodeCPU        []float64 `json:"node_cpu_percent"`       // per node, % of one core
	FreshRSS       []uint64  `json:"fresh_rss_bytes"`        // per node, before the declares
	IdleRSS        []uint64  `json:"idle_rss_bytes"`         // per node, at the end of the idle window
	RSSPerQueue    float64   `json:"rss_per_queue_mb"`       // (sum idle - sum fresh) / queues, MB
	Failover       *Failover `json:"failover,omitempty"`     // the failover check, if run
	Notes          []string  `json:"notes,omitempty"`        // anything odd
	ToolCPU        float64   `json:"tool_cpu_percent"`       // this tool's CPU during the idle window
	MachineLoad    string    `json:"machine_load,omitempty"` // load average at the end
}

// Failover is the failover check's outcome.
type Failover struct {
	Queue       string  `json:"queue"`
	Killed      string  `json:"killed_node"`  // the queue's leader, SIGKILLed
	PublishedOn string  `json:"published_on"` // the node the publisher used
	Published   int     `json:"published"`
	Confirmed   int     `json:"confirmed"`
	Nacked      int     `json:"nacked"`
	StallMs     float64 `json:"longest_stall_ms"` // longest time without a confirm, from the kill on
	RecoverMs   float64 `json:"recover_ms"`       // kill to the first confirm of a message published after it
	Error       string  `json:"error,omitempty"`  // the publisher's channel failed
	LeaderAfter string  `json:"leader_after"`     // the queue's leader once it recovered
}

func (c *ClusterConfig) defaults() {
	if c.Nodes <= 0 {
		c.Nodes = 3
	}
	if len(c.URIs) > 0 {
		c.Nodes = len(c.URIs)
	}
	if c.Queues <= 0 {
		c.Queues = 300
	}
	if c.Channels <= 0 {
		c.Channels = 10
	}
	if c.Settle <= 0 {
		c.Settle = 2 * time.Second
	}
	if c.Idle <= 0 {
		c.Idle = 15 * time.Second
	}
	if c.FailoverRun <= 0 {
		c.FailoverRun = 10 * time.Second
	}
	if c.Runs <= 0 {
		c.Runs = 1
	}
}

func (c *ClusterConfig) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, format+"\n", args...)
	}
}

// clusterNode is one node of the measured cluster.
type clusterNode struct {
	id          string
	uri         string
	clusterAddr string // Warren only
	pid         int
	cmd         *exec.Cmd
	exited      chan struct{}
	logPath     string
}

// testCluster is the cluster a run measures: started by the tool (Warren) or given (URIs).
type testCluster struct {
	nodes []*clusterNode
	base  string // temporary directory of started nodes; "" for a given cluster
}

// startWarrenCluster starts n `warren serve` processes on free loopback ports forming one
// cluster and waits until each answers AMQP and sees a metadata leader.
func startWarrenCluster(ctx context.Context, bin string, n int, profileDir string) (*testCluster, error) {
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find this executable to start Warren: %w", err)
		}
		bin = exe
	}
	base, err := os.MkdirTemp("", "warren-perf-cluster-")
	if err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}
	tc := &testCluster{base: base}
	var peers []string
	ports, err := netserve.FreePorts(2 * n)
	if err != nil {
		tc.stop()
		return nil, err
	}
	for i := 1; i <= n; i++ {
		ap, cp := ports[2*i-2], ports[2*i-1]
		nd := &clusterNode{
			id:          fmt.Sprintf("n%d", i),
			uri:         fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", ap),
			clusterAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(cp)),
		}
		tc.nodes = append(tc.nodes, nd)
		peers = append(peers, nd.id+"="+nd.clusterAddr)
	}
	for _, nd := range tc.nodes {
		port, _ := uriPort(nd.uri)
		data := filepath.Join(base, "data-"+nd.id)
		nd.logPath = filepath.Join(base, nd.id+".log")
		if profileDir != "" {
			nd.logPath = filepath.Join(profileDir, nd.id+".log") // kept with the profiles
		}
		lf, err := os.Create(nd.logPath)
		if err != nil {
			tc.stop()
			return nil, fmt.Errorf("create node log: %w", err)
		}
		cmd := exec.Command(bin, "serve", "--amqp-listen", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			"--http-listen", "", "--prometheus-listen", "", "--stream-listen", "", "--data-dir", data, "--log-level", "warn",
			"--node-id", nd.id, "--cluster-listen", nd.clusterAddr, "--cluster-peers", strings.Join(peers, ","))
		if profileDir != "" {
			cmd.Args = append(cmd.Args, "--cpu-profile", filepath.Join(profileDir, nd.id+".prof"),
				"--heap-profile", filepath.Join(profileDir, nd.id+".heap"))
		}
		cmd.Stdout, cmd.Stderr = lf, lf
		err = cmd.Start()
		lf.Close()
		if err != nil {
			tc.stop()
			return nil, fmt.Errorf("start %s serve: %w", bin, err)
		}
		nd.cmd, nd.pid, nd.exited = cmd, cmd.Process.Pid, make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(nd.exited)
		}()
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, nd := range tc.nodes {
		for {
			err := nd.ready(ctx)
			if err == nil {
				break
			}
			select {
			case <-nd.exited:
				tc.stop()
				return nil, fmt.Errorf("node %s exited at start-up (log: %s)", nd.id, nd.logPath)
			default:
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				tc.stop()
				return nil, fmt.Errorf("node %s not ready within 60 s: %v (log: %s)", nd.id, err, nd.logPath)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return tc, nil
}

// ready reports whether a started node accepts AMQP connections and knows a metadata leader.
func (nd *clusterNode) ready(ctx context.Context) error {
	port, _ := uriPort(nd.uri)
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return err
	}
	c.Close()
	st, err := nd.status(ctx)
	if err != nil {
		return err
	}
	for _, g := range st.Groups {
		if g.ID == 0 && g.Leader != "" {
			return nil
		}
	}
	return errors.New("no metadata leader yet")
}

// status asks a Warren node for its cluster status.
func (nd *clusterNode) status(ctx context.Context) (*cluster.Status, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cluster.Admin(cctx, nd.clusterAddr, cluster.AdminRequest{Op: "status"})
	if err != nil {
		return nil, err
	}
	if resp.Error != "" || resp.Status == nil {
		return nil, fmt.Errorf("status of %s: %s", nd.id, resp.Error)
	}
	return resp.Status, nil
}

// givenCluster describes an already running cluster by its nodes' AMQP URIs.
func givenCluster(uris []string) (*testCluster, error) {
	tc := &testCluster{}
	for i, u := range uris {
		port, err := uriPort(u)
		if err != nil {
			return nil, fmt.Errorf("node %d: %w", i+1, err)
		}
		pid, err := pidListeningOn(port)
		if err != nil {
			return nil, fmt.Errorf("node %d (%s): %w", i+1, redact(u), err)
		}
		tc.nodes = append(tc.nodes, &clusterNode{id: fmt.Sprintf("node%d", i+1), uri: u, pid: pid})
	}
	return tc, nil
}

// stop ends the started nodes (SIGTERM, then SIGKILL after 20 s) and removes their data.
func (tc *testCluster) stop() {
	for _, nd := range tc.nodes {
		if nd.cmd != nil {
			_ = nd.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, nd := range tc.nodes {
		if nd.cmd == nil {
			continue
		}
		select {
		case <-nd.exited:
		case <-time.After(20 * time.Second):
			_ = nd.cmd.Process.Kill()
			<-nd.exited
		}
	}
	if tc.base != "" {
		_ = os.RemoveAll(tc.base)
	}
}

func (tc *testCluster) rss() ([]uint64, error) {
	out := make([]uint64, len(tc.nodes))
	for i, nd := range tc.nodes {
		v, err := readRSS(nd.pid)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (tc *testCluster) cpu() ([]time.Duration, error) {
	out := make([]time.Duration, len(tc.nodes))
	for i, nd := range tc.nodes {
		v, err := procCPU(nd.pid)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// progressEvery is the window, in declares, of the declare rate logged while declaring.
const progressEvery = 100

// clusterQueue is the name of the i-th queue (from 1).
func clusterQueue(i int) string { return fmt.Sprintf("perf-cluster-q-%d", i) }

// declareQueues declares queues 1..n as durable quorum queues through uri with ch channels in
// parallel, and returns how many it declared, the time it took and the first error. Every
// progressEvery declares it calls progress with the count and the rate of that last window, so a
// rate that falls as groups accumulate shows where it falls (nil: no progress).
func declareQueues(ctx context.Context, uri string, n, chans int, progress func(done int, rate float64)) (int, time.Duration, error) {
	conn, err := dial(uri, "warren-perf cluster declare")
	if err != nil {
		return 0, 0, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	var (
		next     atomic.Int64
		declared atomic.Int64
		errOnce  sync.Once
		first    error
		wg       sync.WaitGroup
	)
	args := amqp.Table{"x-queue-type": "quorum"}
	start := time.Now()
	var (
		pmu      sync.Mutex
		lastMark = start
	)
	mark := func(done int) {
		if progress == nil || done%progressEvery != 0 {
			return
		}
		pmu.Lock()
		now := time.Now()
		rate := progressEvery / now.Sub(lastMark).Seconds()
		lastMark = now
		progress(done, rate) // under pmu: calls are serial
		pmu.Unlock()
	}
	for c := 0; c < chans; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ch *amqp.Channel
			for ctx.Err() == nil {
				i := int(next.Add(1))
				if i > n {
					break
				}
				if ch == nil {
					if ch, err = conn.Channel(); err != nil {
						errOnce.Do(func() { first = err })
						return
					}
				}
				if _, err := ch.QueueDeclare(clusterQueue(i), true, false, false, false, args); err != nil {
					errOnce.Do(func() { first = fmt.Errorf("declare %s: %w", clusterQueue(i), err) })
					ch = nil // the channel is closed by the error
					continue
				}
				mark(int(declared.Add(1)))
			}
			if ch != nil {
				_ = ch.Close()
			}
		}()
	}
	wg.Wait()
	return int(declared.Load()), time.Since(start), first
}

// deleteClusterQueues deletes queues 1..n through uri (cleanup of a given cluster).
func deleteClusterQueues(uri string, n int) {
	conn, err := dial(uri, "warren-perf cluster cleanup")
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for i := 1; i <= n; i++ {
		if _, err := ch.QueueDelete(clusterQueue(i), false, false, false); err != nil {
			if ch, err = conn.Channel(); err != nil {
				return
			}
		}
	}
}

// Cluster runs the measurement cfg describes, cfg.Runs times.
func Cluster(ctx context.Context, cfg ClusterConfig) ([]*ClusterResult, error) {
	cfg.defaults()
	if err := raiseFileLimit(); err != nil {
		return nil, err
	}
	var out []*ClusterResult
	for r := 1; r <= cfg.Runs; r++ {
		cfg.logf("run %d of %d: %d nodes, %d quorum queues, %d channels", r, cfg.Runs, cfg.Nodes, cfg.Queues, cfg.Channels)
		res, err := clusterRun(ctx, cfg)
		if err != nil {
			return out, fmt.Errorf("run %d: %w", r, err)
		}
		cfg.logf("  %s", res.summary())
		out = append(out, res)
	}
	return out, nil
}

func clusterRun(ctx context.Context, cfg ClusterConfig) (*ClusterResult, error) {
	var tc *testCluster
	var err error
	if len(cfg.URIs) > 0 {
		tc, err = givenCluster(cfg.URIs)
	} else {
		tc, err = startWarrenCluster(ctx, cfg.Bin, cfg.Nodes, cfg.ProfileDir)
	}
	if err != nil {
		return nil, err
	}
	if len(cfg.URIs) > 0 {
		defer deleteClusterQueues(tc.nodes[0].uri, cfg.Queues)
	} else {
		defer tc.stop()
	}
	res := &ClusterResult{Nodes: len(tc.nodes), Queues: cfg.Queues, Channels: cfg.Channels}
	if !sleepCtx(ctx, time.Second) {
		return nil, ctx.Err()
	}
	if res.FreshRSS, err = tc.rss(); err != nil {
		return nil, err
	}
	cfg.logf("  cluster up; declaring %d quorum queues through %s", cfg.Queues, tc.nodes[0].id)
	// The nodes' CPU time per declare over each window is what a shared machine cannot skew: the
	// rate falls when other work takes the cores, the CPU per declare only when a declare costs more.
	lastCPU, _ := tc.cpu()
	n, took, derr := declareQueues(ctx, tc.nodes[0].uri, cfg.Queues, cfg.Channels, func(done int, rate float64) {
		cpu, err := tc.cpu()
		var ms float64
		if err == nil && len(lastCPU) == len(cpu) {
			for i := range cpu {
				ms += float64(cpu[i]-lastCPU[i]) / float64(time.Millisecond)
			}
			lastCPU = cpu
		}
		cfg.logf("  declared %d: %.1f/s, nodes' CPU %.1f ms per declare over the last %d (load %s)",
			done, rate, ms/progressEvery, progressEvery, loadAverage())
	})
	res.Declared, res.DeclareSeconds = n, took.Seconds()
	if took > 0 {
		res.DeclareRate = float64(n) / took.Seconds()
	}
	if derr != nil {
		res.DeclareError = derr.Error()
	}
	cfg.logf("  declared %d in %.1f s; settling %s, then idle %s", n, took.Seconds(), cfg.Settle, cfg.Idle)
	if !sleepCtx(ctx, cfg.Settle) {
		return nil, ctx.Err()
	}
	c0, err := tc.cpu()
	if err != nil {
		return nil, err
	}
	t0, self0 := time.Now(), selfCPU()
	if !sleepCtx(ctx, cfg.Idle) {
		return nil, ctx.Err()
	}
	c1, err := tc.cpu()
	if err != nil {
		return nil, err
	}
	wall := time.Since(t0)
	res.IdleSeconds = wall.Seconds()
	res.ToolCPU = 100 * (selfCPU() - self0).Seconds() / wall.Seconds()
	for i := range c0 {
		p := 100 * (c1[i] - c0[i]).Seconds() / wall.Seconds()
		res.NodeCPU = append(res.NodeCPU, p)
		res.IdleCPU += p
	}
	if res.IdleRSS, err = tc.rss(); err != nil {
		return nil, err
	}
	var fresh, idle float64
	for i := range res.IdleRSS {
		fresh += float64(res.FreshRSS[i])
		idle += float64(res.IdleRSS[i])
	}
	if n > 0 {
		res.RSSPerQueue = (idle - fresh) / float64(n) / (1 << 20)
	}
	res.MachineLoad = loadAverage()
	if cfg.Failover && len(cfg.URIs) == 0 && n > 0 {
		cfg.logf("  failover check")
		res.Failover = failoverCheck(ctx, cfg, tc)
	}
	return res, nil
}

// failoverCheck publishes with confirms to queue 1 from a node other than its leader, SIGKILLs
// the leader's node after 3 s, and measures the confirm stall.
func failoverCheck(ctx context.Context, cfg ClusterConfig, tc *testCluster) *Failover {
	q := clusterQueue(1)
	fo := &Failover{Queue: q}
	leader, err := queueLeader(ctx, tc, q, "")
	if err != nil {
		fo.Error = err.Error()
		return fo
	}
	fo.Killed = leader.id
	var pubNode *clusterNode
	for _, nd := range tc.nodes {
		if nd != leader {
			pubNode = nd
			break
		}
	}
	fo.PublishedOn = pubNode.id
	conn, err := dial(pubNode.uri, "warren-perf cluster failover")
	if err != nil {
		fo.Error = err.Error()
		return fo
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		fo.Error = err.Error()
		return fo
	}
	const window = 50
	const rate = 1000 // messages per second at most
	body := make([]byte, 1024)
	type pending struct {
		dc *amqp.DeferredConfirmation
		at time.Time
	}
	var (
		inflight  []pending
		killAt    time.Time
		lastAck   time.Time
		stall     time.Duration
		recovered time.Time
	)
	settle := func(p pending, now time.Time) {
		if !p.dc.Acked() {
			fo.Nacked++
			return
		}
		fo.Confirmed++
		if !killAt.IsZero() {
			from := lastAck
			if from.Before(killAt) {
				from = killAt
			}
			stall = max(stall, now.Sub(from))
			if recovered.IsZero() && p.at.After(killAt) {
				recovered = now
			}
		}
		lastAck = now
	}
	start := time.Now()
	end := start.Add(3*time.Second + cfg.FailoverRun)
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for time.Now().Before(end) && ctx.Err() == nil {
		if killAt.IsZero() && time.Since(start) >= 3*time.Second {
			killAt = time.Now()
			_ = leader.cmd.Process.Kill()
			<-leader.exited
		}
		// Settle what is done; wait for the oldest when the window is full.
	settled:
		for len(inflight) > 0 {
			p := inflight[0]
			if len(inflight) < window {
				select {
				case <-p.dc.Done():
				default:
					break settled
				}
			} else {
				select {
				case <-p.dc.Done():
				case <-time.After(time.Until(end)):
					fo.Error = fmt.Sprintf("%d publishes unconfirmed at the end", len(inflight))
					goto done
				}
			}
			settle(p, time.Now())
			inflight = inflight[1:]
		}
		if ch.IsClosed() {
			fo.Error = "the publisher's channel closed"
			break
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
		if err != nil {
			fo.Error = fmt.Sprintf("publish: %v", err)
			break
		}
		fo.Published++
		inflight = append(inflight, pending{dc: dc, at: time.Now()})
		<-tick.C
	}
	for _, p := range inflight {
		select {
		case <-p.dc.Done():
			settle(p, time.Now())
		case <-time.After(15 * time.Second):
			fo.Error = "publishes unconfirmed 15 s after the end"
			goto done
		}
	}
done:
	if !killAt.IsZero() {
		if lastAck.Before(killAt) {
			stall = time.Since(killAt) // nothing confirmed after the kill
		} else if recovered.IsZero() || fo.Error != "" {
			// Publishes were left unconfirmed (or none published after the kill was confirmed):
			// the stall lasts from the last confirm to now, not only between confirms (a run whose
			// queue never failed over reported the 79 ms between the last confirms before it).
			stall = max(stall, time.Since(lastAck))
		}
		fo.StallMs = float64(stall) / float64(time.Millisecond)
		if !recovered.IsZero() {
			fo.RecoverMs = float64(recovered.Sub(killAt)) / float64(time.Millisecond)
		}
		if nl, err := queueLeader(ctx, tc, q, leader.id); err == nil {
			fo.LeaderAfter = nl.id
		}
	}
	return fo
}

// queueLeader returns the node leading queue q's group, asking the running nodes (not skip).
func queueLeader(ctx context.Context, tc *testCluster, q, skip string) (*clusterNode, error) {
	name := fmt.Sprintf("queue '%s' in vhost '/'", q)
	deadline := time.Now().Add(15 * time.Second)
	for {
		for _, nd := range tc.nodes {
			if nd.id == skip {
				continue
			}
			st, err := nd.status(ctx)
			if err != nil {
				continue
			}
			for _, g := range st.Groups {
				if g.Name != name || g.Leader == "" {
					continue
				}
				for _, l := range tc.nodes {
					if l.id == g.Leader && l.id != skip {
						return l, nil
					}
				}
			}
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 100*time.Millisecond) {
			return nil, fmt.Errorf("no leader of %s known", q)
		}
	}
}

func (r *ClusterResult) summary() string {
	s := fmt.Sprintf("declared %d/%d in %.1f s (%.1f/s); idle CPU %.1f%% of one core (nodes %s); RSS per queue %.3f MB",
		r.Declared, r.Queues, r.DeclareSeconds, r.DeclareRate, r.IdleCPU, fmtPercents(r.NodeCPU), r.RSSPerQueue)
	if r.DeclareError != "" {
		s += "; first declare error: " + r.DeclareError
	}
	if f := r.Failover; f != nil {
		s += fmt.Sprintf("; failover: killed %s (leader of %s), published on %s, longest confirm stall %.0f ms, recovered after %.0f ms, %d confirmed, %d nacked, new leader %s",
			f.Killed, f.Queue, f.PublishedOn, f.StallMs, f.RecoverMs, f.Confirmed, f.Nacked, f.LeaderAfter)
		if f.Error != "" {
			s += " (" + f.Error + ")"
		}
	}
	return s
}

func fmtPercents(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.1f%%", x)
	}
	return strings.Join(parts, " ")
}

// medianOf returns the median of the values f picks from the results.
func medianOf(rs []*ClusterResult, f func(*ClusterResult) (float64, bool)) (float64, int) {
	var v []float64
	for _, r := range rs {
		if x, ok := f(r); ok {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return 0, 0
	}
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2], len(v)
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2, len(v)
}

// writeClusterHuman prints every run and the medians.
func writeClusterHuman(w io.Writer, rs []*ClusterResult) error {
	var b strings.Builder
	for i, r := range rs {
		fmt.Fprintf(&b, "run %d: %s\n", i+1, r.summary())
	}
	if len(rs) > 0 {
		all := func(f func(*ClusterResult) float64) func(*ClusterResult) (float64, bool) {
			return func(r *ClusterResult) (float64, bool) { return f(r), true }
		}
		dr, _ := medianOf(rs, all(func(r *ClusterResult) float64 { return r.DeclareRate }))
		cpu, _ := medianOf(rs, all(func(r *ClusterResult) float64 { return r.IdleCPU }))
		rss, _ := medianOf(rs, all(func(r *ClusterResult) float64 { return r.RSSPerQueue }))
		fmt.Fprintf(&b, "median of %d: %d nodes, %d quorum queues: declares %.1f/s, idle CPU %.1f%% of one core, RSS per queue %.3f MB",
			len(rs), rs[0].Nodes, rs[0].Queues, dr, cpu, rss)
		if st, k := medianOf(rs, func(r *ClusterResult) (float64, bool) {
			return r.Failover.stall()
		}); k > 0 {
			worst := slices.MaxFunc(rs, func(a, b *ClusterResult) int {
				x, _ := a.Failover.stall()
				y, _ := b.Failover.stall()
				switch {
				case x < y:
					return -1
				case x > y:
					return 1
				}
				return 0
			})
			ws, _ := worst.Failover.stall()
			fmt.Fprintf(&b, ", longest confirm stall after a leader kill %.0f ms (worst %.0f ms)", st, ws)
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (f *Failover) stall() (float64, bool) {
	if f == nil || f.Killed == "" {
		return 0, false
	}
	return f.StallMs, true
}

func clusterCommand() *cli.Command {
	return &cli.Command{
		Name:  "cluster",
		Usage: "the cost of quorum queues on a cluster on loopback: declare rate, idle CPU, RSS per queue, failover stall",
		Description: "Starts --nodes `warren serve` processes on free loopback ports as one cluster (or uses the\n" +
			"running cluster given by --uris, e.g. RabbitMQ), declares --queues durable quorum queues through\n" +
			"node 1 with --channels channels, waits --settle, then reads the nodes' CPU time (/proc/PID/stat)\n" +
			"over --idle and their RSS. With --failover, a publisher on another node publishes with confirms\n" +
			"to one queue while its leader's node is SIGKILLed, and the longest confirm stall is reported.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "warren-bin", Usage: "warren binary to start (default: this executable)"},
			&cli.IntFlag{Name: "nodes", Value: 3, Usage: "nodes to start"},
			&cli.IntFlag{Name: "queues", Value: 300, Usage: "quorum queues to declare"},
			&cli.IntFlag{Name: "channels", Value: 10, Usage: "channels declaring in parallel"},
			&cli.DurationFlag{Name: "settle", Value: 2 * time.Second, Usage: "pause between the declares and the idle window"},
			&cli.DurationFlag{Name: "idle", Value: 15 * time.Second, Usage: "idle window over which CPU is measured"},
			&cli.BoolFlag{Name: "failover", Usage: "then kill the leader of one queue and measure the confirm stall"},
			&cli.DurationFlag{Name: "failover-run", Value: 10 * time.Second, Usage: "publishing time after the kill"},
			&cli.IntFlag{Name: "runs", Value: 1, Usage: "runs, each on a fresh cluster; medians are reported"},
			&cli.StringFlag{Name: "uris", Usage: "comma-separated AMQP `URIS` of a running cluster, node 1 first (nothing is started)"},
			&cli.BoolFlag{Name: "json", Usage: "print the results as one JSON array"},
			&cli.StringFlag{Name: "cpu-profile-dir", Usage: "`DIR` where every started node writes a Go CPU profile of its run (<node id>.prof)"},
		},
		Action: func(c *cli.Context) error {
			cfg := ClusterConfig{
				Bin: c.String("warren-bin"), Nodes: c.Int("nodes"), Queues: c.Int("queues"), Channels: c.Int("channels"),
				Settle: c.Duration("settle"), Idle: c.Duration("idle"), Failover: c.Bool("failover"),
				FailoverRun: c.Duration("failover-run"), Runs: c.Int("runs"), Log: c.App.ErrWriter,
				ProfileDir: c.String("cpu-profile-dir"),
			}
			if u := c.String("uris"); u != "" {
				cfg.URIs = strings.Split(u, ",")
			}
			ctx, stop := signalContext(c)
			defer stop()
			rs, err := Cluster(ctx, cfg)
			if c.Bool("json") {
				if jerr := writeJSON(c.App.Writer, rs); jerr != nil {
					return jerr
				}
			} else if herr := writeClusterHuman(c.App.Writer, rs); herr != nil {
				return herr
			}
			if err != nil {
				return fmt.Errorf("perf cluster: %w", err)
			}
			return nil
		},
	}
}
