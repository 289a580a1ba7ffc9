package metrics

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"warren/server"
	corepkg "warren/server/core"
	"warren/server/queue"
	"warren/server/stats"
)

// collector reads one node for one endpoint at scrape time. It keeps no state between scrapes:
// every number comes from the core's atomics and last samples (queue stats are each queue's
// own short critical section, never a lock held across the scrape).
type collector struct {
	s         *server.Server
	c         *catalogue
	version   string
	perObject bool
}

// Describe sends nothing: the collector is unchecked, as its per-object series come and go.
func (*collector) Describe(chan<- *prometheus.Desc) {}

// queueSample is one queue's numbers, read once per scrape.
type queueSample struct {
	vhost, name, kind string
	st                queue.Stats
	counts            stats.Values
}

// emitFunc sends (per-object) or sums (aggregated) one series with its two object labels
// (vhost and queue, vhost and channel; b is unused for a connection's one label). Two fixed
// arguments rather than a variadic slice: the aggregated endpoint then allocates nothing per
// object.
type emitFunc func(f *family, v float64, a, b string)

// sum accumulates an Object family's aggregate.
type sums map[*family]float64

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	cat := c.c
	agg := sums{}
	// emit sends a per-object series on /metrics/per-object and adds it to the aggregate on
	// /metrics.
	var emit emitFunc = func(f *family, v float64, a, b string) {
		if c.perObject {
			if len(f.ObjectLabels) == 1 {
				ch <- prometheus.MustNewConstMetric(f.obj, f.Type, v, a)
			} else {
				ch <- prometheus.MustNewConstMetric(f.obj, f.Type, v, a, b)
			}
			return
		}
		if f.agg != nil {
			agg[f] += v
		}
	}
	node := func(f *family, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(f.agg, f.Type, v, labels...)
	}

	core := c.s.Core()
	reg := core.Stats()

	// Queues, one at a time: nothing is kept per queue but a replicated queue's name for its
	// raft group's labels.
	byGroup := map[uint64][2]string{}
	consumers, nqueues := 0, 0
	var q queueSample
	for _, v := range core.VHosts() {
		q.vhost = v.Name()
		for _, cq := range v.Queues() {
			q.name, q.kind, q.st = cq.Name(), cq.Kind(), cq.Stats()
			q.counts = stats.Values{}
			if o := cq.Counters(); o != nil {
				q.counts = o.Values()
			}
			if cq.Replicated() {
				byGroup[cq.ID()] = [2]string{q.vhost, q.name}
			}
			nqueues++
			consumers += q.st.Consumers
			c.queue(emit, &q)
		}
	}

	// Channels: their own counters (the per-object series); node totals come from the registry,
	// where closed channels' counts are kept. An open channel that has published is a publisher
	// (RabbitMQ's rabbitmq_global_publishers for AMQP 0-9-1).
	publishers := 0
	if reg != nil {
		for _, o := range reg.Objects(stats.ScopeChannel) {
			if o.Load(stats.Published) > 0 {
				publishers++
			}
			l := o.Labels()
			v := o.Values()
			name := fmt.Sprintf("%s (%d)", l.Name, l.Channel)
			for _, cc := range cat.chanCounters {
				emit(cc.f, sumKinds(&v, cc.kinds), l.VHost, name)
			}
		}
	}
	streamTotals, streamConsumers, streamPublishers := c.s.StreamProtocolStats()
	if reg != nil {
		totals := reg.Totals()
		for _, g := range cat.global {
			if len(g.f.Labels) == 0 {
				node(g.f, sumKinds(&totals, g.kinds))
				continue
			}
			// AMQP 0-9-1's traffic is the channels' (server/stats); the stream protocol counts
			// its own.
			node(g.f, sumKinds(&totals, g.kinds), "amqp091")
			node(g.f, sumKinds(&streamTotals, g.kinds), "stream")
		}
		for _, ch := range cat.churn {
			node(ch.f, float64(totals[ch.kind]))
		}
	}

	// Connections.
	conns := core.Connections()
	channels := 0
	byProto := map[string]int{}
	for _, ci := range conns {
		channels += ci.Channels
		byProto[protocolLabel(ci.Protocol)]++
		emit(cat.connChannels, float64(ci.Channels), ci.Name, "")
	}
	node(cat.connections, float64(len(conns)))
	node(cat.channels, float64(channels))
	node(cat.queues, float64(nqueues))
	node(cat.consumers, float64(consumers))
	// Consumers on queues are AMQP 0-9-1's (queues do not know their consumers' protocol; see
	// docs/differences.md); the stream protocol's subscriptions are its own.
	node(cat.globalConsumers, float64(consumers), "amqp091")
	node(cat.globalConsumers, float64(streamConsumers), "stream")
	node(cat.globalPublishers, float64(publishers), "amqp091")
	node(cat.globalPublishers, float64(streamPublishers), "stream")

	// Stream readers' lag, per reader (per-object only).
	if c.perObject {
		// Consumer tags are unique per channel, not per stream: two consumers with one tag on a
		// stream are one series, the larger lag (a duplicate series would fail the scrape).
		type key struct{ vhost, stream, tag string }
		consumerLag := map[key]uint64{}
		for _, l := range c.s.StreamLags() {
			switch l.Kind {
			case "consumer":
				k := key{l.VHost, l.Stream, l.Name}
				if v, ok := consumerLag[k]; !ok || l.Lag > v {
					consumerLag[k] = l.Lag
				}
			case "offset":
				ch <- prometheus.MustNewConstMetric(cat.streamOffsetLag.obj, gauge, float64(l.Lag), l.VHost, l.Stream, l.Name)
			case "group":
				ch <- prometheus.MustNewConstMetric(cat.groupLag.obj, gauge, float64(l.Lag), l.VHost, l.Stream, l.Name)
				if l.HasOffset {
					ch <- prometheus.MustNewConstMetric(cat.groupCommitted.obj, gauge, float64(l.Offset), l.VHost, l.Stream, l.Name)
				}
			}
		}
		for k, lag := range consumerLag {
			ch <- prometheus.MustNewConstMetric(cat.streamConsumerLag.obj, gauge, float64(lag), k.vhost, k.stream, k.tag)
		}
	}

	// Raft groups: the metadata group (id 0) and replicated queues' groups.
	groups := c.s.RaftGroups()
	for _, g := range groups {
		vhost, name := "", ""
		if q, ok := byGroup[g.ID]; ok && g.ID != 0 {
			vhost, name = q[0], q[1]
		}
		leader := 0.0
		if g.Leader {
			leader = 1
		}
		emit(cat.raftTerm, float64(g.Term), vhost, name)
		emit(cat.raftCommit, float64(g.CommitIndex), vhost, name)
		emit(cat.raftApplied, float64(g.Applied), vhost, name)
		emit(cat.raftLast, float64(g.LastIndex), vhost, name)
		emit(cat.raftLeader, leader, vhost, name)
		emit(cat.raftLatency, g.CommitLatency.Seconds(), vhost, name)
	}

	if !c.perObject {
		for _, f := range cat.all {
			if f.Scope == Object {
				// Every Object family is served, 0 when there is nothing to sum; the commit
				// latency is averaged over the groups, as RabbitMQ's aggregate is.
				v := agg[f]
				if f == cat.raftLatency && len(groups) > 0 {
					v /= float64(len(groups))
				}
				node(f, v)
			}
		}
	}

	// Resources and alarms.
	if r, ok := c.s.Resources(); ok {
		node(cat.rss, float64(r.RSS))
		node(cat.memLimit, float64(r.MemoryLimit))
		if r.DiskFree >= 0 {
			node(cat.diskFree, float64(r.DiskFree))
		}
		node(cat.diskLimit, float64(r.DiskLimit))
		node(cat.alarmMemory, bool01(r.MemoryAlarm))
		node(cat.alarmDisk, bool01(r.DiskAlarm))
	}
	node(cat.alarmFD, 0)
	open, max := fds()
	if open >= 0 {
		node(cat.openFDs, float64(open))
	}
	if max > 0 {
		node(cat.maxFDs, float64(max))
		node(cat.maxSockets, float64(max))
	}
	node(cat.openSockets, float64(len(conns)))

	// Logins by protocol.
	for _, p := range corepkg.AuthProtocols() {
		ok, failed := core.AuthAttemptsOf(p)
		node(cat.authTotal, float64(ok+failed), p.String())
		node(cat.authSucceeded, float64(ok), p.String())
		node(cat.authFailed, float64(failed), p.String())
	}

	node(cat.identity, 1, c.s.NodeName(), c.s.NodeName(), c.s.NodeName())
	node(cat.build, 1, c.version, c.version, clientVersion(), runtime.Version())

	st := c.s.StorageStats()
	node(cat.storeCommits, float64(st.Batches))
	node(cat.storeTxns, float64(st.Txns))
	node(cat.storeOps, float64(st.Ops))
	node(cat.storeLSM, float64(st.LSMBytes))
	node(cat.storeVlog, float64(st.VlogBytes))
	if st.RoundSeconds.Buckets != nil {
		ch <- prometheus.MustNewConstHistogram(cat.storeRoundSeconds.agg, st.RoundSeconds.Count, st.RoundSeconds.Sum, st.RoundSeconds.Buckets)
		ch <- prometheus.MustNewConstHistogram(cat.storeRoundBatches.agg, st.RoundBatches.Count, st.RoundBatches.Sum, st.RoundBatches.Buckets)
	}
}

