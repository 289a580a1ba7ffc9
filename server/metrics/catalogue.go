package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"warren/server/stats"
)

// Scope says on which endpoint a metric is served and how.
type Scope uint8

// Scopes.
const (
	// Node metrics are the same on /metrics and /metrics/per-object.
	Node Scope = iota
	// Object metrics are per queue, connection or channel: labelled on /metrics/per-object, and
	// summed into one unlabelled series on /metrics (as RabbitMQ's aggregated endpoint does).
	Object
	// PerObjectOnly metrics exist only on /metrics/per-object (a sum would mean nothing: offsets).
	PerObjectOnly
)

// Info describes one metric family: what docs/metrics.md lists and the tests check.
type Info struct {
	Name   string
	Type   prometheus.ValueType
	Help   string
	Labels []string // on /metrics; Object metrics add ObjectLabels on /metrics/per-object
	// ObjectLabels are the labels of the per-object series (vhost, queue, connection, channel).
	ObjectLabels []string
	Scope        Scope
	// Histogram families are Prometheus histograms (_bucket, _sum, _count); Type is then unused.
	Histogram bool
}

// family is a metric family with its descriptors for both endpoints.
type family struct {
	Info
	agg, obj *prometheus.Desc // agg is nil for PerObjectOnly, obj nil for Node
}

// Label sets.
var (
	queueLabels = []string{"vhost", "queue"}
	connLabels  = []string{"connection"}
	protoLabels = []string{"protocol"}
	chanLabels  = []string{"vhost", "channel"}
)

// catalogue is every family the exporter serves, built once per exporter.
type catalogue struct {
	all []*family

	// Counts of objects.
	connections, channels, queues, consumers *family
	globalConsumers, globalPublishers        *family

	// Queues (Object scope: vhost, queue).
	queueReady, queueUnacked, queueMessages, queueReadyBytes, queueConsumers *family
	// Streams (Warren's own).
	streamMessages, streamBytes, streamSegments, streamFirst, streamLast *family
	// Readers' lag (per-object only: labelled by reader).
	streamConsumerLag, streamOffsetLag, groupLag, groupCommitted *family

	// Connections (Object scope: connection).
	connChannels *family

	// Node resources.
	rss, memLimit, diskFree, diskLimit          *family
	alarmMemory, alarmDisk, alarmFD             *family
	openFDs, maxFDs, openSockets, maxSockets    *family
	authTotal, authSucceeded, authFailed        *family
	identity, build                             *family
	raftTerm, raftCommit, raftApplied, raftLast *family
	raftLeader, raftLatency                     *family

	// Message counters of the node (server/stats), by protocol.
	global []globalCounter
	// Churn.
	churn []churnCounter

	// Per channel (Object scope: vhost, channel).
	chanCounters []objCounter
	// Per queue counters (Object scope: vhost, queue).
	queueCounters []objCounter

	// Storage (Warren's own).
	storeCommits, storeTxns, storeOps, storeLSM, storeVlog *family
	storeRoundSeconds, storeRoundBatches                   *family
}

// globalCounter is a rabbitmq_global_messages_* family: the sum of kinds of the node's totals.
type globalCounter struct {
	f     *family
	kinds []stats.Kind
}

// churnCounter is a node churn counter family.
type churnCounter struct {
	f    *family
	kind stats.Kind
}

// objCounter is a per-channel or per-queue counter family: the sum of kinds of the object.
type objCounter struct {
	f     *family
	kinds []stats.Kind
}

const (
	counter = prometheus.CounterValue
	gauge   = prometheus.GaugeValue
	untyped = prometheus.UntypedValue
)

func (c *catalogue) add(scope Scope, name string, typ prometheus.ValueType, help string, labels, objLabels []string) *family {
	f := &family{Info: Info{Name: name, Type: typ, Help: help, Labels: labels, ObjectLabels: objLabels, Scope: scope}}
	if scope != PerObjectOnly {
		f.agg = prometheus.NewDesc(name, help, labels, nil)
	}
	if scope != Node {
		f.obj = prometheus.NewDesc(name, help, append(append([]string{}, labels...), objLabels...), nil)
	}
	c.all = append(c.all, f)
	return f
}