// sumKinds adds the values of kinds.
func sumKinds(v *stats.Values, kinds []stats.Kind) float64 {
	var n uint64
	for _, k := range kinds {
		n += v[k]
	}
	return float64(n)
}

// protocolLabel maps a connection's protocol name onto rabbitmq_prometheus's label value.
func protocolLabel(p string) string {
	if p == "stream" {
		return "stream"
	}
	return "amqp091"
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// fds counts the process's open file descriptors (-1 if unknown) and reads its limit.
func fds() (open int, max uint64) {
	open = -1
	if d, err := os.Open("/proc/self/fd"); err == nil {
		names, err := d.Readdirnames(-1)
		d.Close()
		if err == nil {
			open = len(names) - 1 // the directory itself, opened to list it
		}
	}
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil {
		max = rl.Cur
	}
	return open, max
}

// clientVersion is the version of client_golang built in, as rabbitmq_build_info's
// prometheus_client_version.
func clientVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/prometheus/client_golang" {
				return m.Version
			}
		}
	}
	return "unknown"
}

// queue sends one queue's series.
func (c *collector) queue(emit emitFunc, q *queueSample) {
	cat, st := c.c, &q.st
	emit(cat.queueReady, float64(st.Ready), q.vhost, q.name)
	emit(cat.queueUnacked, float64(st.Unacked), q.vhost, q.name)
	emit(cat.queueMessages, float64(st.Ready+st.Unacked), q.vhost, q.name)
	emit(cat.queueReadyBytes, float64(st.ReadyBytes), q.vhost, q.name)
	emit(cat.queueConsumers, float64(st.Consumers), q.vhost, q.name)
	for _, qc := range cat.queueCounters {
		emit(qc.f, sumKinds(&q.counts, qc.kinds), q.vhost, q.name)
	}
	if q.kind == "stream" {
		emit(cat.streamMessages, float64(st.Messages), q.vhost, q.name)
		emit(cat.streamBytes, float64(st.Bytes), q.vhost, q.name)
		emit(cat.streamSegments, float64(st.Segments), q.vhost, q.name)
		emit(cat.streamFirst, float64(st.FirstOffset), q.vhost, q.name)
		emit(cat.streamLast, float64(st.LastOffset), q.vhost, q.name)
	}
}