// newCatalogue defines the families. Names, types and help texts of rabbitmq_* families are
// RabbitMQ 3.10.8's rabbitmq_prometheus (testdata/rabbitmq-3.10.8.tsv, checked by a test);
// warren_* are Warren's own.
func newCatalogue() *catalogue {
	c := &catalogue{}
	node := func(name string, typ prometheus.ValueType, help string, labels ...string) *family {
		return c.add(Node, name, typ, help, labels, nil)
	}
	obj := func(name string, typ prometheus.ValueType, help string, objLabels []string) *family {
		return c.add(Object, name, typ, help, nil, objLabels)
	}
	only := func(name string, typ prometheus.ValueType, help string, objLabels []string) *family {
		return c.add(PerObjectOnly, name, typ, help, nil, objLabels)
	}

	c.connections = node("rabbitmq_connections", gauge, "Connections currently open")
	c.channels = node("rabbitmq_channels", gauge, "Channels currently open")
	c.queues = node("rabbitmq_queues", gauge, "Queues available")
	c.consumers = node("rabbitmq_consumers", gauge, "Consumers currently connected")
	c.globalConsumers = node("rabbitmq_global_consumers", gauge, "Current number of consumers", protoLabels...)
	c.globalPublishers = node("rabbitmq_global_publishers", gauge, "Current number of publishers", protoLabels...)

	c.queueReady = obj("rabbitmq_queue_messages_ready", gauge, "Messages ready to be delivered to consumers", queueLabels)
	c.queueUnacked = obj("rabbitmq_queue_messages_unacked", gauge, "Messages delivered to consumers but not yet acknowledged", queueLabels)
	c.queueMessages = obj("rabbitmq_queue_messages", gauge, "Sum of ready and unacknowledged messages - total queue depth", queueLabels)
	c.queueReadyBytes = obj("rabbitmq_queue_messages_ready_bytes", gauge, "Size in bytes of ready messages", queueLabels)
	c.queueConsumers = obj("rabbitmq_queue_consumers", gauge, "Consumers on a queue", queueLabels)

	c.streamMessages = obj("warren_stream_messages", gauge, "Records in a stream's log", queueLabels)
	c.streamBytes = obj("warren_stream_bytes", gauge, "Bytes of a stream's log on disk", queueLabels)
	c.streamSegments = obj("warren_stream_segments", gauge, "Chunks (segments) in a stream's log", queueLabels)
	c.streamFirst = only("warren_stream_first_offset", gauge, "First offset still in a stream's log", queueLabels)
	c.streamLast = only("warren_stream_last_offset", gauge, "Last offset written to a stream's log", queueLabels)

	c.streamConsumerLag = only("warren_stream_consumer_lag", gauge, "Records of a stream committed after a stream consumer's next offset", []string{"vhost", "queue", "consumer"})
	c.streamOffsetLag = only("warren_stream_offset_lag", gauge, "Records of a stream after a stored (named) offset", []string{"vhost", "queue", "reference"})
	c.groupLag = only("warren_stream_group_lag", gauge, "Records of a consumer group's partition after the group's committed offset (all retained records when none is committed)", []string{"vhost", "queue", "group"})
	c.groupCommitted = only("warren_stream_group_committed_offset", gauge, "A consumer group's committed offset on a partition (absent when none)", []string{"vhost", "queue", "group"})

	c.connChannels = obj("rabbitmq_connection_channels", gauge, "Channels on a connection", connLabels)

	c.rss = node("rabbitmq_process_resident_memory_bytes", gauge, "Memory used in bytes")
	c.memLimit = node("rabbitmq_resident_memory_limit_bytes", gauge, "Memory high watermark in bytes")
	c.diskFree = node("rabbitmq_disk_space_available_bytes", gauge, "Disk space available in bytes")
	c.diskLimit = node("rabbitmq_disk_space_available_limit_bytes", gauge, "Free disk space low watermark in bytes")
	c.alarmMemory = node("rabbitmq_alarms_memory_used_watermark", untyped, "is 1 if VM memory watermark alarm is in effect")
	c.alarmDisk = node("rabbitmq_alarms_free_disk_space_watermark", untyped, "is 1 if free disk space watermark alarm is in effect")
	c.alarmFD = node("rabbitmq_alarms_file_descriptor_limit", untyped, "is 1 if file descriptor limit alarm is in effect")
	c.openFDs = node("rabbitmq_process_open_fds", gauge, "Open file descriptors")
	c.maxFDs = node("rabbitmq_process_max_fds", gauge, "Open file descriptors limit")
	c.openSockets = node("rabbitmq_process_open_tcp_sockets", gauge, "Open TCP sockets")
	c.maxSockets = node("rabbitmq_process_max_tcp_sockets", gauge, "Open TCP sockets limit")

	c.authTotal = node("rabbitmq_auth_attempts_total", counter, "Total number of authorization attempts", protoLabels...)
	c.authSucceeded = node("rabbitmq_auth_attempts_succeeded_total", counter, "Total number of successful authentication attempts", protoLabels...)
	c.authFailed = node("rabbitmq_auth_attempts_failed_total", counter, "Total number of failed authentication attempts", protoLabels...)

	c.identity = node("rabbitmq_identity_info", untyped, "RabbitMQ node & cluster identity info",
		"rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id")
	c.build = node("rabbitmq_build_info", untyped, "RabbitMQ & Erlang/OTP version info",
		"rabbitmq_version", "prometheus_plugin_version", "prometheus_client_version", "erlang_version")

	c.raftTerm = obj("rabbitmq_raft_term_total", counter, "Current Raft term number", queueLabels)
	c.raftCommit = obj("rabbitmq_raft_log_commit_index", gauge, "Raft log commit index", queueLabels)
	c.raftApplied = obj("rabbitmq_raft_log_last_applied_index", gauge, "Raft log last applied index", queueLabels)
	c.raftLast = obj("rabbitmq_raft_log_last_written_index", gauge, "Raft log last written index", queueLabels)
	c.raftLatency = obj("rabbitmq_raft_entry_commit_latency_seconds", gauge, "Time taken for a log entry to be committed", queueLabels)
	c.raftLeader = obj("warren_raft_group_leader", gauge, "1 if this node leads the raft group (summed: groups this node leads)", queueLabels)

	ks := func(k ...stats.Kind) []stats.Kind { return k }
	global := func(name, help string, k ...stats.Kind) {
		c.global = append(c.global, globalCounter{node(name, counter, help, protoLabels...), k})
	}
	global("rabbitmq_global_messages_received_total", "Total number of messages received from publishers", stats.Published)
	global("rabbitmq_global_messages_received_confirm_total", "Total number of messages received from publishers expecting confirmations", stats.PublishedConfirm)
	global("rabbitmq_global_messages_routed_total", "Total number of messages routed to queues or streams", stats.Routed)
	global("rabbitmq_global_messages_unroutable_dropped_total", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable", stats.UnroutableDropped)
	global("rabbitmq_global_messages_unroutable_returned_total", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable", stats.UnroutableReturned)
	global("rabbitmq_global_messages_confirmed_total", "Total number of messages confirmed to publishers", stats.Confirmed)
	global("rabbitmq_global_messages_delivered_total", "Total number of messages delivered to consumers",
		stats.DeliveredAck, stats.DeliveredNoAck, stats.GetAck, stats.GetNoAck)
	global("rabbitmq_global_messages_delivered_consume_manual_ack_total", "Total number of messages delivered to consumers using basic.consume with manual acknowledgment", stats.DeliveredAck)
	global("rabbitmq_global_messages_delivered_consume_auto_ack_total", "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment", stats.DeliveredNoAck)
	global("rabbitmq_global_messages_delivered_get_manual_ack_total", "Total number of messages delivered to consumers using basic.get with manual acknowledgment", stats.GetAck)
	global("rabbitmq_global_messages_delivered_get_auto_ack_total", "Total number of messages delivered to consumers using basic.get with automatic acknowledgment", stats.GetNoAck)
	global("rabbitmq_global_messages_get_empty_total", "Total number of times basic.get operations fetched no message", stats.GetEmpty)
	global("rabbitmq_global_messages_redelivered_total", "Total number of messages redelivered to consumers", stats.Redelivered)
	global("rabbitmq_global_messages_acknowledged_total", "Total number of messages acknowledged by consumers", stats.Acknowledged)
	// Dead-lettering is counted on the queues, whatever protocol fed them: no protocol label
	// (RabbitMQ labels these queue_type and dead_letter_strategy instead).
	dead := func(name, help string, k stats.Kind) {
		c.global = append(c.global, globalCounter{node(name, counter, help), ks(k)})
	}
	dead("rabbitmq_global_messages_dead_lettered_expired_total", "Total number of messages dead-lettered due to message TTL exceeded", stats.DeadLetteredExpired)
	dead("rabbitmq_global_messages_dead_lettered_rejected_total", "Total number of messages dead-lettered due to basic.reject or basic.nack", stats.DeadLetteredRejected)
	dead("rabbitmq_global_messages_dead_lettered_maxlen_total", "Total number of messages dead-lettered due to overflow drop-head or reject-publish-dlx", stats.DeadLetteredMaxLen)
	dead("rabbitmq_global_messages_dead_lettered_delivery_limit_total", "Total number of messages dead-lettered due to delivery-limit exceeded", stats.DeadLetteredDeliveryLimit)
	dead("rabbitmq_global_messages_dead_lettered_confirmed_total", "Total number of messages dead-lettered and confirmed by target queues", stats.DeadLetteredConfirmed)

	churn := func(name, help string, k stats.Kind) {
		c.churn = append(c.churn, churnCounter{node(name, counter, help), k})
	}
	churn("rabbitmq_connections_opened_total", "Total number of connections opened", stats.ConnectionsOpened)
	churn("rabbitmq_connections_closed_total", "Total number of connections closed or terminated", stats.ConnectionsClosed)
	churn("rabbitmq_channels_opened_total", "Total number of channels opened", stats.ChannelsOpened)
	churn("rabbitmq_channels_closed_total", "Total number of channels closed", stats.ChannelsClosed)
	churn("rabbitmq_queues_declared_total", "Total number of queues declared", stats.QueuesDeclared)
	churn("rabbitmq_queues_created_total", "Total number of queues created", stats.QueuesCreated)
	churn("rabbitmq_queues_deleted_total", "Total number of queues deleted", stats.QueuesDeleted)

	ch := func(name, help string, k ...stats.Kind) {
		c.chanCounters = append(c.chanCounters, objCounter{obj(name, counter, help, chanLabels), k})
	}
	ch("rabbitmq_channel_messages_published_total", "Total number of messages published into an exchange on a channel", stats.Published)
	ch("rabbitmq_channel_messages_confirmed_total", "Total number of messages published into an exchange and confirmed on the channel", stats.Confirmed)
	ch("rabbitmq_channel_messages_unroutable_returned_total", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable", stats.UnroutableReturned)
	ch("rabbitmq_channel_messages_unroutable_dropped_total", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable", stats.UnroutableDropped)
	ch("rabbitmq_channel_get_ack_total", "Total number of messages fetched with basic.get in manual acknowledgement mode", stats.GetAck)
	ch("rabbitmq_channel_get_total", "Total number of messages fetched with basic.get in automatic acknowledgement mode", stats.GetNoAck)
	ch("rabbitmq_channel_get_empty_total", "Total number of times basic.get operations fetched no message", stats.GetEmpty)
	ch("rabbitmq_channel_messages_delivered_ack_total", "Total number of messages delivered to consumers in manual acknowledgement mode", stats.DeliveredAck)
	ch("rabbitmq_channel_messages_delivered_total", "Total number of messages delivered to consumers in automatic acknowledgement mode", stats.DeliveredNoAck)
	ch("rabbitmq_channel_messages_redelivered_total", "Total number of messages redelivered to consumers", stats.Redelivered)
	ch("rabbitmq_channel_messages_acked_total", "Total number of messages acknowledged by consumers", stats.Acknowledged)

	q := func(name, help string, k ...stats.Kind) {
		c.queueCounters = append(c.queueCounters, objCounter{obj(name, counter, help, queueLabels), k})
	}
	q("rabbitmq_queue_messages_published_total", "Total number of messages published to queues", stats.Published)
	q("warren_queue_messages_delivered_total", "Messages a queue delivered to consumers or basic.get, acknowledged or not", stats.DeliveredAck, stats.DeliveredNoAck, stats.GetAck, stats.GetNoAck)
	q("warren_queue_messages_redelivered_total", "Deliveries of a queue with the redelivered flag set", stats.Redelivered)
	q("warren_queue_messages_acknowledged_total", "Deliveries of a queue acknowledged by consumers", stats.Acknowledged)
	q("warren_queue_messages_dead_lettered_total", "Messages that died in a queue (expired, rejected, maxlen, delivery limit), dead-letter exchange or not",
		stats.DeadLetteredExpired, stats.DeadLetteredRejected, stats.DeadLetteredMaxLen, stats.DeadLetteredDeliveryLimit)

	c.storeCommits = node("warren_storage_commits_total", counter, "Write batches committed by the storage engine (Commit calls)")
	c.storeTxns = node("warren_storage_transactions_total", counter, "Storage transactions committed, each one fsync: commits/transactions is the group-commit batch size")
	c.storeOps = node("warren_storage_operations_total", counter, "Set and delete operations written by the storage engine")
	c.storeLSM = node("warren_storage_lsm_bytes", gauge, "Disk space used by the storage engine's LSM tree")
	c.storeVlog = node("warren_storage_vlog_bytes", gauge, "Disk space used by the storage engine's value log")
	c.storeRoundSeconds = node("warren_storage_commit_round_seconds", untyped, "Time the storage engine's group committer took to write and fsync one round of batches")
	c.storeRoundSeconds.Histogram = true
	c.storeRoundBatches = node("warren_storage_commit_round_batches", untyped, "Write batches merged into one group-commit round (one fsync per round): the group-commit batch size")
	c.storeRoundBatches.Histogram = true
	return c
}

// Catalogue lists every metric family the exporter serves (except the process_* and go_*
// families of client_golang's own collectors), in the order they are defined.
func Catalogue() []Info {
	c := newCatalogue()
	out := make([]Info, len(c.all))
	for i, f := range c.all {
		out[i] = f.Info
	}
	return out
}
